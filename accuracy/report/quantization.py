"""Which quantization should an FP8 attention use (issue 14): the report's quantization section and its closing
recommendation table, both computed from rows.

:func:`quantization_section` compares the quantization schemes (:data:`zyfa.recipes.QUANT_SCHEMES`: ``zyfa``, per
tensor, and ``zyfa`` with other quantizations of Q, K and V; its P handling, accumulator and output unchanged, so
that against ``zyfa`` only the quantization differs) on the capture inputs of the accuracy rows: the error against
the FP64 oracle on the original inputs (``orig_rel_l2``, which includes what quantizing Q, K and V loses), per
model, with bootstrap 95% intervals, and each scheme's paired ratio to ``zyfa``. Where the rows carry per-head
errors (``orig_rel_l2_heads``, which ``zyfa study`` adds for these recipes) the samples are the captured (layer,
query head) pairs, else the inputs. Peers that quantize more finely (:data:`REFERENCES`) follow, marked: they differ
from ``zyfa`` in more than the quantization.

:func:`recommendation_section` closes the report: scheme -> operator error -> model KL (``zyfa impact`` rows) ->
kernel cost (``zyfa bench`` rows). A scheme with no impact rows or no benchmark row says so, with the command that
would measure it; no number is filled in that no file holds.

Both are ``add(doc, plots)`` callables for :func:`accuracy.report.build.build_report`, and both add nothing when the
rows hold no scheme but ``zyfa`` (an older study, or ``--quick``).

Exposed: ``REFERENCES``, ``scheme_samples``, ``scheme_table``, ``quantization_section``, ``recommendation_rows``,
``recommendation_section``.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Sequence

from zyfa.accuracy.report.blocks import fmt, fmt_ci
from zyfa.accuracy.report.document import Doc
from zyfa.accuracy.report.results import group_of, input_key
from zyfa.accuracy.report.stats import mean_ci

from zyfa.recipes import QUANT_SCHEMES, RECIPES

__all__ = ["REFERENCES", "quantization_section", "recommendation_rows", "recommendation_section", "scheme_samples",
           "scheme_table"]

BASELINE = QUANT_SCHEMES[0]  # zyfa: per-tensor e4m3fn Q, K and V
# Peers with finer quantization of Q/K (and V), shown after the schemes for comparison (their P handling,
# accumulator and output differ from zyfa's too).
REFERENCES = ("ck-blockscale", "sage2")
# The kernel the benchmark runs with per-tensor descales and zyfa's numerics (on the H200).
PER_TENSOR_KERNEL = "zyfa-hopper"
_HOPPER = "accumulator=matrix_unit,accum_flush_tiles=1"  # zyfa-hopper's accumulation, as a recipe override


def _what(name: str) -> str:
    """How a recipe quantizes Q, K and V, from its fields (never a hand-written label)."""
    r = RECIPES.get(name)
    if r is None:
        return "-"
    fmts = r.q_format if r.q_format == r.k_format == r.v_format else f"{r.q_format}/{r.k_format}/{r.v_format}"

    def gran(g: str, block: int) -> str:
        return f"block {block}" if g == "block" else g

    parts = [f"{fmts}; descales Q {gran(r.q_scale, r.scale_block_q)}, K {gran(r.k_scale, r.scale_block_kv)}, "
             f"V {gran(r.v_scale, r.scale_block_kv)}"]
    if r.k_smoothing:
        parts.append("K smoothed")
    if r.qk_rotation != "none":
        parts.append(f"Q, K rotated ({r.qk_rotation.replace('_', ' ')})")
    return "; ".join(parts)


def _schemes_in(names: Sequence[str]) -> list[str]:
    """The schemes and references among ``names``, in :data:`QUANT_SCHEMES` then :data:`REFERENCES` order."""
    have = set(names)
    return [n for n in (*QUANT_SCHEMES, *REFERENCES) if n in have]


def scheme_samples(rows: Sequence[dict], recipe: str) -> tuple[dict, str]:
    """{sample key: orig rel L2} of one recipe's rows and the sample unit: ``head`` ((input, query head) pairs)
    when every row carries ``orig_rel_l2_heads``, else ``input``."""
    mine = [r for r in rows if r["recipe"] == recipe and not r.get("real")]
    if mine and all(isinstance(r.get("orig_rel_l2_heads"), list) for r in mine):
        out = {}
        for r in mine:
            heads = r.get("input_q_heads") if isinstance(r.get("input_q_heads"), list) else \
                list(range(len(r["orig_rel_l2_heads"])))
            for h, v in zip(heads, r["orig_rel_l2_heads"], strict=False):
                out[(*input_key(r), h)] = float(v)
        return out, "head"
    return {input_key(r): float(r["orig_rel_l2"]) for r in mine if r.get("orig_rel_l2") is not None}, "input"


def _paired(a: dict, b: dict) -> list[float]:
    """a / b on the keys both have (b > 0)."""
    return [a[k] / b[k] for k in a if k in b and b[k] > 0 and math.isfinite(a[k])]


def _samples_paired(rows: Sequence[dict], name: str) -> tuple[dict, dict, str]:
    """(scheme samples, baseline samples, unit), on one unit for both: per head only when both have heads."""
    s, su = scheme_samples(rows, name)
    z, zu = scheme_samples(rows, BASELINE)
    if su != zu:  # one has per-head errors, the other not: compare per input
        keep = [r for r in rows if r["recipe"] in (name, BASELINE)]
        stripped = [{k: v for k, v in r.items() if k != "orig_rel_l2_heads"} for r in keep]
        s, _ = scheme_samples(stripped, name)
        z, _ = scheme_samples(stripped, BASELINE)
        su = "input"
    return s, z, su


def scheme_table(rows: Sequence[dict]) -> tuple[list[str], list[list[str]], dict]:
    """(header, body, details) of the scheme x model table from the capture rows; ``details`` maps
    (scheme, model) -> {"err": CI, "ratio": CI or None, "n": samples, "unit": ...} and (scheme, "all") -> the
    pooled ratio."""
    caps = [r for r in rows if r.get("input_source") == "capture" and not r.get("real")]
    models = sorted({group_of(r) for r in caps})
    names = _schemes_in([r["recipe"] for r in caps])
    header = ["scheme", "quantization of Q, K, V"]
    for m in models:
        header += [f"{m}: rel L2 (orig)", f"{m}: / {BASELINE}"]
    header.append(f"all captures: / {BASELINE}")
    body, details = [], {}
    for name in names:
        cells = [name if name in QUANT_SCHEMES else f"{name} (peer)", _what(name)]
        pooled: list[float] = []
        for m in models:
            grows = [r for r in caps if group_of(r) == m]
            s, z, unit = _samples_paired(grows, name)
            if not s:
                cells += ["-", "-"]
                continue
            err = mean_ci(list(s.values()))
            ratios = _paired(s, z) if name != BASELINE else []
            ratio = mean_ci(ratios, log=True) if ratios else None
            pooled += ratios
            details[(name, m)] = {"err": err, "ratio": ratio, "n": len(s), "unit": unit}
            cells += [fmt_ci(err, "err"), "1" if name == BASELINE else (fmt_ci(ratio, "ratio") if ratio else "-")]
        allr = mean_ci(pooled, log=True) if pooled else None
        details[(name, "all")] = {"ratio": allr, "n": len(pooled)}
        cells.append("1" if name == BASELINE else (fmt_ci(allr, "ratio") if allr else "-"))
        body.append(cells)
    return header, body, details


def _has_schemes(names: Sequence[str]) -> bool:
    return any(n in QUANT_SCHEMES[1:] for n in names)


def quantization_section(rows: Sequence[dict]) -> Callable[[Doc, bool], None]:
    """The section comparing the quantization schemes on the capture inputs (nothing without a scheme's rows)."""

    def add(doc: Doc, plots: bool) -> None:
        caps = [r for r in rows if r.get("input_source") == "capture" and not r.get("real")]
        if BASELINE not in {r["recipe"] for r in caps} or not _has_schemes([r["recipe"] for r in caps]):
            return
        header, body, details = scheme_table(caps)
        units = {d["unit"] for k, d in details.items() if k[1] != "all"}
        unit = ("captured (layer, query head) pairs" if units == {"head"} else "inputs (layers)" if units == {"input"}
                else "captured (layer, query head) pairs where the rows have per-head errors, else inputs (layers)")
        per_input = sorted({n for (n, m), d in details.items() if m != "all" and d["unit"] == "input"})
        counts = {m: d["n"] for (n, m), d in details.items() if n == BASELINE and m != "all"}
        doc.h(2, "Quantization of Q, K and V")
        doc.p(f"Each scheme is `{BASELINE}` with another quantization of Q, K and V: its P handling, row sums, "
              "accumulator and output are unchanged, so against `zyfa` (one descale per tensor) only the "
              "quantization differs. Error: relative L2 against the FP64 oracle on the original inputs "
              "(`orig`, which includes what quantizing Q, K and V loses), mean over the "
              f"{unit} of each model's captures (`{BASELINE}`: {', '.join(f'{m} {n}' for m, n in counts.items())})"
              + (f"; per input for {', '.join(f'`{n}`' for n in per_input)}, whose rows have no per-head errors"
                 if per_input and units != {"input"} else "")
              + f", with a bootstrap 95% CI; `/ {BASELINE}`: per sample the scheme's error over `{BASELINE}`'s on the "
              "same sample, geometric mean with a bootstrap 95% CI on the log ratios (below 1: the scheme is more "
              "accurate). Samples of one layer share its quantization scales, so the intervals are optimistic. "
              "Rows marked (peer) are other kernels' recipes that quantize more finely; they differ from "
              f"`{BASELINE}` in P handling and accumulation too. Sources of each scheme: `zyfa recipes NAME`; "
              "docs/QUANTIZATION.md.")
        doc.table("t-quant-schemes", header, body)

    return add


# ---------------------------------------------------------------------------------------------- recommendation

def _by_recipe(impact: dict | None) -> dict:
    """{(model, n_tokens, text): {recipe: entry}} of :func:`zyfa.accuracy.impact.section.summarize`'s result."""
    return {g: {e["recipe"]: e for e in entries} for g, entries in (impact or {}).items()}


def _bench_rows(bench: Sequence) -> list[dict]:
    """Every timed row of every benchmark file, tagged with its file's index (``_run``): times compare in one run."""
    return [{**r, "_run": i} for i, (_, _, rows) in enumerate(bench) for r in rows
            if isinstance(r, dict) and r.get("ms") is not None and not r.get("error")]


_SAME_INPUT = ("_run", "input", "s", "causal", "d_qk", "d_v", "h", "h_kv", "b")


def _per_tensor_ratio(r: dict, bench_rows: list[dict]) -> str:
    """' = N× zyfa-hopper, same run' against the per-tensor kernel's row of the same run and input, or ''."""
    if _spec_base(r.get("recipe") or "") == PER_TENSOR_KERNEL:
        return ""
    ref = [x for x in bench_rows if _spec_base(x.get("recipe") or "") == PER_TENSOR_KERNEL
           and x.get("impl") == r.get("impl") and all(x.get(k) == r.get(k) for k in _SAME_INPUT)]
    if not ref or not ref[0]["ms"]:
        return ""
    return f" = {float(r['ms']) / float(ref[0]['ms']):.3f}× {PER_TENSOR_KERNEL}, same run"


def _spec_base(spec: str) -> str:
    return str(spec).split(":")[0].split("@")[0].strip()


def _kernel_cost(name: str, bench_rows: list[dict]) -> str:
    """The benchmark's kernel times of ``name`` (any spec of it: ``name@h200``, ``name:field=value``; its rows at
    head dim 128 when there are any) with the rotation's own time where the row has it and the ratio to the
    per-tensor kernel on the same input in the same run where that run has it, or 'not measured'."""
    mine = [r for r in bench_rows if _spec_base(r.get("recipe") or "") == name]
    if not mine:
        return "not measured"
    d128 = [r for r in mine if r.get("d_qk") == 128] or mine
    parts = []
    for r in d128[:4]:
        causal = "causal" if r.get("causal") else "full"
        rot = (f"; rotation of Q and K {fmt(float(r['rotation_ms']), 'num')} ms on its own"
               if isinstance(r.get("rotation_ms"), (int, float)) else "")
        parts.append(f"{fmt(float(r['ms']), 'num')} ms ({r.get('impl')}, {r.get('recipe')}, s {r.get('s')}, "
                     f"d {r.get('d_qk')}, {causal}{rot}){_per_tensor_ratio(r, bench_rows)}")
    return "; ".join(parts)


def recommendation_rows(acc_rows: Sequence[dict], impact: dict | None, bench: Sequence = ()) -> dict:
    """The recommendation table's content: {"header", "body", "kl_groups", "unmeasured_kl", "unbenched",
    "per_tensor_kernel"}. ``impact``: :func:`zyfa.accuracy.impact.section.summarize` of the prepared impact rows (the
    caller summarizes them: this module does not import the impact package); ``bench``:
    :func:`zyfa.accuracy.report.speed.load_bench`."""
    caps = [r for r in acc_rows if r.get("input_source") == "capture" and not r.get("real")]
    _, _, details = scheme_table(caps) if caps else ([], [], {})
    impact = _by_recipe(impact)
    groups = sorted(impact)
    brows = _bench_rows(bench)
    names = _schemes_in([*(r["recipe"] for r in caps), *QUANT_SCHEMES,
                         *(rc for g in groups for rc in impact[g])])
    header = ["scheme", f"operator error / {BASELINE} (orig, all captures)"]
    header += [f"KL {g[0]} ({g[1]} tokens of {g[2]})" for g in groups]
    header.append("kernel cost")
    body, unmeasured, unbenched = [], [], []
    for name in names:
        d = details.get((name, "all"))
        if name == BASELINE and any(k[0] == BASELINE for k in details):
            op = "1"
        elif d and d["ratio"] is not None:
            op = fmt_ci(d["ratio"], "ratio")
        else:
            op = "not in these results"
        cells = [name if name in QUANT_SCHEMES else f"{name} (peer)", op]
        missing = False
        for g in groups:
            e, z = impact[g].get(name), impact[g].get(BASELINE)
            if e is None:
                cells.append("not measured")
                missing = True
                continue
            kl = e["kl"]
            cell = f"{fmt_ci((kl.estimate, kl.low, kl.high), 'err')}, {len(e['windows'])} windows"
            if z is not None and name != BASELINE and kl.estimate > 0:
                cell += f"; {BASELINE}/scheme {fmt(z['kl'].estimate / kl.estimate, 'ratio')}"
            cells.append(cell)
        if missing or not groups:
            unmeasured.append(name)
        cost = _kernel_cost(name, brows)
        if cost == "not measured" and name == BASELINE and _kernel_cost(PER_TENSOR_KERNEL, brows) != cost:
            # zyfa's numerics with Hopper accumulation: the per-tensor kernel the benchmark runs
            cost = f"as `{PER_TENSOR_KERNEL}`: {_kernel_cost(PER_TENSOR_KERNEL, brows)}"
        if cost == "not measured":
            unbenched.append(name)
        cells.append(cost)
        body.append(cells)
    return {"header": header, "body": body, "kl_groups": groups, "unmeasured_kl": unmeasured,
            "unbenched": unbenched, "per_tensor_kernel": _kernel_cost(PER_TENSOR_KERNEL, brows)}


def _impact_command(groups: list, impact: dict, names: list[str]) -> str:
    """The ``zyfa impact`` command that would measure ``names`` as the committed rows measured zyfa."""
    models = ",".join(dict.fromkeys(g[0] for g in groups)) or "smollm2,gemma3,qwen25coder"
    n_tokens = {g[1] for g in groups}
    texts = {g[2] for g in groups}
    windows = max((len(impact[g][BASELINE]["windows"]) for g in groups if BASELINE in impact[g]), default=3)
    parts = ["zyfa", "impact", "--models", models, "--recipes", ",".join(names),
             "--tokens", str(n_tokens.pop() if len(n_tokens) == 1 else 2048),
             "--windows", str(max(windows, 3)), "--text", texts.pop() if len(texts) == 1 else "lee",
             "--out", "reports/impact/results_quantization.jsonl"]
    return shlex.join(parts)


def recommendation_section(acc_rows: Sequence[dict], impact: dict | None,
                           bench: Sequence = ()) -> Callable[[Doc, bool], None]:
    """The closing recommendation table (nothing when neither the accuracy nor the impact rows hold a scheme);
    arguments as :func:`recommendation_rows`."""

    def add(doc: Doc, plots: bool) -> None:
        names = {r["recipe"] for r in acc_rows} | {e["recipe"] for es in (impact or {}).values() for e in es}
        if not _has_schemes(list(names)):
            return
        rec = recommendation_rows(acc_rows, impact, bench)
        by = _by_recipe(impact)
        doc.h(2, "Recommendation: quantization, error, model, cost")
        doc.p("Each quantization scheme from operator to model to kernel. Operator error: the geometric mean of "
              f"the scheme's error over `{BASELINE}`'s on the same captured samples, against the FP64 oracle on the "
              "original inputs, with its bootstrap 95% CI (the [quantization section](#t-quant-schemes) has it "
              "per model). KL: mean next-token KL(stock ‖ scheme) in nats/token over the held-out windows of "
              "`zyfa impact`, with its bootstrap 95% CI over windows, and "
              f"`{BASELINE}`'s KL over the scheme's (above 1: the scheme disturbs the model less). Kernel cost: "
              "the benchmark's median kernel time of the scheme's recipe, as `zyfa bench` recorded it.")
        doc.table("t-quant-recommend", rec["header"], rec["body"])
        notes = []
        if rec["unmeasured_kl"]:
            cmd = _impact_command(rec["kl_groups"], by, [n for n in rec["unmeasured_kl"] if n in RECIPES])
            notes.append(f"Model KL not measured for {', '.join(f'`{n}`' for n in rec['unmeasured_kl'])}: "
                         f"`{cmd}` measures them (CPU, hours on 2 cores; append the file to `--impact`).")
        if rec["unbenched"]:
            ours = [n for n in rec["unbenched"] if n in QUANT_SCHEMES]
            peers = [n for n in rec["unbenched"] if n not in QUANT_SCHEMES]
            notes.append("Kernel cost not measured (no row of the benchmark file runs the recipe)"
                         + (f" for {', '.join(f'`{n}`' for n in ours)}: `zyfa bench --recipes "
                            f"'{';'.join(f'{n}:{_HOPPER}' for n in ours)}'` on a GPU times them in our Triton kernel "
                            f"with `{PER_TENSOR_KERNEL}`'s accumulation (so that they compare with it), and the "
                            "rotation of Q and K on its own" if ours else "")
                         + (f"{';' if ours else ''} for the peers {', '.join(f'`{n}`' for n in peers)}: their own "
                            "kernels are not in the benchmark" if peers else "") + ".")
        if rec["per_tensor_kernel"] != "not measured":
            notes.append(f"`{BASELINE}`'s kernel cost is that of `{PER_TENSOR_KERNEL}`, zyfa's numerics with the "
                         "sums kept in the H200's FP8 accumulator (flushed into fp32 every KV tile), the per-tensor "
                         "kernel the benchmark runs.")
        for n in notes:
            doc.p(n)

    return add
