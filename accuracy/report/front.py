"""The report's front page: one screen that answers "which implementations can I trust?", "how accurate is each?"
and "how fast?", every number with where it came from.

Computed from the result rows and the benchmark rows:

* the first table, one row per implementation: its verdict (``ok``, ``suspect``, ``nonconforming``, ``failed``,
  ``not run``; :func:`accuracy.scoring.kernel_verdicts.implementation_verdicts`, the same verdicts the scoring commands
  print) with the reason in the same row, then its error, absolute, with its bootstrap 95% interval, on the captures and
  on the Gaussian inputs, its status (``zyfa.recipes.Recipe.status``: verified, from source, assumed, modelled; a
  real kernel's rows are "measured" on their device) and ``from``: the source of its numbers (:func:`source_label`:
  "this run (device)" for the files this command wrote, else the file with its commit and device, read from its
  provenance record). A failed or nonconforming implementation has no number anywhere on the page: its cells say
  its verdict and a short reason, and it has no point in the picture. An implementation is a row's
  ``implementation`` (a real kernel) or else its recipe (the emulator); ZYFA's ablations stay in the details.
  Under the table: the paragraph on deq and orig, its ratios computed from the table's printed numbers
  (:func:`front_prose`; errors in one format, :func:`number`), the whole reasons the cells had to cut, one line per
  recipe status and why (the recipes' ``status_note``), and the 4-bit weights of the captured models
  (:func:`quantized_weights`, from :data:`zyfa.capture.models.MODELS`);
* "where we land": :func:`zyfa.bench.table.summary_lines` of the benchmark file (the same table as its Markdown), with
  the GPU named and each row's source (:func:`bench_source`); a column only beside an implementation with error
  rows here, a ``× peer`` column (our kernel's speed over the peer's) only where our kernel's column is shown too,
  and our kernel named as "zyfa kernel (zyfa-hopper numerics)", never as the recipe or peer whose numerics it
  borrows;
* one picture of speed against accuracy: each implementation that has both a speed and an error is a point
  (TFLOP/s at the longest head-dim-128 non-causal Gaussian sequence of the benchmark, error on the captures),
  named by the kernel that was timed (:func:`timed_name`: ``triton:fa3`` is "zyfa kernel (fa3 numerics)",
  FlashInfer's FA3 is "fa3 (FlashInfer)"), with the Pareto frontier (no other point is both faster and more
  accurate).

Exposed: ``is_real(row)``, ``on_front_page(row)``, ``implementation_of(row)``, ``status_of(name, rows)``,
``source_label(file, provenance, this_run)``, ``sources_of(rows, provenances, this_run)``,
``error_table(rows, provenances, this_run)``, ``where_we_land(bench)``, ``speed_points(bench_rows)``,
``timed_name(key)``, ``pareto(points)``, ``number(v)``, ``ratio(v)``, ``front_prose(entries)``,
``bench_source(name, meta)``, ``quantized_weights(rows)``, ``section_front(doc, rows, bench, plots, ...)``,
``FRONT_KEYS``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
from zyfa.accuracy.io.results_io import run_provenances
from zyfa.accuracy.report.blocks import fmt_ci, slug
from zyfa.accuracy.report.document import Doc
from zyfa.accuracy.report.plots import png, pyplot
from zyfa.accuracy.report.real_kernels import measured_on
from zyfa.accuracy.scoring.kernel_verdicts import Verdict, implementation_verdicts, short_reason
from zyfa.capture.models import MODELS

from zyfa.bench.table import CUTE_IMPL, OURS_IMPL, checked_rows, headline_tflops, summary_lines
from zyfa.recipe_spec import get_recipe

# ZYFA's ablations: in the details, not on the front page
ABLATION_PREFIX = ("zyfa-exp2", "zyfa-fp32sum", "zyfa-noscale", "zyfa-pow2fixed", "zyfa-tilescale")
# the table keys of the front page (a test checks that the first section holds them)
FRONT_KEYS = ("t-front-error", "t-front-speed")
METRIC = "deq_rel_l2"  # the picture's error: what the implementation's arithmetic adds on its own inputs
# bench peers -> the study's name of the same numerics
BENCH_PEERS = {"cudnn-fp8": "cudnn-fp8", "sdpa-bf16:cudnn": "bf16", "sdpa-bf16:flash": "bf16"}
# the bench's names of our kernels -> the registry namespace their rows are named under (triton:RECIPE, cute:RECIPE)
OUR_BENCH_KERNELS = {OURS_IMPL: "triton", CUTE_IMPL: "cute"}
# real kernels shown on the front page (our kernel's default recipe, the real peers, and any user plug-in); every
# other real kernel (our kernel under each peer recipe and ablation) is in the "Real kernels" section
FRONT_REAL = ("triton:zyfa-hopper", "cudnn-fp8", "sdpa-bf16:cudnn", "flash-attn-triton-amd", "flashinfer-fa3")
PLUGIN_PREFIX = "plugin:"
REAL_SUFFIX = " (real)"  # a real kernel named like a recipe (cudnn-fp8) is told apart from its emulation
# the speed picture's keys (recipes) -> the real kernel that was timed for them, whose error is then plotted
REAL_OF_SPEED = {"cudnn-fp8": "cudnn-fp8" + REAL_SUFFIX}
# a timed peer -> the recipe that emulates it (its error where the real kernel did not run in this study)
EMULATION_OF_PEER = {"cudnn-fp8": "cudnn-fp8", "sdpa-bf16:cudnn": "bf16", "sdpa-bf16:flash": "bf16",
                     "flashinfer-fa3": "fa3", "flash-attn-triton-amd": "triton-amd"}


def is_real(row: dict) -> bool:
    """True for a real kernel's row (``real`` set, or an implementation other than its recipe)."""
    impl = row.get("implementation")
    return bool(row.get("real")) or bool(impl and impl != row.get("recipe"))


def implementation_of(row: dict) -> str:
    """A row's implementation: its ``implementation`` (a real kernel) when it has one, else its recipe; a real
    kernel named like a recipe gets the suffix `` (real)``."""
    name = str(row.get("implementation") or row.get("recipe"))
    if is_real(row) and name == row.get("recipe"):
        name += REAL_SUFFIX
    return name


def on_front_page(row: dict) -> bool:
    """Recipes (ablations aside), and the real kernels of FRONT_REAL and user plug-ins."""
    name = str(row.get("implementation") or row.get("recipe"))
    if is_real(row):
        return name in FRONT_REAL or name.startswith(PLUGIN_PREFIX)
    return not name.startswith(ABLATION_PREFIX)


def status_of(name: str, rows: Sequence[dict] = ()) -> str:
    """``verified``, ``from source``, ``assumed`` or ``modelled`` (the recipe's ``status``), ``measured on
    <device>`` for a real kernel's rows, or ``-`` when neither is known."""
    real = [r for r in rows if is_real(r) and implementation_of(r) == name]
    if real:
        devices = sorted({measured_on(r) for r in real})
        return "measured on " + ", ".join(devices)
    try:
        # lazy: inside its ImportError fallback
        from zyfa.recipe_spec import get_recipe

        return str(getattr(get_recipe(name), "status", None) or "-")
    except (ValueError, KeyError, ImportError):
        return "-"


def _ci(values):
    # lazy: imports torch, scipy; zyfa report reads results without torch
    from zyfa.accuracy.scoring.metrics import bootstrap_ci

    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    if not np.all(np.isfinite(x)):
        return (float(np.mean(x)),) * 3
    return tuple(bootstrap_ci(x))


def source_label(label: str, prov: dict | None, this_run: Sequence[str] = ()) -> str:
    """Where a result file's numbers come from: ``this run (<device>)`` for a file this command wrote (its label in
    ``this_run``), else ``<file> @ <commit>, <device>`` read from its provenance record. A resumed run's file names
    every segment's commit and device, oldest first, each pair once (``r.jsonl @ e578be6, H200 and d3c31b1,
    H100``)."""
    runs = run_provenances(prov) or [{}]

    def device(p: dict) -> str:
        return str(p.get("device_name") or (p.get("cuda_device") if p.get("device") == "cuda" else None)
                   or p.get("device") or "device unknown").removeprefix("NVIDIA ")

    if label in this_run:
        return f"this run ({', '.join(dict.fromkeys(device(p) for p in runs))})"

    def commit(p: dict) -> str:
        c = str(p.get("git_commit") or "")
        return c[:7] + ("+dirty" if p.get("git_dirty") else "") if c else "no commit"

    return f"{label} @ " + " and ".join(dict.fromkeys(f"{commit(p)}, {device(p)}" for p in runs))


def sources_of(rows: Sequence[dict], provenances: Sequence[tuple[str, dict]], this_run: Sequence[str]) -> str:
    """The source labels (:func:`source_label`) of ``rows``' files, each once; ``unknown source`` for rows whose
    file or run has no provenance record."""
    by_file = {label: prov for label, prov in provenances}
    out = []
    for r in rows:
        f = r.get("_file")
        label = "unknown source" if f is None or f not in by_file or r.get("_no_provenance") else \
            source_label(str(f), by_file[f], this_run)
        if label not in out:
            out.append(label)
    return "; ".join(out) or "unknown source"


def error_table(rows: Sequence[dict], provenances: Sequence[tuple[str, dict]] = (),
                this_run: Sequence[str] = ()) -> list[dict]:
    """One entry per implementation on the front page (:func:`on_front_page`), in the order of the rows (recipes
    first, then real kernels): name, status, verdict
    (:func:`zyfa.accuracy.scoring.kernel_verdicts.implementation_verdicts`
    of its rows), source (:func:`source_label` of its rows' files, ``provenances`` as (file label, record),
    ``this_run`` the labels this command wrote), and the (mean, low, high) of ``orig_rel_l2`` and ``deq_rel_l2``
    over the capture inputs and over the Gaussian inputs that ran (status ``ok`` or ``suspect``; NaN triples
    where there are none), and the input counts; ``self_quantizing``: a real kernel that quantizes for itself,
    whose error on a recipe's dequantized inputs is not what it computed with."""
    shown = [r for r in rows if on_front_page(r)]
    names = list(dict.fromkeys([*(implementation_of(r) for r in shown if not is_real(r)),
                                *(implementation_of(r) for r in shown if is_real(r))]))
    if "zyfa" in names:
        names.remove("zyfa")
        names.insert(0, "zyfa")
    verdicts = {v.name: v for v in implementation_verdicts(shown, implementation_of)}
    out = []
    for n in names:
        mine = [r for r in rows if implementation_of(r) == n]
        ran = [r for r in mine if str(r.get("status") or "ok") in ("ok", "suspect")]
        e = {"name": n, "status": status_of(n, mine), "recipe": str(mine[0].get("recipe")),
             "self_quantizing": is_real(mine[0]) and mine[0].get("quantizes") == "self",
             "verdict": verdicts[n], "source": sources_of(mine, provenances, this_run)}
        for src, pick in (("captures", lambda r: r.get("input_source") == "capture"),
                          ("gaussian", lambda r: r.get("input_source") != "capture")):
            sel = [r for r in ran if pick(r)]
            e[f"{src}_n"] = len(sel)
            for m in ("orig_rel_l2", "deq_rel_l2"):
                e[f"{src}_{m}"] = _ci([r.get(m) for r in sel])
        out.append(e)
    return out


def where_we_land(bench: Sequence[tuple[str, dict, list[dict]]]) -> tuple[str, dict, list[str], list[list[str]]]:
    """(file name, meta, header, body) of the "where we land" table of the first benchmark file that has one
    (:func:`zyfa.bench.table.summary_lines`, the table of the bench Markdown); ("", {}, [], []) when none has."""
    for name, meta, rows in bench:
        try:
            lines = summary_lines(rows)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue
        table = [ln for ln in lines if ln.startswith("|")]
        if len(table) < 3:
            continue
        cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in table]
        return name, meta, cells[0], cells[2:]
    return "", {}, [], []


def emulation_of_timed(name: str) -> str:
    """The emulated recipe whose numerics a timed kernel computes: ``triton:X`` or ``cute:X`` (ours) -> ``X``; a peer
    -> its recipe."""
    namespace, colon, recipe = name.partition(":")
    return recipe if colon and namespace in OUR_BENCH_KERNELS.values() else EMULATION_OF_PEER.get(name, name)


def speed_points(bench_rows: Sequence[dict]) -> tuple[dict[str, float], str]:
    """(name -> TFLOP/s, shape label) at the longest head-dim-128 non-causal Gaussian sequence of the run (else
    the longest head-dim-128 one, else any), each under the name of the real kernel that was timed (the
    implementation registry's): our kernels under recipe X as ``triton:X`` and ``cute:X`` (never as ``X``, the
    emulation whose numerics they borrow), every peer by its own name (``cudnn-fp8``, ``sdpa-bf16:cudnn``,
    ``flashinfer-fa3``, ...). Our kernels' speeds include V's transpose where it was timed (as in the bench summary).
    """
    ok = [r for r in checked_rows(bench_rows) if "error" not in r and isinstance(r.get("tflops"), (int, float))
          and r.get("input", "gaussian") == "gaussian"]
    for pick in (lambda r: r.get("d_qk") == 128 and r.get("d_v") == 128 and not r.get("causal"),
                 lambda r: r.get("d_qk") == 128 and r.get("d_v") == 128, lambda r: True):
        cand = [r for r in ok if pick(r)]
        if cand:
            break
    else:
        return {}, ""
    s = max(int(r.get("s") or 0) for r in cand)
    at = [r for r in cand if int(r.get("s") or 0) == s]
    ref = at[0]
    hd = f"hd{ref.get('d_qk')}" if ref.get("d_qk") == ref.get("d_v") else f"MLA {ref.get('d_qk')}/{ref.get('d_v')}"
    shape = f"{hd}, {'causal' if ref.get('causal') else 'non-causal'}, {s // 1024}K tokens" if s >= 1024 else \
        f"{hd}, {'causal' if ref.get('causal') else 'non-causal'}, {s} tokens"
    out: dict[str, float] = {}

    def put(key: str, v: float) -> None:
        if key and v > out.get(key, -math.inf):
            out[key] = v

    for r in at:  # every speed under the name of the real kernel that was timed, never under an emulation's name
        impl, recipe, v = str(r.get("impl") or ""), str(r.get("recipe") or ""), headline_tflops(r)
        if impl in OUR_BENCH_KERNELS:
            put(f"{OUR_BENCH_KERNELS[impl]}:{recipe}", v)
        else:
            put(impl, v)
    return out, shape


def pareto(points: dict[str, tuple[float, float]]) -> list[str]:
    """The names on the Pareto frontier of (speed, error) points: no other point is at least as fast and at
    least as accurate and better in one of the two. Sorted by speed."""
    front = []
    for n, (x, y) in points.items():
        if not (math.isfinite(x) and math.isfinite(y)):
            continue
        dominated = any((x2 >= x and y2 <= y) and (x2 > x or y2 < y) for m, (x2, y2) in points.items()
                        if m != n and math.isfinite(x2) and math.isfinite(y2))
        if not dominated:
            front.append(n)
    return sorted(front, key=lambda n: points[n][0])


def number(v: float) -> str:
    """The front page's one format for an error, in its tables and its prose: three significant digits and a
    one-digit exponent (``6.02e-3``), so that six columns fit the first screen."""
    return f"{v:.2e}".replace("e-0", "e-").replace("e+0", "e+")


def ratio(v: float) -> str:
    """The front page's one format for a ratio of two of its numbers: three significant digits and ``×``."""
    return f"{v:.3g}×"


VERDICT_REASON = 48  # the most characters of a reason in the verdict column (the whole one is below the table)
CELL_REASON = 32  # the most characters of a reason in an error cell (the verdict column has the longer one)


def _front_cell(e: dict, src: str, metric: str = "deq") -> str:
    """The error cell of one entry, source and metric (``deq`` or ``orig``): ``<verdict>: <short reason>`` for an
    implementation whose numbers are not measurements (failed, nonconforming, not run); ``-`` without inputs, and
    for the deq error of a kernel that quantizes for itself (it computed with its own FP8 values, not the
    recipe's)."""
    v: Verdict = e["verdict"]
    if not v.scored:
        return f"{v.verdict}: {short_reason(v.reason, CELL_REASON)}" if v.reason else v.verdict
    if not e[f"{src}_n"] or (metric == "deq" and e["self_quantizing"]):
        return "-"
    est, lo, hi = e[f"{src}_{metric}_rel_l2"]
    if not all(math.isfinite(x) for x in (est, lo, hi)):
        return fmt_ci((est, lo, hi), "err")
    if e[f"{src}_n"] < 2:  # one input: its value, no interval (a bootstrap over one value is a point, not a CI)
        return f"{number(est)} (n = 1)"
    return f"{number(est)} [{number(lo)}, {number(hi)}]"


# the columns of the bench's "where we land" table and the implementations whose error rows they stand beside
SPEED_COLUMN_OF = {"zyfa-hopper": ("zyfa-hopper", "triton:zyfa-hopper"), "cuDNN BF16": ("bf16", "sdpa-bf16:cudnn"),
                   "cuDNN FP8": ("cudnn-fp8",), "FA3 FP8 (FlashInfer)": ("flashinfer-fa3",),
                   "AMD Triton FP8": ("flash-attn-triton-amd", "triton-amd")}
OUR_COLUMN = "zyfa-hopper"  # the bench's column of our kernel; a "× X" column is its speed over peer X's
# the names the front page gives the bench's columns: the kernel that was timed, never the recipe whose numerics
# it borrows (our kernel under zyfa-hopper is "zyfa kernel", FA3's real kernel through FlashInfer is "fa3")
SPEED_HEADER = {"zyfa-hopper": "zyfa kernel (zyfa-hopper numerics)", "FA3 FP8 (FlashInfer)": "fa3 (FlashInfer)",
                "FA3 FP8": "fa3 (FlashInfer)"}
# a timed kernel's name on the picture (the bench's key -> what it is); our kernel under recipe X is
# "zyfa kernel (X numerics)" (timed_name)
TIMED_NAMES = {"cudnn-fp8": "cuDNN FP8", "sdpa-bf16:cudnn": "cuDNN BF16", "sdpa-bf16:flash": "FA2 BF16",
               "flashinfer-fa3": "fa3 (FlashInfer)", "flash-attn-triton-amd": "AMD Triton FP8"}


def timed_name(key: str) -> str:
    """What a timed kernel is, by its bench key (:func:`speed_points`): ``triton:X`` is our Triton kernel under
    recipe X, ``zyfa kernel (X numerics)``, ``cute:X`` our CuTe kernel, ``zyfa CuTe kernel (X numerics)``; a peer is
    named by itself (``flashinfer-fa3``: ``fa3 (FlashInfer)``)."""
    namespace, _, recipe = key.partition(":")
    if namespace == "triton":
        return f"zyfa kernel ({recipe} numerics)"
    if namespace == "cute":
        return f"zyfa CuTe kernel ({recipe} numerics)"
    return TIMED_NAMES.get(key, key)


def speed_header(h: str) -> str:
    """A bench column's name on the front page (:data:`SPEED_HEADER`; ``× X`` renamed as X is)."""
    if h.startswith("× "):
        return "× " + SPEED_HEADER.get(h[2:], h[2:])
    return SPEED_HEADER.get(h, h)


def speed_columns_with_errors(header: list[str], body: list[list[str]], names: Sequence[str]):
    """The speed table cut to the implementations with error rows in this report (``names``, real kernels as
    ``name (real, device)``): (header, body, the timed implementations left out). A ratio column ``× X`` (our
    kernel's speed over X's) stays only where both X's column and our kernel's stay; shape columns always stay."""
    base = {n.split(" (real", 1)[0] for n in names}
    shown = {col for col, impls in SPEED_COLUMN_OF.items() if any(i in base for i in impls)}
    keep, dropped = [], []
    for i, h in enumerate(header):
        col = h[2:] if h.startswith("× ") else h
        peer = next((c for c in SPEED_COLUMN_OF if c == col or c.startswith(col)), None)
        if peer is None or (peer in shown and (not h.startswith("× ") or OUR_COLUMN in shown)):
            keep.append(i)
        elif not h.startswith("× "):
            dropped.append(h)
    return [header[i] for i in keep], [[r[i] if i < len(r) else "" for i in keep] for r in body], dropped


def _figure(points: dict[str, tuple[float, float, float, float]], front: list[str], device: str,
            shape: str, timed: Sequence[str] = (), source: str = "") -> tuple[str, bytes, str]:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 3.0))
    names = list(points)
    x = np.array([points[n][0] for n in names])
    y = np.array([points[n][1] for n in names])
    lo = np.array([points[n][2] for n in names])
    hi = np.array([points[n][3] for n in names])
    ok = np.isfinite(lo) & np.isfinite(hi) & (hi > lo)
    ax.errorbar(x[ok], y[ok], yerr=[y[ok] - lo[ok], hi[ok] - y[ok]], fmt="none", ecolor="#888", lw=0.8, capsize=2)
    on = [n in front for n in names]
    ax.scatter(x, y, s=28, zorder=3, c=["#d62728" if o else "#1f77b4" for o in on])
    if len(front) > 1:
        ax.step([points[n][0] for n in front], [points[n][1] for n in front], where="pre", color="#d62728", lw=1.0,
                alpha=0.7, label="Pareto frontier")
        ax.legend(fontsize=7, loc="upper left")
    span = float(np.nanmax(x) - np.nanmin(x)) or 1.0
    placed: list[tuple[float, float, int]] = []  # labels so far: x, log10 y, vertical offset
    for n, xi, yi in sorted(zip(names, x, y, strict=True), key=lambda t: t[1]):
        # a label near an earlier one (close in speed and error) goes below it, then further down
        near = [dy for px, py, dy in placed if abs(px - xi) < 0.12 * span
                and abs(py - math.log10(max(yi, 1e-30))) < 0.15]
        dy = min(near) - 11 if near else 3
        placed.append((xi, math.log10(max(yi, 1e-30)), dy))
        ax.annotate(timed_name(n), (xi, yi), textcoords="offset points", xytext=(5, dy), fontsize=7)
    ax.set_yscale("log")
    ax.set_xlim(float(np.nanmin(x)) - 0.08 * span, float(np.nanmax(x)) + 0.45 * span)
    ax.set_xlabel(f"TFLOP/s, {device}, {shape}", fontsize=8)
    ax.set_ylabel("rel L2 (deq), captures", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.set_title(f"Speed against error, {device} (right and low is better)", fontsize=9)
    return ("fig_front_speed_accuracy.png", png(fig),
            f"Red: the Pareto frontier ({', '.join(timed_name(n) for n in front)}): the implementations no other "
            "beats on both speed and error. The most accurate one (bf16: no FP8 rounding) and the fastest one are on "
            "it by definition; an FP8 recipe in between is on it only where no faster one has less error. Each point "
            "is named by the kernel that was timed: \"zyfa kernel (X numerics)\" is our Triton kernel under recipe X "
            "(never the peer whose numerics X models), cuDNN FP8 and fa3 (FlashInfer) the vendors' kernels, "
            "cuDNN BF16 and FA2 BF16 PyTorch's BF16 SDPA through cuDNN and FlashAttention-2, AMD Triton FP8 "
            "flash-attn's Triton kernel. "
            f"Speed: {source or 'the benchmark file'}. Error: mean over "
            "the captures (deq, 95% CI) of that kernel's own rows where it ran in these results, else of the recipe "
            "that emulates it (our kernel under X: X; cuDNN FP8: cudnn-fp8; BF16 SDPA: bf16; fa3 (FlashInfer): fa3)."
            " A kernel whose verdict is failed or nonconforming has no point."
            + (f" Timed, but without rows in these results: {', '.join(timed_name(t) for t in timed)}."
               if timed else ""))


# columns of the bench's "where we land" table left to the full table in the details
FRONT_SPEED_DROP = ("fastest of our recipes", "best BF16 SDPA", "× best BF16", "captured / Gaussian")


def _front_speed(header: list[str], body: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """The front page's cut of the "where we land" table: without :data:`FRONT_SPEED_DROP` and columns that are
    empty ("-") in every row."""
    keep = [i for i, h in enumerate(header) if h not in FRONT_SPEED_DROP
            and any(i < len(r) and r[i] not in ("-", "") for r in body)]
    return [header[i] for i in keep], [[r[i] if i < len(r) else "" for i in keep] for r in body]


def bench_source(name: str, meta: dict) -> str:
    """Where a benchmark file's numbers come from: ``<file> @ <commit>, <device>, <date>`` (its ``meta``)."""
    commit = str(meta.get("git_commit") or "").split()
    device = str(meta.get("device") or "device unknown").removeprefix("NVIDIA ")
    date = f", {str(meta['date'])[:10]}" if meta.get("date") else ""
    return f"{name} @ {commit[0][:7] if commit else 'no commit'}, {device}{date}"


def quantized_weights(rows: Sequence[dict]) -> str:
    """The sentence on the captures' model weights (4-bit GGUF for the shipped models, from the model registry
    :data:`zyfa.capture.models.MODELS`), or "" without captures."""
    models = list(dict.fromkeys(str(r.get("input_model")) for r in rows if r.get("input_source") == "capture"
                                and r.get("input_model")))
    if not models:
        return ""
    known = []
    for m in models:
        spec = MODELS.get(m)
        q = re.search(r"GGUF (Q\d\w*)", spec.description) if spec is not None else None
        known.append(f"{m} ({q.group(1)})" if q else f"{m} (weights not in the registry: precision unknown)")
    quant = [m for m in models if MODELS.get(m) is not None and re.search(r"GGUF Q4", MODELS[m].description)]
    lead = ("**The captures come from 4-bit-weight models**" if len(quant) == len(models) else
            "**The captures' model weights**")
    return (f"{lead} (GGUF quantization, datasets/README.md): {', '.join(known)}. Their activations are those of "
            "the quantized models, which may differ from the full-precision models' (outlier sizes in particular).")


def _status_lines(entries: Sequence[dict]) -> list[str]:
    """One line per (status, why) among the table's recipes: the recipes with that status and the why of it
    (``status_note`` of :mod:`zyfa.recipes`; ``from source`` without a note: every field read in the peer's
    source), and one line for a real kernel's ``measured on``."""
    groups: dict[tuple[str, str], list[str]] = {}
    for e in entries:
        if e["status"].startswith("measured on"):
            continue
        try:
            note = str(getattr(get_recipe(e["name"]), "status_note", "") or "").strip().rstrip(".")
        except (ValueError, KeyError):
            continue
        if not note and e["status"] == "from source":
            note = "every field read in the peer's source code"
        if note:
            groups.setdefault((e["status"], note), []).append(e["name"])
    out = [f"{', '.join(f'`{n}`' for n in names)} {'is' if len(names) == 1 else 'are'} **{status}**: {note}."
           for (status, note), names in groups.items()]
    if any(e["status"].startswith("measured on") for e in entries):
        out.append("**measured on X**: a real kernel, run on device X; its numbers are its own outputs against FP64.")
    return out


def _orig_over_deq(entries: Sequence[dict], src: str) -> list[float]:
    """orig / deq of the table's own means (as printed, :func:`number`) for the scored FP8 entries on ``src``."""
    out = []
    for e in entries:
        if not e["verdict"].scored or e["recipe"].split(":")[0] in ("bf16", "fp32") or e["self_quantizing"] \
                or not e[f"{src}_n"]:
            continue
        d, o = e[f"{src}_deq_rel_l2"][0], e[f"{src}_orig_rel_l2"][0]
        if math.isfinite(d) and math.isfinite(o) and d > 0:
            out.append(float(number(o)) / float(number(d)))
    return out


def front_prose(entries: Sequence[dict]) -> str:
    """The paragraph under the error table, every number computed from the table's own (printed) numbers."""
    parts = []
    for src, label in (("captures", "on the captures"), ("gaussian", "on the Gaussian inputs")):
        r = _orig_over_deq(entries, src)
        if r:
            parts.append(f"{ratio(min(r))} to {ratio(max(r))} {label}" if len(r) > 1 else f"{ratio(r[0])} {label}")
    if parts:  # "... 2.43× to 2.56× their deq error on the captures and 2.21× to 2.49× on the Gaussian inputs"
        parts[0] = parts[0].replace(" on the", " their deq error on the", 1)
    scored = [e for e in entries if e["verdict"].scored and e["captures_n"]
              and e["recipe"].split(":")[0] not in ("bf16", "fp32") and not e["self_quantizing"]
              and math.isfinite(e["captures_orig_rel_l2"][0])]
    quant = ""
    if scored:
        lo = min(scored, key=lambda e: e["captures_orig_rel_l2"][0])
        hi = max(scored, key=lambda e: e["captures_orig_rel_l2"][0])
        quant = (f" With the quantization of Q, K and V (`orig`) the FP8 implementations of the table are at "
                 f"{number(lo['captures_orig_rel_l2'][0])} ({lo['name']}) to {number(hi['captures_orig_rel_l2'][0])} "
                 f"({hi['name']}) on the captures.")
    return ("**Error**: mean relative L2 error against the FP64 oracle, [bootstrap 95% interval] over the inputs. "
            "**deq**: against FP64 on the very FP8 inputs the implementation computed with, i.e. the error its "
            "arithmetic adds (how kernels compare). **orig**: against FP64 on the original inputs, the quantization "
            "of Q, K and V included, i.e. what a model sees"
            + (f"; in this table the FP8 implementations' orig error is {' and '.join(parts)}" if parts else "")
            + f".{quant} **Verdict**: ok, suspect (its error is far from its paired emulation's), "
            "nonconforming (it failed a conformance probe: not the attention the contract describes) or failed (it "
            "raised or returned a malformed output); a failed or nonconforming implementation has no numbers. "
            "**from**: where the row's numbers were measured.")


def section_front(doc: Doc, rows: Sequence[dict], bench: Sequence[tuple[str, dict, list[dict]]], plots: bool,
                  links: Sequence[tuple[str, str]] = (), findings: Sequence[str] = (),
                  provenances: Sequence[tuple[str, dict]] = (), this_run: Sequence[str] = ()) -> None:
    """Append the front page: the verdict-and-error table (one row per implementation, its verdict and reason
    first, each row's source), the speed table (each row's source), the picture, ``findings`` (one paragraph each,
    e.g. the long-context finding, each naming its source) and ``links`` (label, anchor) to the details.
    ``provenances``: (file label, provenance record) of the result files; ``this_run``: the labels of the files this
    command wrote (their rows are "this run")."""
    doc.h(2, "At a glance: verdict, error and speed")
    entries = error_table(rows, provenances, this_run)
    name, meta, sh, sb = where_we_land(bench)
    device = str(meta.get("device") or "the GPU")
    speeds, shape = speed_points(next((r for n, _, r in bench if n == name), [])) if sh else ({}, "")
    points = {}
    by_name = {e["name"]: e for e in entries}
    for key, speed in speeds.items():  # a timed kernel's error: the real kernel's where it ran, else its emulation's
        for n in (REAL_OF_SPEED.get(key, key), emulation_of_timed(key)):
            e = by_name.get(n)
            if e and not e["verdict"].scored:
                break  # a failed or nonconforming kernel has no point
            if e and e["captures_n"] and math.isfinite(e["captures_deq_rel_l2"][0]):
                points[key] = (speed, *e["captures_deq_rel_l2"])  # named by the kernel that was timed
                break
    front = pareto({n: (p[0], p[1]) for n, p in points.items()}) if len(points) >= 2 else []
    timed = [k for k in speeds if ":" not in k and k not in points and k not in BENCH_PEERS
             and k not in BENCH_PEERS.values() and k not in {e["name"] for e in entries}]
    header = ["implementation", "verdict", "captures: deq", "captures: orig", "Gaussian: deq", "Gaussian: orig",
              "status", "from"]
    body = [[e["name"], e["verdict"].short(VERDICT_REASON), *(_front_cell(e, src, m) for src in ("captures", "gaussian")
                                                for m in ("deq", "orig")), e["status"], e["source"]]
            for e in entries]
    labels = list(dict.fromkeys(x for e in entries for x in e["source"].split("; ")))
    doc.p(f"**Where the numbers come from** (row by row in the last column): errors from {'; '.join(labels)}"
          + (f"; speeds from {bench_source(name, meta)}" if sh else "") + ".")
    doc.table(FRONT_KEYS[0], header, body)
    doc.p(front_prose(entries))
    cut = [e["verdict"] for e in entries if e["verdict"].reason
           and e["verdict"].short(VERDICT_REASON) != f"{e['verdict'].verdict}: {e['verdict'].reason}"]
    for v in cut:  # the whole reason where the table's cell had to cut it
        doc.p(f"`{v.name}` is **{v.verdict}**: {v.reason}.")
    own = [e["name"] for e in entries if e["self_quantizing"] and e["verdict"].scored]
    if own:
        doc.p(f"{', '.join(f'`{n}`' for n in own)} "
              + ("quantizes for itself" if len(own) == 1 else "quantize for themselves")
              + ", so only the orig error is defined (its FP8 inputs are its own).")
    for line in _status_lines(entries):
        doc.p(line)
    weights = quantized_weights(rows)
    if weights:
        doc.p(weights)
    source = bench_source(name, meta) if sh else ""
    if plots and len(points) >= 2:  # below the error table, which keeps the page's full width for its columns
        doc.img(*_figure(points, front, device, shape, timed, source))

    if sh:
        fh, fb = _front_speed(sh, sb)
        fh, fb, not_here = speed_columns_with_errors(fh, fb, [e["name"] for e in entries])
        doc.p(f"**Speed** on the **{device}**, from the benchmark file {source} (not this run): where we "
              "land, TFLOP/s at each shape's longest Gaussian sequence, for the implementations with error rows "
              "above; \"zyfa kernel (zyfa-hopper numerics)\" is our Triton kernel under its default recipe, × its "
              "speed over the peer's (shown only where both columns are).")
        doc.table(FRONT_KEYS[1], [*(speed_header(h) for h in fh), "from"], [[*r, source] for r in fb])
        if not_here:
            doc.p(f"Timed on the {device}, not in these results: {', '.join(speed_header(h) for h in not_here)} "
                  "(the full table is in the speed section).")
    else:
        doc.p("**Speed**: no benchmark file with a \"where we land\" table was given (`zyfa bench` on a GPU writes "
              "`reports/bench/bench.json`; `--bench` names another).")
        doc.table(FRONT_KEYS[1], ["speed"], [["no benchmark file"]])
    if len(points) >= 2 and not plots:
        doc.p(f"Pareto frontier of speed and error: {', '.join(timed_name(n) for n in front)}."
              + (f" Timed, but without rows in these results: {', '.join(timed_name(t) for t in timed)}."
                 if timed else ""))
    elif len(points) < 2 and sh:
        doc.p("No speed-against-accuracy picture: fewer than two implementations have both a speed in the "
              "benchmark file and an error on the captures.")
    for f in findings:
        doc.p(f)
    if links:
        doc.p("Details: " + " · ".join(f"[{label}](#{anchor})" for label, anchor in links) + ".")


def model_anchor(group: str) -> str:
    """The anchor of a model's recipe table (``t-<model>-recipes``), for links to it."""
    return f"t-{slug(group)}-recipes"
