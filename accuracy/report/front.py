"""The report's front page: one screen that answers "how accurate is each implementation?" and "how fast?".

Three parts, computed from the result rows and the benchmark rows:

* each implementation's error, absolute, with its bootstrap 95% interval, on the captures and on the Gaussian
  inputs, with its status (``zyfa.recipes.Recipe.status``: verified, from source, assumed, modelled; a real
  kernel's rows are "measured" on their device). An implementation is a row's ``implementation`` (a real
  kernel) or else its recipe (the emulator); ZYFA's ablations stay in the details.
* "where we land": :func:`zyfa.bench.summary_lines` of the benchmark file (the same table as its Markdown),
  with the GPU named;
* one picture of speed against accuracy: each implementation that has both a speed and an error is a point
  (TFLOP/s at the longest head-dim-128 non-causal Gaussian sequence of the benchmark, error on the captures),
  with the Pareto frontier (no other point is both faster and more accurate).

Exposed: ``is_real(row)``, ``on_front_page(row)``,
``implementation_of(row)``, ``status_of(name, rows)``, ``error_table(rows)``, ``where_we_land(bench)``,
``speed_points(bench_rows)``, ``pareto(points)``, ``section_front(doc, rows, bench, plots)``, ``FRONT_KEYS``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from accuracy.report.blocks import fmt, fmt_ci, slug
from accuracy.report.document import Doc
from accuracy.report.plots import png, pyplot
from accuracy.report.real_kernels import measured_on

# ZYFA's ablations: in the details, not on the front page
ABLATION_PREFIX = ("zyfa-exp2", "zyfa-fp32sum", "zyfa-noscale", "zyfa-pow2fixed", "zyfa-tilescale")
# the table keys of the front page (a test checks that the first section holds them)
FRONT_KEYS = ("t-front-error", "t-front-speed")
METRIC = "deq_rel_l2"  # the picture's error: what the implementation's arithmetic adds on its own inputs
# bench peers -> the study's name of the same numerics
BENCH_PEERS = {"cudnn-fp8": "cudnn-fp8", "sdpa-bf16:cudnn": "bf16", "sdpa-bf16:flash": "bf16"}
OURS = "triton-fp8"  # the bench's name of our kernel
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
        from zyfa.recipes import get_recipe

        return str(getattr(get_recipe(name), "status", None) or "-")
    except (ValueError, KeyError, ImportError):
        return "-"


def _ci(values):
    from accuracy.metrics import bootstrap_ci

    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    if not np.all(np.isfinite(x)):
        return (float(np.mean(x)),) * 3
    return tuple(bootstrap_ci(x))


def error_table(rows: Sequence[dict]) -> list[dict]:
    """One entry per implementation on the front page (:func:`on_front_page`), in the order of the rows (recipes
    first, then real kernels): name, status, and the
    (mean, low, high) of ``orig_rel_l2`` and ``deq_rel_l2`` over the capture inputs and over the Gaussian
    inputs (NaN triples where there are none), and the input counts; ``self_quantizing``: a real kernel that
    quantizes for itself, whose error on a recipe's dequantized inputs is not what it computed with."""
    shown = [r for r in rows if on_front_page(r)]
    names = list(dict.fromkeys([*(implementation_of(r) for r in shown if not is_real(r)),
                                *(implementation_of(r) for r in shown if is_real(r))]))
    if "zyfa" in names:
        names.remove("zyfa")
        names.insert(0, "zyfa")
    out = []
    for n in names:
        mine = [r for r in rows if implementation_of(r) == n]
        e = {"name": n, "status": status_of(n, mine), "recipe": str(mine[0].get("recipe")),
             "self_quantizing": is_real(mine[0]) and mine[0].get("quantizes") == "self"}
        for src, pick in (("captures", lambda r: r.get("input_source") == "capture"),
                          ("gaussian", lambda r: r.get("input_source") != "capture")):
            sel = [r for r in mine if pick(r)]
            e[f"{src}_n"] = len(sel)
            for m in ("orig_rel_l2", "deq_rel_l2"):
                e[f"{src}_{m}"] = _ci([r.get(m) for r in sel])
        out.append(e)
    return out


def where_we_land(bench: Sequence[tuple[str, dict, list[dict]]]) -> tuple[str, dict, list[str], list[list[str]]]:
    """(file name, meta, header, body) of the "where we land" table of the first benchmark file that has one
    (:func:`zyfa.bench.summary_lines`, the table of the bench Markdown); ("", {}, [], []) when none has."""
    from zyfa.bench import summary_lines

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
    """The emulated recipe whose numerics a timed kernel computes: ``triton:X`` -> ``X``; a peer -> its recipe."""
    return name[len("triton:"):] if name.startswith("triton:") else EMULATION_OF_PEER.get(name, name)


def speed_points(bench_rows: Sequence[dict]) -> tuple[dict[str, float], str]:
    """(name -> TFLOP/s, shape label) at the longest head-dim-128 non-causal Gaussian sequence of the run (else
    the longest head-dim-128 one, else any), each under the name of the real kernel that was timed (the
    implementation registry's): our kernel under recipe X as ``triton:X`` (never as ``X``, the emulation whose
    numerics it borrows), every peer by its own name (``cudnn-fp8``, ``sdpa-bf16:cudnn``, ``flashinfer-fa3``, ...).
    Our kernel's speeds include V's transpose where it was timed (as in the bench summary).
    """
    from zyfa.bench import canonical_rows, headline_tflops

    ok = [r for r in canonical_rows(bench_rows) if "error" not in r and isinstance(r.get("tflops"), (int, float))
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
        if impl == OURS:
            put(f"triton:{recipe}", v)
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


def _front_cell(e: dict, src: str, metric: str = "deq") -> str:
    """The error cell of one entry, source and metric (``deq`` or ``orig``); ``-`` without inputs, and for the
    deq error of a kernel that quantizes for itself (it computed with its own FP8 values, not the recipe's)."""
    if not e[f"{src}_n"] or (metric == "deq" and e["self_quantizing"]):
        return "-"
    est, lo, hi = e[f"{src}_{metric}_rel_l2"]
    if not all(math.isfinite(v) for v in (est, lo, hi)):
        return fmt_ci((est, lo, hi), "err")

    def short(v: float) -> str:  # three digits, a one-digit exponent: six columns fit the first screen
        return f"{v:.2e}".replace("e-0", "e-").replace("e+0", "e+")

    if e[f"{src}_n"] < 2:  # one input: its value, no interval (a bootstrap over one value is a point, not a CI)
        return f"{short(est)} (n = 1)"
    return f"{short(est)} [{short(lo)}, {short(hi)}]"


# the columns of the bench's "where we land" table and the implementations whose error rows they stand beside
SPEED_COLUMN_OF = {"zyfa-hopper": ("zyfa-hopper", "triton:zyfa-hopper"), "cuDNN BF16": ("bf16", "sdpa-bf16:cudnn"),
                   "cuDNN FP8": ("cudnn-fp8",), "FA3 FP8 (FlashInfer)": ("flashinfer-fa3",),
                   "AMD Triton FP8": ("flash-attn-triton-amd", "triton-amd")}


def speed_columns_with_errors(header: list[str], body: list[list[str]], names: Sequence[str]):
    """The speed table cut to the implementations with error rows in this report (``names``, real kernels as
    ``name (real, device)``): (header, body, the timed implementations left out). A ratio column ``× X`` stays
    with its column ``X``; shape columns always stay."""
    base = {n.split(" (real", 1)[0] for n in names}
    shown = {col for col, impls in SPEED_COLUMN_OF.items() if any(i in base for i in impls)}
    keep, dropped = [], []
    for i, h in enumerate(header):
        col = h[2:] if h.startswith("× ") else h
        peer = next((c for c in SPEED_COLUMN_OF if c == col or c.startswith(col)), None)
        if peer is None or peer in shown:
            keep.append(i)
        elif not h.startswith("× "):
            dropped.append(h)
    return [header[i] for i in keep], [[r[i] if i < len(r) else "" for i in keep] for r in body], dropped


def _figure(points: dict[str, tuple[float, float, float, float]], front: list[str], device: str,
            shape: str, timed: Sequence[str] = ()) -> tuple[str, bytes, str]:
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
        ax.annotate(n, (xi, yi), textcoords="offset points", xytext=(5, dy), fontsize=8)
    ax.set_yscale("log")
    ax.set_xlim(float(np.nanmin(x)) - 0.08 * span, float(np.nanmax(x)) + 0.3 * span)
    ax.set_xlabel(f"TFLOP/s, {device}, {shape}", fontsize=8)
    ax.set_ylabel("rel L2 (deq), captures", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.set_title(f"Speed against error, {device} (right and low is better)", fontsize=9)
    return ("fig_front_speed_accuracy.png", png(fig),
            f"Red: the Pareto frontier ({', '.join(front)}): the implementations no other beats on both speed and "
            "error. The most accurate one (bf16: no FP8 rounding) and the fastest one are on it by definition; an FP8 "
            "recipe in between is on it only where no faster one has less error. Each point is named by the kernel "
            "that was timed (the committed bench file, not this run): triton:X is our Triton kernel under recipe X, "
            "cudnn-fp8 and flashinfer-fa3 the vendors' kernels, sdpa-bf16:* PyTorch's BF16 SDPA. Error: mean over "
            "the captures (deq, 95% CI) of that kernel's own rows where it ran in this study, else of the recipe "
            "that emulates it (triton:X: X; cudnn-fp8: cudnn-fp8; sdpa-bf16: bf16; flashinfer-fa3: fa3)."
            + (f" Timed, but without rows in these results: {', '.join(timed)}." if timed else ""))


# columns of the bench's "where we land" table left to the full table in the details
FRONT_SPEED_DROP = ("fastest of our recipes", "best BF16 SDPA", "× best BF16", "captured / Gaussian")


def _front_speed(header: list[str], body: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """The front page's cut of the "where we land" table: without :data:`FRONT_SPEED_DROP` and columns that are
    empty ("-") in every row."""
    keep = [i for i, h in enumerate(header) if h not in FRONT_SPEED_DROP
            and any(i < len(r) and r[i] not in ("-", "") for r in body)]
    return [header[i] for i in keep], [[r[i] if i < len(r) else "" for i in keep] for r in body]


def section_front(doc: Doc, rows: Sequence[dict], bench: Sequence[tuple[str, dict, list[dict]]], plots: bool,
                  links: Sequence[tuple[str, str]] = (), findings: Sequence[str] = ()) -> None:
    """Append the front page: the error table, the speed table, the picture, ``findings`` (one paragraph each,
    e.g. the long-context finding) and ``links`` (label, anchor) to the details."""
    doc.h(2, "At a glance: error and speed")
    entries = error_table(rows)
    orig = {e["name"]: e["captures_orig_rel_l2"][0] for e in entries if e["captures_n"]}
    recipe_of = {e["name"]: e["recipe"].split(":")[0] for e in entries}
    fp8 = [v for n, v in orig.items() if recipe_of[n] not in ("bf16", "fp32") and math.isfinite(v)]
    quant = (f" With the quantization of Q, K and V (`orig`) the FP8 implementations are at {fmt(min(fp8), 'err')} "
             f"to {fmt(max(fp8), 'err')} on the captures" + (f", bf16 at {fmt(orig['bf16'], 'err')}"
                                                             if math.isfinite(orig.get("bf16", math.nan)) else "")
             + " (details below)." if fp8 else "")
    doc.p("**Error**: mean relative L2 error against the FP64 oracle, [bootstrap 95% interval] over the inputs. "
          "**deq**: against FP64 on the very FP8 inputs the implementation computed with, i.e. the error its "
          "arithmetic adds (how kernels compare). **orig**: against FP64 on the original inputs, the quantization "
          f"of Q, K and V included, i.e. what a model sees (about 10x deq for FP8).{quant} Status: how far an "
          "emulated recipe is backed; a real kernel is measured.")
    name, meta, sh, sb = where_we_land(bench)
    device = str(meta.get("device") or "the GPU")
    speeds, shape = speed_points(next((r for n, _, r in bench if n == name), [])) if sh else ({}, "")
    points = {}
    by_name = {e["name"]: e for e in entries}
    for key, speed in speeds.items():  # a timed kernel's error: the real kernel's where it ran, else its emulation's
        for n in (REAL_OF_SPEED.get(key, key), emulation_of_timed(key)):
            e = by_name.get(n)
            if e and e["captures_n"] and math.isfinite(e["captures_deq_rel_l2"][0]):
                points[key] = (speed, *e["captures_deq_rel_l2"])  # named by the kernel that was timed
                break
    front = pareto({n: (p[0], p[1]) for n, p in points.items()}) if len(points) >= 2 else []
    timed = [k for k in speeds if ":" not in k and k not in points and k not in BENCH_PEERS
             and k not in BENCH_PEERS.values() and k not in {e["name"] for e in entries}]
    header = ["implementation", "status", "captures: deq", "captures: orig", "Gaussian: deq", "Gaussian: orig"]
    body = [[e["name"], e["status"], *(_front_cell(e, src, m) for src in ("captures", "gaussian")
                                       for m in ("deq", "orig"))] for e in entries]
    doc.table(FRONT_KEYS[0], header, body)
    own = [e["name"] for e in entries if e["self_quantizing"]]
    if own:
        doc.p(f"{', '.join(f'`{n}`' for n in own)} "
              + ("quantizes for itself" if len(own) == 1 else "quantize for themselves")
              + ", so only the orig error is defined (its FP8 inputs are its own).")
    if plots and len(points) >= 2:  # below the error table, which keeps the page's full width for its six columns
        doc.img(*_figure(points, front, device, shape, timed))

    if sh:
        about = [f"`{name}`"]
        if meta.get("date"):
            about.append(str(meta["date"])[:10])
        if meta.get("git_commit"):
            about.append(f"commit {meta['git_commit']}")
        fh, fb = _front_speed(sh, sb)
        fh, fb, not_here = speed_columns_with_errors(fh, fb, [e["name"] for e in entries])
        doc.p(f"**Speed** on the **{device}** ({', '.join(about)}): where we land, TFLOP/s at each shape's longest "
              "Gaussian sequence, for the implementations with error rows above; zyfa-hopper is our kernel's "
              "default recipe, × its speed over the peer's.")
        doc.table(FRONT_KEYS[1], fh, fb)
        if not_here:
            doc.p(f"Timed on the {device}, not in these results: {', '.join(not_here)} (the full table is in the "
                  "speed section).")
    else:
        doc.p("**Speed**: no benchmark file with a \"where we land\" table was given (`zyfa bench` on a GPU writes "
              "`reports/bench/bench.json`; `--bench` names another).")
        doc.table(FRONT_KEYS[1], ["speed"], [["no benchmark file"]])
    if len(points) >= 2 and not plots:
        doc.p(f"Pareto frontier of speed and error: {', '.join(front)}."
              + (f" Timed, but without rows in these results: {', '.join(timed)}." if timed else ""))
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
