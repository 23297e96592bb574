"""The bench table: the Markdown of a ``zyfa bench`` file from its rows (where we land, the speed–accuracy planes,
the user's kernels, every row), and ``--render``, which rewrites it from the JSON. It imports no torch, so the
report's speed section (:mod:`zyfa.accuracy.report.speed`) renders the same table from here.

Exposed: ``OURS_IMPL``, ``CUTE_IMPL``, ``WRONG_OUTPUT_REL_L2``, ``checked_rows``, ``ours_label``, ``headline_tflops``,
``ratio_cell``, ``plugin_lines``, ``cute_lines``, ``plane_lines``, ``summary_lines``, ``ROW_HEADER``, ``row_cells``,
``to_markdown``, ``render``.
"""

from __future__ import annotations

import json
import math
import os

from zyfa.markdown import md_escape
from zyfa.outputs import atomic_write_text
from zyfa.peers.names import PEER_NAMES, canonical_name
from zyfa.recipe_spec import names_old_accumulator

OURS_IMPL = "triton-fp8"  # the bench's name of our kernel (its recipe in the row's "recipe")
CUTE_IMPL = "cute-fp8"  # the bench's name of our CuTe DSL kernel (zyfa/kernels/attention_cute.py)
# rel-L2 against SDPA BF16 on Gaussian inputs above which a row's output is wrong (an FP8 attention is at about
# 0.05 there): such a row is no speed, and the summary shows it as a wrong output. (AMD's Triton FP8 kernel gave
# 0.49 and NaN at MLA's 192/128 head dims on the H200 when the bench still ran it there: it takes one head size for
# Q, K and V, and ``flash_attn_amd_forward`` now refuses such a shape.)
WRONG_OUTPUT_REL_L2 = 0.3


def checked_rows(rows):
    """Bench rows as stored, refused in one line where a row is in an older form: an old peer name (SDPA's backends
    were ``sdpa-cudnn``/``sdpa-flash``) or an old accumulator name in its recipe; ``scripts/migrate_rows.py`` rewrites
    such a file once."""
    for i, r in enumerate(rows):
        impl, recipe = r.get("impl"), r.get("recipe")
        old = (f"peer {impl!r} under its old name (now {canonical_name(impl)!r})" if canonical_name(impl) != impl
               else f"recipe {recipe!r} under the accumulator's old name"
               if isinstance(recipe, str) and names_old_accumulator(recipe) else None)
        if old:
            raise ValueError(f"bench row {i}: {old}, written before a rename; migrate the file once with "
                             "`python scripts/migrate_rows.py`")
    return rows


def ours_label(r: dict) -> str | None:
    """The name of one of our kernels' rows as the implementations registry spells it (the Triton kernel's recipe,
    ``cute:<recipe>`` for the CuTe DSL kernel); None for a peer's row."""
    return r["recipe"] if r["impl"] == OURS_IMPL else f"cute:{r['recipe']}" if r["impl"] == CUTE_IMPL else None


def _num(x, fmt):
    return format(x, fmt) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else "-"


def ratio_cell(row: dict, peer: str) -> str:
    """``median [min–max]`` of the speed ratio against ``peer`` taken within each repeat (V's transpose included for
    our kernel), with the ratio at matched SM clock after it; "-" without one."""
    vs = (row.get("vs_incl_transpose") or row.get("vs") or {}).get(peer)
    if not isinstance(vs, dict) or not isinstance(vs.get("median"), (int, float)):
        return "-"
    cell = f"{vs['median']:.2f} [{_num(vs.get('min'), '.2f')}–{_num(vs.get('max'), '.2f')}]"
    if isinstance(vs.get("matched_clock_median"), (int, float)):
        cell += f" (clock-matched {vs['matched_clock_median']:.2f})"
    return cell


def _kernel_lines(mine: list[dict], title: str, name_of) -> list[str]:
    """A section of ``mine`` (rows of kernels other than the peers) at each case they ran: median TFLOP/s (V's
    transpose included where it was timed) with the range over the repeats, the error (bf16 and FP8 output), and
    the speed ratio against each peer of the same interleaving."""
    if not mine:
        return []
    peers = [p for p in PEER_NAMES if any(p in (r.get("vs_incl_transpose") or r.get("vs") or {}) for r in mine)]
    out = [title, "",
           "| kernel | input | shape | s | mask | TFLOP/s | range | err | err FP8 out | "
           + " | ".join(f"× {p}" for p in peers) + " |", "|" + "---|" * (9 + len(peers))]
    for r in mine:
        shape = f"h{r['h']}/{r['h_kv']} d{r['d_qk']}/{r['d_v']}"
        mask = "causal" if r.get("causal") else "non-causal"
        if "error" in r:
            out.append(f"| {name_of(r)} | {r['input']} | {shape} | {r['s']} | {mask} | failed: "
                       f"{str(r['error'])[:160]} |" + "  |" * (3 + len(peers)))
            continue
        rng = "-"
        lo, hi = ("tflops_incl_transpose_min", "tflops_incl_transpose_max") if r.get("tflops_incl_transpose") \
            else (None, None)
        if lo and isinstance(r.get(lo), (int, float)) and isinstance(r.get(hi), (int, float)):
            rng = f"{r[lo]:.0f}–{r[hi]:.0f}"
        elif isinstance(r.get("ms_min"), (int, float)) and isinstance(r.get("ms_max"), (int, float)):
            rng = f"{r['tflops'] * r['ms'] / r['ms_max']:.0f}–{r['tflops'] * r['ms'] / r['ms_min']:.0f}"
        out.append(f"| {name_of(r)} | {r['input']} | {shape} | {r['s']} | {mask} | "
                   f"{_num(headline_tflops(r), '.0f')} | {rng} | {_num(r.get('rel_l2_vs_sdpa_bf16'), '.4f')} | "
                   f"{_num(r.get('rel_l2_fp8_out_vs_sdpa_bf16'), '.4f')} | "
                   + " | ".join(ratio_cell(r, p) for p in peers) + " |")
    return [*out, ""]


def plugin_lines(rows) -> list[str]:
    """'Your kernels': every user kernel (``plugin:NAME``) at each case it ran, its median TFLOP/s with the range
    over the repeats, its error (bf16 and FP8 output), and its speed ratio against each peer of the same
    interleaving (median [min–max] of the per-repeat ratios, clock-matched median)."""
    mine = [r for r in checked_rows(rows) if str(r.get("impl", "")).startswith("plugin:")]
    return _kernel_lines(mine, "## Your kernels (same run, interleaved with the peers)", lambda r: r["impl"][7:])


def cute_lines(rows) -> list[str]:
    """'Our CuTe DSL kernel': each recipe of :data:`CUTE_IMPL` at each case it ran, as :func:`plugin_lines` shows a
    user's kernel, its TFLOP/s and ratios with V's transpose included (as for our Triton kernel)."""
    mine = [r for r in checked_rows(rows) if r.get("impl") == CUTE_IMPL]
    return _kernel_lines(mine, "## Our CuTe DSL kernel (same run, interleaved with the peers; V's transpose "
                         "included)", lambda r: r["recipe"])


# the columns of the bench table's every-row section, here and in the report's speed section
ROW_HEADER = ("input", "shape", "s", "causal", "impl", "recipe", "TFLOP/s", "range", "ms", "repeats", "V^T ms", "incl.",
              "err", "err FP8 out", "SM MHz", "rotation ms (FWHT / matmul)")


def row_cells(r: dict) -> list[str]:
    """One bench row as the cells of :data:`ROW_HEADER` (a failed row: its error, then empty cells). KeyError for a
    row without the fields every bench row has (input, h, h_kv, d_qk, d_v, s, causal, impl, recipe)."""
    head = [str(r["input"]), f"h{r['h']}/{r['h_kv']} d{r['d_qk']}/{r['d_v']}", str(r["s"]), str(r["causal"]),
            str(r["impl"]), str(r["recipe"])]
    if "error" in r:
        return [*head, f"failed: {str(r['error'])[:120]}", *[""] * (len(ROW_HEADER) - len(head) - 1)]
    lo, hi = r.get("ms_max"), r.get("ms_min")
    rng = "-"
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo > 0 and hi > 0:
        rng = f"{r['tflops'] * r['ms'] / lo:.0f}–{r['tflops'] * r['ms'] / hi:.0f}"
    clk = _num(r.get("sm_clock_mhz"), ".0f")
    if isinstance(r.get("sm_clock_min_mhz"), (int, float)):
        clk += f" [{_num(r.get('sm_clock_min_mhz'), '.0f')}–{_num(r.get('sm_clock_max_mhz'), '.0f')}]"
    rotation = (f"{_num(r.get('rotation_ms'), '.3f')} / {_num(r.get('rotation_matmul_ms'), '.3f')}"
                if r.get("rotation_ms") is not None else "-")
    return [*head, _num(r.get("tflops"), ".0f"), rng, _num(r.get("ms"), ".3f"), str(r.get("repeats", 1)),
            _num(r.get("v_transpose_ms"), ".3f"), _num(r.get("tflops_incl_transpose"), ".0f"),
            _num(r.get("rel_l2_vs_sdpa_bf16"), ".4f"), _num(r.get("rel_l2_fp8_out_vs_sdpa_bf16"), ".4f"), clk,
            rotation]


def to_markdown(meta, rows, ours="zyfa-hopper"):
    rows = checked_rows(rows)
    # every string of the file as inert Markdown (zyfa.markdown): names and notes add no column, row or heading
    meta = {k: md_escape(v) if isinstance(v, str) else v for k, v in meta.items()}
    rows = [{k: md_escape(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]
    ours = md_escape(ours)
    repeats = meta.get("repeats")
    method = (f"every implementation of a case timed once per repeat in rotating order, {repeats} repeats; a "
              "row's TFLOP/s is the median over the repeats with their range beside it, and a speed ratio is taken "
              "within each repeat, then summarised as median [min–max]" if repeats else
              "one timing per implementation, in a fixed order (a file from before the interleaved bench)")
    lines = [f"# Benchmark: FP8 attention on {meta['device']}", "",
             f"- command: `{meta['command']}`", f"- date: {meta['date']}", f"- git commit: {meta['git_commit']}",
             f"- versions: {md_escape(json.dumps(meta['versions']))}",
             f"- inputs: {meta['inputs_note']}",
             f"- method: {method}. Each sample is a triton.testing.do_bench median (CUDA events, L2 flushed). "
             "TFLOP/s = FLOPs / time; FLOPs = 4·b·h·s²·d (2·(d_qk+d_v) for MLA), halved for causal. Our kernel's "
             "'ms' and 'TFLOP/s' exclude V's one-off transpose (column 'V^T ms'); 'incl.' includes it, and the "
             "summary tables use 'incl.'. SM clock: NVML, read every 5 ms during each sample; the clock-matched ratio "
             "compares cycles (time × clock) and is what the ratio would be at one fixed clock if time scales with it. "
             "No power column: NVML's power reading averages over about a second, longer than a sample.",
             "- err = relative L2 of the output vs PyTorch SDPA bf16 on the same (bf16) inputs: a sanity check, not "
             "the accuracy study. cuDNN FP8 writes FP8 on Hopper, so our kernel's error is also given with its output "
             "rounded to FP8 the same way ('err FP8 out': one scale 448/amax); compare like with like.", ""]
    summary = summary_lines(rows, ours)  # ends with "", "## Every row", ""
    lines += (cute_lines(rows) + plugin_lines(rows) + summary[:-2] + plane_lines(rows)
              + plane_lines(rows, "flashinfer-fa3") + summary[-2:])
    lines += ["| " + " | ".join(ROW_HEADER) + " |", "|" + "---|" * len(ROW_HEADER)]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _plausible(r: dict) -> bool:
    err = r.get("rel_l2_vs_sdpa_bf16")
    return err is None or err <= WRONG_OUTPUT_REL_L2


def headline_tflops(r: dict) -> float:
    """A row's TFLOP/s as the summaries count it: our kernel's with V's transpose included where it was timed
    (``tflops_incl_transpose``: a user with V as stored pays it), a peer's as timed."""
    incl = r.get("tflops_incl_transpose")
    return float(incl) if r.get("impl") in (OURS_IMPL, CUTE_IMPL) and isinstance(incl, (int, float)) \
        else float(r["tflops"])


def _longest_gaussian(rows):
    """{(d_qk, d_v, causal): rows at that shape's longest Gaussian sequence} over the rows that ran."""
    ok = [r for r in rows if "error" not in r and r.get("tflops")]
    by = {}
    for r in ok:
        by.setdefault((r["d_qk"], r["d_v"], r["causal"]), []).append(r)
    out = {}
    for key, rs in sorted(by.items(), key=lambda kv: (kv[0][0] == 192, kv[0][0], kv[0][2])):
        gs = [r for r in rs if r["input"] == "gaussian"]
        if gs:
            s = max(r["s"] for r in gs)
            out[key] = (s, [r for r in gs if r["s"] == s], rs)
    return out


# the peers our configurations are set against on the speed–accuracy plane
PLANE_PEERS = ("cudnn-fp8", "flashinfer-fa3")


def plane_lines(rows, peer="cudnn-fp8"):
    """'Against <peer> on the speed–accuracy plane': at each shape's longest Gaussian sequence, the peer's speed and
    error (rel-L2 against SDPA BF16 on the same inputs) and every configuration of our kernel that is both faster
    (V's transpose included) and more accurate, fastest first; where none is, the fastest of the more accurate ones.
    Empty without a row of that peer. ``peer``: one of :data:`PLANE_PEERS`."""
    name = PEER_NAMES[peer]
    rows = checked_rows(rows)
    # cuDNN FP8 writes FP8: set against our error with the output rounded the same way, where the row has it
    err_key = "rel_l2_fp8_out_vs_sdpa_bf16" if peer == "cudnn-fp8" else "rel_l2_vs_sdpa_bf16"

    def ours_err(r):
        v = r.get(err_key)
        return v if isinstance(v, (int, float)) else r.get("rel_l2_vs_sdpa_bf16")

    out = []
    for (d_qk, d_v, causal), (s, at, _rs) in _longest_gaussian(rows).items():
        fp8 = [r for r in at if r["impl"] == peer and _plausible(r)
               and isinstance(r.get("rel_l2_vs_sdpa_bf16"), (int, float))]
        ours = [r for r in at if ours_label(r) and _plausible(r) and isinstance(ours_err(r), (int, float))]
        if not fp8 or not ours:
            continue
        ref = max(fp8, key=lambda r: r["tflops"])
        t_ref, e_ref = ref["tflops"], ref["rel_l2_vs_sdpa_bf16"]
        better = sorted((r for r in ours if ours_err(r) < e_ref), key=headline_tflops, reverse=True)
        both = [r for r in better if headline_tflops(r) > t_ref]

        def cell(r, t_ref=t_ref):
            return (f"{ours_label(r)} ({headline_tflops(r):.0f}, {ours_err(r):.4f}, "
                    f"{headline_tflops(r) / t_ref:.2f}×)")

        found = "; ".join(cell(r) for r in both) if both else \
            ("none; fastest more accurate: " + cell(better[0]) if better else "none more accurate")
        shape = "MLA 192/128" if d_qk != d_v else f"hd{d_qk}"
        out.append(f"| {shape} | {s} | {'causal' if causal else 'non-causal'} | {t_ref:.0f} | {e_ref:.4f} | "
                   f"{found} |")
    if not out:
        return []
    with_fp8 = any(isinstance(r.get("rel_l2_fp8_out_vs_sdpa_bf16"), (int, float)) for r in rows)
    own = ("both with FP8 output: ours rounded to FP8 as cuDNN writes it" if peer == "cudnn-fp8" and with_fp8
           else "cuDNN FP8's includes its FP8 output, ours is bf16: not like for like" if peer == "cudnn-fp8"
           else "both write bf16")
    return [f"## Against {name} on the speed–accuracy plane (same inputs, same run)", "",
            f"Our configurations that are both faster than {name} (TFLOP/s with V's transpose) and more accurate "
            f"(rel-L2 against SDPA BF16 on the same Gaussian inputs; {own}), fastest first, as recipe (TFLOP/s, "
            f"error, × {name}).", "",
            f"| shape | s | mask | {name} TFLOP/s | {name} error | faster and more accurate |",
            "|" + "---|" * 6, *out, ""]


def summary_lines(rows, ours="zyfa-hopper"):
    """'Where we land': at each shape's longest Gaussian sequence, ``ours`` against the peers of the same run,
    and its captured/Gaussian throughput ratio (the capture tiled to that length against Gaussian inputs of the
    capture's shape) where both were timed. Our kernel's speeds include V's transpose where it was timed
    (:func:`headline_tflops`). A row whose output is wrong (rel-L2 against SDPA BF16 above
    :data:`WRONG_OUTPUT_REL_L2`) is shown as such, never as a speed."""
    rows = checked_rows(rows)
    out = []
    for (d_qk, d_v, causal), (s, at, rs) in _longest_gaussian(rows).items():

        def best(pred, at=at):
            c = [r for r in at if pred(r) and _plausible(r)]
            return max(c, key=headline_tflops) if c else None

        def wrong(pred, at=at):
            c = [r["rel_l2_vs_sdpa_bf16"] for r in at if pred(r) and not _plausible(r)]
            return f"wrong output (rel-L2 {max(c):.2f})" if c else "-"

        mine = best(lambda r: r["impl"] == "triton-fp8" and r["recipe"] == ours)
        if mine is None:
            continue
        top = best(ours_label)  # either of our kernels
        peers = {"cudnn": lambda r: r["impl"] == "sdpa-bf16:cudnn", "bf16": lambda r: r["impl"].startswith("sdpa-"),
                 "fp8": lambda r: r["impl"] == "cudnn-fp8", "fa3": lambda r: r["impl"] == "flashinfer-fa3",
                 "amd": lambda r: r["impl"] == "flash-attn-triton-amd"}
        cudnn, bf16, fp8, fa3, amd = (best(peers[k]) for k in ("cudnn", "bf16", "fp8", "fa3", "amd"))
        same = [r for r in rs if r["s"] == s and r["impl"] == "triton-fp8" and r["recipe"] == ours]
        cap = [r for r in same if r["input"].startswith("captured")]
        like = [r for r in same if r["input"] == "gaussian-like-capture"]

        def t(r, peer=None, peers=peers):
            return f"{headline_tflops(r):.0f}" if r else (wrong(peers[peer]) if peer else "-")

        ratios = [(ratio_cell(mine, p["impl"]) if mine.get("vs") else f"{headline_tflops(mine) / p['tflops']:.2f}")
                  if p else "-" for p in (cudnn, bf16, fp8, fa3, amd)]
        ratios.append(f"{cap[0]['tflops'] / like[0]['tflops']:.2f}" if cap and like else "-")
        shape = "MLA 192/128" if d_qk != d_v else f"hd{d_qk}"
        out.append(f"| {shape} | {s} | {'causal' if causal else 'non-causal'} | {t(mine)} | "
                   f"{t(top)} ({ours_label(top)}) | {t(cudnn, 'cudnn')} | {t(bf16, 'bf16')} "
                   f"({bf16['impl'].rpartition(':')[2] if bf16 else '-'}) | {t(fp8, 'fp8')} | {t(fa3, 'fa3')} | "
                   f"{t(amd, 'amd')} | "
                   + " | ".join(ratios) + " |")
    if not out:
        return []
    return ["## Where we land (TFLOP/s at each shape's longest Gaussian sequence, same run)", "",
            "Our kernel's numbers include V's transpose (the one copy a caller with V as stored pays; 'incl.' "
            "below); the peers read V as stored. Ratios: median [min–max] over the repeats, each taken within one "
            "repeat, with the clock-matched median after it.", "",
            f"| shape | s | mask | {ours} | fastest of our recipes | cuDNN BF16 | best BF16 SDPA | cuDNN FP8 | "
            "FA3 FP8 (FlashInfer) | AMD Triton FP8 | × cuDNN BF16 | × best BF16 | × cuDNN FP8 | × FA3 FP8 | "
            "× AMD Triton FP8 | captured / Gaussian |",
            "|" + "---|" * 16, *out, "", "## Every row", ""]


# Row fields that count something (heads, tokens, dims): positive integers; and measured numbers: finite, >= 0
# (the error against SDPA may be NaN: a NaN output).
_BENCH_COUNTS = ("b", "h", "h_kv", "s", "d_qk", "d_v")
_BENCH_NUMBERS = ("ms", "tflops", "v_transpose_ms", "tflops_incl_transpose", "rel_l2_vs_sdpa_bf16", "sm_clock_mhz",
                  "power_w", "rotation_ms", "rotation_matmul_ms", "ms_min", "ms_max", "v_transpose_ms",
                  "rel_l2_fp8_out_vs_sdpa_bf16")


def _check_bench_row(r: dict, where: str) -> None:
    """ValueError naming the row and field for a count that is not a positive integer (a NaN or negative head
    count) or a measured number that is not finite and >= 0."""
    for k in _BENCH_COUNTS:
        v = r.get(k)
        if k in r and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{where}: {k!r} must be a positive integer, got {v!r}; the Markdown was left as it was")
    for k in _BENCH_NUMBERS:
        v = r.get(k)
        if k == "rel_l2_vs_sdpa_bf16" and isinstance(v, float) and math.isnan(v):
            continue  # a NaN output: shown as a wrong output, not a speed
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                  and v >= 0):
            raise ValueError(f"{where}: {k!r} must be a finite number >= 0, got {v!r}; the Markdown was left as it "
                             "was")


def render(path: str, ours: str = "zyfa-hopper") -> str:
    """Rewrite ``<stem>.md`` from ``<stem>.json`` (no GPU); returns the Markdown path.

    The Markdown is rendered to a string first and then replaces the old file atomically, so a file that
    cannot be rendered (missing, not JSON, not a bench file, a row or meta field missing) leaves the old
    Markdown as it was; the error (ValueError / FileNotFoundError) names the file and the problem."""
    if not path.endswith(".json") or not os.path.isfile(path):
        raise FileNotFoundError(f"--render takes a .json written by zyfa bench; {path!r} is not one")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file") from None
    except RecursionError:
        raise ValueError(f"{path}: not a zyfa bench file (nested too deeply to read)") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise ValueError(f"{path}: not JSON ({str(e).split(';')[0]})") from None
    if not isinstance(data, dict) or "meta" not in data or "rows" not in data:
        raise ValueError(f"{path}: not a zyfa bench file (expected 'meta' and 'rows')")
    if not isinstance(data["meta"], dict) or not isinstance(data["rows"], list) \
            or not all(isinstance(r, dict) for r in data["rows"]):
        raise ValueError(f"{path}: not a zyfa bench file ('meta' must be an object, 'rows' a list of objects)")
    for i, r in enumerate(data["rows"]):
        _check_bench_row(r, f"{path}: rows[{i}]")
    try:
        checked_rows(data["rows"])
    except ValueError as e:  # a file in an older form: its own line, before the Markdown is touched
        raise ValueError(f"{path}: {e}") from None
    try:
        text = to_markdown(data["meta"], data["rows"], ours)
    except KeyError as e:
        raise ValueError(f"{path}: not a complete zyfa bench file (no {e.args[0]!r} field); "
                         "the Markdown was left as it was") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: a field has the wrong type ({e}); the Markdown was left as it was") from None
    md = path[: -len(".json")] + ".md"
    atomic_write_text(md, text)
    return md
