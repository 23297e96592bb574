"""The sections of the accuracy report (:func:`zyfa.accuracy.report.build.build_report` puts them in order): the
summary, per model or for the Gaussian inputs the recipe x metric tables, paired ratios, the ablation of ZYFA's
techniques, per layer and head, head dim and sequence length; then the causes of error, every result, the inputs
and the provenance. Every number is computed from the result rows and formatted by
:func:`zyfa.accuracy.report.blocks.fmt`, so a test can parse them back.

Exposed: one ``section_*(doc, ...)`` per section; ``ABLATIONS``, ``MAIN_METRICS``, ``OTHER_METRICS``, ``CAUSES``,
``METRIC_NOTE``.
"""

from __future__ import annotations

import math
import shlex
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from zyfa.accuracy.io.results_io import run_provenances
from zyfa.accuracy.report.blocks import fmt, fmt_ci, kind_of, sharding_line, slug
from zyfa.accuracy.report.document import Doc
from zyfa.accuracy.report.plots import png, pyplot
from zyfa.accuracy.report.results import GAUSSIAN, Results, group_of, input_key
from zyfa.accuracy.report.stats import (
    MIN_INTERVAL_N,
    TableEntry,
    mean_ci,
    mean_or_ci,
    paired_rows,
    paired_values,
    row_value,
    rows_by_recipe,
    table_entries,
)
from zyfa.accuracy.scoring.verdict import spearman_with_p

__all__ = ["ABLATIONS", "CAUSES", "MAIN_METRICS", "METRIC_NOTE", "OTHER_METRICS", "section_ablation", "section_all",
           "section_causes", "section_headdim", "section_inputs", "section_layers", "section_provenance",
           "section_ratios", "section_recipes", "section_seq", "section_summary"]

# ZYFA's ablation recipes: name -> what is switched off (docs/DESIGN.md, the three ZYFA techniques)
ABLATIONS = {
    "zyfa-exp2": ("1", "exponential-free FP8 probabilities off: fp32 exp2, then an RNE cast to e4m3fn"),
    "zyfa-fp32sum": ("3", "normalization by the rounded sum off: row sum from the fp32 probabilities"),
    "zyfa-noscale": ("3", "power-of-two block scaling off: P in (0, 1] rounded unscaled"),
    "zyfa-pow2fixed": ("3", "per-row exponent replaced by a fixed 2^8 (FA3/FA4's choice)"),
    "zyfa-tilescale": ("3", "per-row exponent replaced by one exponent per 128x128 tile"),
}
# main table: metric -> header
MAIN_METRICS = {
    "deq_rel_l2": "rel L2 (deq)",
    "orig_rel_l2": "rel L2 (orig)",
    "deq_sqnr_db": "SQNR dB (deq)",
    "deq_row_rel_err_p99": "row rel err p99 (deq)",
    "p_flushed_frac": "P flushed to 0",
}
OTHER_METRICS = ("deq_rmse", "deq_max_abs_err", "deq_cosine", "deq_row_rel_err_p50", "deq_row_rel_err_max",
                 "deq_lse_max_abs_err", "deq_lse_rmse", "orig_sqnr_db", "orig_row_rel_err_p99")
# causes of error: column -> label
CAUSES = {
    "feat_k_outlier": "max|K| / rms(K)",
    "feat_q_outlier": "max|Q| / rms(Q)",
    "feat_entropy_nats": "attention entropy (nats)",
    "p_flushed_frac": "fraction of P flushed to 0",
}
METRIC_NOTE = ("`deq`: error against the FP64 oracle on the dequantized inputs the recipe saw (the error its "
               "arithmetic adds: P rounding, row sums, accumulation, output rounding); `orig`: against the "
               "FP64 oracle on the original inputs (adds the quantization of Q, K and V).")


def _hd(row: dict) -> str:
    d, dv = row.get("head_dim"), row.get("head_dim_v")
    return f"{d}" if dv in (None, d) else f"{d}/{dv}"


def _real_notes(entries: list[TableEntry], n_inputs: int) -> list[str]:
    """Sentences on a table's real-kernel rows: pairing that is not the row above, inputs left out, deq."""
    notes, fewer = [], []
    for e in entries:
        if not e.real:
            continue
        if e.paired is None:
            notes.append(f"`{e.label}` is paired with no recipe.")
        elif e.placed != e.paired:
            notes.append(f"`{e.label}` is paired with `{e.paired}`" + (f", shown after `{e.placed}`."
                                                                         if e.placed else "."))
        if e.self_quantizing:
            notes.append(f"`{e.label}` quantizes for itself, so it has no `deq` error; compare its `orig` error.")
        if len(e.rows) < n_inputs:
            fewer.append(f"`{e.label}` {fmt(len(e.rows), 'int')}")
    if fewer:
        notes.append(f"Ran on fewer of the {fmt(n_inputs, 'int')} inputs (the others: [not run](#t-real-not-run)): "
                     f"{', '.join(fewer)}.")
    return notes


# ---------------------------------------------------------------------------------------------- plots

def _style(name: str, recipes: list) -> dict:
    """One color per recipe (tab20, in report order) and a dashed line for ZYFA's ablations."""
    cmap = pyplot().get_cmap("tab20" if len(recipes) > 10 else "tab10")
    i = recipes.index(name) if name in recipes else 0
    return {"color": cmap(i % cmap.N), "ls": "--" if name in ABLATIONS else "-"}


# ---------------------------------------------------------------------------------------------- sections

def section_recipes(doc: Doc, gname: str, rows: list, recipes: list, plots: bool,
                     real_rows: Sequence[dict] = ()) -> None:
    tkey = slug(gname)
    n_inputs = len({input_key(r) for r in rows})
    entries = table_entries(rows, recipes, real_rows)
    doc.h(3, f"{gname}: error by recipe")
    few = (" With so few inputs the intervals only show the spread; the per-head table below has more samples."
           if n_inputs < 5 else "")
    doc.p(f"Mean over {n_inputs} input(s) with its bootstrap 95% confidence interval over the inputs "
          f"(each capture input is one layer, all its captured heads).{few} {METRIC_NOTE}")
    if any(e.real for e in entries):
        doc.p(" ".join([
            "Rows marked *(real, device)* are real kernels measured on that device, each after the recipe it is paired "
            "with (its emulation), on the same inputs; their `deq` error is against the FP64 oracle on that "
            "recipe's dequantized inputs, which they computed with. `P flushed to 0` is the emulator's count "
            "(`-` for a real kernel); the plot shows the recipes.", *_real_notes(entries, n_inputs)]))
    header = ["recipe", "inputs", *MAIN_METRICS.values()]
    body, cis = [], {}
    for e in entries:
        cells = [e.label, fmt(len(e.rows), "int")]
        for m in MAIN_METRICS:
            vals = e.values(m)
            ci = mean_ci(vals)
            cis[(e.label, m)] = ci
            cells.append(fmt_ci(ci, kind_of(m)) if vals else "-")
        body.append(cells)
    doc.table(f"t-{tkey}-recipes", header, body)
    other = [m for m in OTHER_METRICS if any(m in r for r in rows)]
    if other:
        doc.p("Other metrics, mean over the inputs (maxima: the largest).")
        body2 = []
        for e in entries:
            cells = [e.label]
            for m in other:
                vals = e.values(m)
                if not vals:
                    cells.append("-")
                    continue
                v = max(vals) if ("max" in m and not m.endswith("p50")) else float(np.mean(vals))
                cells.append(fmt(v, kind_of(m)))
            body2.append(cells)
        doc.table(f"t-{tkey}-other", ["recipe", *other], body2)
    nan = sorted({r["recipe"] for r in rows if r.get("has_nan")})
    if nan:
        doc.p(f"NaN or Inf in the output of: {', '.join(nan)} (their intervals are nan).")
    names = [e.label for e in entries if not e.real]
    if plots and names:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(max(5.0, 0.55 * len(names)), 3.2))
        for i, (metric, color) in enumerate((("deq_rel_l2", "#1f77b4"), ("orig_rel_l2", "#ff7f0e"))):
            est = np.array([cis[(n, metric)][0] for n in names])
            lo = np.array([cis[(n, metric)][1] for n in names])
            hi = np.array([cis[(n, metric)][2] for n in names])
            x = np.arange(len(names)) + (i - 0.5) * 0.38
            ax.bar(x, est, width=0.38, color=color, label=MAIN_METRICS[metric])
            ok = np.isfinite(lo) & np.isfinite(hi)
            ax.errorbar(x[ok], est[ok], yerr=[est[ok] - lo[ok], hi[ok] - est[ok]], fmt="none", ecolor="k",
                        lw=0.8, capsize=2)
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(names)), names, rotation=45, ha="right")
        ax.set_ylabel("relative L2 error")
        ax.set_title(f"{gname}: mean error, 95% CI")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="y", alpha=0.3)
        doc.img(f"fig_{tkey}_recipes.png", png(fig), f"{gname}: relative L2 error by recipe (mean, 95% CI)")


def section_ratios(doc: Doc, gname: str, rows: list, recipes: list, real_rows: Sequence[dict] = ()) -> None:
    if "zyfa" not in recipes:
        return
    entries = [e for e in table_entries(rows, recipes, real_rows)
               if e.label != "zyfa" and e.label not in ABLATIONS and e.placed not in ABLATIONS]
    if not entries:
        return
    left_out = [e.rows[0].get("implementation") or e.label for e in table_entries(rows, recipes, real_rows)
                if e.real and e.placed in ABLATIONS]
    doc.h(3, f"{gname}: zyfa against each peer, on the same inputs")
    doc.p("Per input, the ratio zyfa / peer of the relative L2 error; the geometric mean of the ratios with "
          "a bootstrap 95% CI (over inputs, on the log ratios). Below 1: zyfa is more accurate."
          + (f" With {len({input_key(r) for r in rows})} inputs (fewer than {MIN_INTERVAL_N}) the geometric mean is "
             "given alone: an interval over so few layers carries no information."
             if len({input_key(r) for r in rows}) < MIN_INTERVAL_N else "")
          + (" A peer marked *(real, device)* is a real kernel measured on that device, paired with zyfa's emulation "
             "on the inputs both have." if any(e.real for e in entries) else "")
          + (" A kernel that quantizes for itself has no `deq` ratio." if any(e.self_quantizing for e in entries)
             else "")
          + (f" The real kernels of ZYFA's ablations ({', '.join(left_out)}) are in the table above, not here."
             if left_out else ""))
    zyfa = [r for r in rows if r["recipe"] == "zyfa"]
    body = []
    for e in entries:
        deq = paired_rows(zyfa, e.rows, "deq_rel_l2") if e.values("deq_rel_l2") else []
        orig = paired_rows(zyfa, e.rows, "orig_rel_l2")
        if not deq and not (e.real and orig):
            continue
        wins = sum(x < 1 for x in deq)
        body.append([e.label, fmt(len(deq or orig), "int"),
                     fmt_ci(mean_or_ci(deq, log=True), "ratio") if deq else "-",
                     fmt_ci(mean_or_ci(orig, log=True), "ratio") if orig else "-",
                     f"{wins}/{len(deq)}" if deq else "-"])
    doc.table(f"t-{slug(gname)}-ratios", ["peer", "pairs", "zyfa/peer rel L2 (deq)",
                                           "zyfa/peer rel L2 (orig)", "zyfa lower"], body)


def section_summary(doc: Doc, groups: list, rows: list, recipes: list, real_rows: Sequence[dict] = (),
                     unavailable: dict | None = None) -> None:
    doc.h(2, "Summary")
    per_group = {g: ([r for r in rows if group_of(r) == g], [r for r in real_rows if group_of(r) == g])
                 for g in groups}
    n_in = {g: len({input_key(r) for r in rs}) for g, (rs, _) in per_group.items()}
    by_group = {g: {e.label: e for e in table_entries(rs, recipes, real)} for g, (rs, real) in per_group.items()}
    entries = table_entries(rows, recipes, real_rows)
    doc.p("Each implementation's mean relative L2 error (deq: against the FP64 oracle on the inputs it computed "
          "with) and its bootstrap 95% confidence interval over the inputs, per model and for the Gaussian "
          f"inputs ({', '.join(f'{g}: {n_in[g]}' for g in groups)} inputs); with fewer than {MIN_INTERVAL_N} "
          "inputs, the mean alone (an interval over 2-3 layers carries no information)."
          + (" Rows marked *(real, device)* are real kernels measured on that device, each after the recipe it is "
             "paired with (its emulation); the others are the emulator's recipes. Where a real kernel ran on "
             "fewer inputs, the cell says on how many." if any(e.real for e in entries) else ""))
    if unavailable:
        doc.p(f"Real implementations not run on this machine: {', '.join(f'`{n}`' for n in unavailable)} (each "
              "with the reason under [Real kernels vs their emulations](#t-real-not-run)).")
    own = [e.label for e in entries if e.self_quantizing]
    if own:
        doc.p(f"Marked (orig): {', '.join(f'`{n}`' for n in own)} "
              + ("quantizes for itself" if len(own) == 1 else "quantize for themselves")
              + ", so it has no `deq` error; the cell is the error against the FP64 oracle on the original "
              "inputs (with the kernel's own quantization of Q, K and V).")
    body = []
    for e in entries:
        cells = [e.label]
        for g in groups:
            ge = by_group[g].get(e.label)
            metric = "orig_rel_l2" if e.self_quantizing else "deq_rel_l2"
            vals = ge.values(metric) if ge else []
            cell = fmt_ci(mean_or_ci(vals), "err") + (" (orig)" if e.self_quantizing else "") if vals else "-"
            if vals and len(vals) < n_in[g]:
                cell += f" ({fmt(len(vals), 'int')} of {fmt(n_in[g], 'int')} inputs)"
            cells.append(cell)
        body.append(cells)
    doc.table("t-summary-error", ["implementation", *groups], body)
    if "zyfa" not in recipes:
        return
    peers = [r for r in recipes if r != "zyfa" and r not in ABLATIONS]
    doc.p("Per model and for the Gaussian inputs: zyfa's mean relative L2 error (deq), and the geometric mean "
          "over the same inputs of zyfa's error divided by each peer's (deq; below 1: zyfa is more accurate). "
          "Intervals are in the sections below."
          + (" Real kernels are left out of this table (one column per emulated peer); each section's "
             "\"zyfa against each peer\" table has them." if real_rows else ""))
    body = []
    for g in groups:
        grows = [r for r in rows if group_of(r) == g]
        z = [row_value(r, "deq_rel_l2") for r in grows if r["recipe"] == "zyfa"]
        cells = [g, fmt(len(z), "int"), fmt(float(np.mean(z)) if z else None, "err")]
        for p in peers:
            ratios = paired_values(grows, "zyfa", p, "deq_rel_l2")
            ok = ratios and all(x > 0 and math.isfinite(x) for x in ratios)
            cells.append(fmt(math.exp(float(np.mean(np.log(ratios)))), "ratio") if ok else "-")
        body.append(cells)
    doc.table("t-summary", ["inputs", "n", "zyfa rel L2 (deq)", *(f"zyfa/{p}" for p in peers)], body)


def section_ablation(doc: Doc, gname: str, rows: list, recipes: list) -> None:
    abl = [r for r in recipes if r in ABLATIONS]
    if "zyfa" not in recipes or not abl:
        return
    doc.h(3, f"{gname}: ablation of ZYFA's techniques")
    doc.p("Each variant switches one choice of `zyfa` off; the ratio variant / zyfa is paired per input "
          "(geometric mean, bootstrap 95% CI). Above 1: the technique reduces error; below 1: it costs "
          "accuracy (technique 1 is a speed technique). Technique 2, the ping-pong schedule, changes no "
          "numerics (it reorders independent work between warp groups), so it has no accuracy ablation: its "
          "effect is on speed, see the speed section.")
    by = rows_by_recipe(rows)
    body = []
    for name in ["zyfa", *abl]:
        rs = by.get(name, [])
        if not rs:
            continue
        tech, what = ("-", "all three techniques on (reference)") if name == "zyfa" else ABLATIONS[name]
        mean = fmt_ci(mean_ci([row_value(r, "deq_rel_l2") for r in rs]), "err")
        if name == "zyfa":
            ratio_d = ratio_o = "1"
        else:
            ratio_d = fmt_ci(mean_ci(paired_values(rows, name, "zyfa", "deq_rel_l2"), log=True), "ratio")
            ratio_o = fmt_ci(mean_ci(paired_values(rows, name, "zyfa", "orig_rel_l2"), log=True), "ratio")
        flushed = fmt(float(np.mean([row_value(r, "p_flushed_frac") for r in rs])), "err")
        body.append([name, tech, what, mean, ratio_d, ratio_o, flushed])
    doc.table(f"t-{slug(gname)}-ablation", ["recipe", "technique", "change", "rel L2 (deq)",
                                             "variant/zyfa (deq)", "variant/zyfa (orig)", "P flushed to 0"], body,
              text=True)


def _heads_of(row: dict) -> list:
    hs = row.get("input_q_heads")
    if isinstance(hs, list):
        return hs
    n = row.get("heads_q") or 0
    return list(range(int(n)))


def section_layers(doc: Doc, gname: str, rows: list, recipes: list, plots: bool) -> None:
    tkey = slug(gname)
    layers = sorted({(int(r["input_layer"]), str(r.get("input_layer_type") or "")) for r in rows
                     if r.get("input_layer") is not None})
    if not layers:
        return
    doc.h(3, f"{gname}: error by layer")
    doc.p("Relative L2 error (deq) of each captured layer (all its captured heads); the mean over rows when "
          "a layer appears in several inputs.")
    by = defaultdict(list)
    for r in rows:
        if r.get("input_layer") is not None:
            by[(int(r["input_layer"]), r["recipe"])].append(row_value(r, "deq_rel_l2"))
    body = [[f"{lay}" + (f" ({typ})" if typ and typ != "None" else "")]
            + [fmt(float(np.mean(by[(lay, n)])), "err") if by.get((lay, n)) else "-" for n in recipes]
            for lay, typ in layers]
    doc.table(f"t-{tkey}-layers", ["layer", *recipes], body)

    with_heads = [n for n in recipes if any(r["recipe"] == n and isinstance(r.get("deq_rel_l2_heads"), list)
                                            for r in rows)]
    if not with_heads:
        doc.p("No per-head errors in the results (the study adds them: `deq_rel_l2_heads`).")
        return
    heads = sorted({h for r in rows for h in _heads_of(r)})
    grid: dict[str, np.ndarray] = {}
    for n in with_heads:
        g = np.full((len(layers), len(heads)), np.nan)
        acc = defaultdict(list)
        for r in rows:
            if r["recipe"] != n or not isinstance(r.get("deq_rel_l2_heads"), list):
                continue
            for h, v in zip(_heads_of(r), r["deq_rel_l2_heads"], strict=False):
                acc[(int(r["input_layer"]), h)].append(float(v))
        for i, (lay, _) in enumerate(layers):
            for j, h in enumerate(heads):
                if acc.get((lay, h)):
                    g[i, j] = float(np.mean(acc[(lay, h)]))
        grid[n] = g
    doc.h(3, f"{gname}: error by layer and head")
    doc.p("Relative L2 error (deq) of each captured query head; the FP8 scales are those of the whole input "
          "(per tensor over the captured heads), as in the runner. Mean over layers and heads with a "
          "bootstrap 95% CI in the last row.")
    body = []
    for i, (lay, _) in enumerate(layers):
        for j, h in enumerate(heads):
            if all(np.isnan(grid[n][i, j]) for n in with_heads):
                continue
            body.append([f"L{lay} h{h}", *(fmt(grid[n][i, j], "err") for n in with_heads)])
    body.append(["mean [95% CI]", *(fmt_ci(mean_ci(grid[n][~np.isnan(grid[n])]), "err") for n in with_heads)])
    doc.table(f"t-{tkey}-heads", ["layer, head", *with_heads], body)
    if plots:
        plt = pyplot()
        # lazy: matplotlib is optional (and heavy)
        from matplotlib.colors import LogNorm

        shown = with_heads[:6]
        vals = np.concatenate([grid[n][np.isfinite(grid[n])] for n in shown])
        vals = vals[vals > 0]
        norm = LogNorm(vmin=float(vals.min()), vmax=float(vals.max())) if vals.size else None
        fig, axes = plt.subplots(1, len(shown), figsize=(1.2 + 2.1 * len(shown) * max(1, len(heads)) / 3,
                                                         0.9 + 0.45 * len(layers)), squeeze=False)
        for ax, n in zip(axes[0], shown, strict=True):
            im = ax.imshow(grid[n], norm=norm, cmap="viridis", aspect="auto")
            ax.set_title(n, fontsize=9)
            ax.set_xticks(range(len(heads)), [str(h) for h in heads], fontsize=7)
            ax.set_yticks(range(len(layers)), [str(lay) for lay, _ in layers], fontsize=7)
            ax.set_xlabel("query head", fontsize=8)
        axes[0][0].set_ylabel("layer", fontsize=8)
        fig.colorbar(im, ax=axes[0].tolist(), shrink=0.9, label="rel L2 (deq)")
        doc.img(f"fig_{tkey}_heads.png", png(fig), f"{gname}: relative L2 error (deq) by layer and query head")


_SPEC_KEYS = ("head_dim", "head_dim_v", "heads_q", "heads_kv", "causal", "window", "input_spec_std",
              "input_spec_outlier_frac", "input_spec_outlier_scale", "input_spec_outlier_tensors", "dtype", "batch")


def _config_label(key: tuple) -> str:
    d = dict(zip(_SPEC_KEYS, key, strict=True))
    hd = f"{d['head_dim']}" if d["head_dim_v"] in (None, d["head_dim"]) else f"{d['head_dim']}/{d['head_dim_v']}"
    s = f"d{hd} h{d['heads_q']}x{d['heads_kv']}"
    if d["causal"]:
        s += " causal"
    if d["window"]:
        s += f" window {d['window']}"
    if d["input_spec_outlier_frac"]:
        s += f" outliers {d['input_spec_outlier_frac']:g}x{d['input_spec_outlier_scale']:g}"
    if d["input_spec_std"] not in (None, 1.0):
        s += f" std {d['input_spec_std']:g}"
    return s


def section_seq(doc: Doc, gname: str, rows: list, recipes: list, plots: bool) -> None:
    configs = defaultdict(list)
    for r in rows:
        configs[tuple(r.get(k) for k in _SPEC_KEYS)].append(r)
    sweeps = [(k, rs) for k, rs in configs.items() if len({r["seq_q"] for r in rs}) >= 2]
    if not sweeps:
        return
    doc.h(3, f"{gname}: error against sequence length")
    doc.p("Relative L2 error (deq) at each sequence length, per input configuration (mean over seeds).")
    for key, rs in sweeps:
        label = _config_label(key)
        seqs = sorted({r["seq_q"] for r in rs})
        cell = defaultdict(list)
        for r in rs:
            cell[(r["seq_q"], r["recipe"])].append(row_value(r, "deq_rel_l2"))
        names = [n for n in recipes if any((s, n) in cell for s in seqs)]
        doc.p(f"**{label}**")
        body = [[fmt(s, "int"), *(fmt(float(np.mean(cell[(s, n)])), "err") if (s, n) in cell else "-"
                                  for n in names)] for s in seqs]
        tkey = slug(f"{gname} {label}")
        doc.table(f"t-{tkey}-seq", ["seq", *names], body)
        if plots:
            plt = pyplot()
            fig, ax = plt.subplots(figsize=(6, 3.4))
            for n in names:
                xs = [s for s in seqs if (s, n) in cell]
                ax.plot(xs, [np.mean(cell[(s, n)]) for s in xs], marker="o", ms=3, label=n,
                        lw=2.2 if n == "zyfa" else 1.0, **_style(n, recipes))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_ylabel("rel L2 (deq)")
            ax.set_title(label, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
            doc.img(f"fig_{tkey}_seq.png", png(fig), f"{gname}, {label}: error against sequence length")


def section_headdim(doc: Doc, gname: str, rows: list, recipes: list) -> None:
    hds = sorted({_hd(r) for r in rows}, key=lambda s: [int(x) for x in s.split("/")])
    if len(hds) < 2:
        return
    doc.h(3, f"{gname}: error by head dim")
    doc.p("Mean relative L2 error (deq) over the inputs of each head dim (all lengths, masks and outlier "
          "settings), and the number of inputs.")
    cell = defaultdict(list)
    for r in rows:
        cell[(_hd(r), r["recipe"])].append(row_value(r, "deq_rel_l2"))
    body = []
    for h in hds:
        n_in = len({input_key(r) for r in rows if _hd(r) == h})
        body.append([h, fmt(n_in, "int"), *(fmt(float(np.mean(cell[(h, n)])), "err") if (h, n) in cell else "-"
                                            for n in recipes)])
    doc.table(f"t-{slug(gname)}-headdim", ["head dim", "inputs", *recipes], body)


def section_causes(doc: Doc, rows: list, recipes: list, plots: bool) -> None:
    doc.h(2, "Error beside input properties (rank correlations)")
    present = [c for c in CAUSES if any(r.get(c) is not None for r in rows)]
    missing = [c for c in CAUSES if c not in present]
    doc.p("Spearman's rank correlation between each recipe's relative L2 error and a property of the input: "
          "the outlier ratio max|x| / rms(x) of K and Q (a per-tensor FP8 scale maps max|x| to 448, so large "
          "ratios leave typical values few codes: this acts on the quantization of Q and K, so it is shown "
          "against the `orig` error too), the mean attention entropy of the exact softmax (low: peaked "
          "attention, many tiny probabilities), and the fraction of probabilities the recipe rounds to zero. "
          "Over all inputs the correlations also carry the differences between sources (captures against "
          "Gaussian inputs), hence the tables per source. Each cell is ρ with its two-sided p and n (the inputs "
          "with both values); p is per cell, not corrected for the table's many tests (with n = 8, |ρ| below 0.74 "
          "is not significant at 5%). A correlation is not a cause: these properties move together across inputs.")
    if missing:
        doc.p(f"Not in the results: {', '.join(f'`{c}`' for c in missing)} (`zyfa study` adds the input "
              "features; the runner's rows alone carry `p_flushed_frac`).")
    if not present:
        return
    by = rows_by_recipe(rows)
    columns = [(c, "deq_rel_l2", CAUSES[c]) for c in present]
    columns += [(c, "orig_rel_l2", f"{CAUSES[c]} (orig)") for c in ("feat_k_outlier", "feat_q_outlier")
                if c in present]
    captures = [r for r in rows if r.get("input_source") == "capture"]
    gaussian = [r for r in rows if r.get("input_source") != "capture"]
    populations = [("all inputs", rows, "t-causes")]
    if captures and gaussian:
        populations += [("captures", captures, "t-causes-captures"), (GAUSSIAN, gaussian, "t-causes-gaussian")]
    for label, prow, key in populations:
        pby = rows_by_recipe(prow)
        body = []
        for n in recipes:
            rs = pby.get(n, [])
            cells = [n, fmt(len(rs), "int")]
            for c, err, _ in columns:
                pairs = [(row_value(r, c), row_value(r, err)) for r in rs if r.get(c) is not None]
                rho, p, n_pairs = spearman_with_p([a for a, _ in pairs], [b for _, b in pairs])
                if not math.isfinite(rho):
                    cells.append("-")
                    continue
                cells.append(f"{fmt(rho, 'corr')} (p {p:.2g}, n {n_pairs})")
            body.append(cells)
        doc.p(f"**{label}** (error: deq unless marked orig):")
        doc.table(key, ["recipe", "inputs", *(h for _, _, h in columns)], body)
    if plots:
        plt = pyplot()
        shown = [n for n in recipes if n not in ABLATIONS][:8]
        # lazy: matplotlib is optional (and heavy)
        from matplotlib.ticker import NullFormatter

        fig, axes = plt.subplots(1, len(present), figsize=(3.4 * len(present), 3.0), squeeze=False, sharey=True)
        for ax, c in zip(axes[0], present, strict=True):
            for n in shown:
                pts = [(row_value(r, c), row_value(r, "deq_rel_l2")) for r in by.get(n, []) if r.get(c) is not None]
                if c == "p_flushed_frac":
                    pts = [(a, b) for a, b in pts if a > 0]
                if pts:
                    ax.scatter([a for a, _ in pts], [b for _, b in pts], s=9, label=n, alpha=0.75,
                               color=_style(n, recipes)["color"])
            ax.set_yscale("log")
            if c != "feat_entropy_nats":
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.tick_params(labelsize=7)
            ax.set_xlabel(CAUSES[c], fontsize=8)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("rel L2 (deq)")
        handles = {lab: h for ax in axes[0] for h, lab in zip(*ax.get_legend_handles_labels(), strict=True)}
        fig.tight_layout()
        if handles:
            fig.legend(list(handles.values()), list(handles), fontsize=7, loc="center left",
                       bbox_to_anchor=(1.0, 0.5))
        doc.img("fig_causes.png", png(fig), "Error beside input properties, one point per input (inputs with no "
                "flushed probability are left out of the last panel)")


# ---------------------------------------------------------------------------------------------- provenance

_PROV_KEYS = ("run_id", "date_utc", "zyfa_version", "git_commit", "git_dirty", "python", "torch", "numpy", "scipy",
              "platform", "cpu", "cpu_count", "device", "device_name", "cuda_device", "torch_cuda", "seed")


def section_provenance(doc: Doc, res: Results) -> None:
    doc.h(2, "Provenance")
    columns = []  # one per run: a file's, or each segment of a resumed file (run_provenances, oldest first)
    for name, p in res.provenances:
        runs = run_provenances(p) or [{}]
        columns += [(f"{name} (run {i} of {len(runs)})" if len(runs) > 1 else name, r) for i, r in enumerate(runs, 1)]
    keys = [k for k in _PROV_KEYS if any(k in p for _, p in columns)]
    extra = sorted({k for _, p in columns for k, v in p.items()
                    if k not in keys and k not in ("recipes", "inputs", "argv", "study_notes")
                    and isinstance(v, (str, int, float, bool))})
    body = []
    for k in [*keys, *extra, "argv"]:
        vals = []
        for _, p in columns:
            v = p.get(k)
            if isinstance(v, list):
                v = shlex.join(str(x) for x in v)
            vals.append("-" if v is None else (fmt(v, "num") if isinstance(v, float) else str(v)))
        body.append([k, *vals])
    doc.table("t-provenance", ["", *(name for name, _ in columns)], body, text=True)
    for name, p in res.provenances:
        if len(run_provenances(p)) > 1:
            doc.p(f"`{name}` was resumed: {len(run_provenances(p))} runs made its rows, a column each above (oldest "
                  "first); each row's `run_id` names its run.")
        if line := sharding_line(p):
            doc.p(f"`{name}` was a sharded run (torchrun, docs/SHARDING.md): {line}.")


def section_inputs(doc: Doc, rows: list) -> None:
    doc.h(2, "Inputs")
    doc.p("Every input, its shape and mask, the hash of its Q/K/V (sha256 of dtypes, shapes and bytes, first "
          "16 hex digits) and of its capture file, and the features the study computed from it.")
    seen, body = set(), []
    feats = [c for c in ("feat_q_outlier", "feat_k_outlier", "feat_v_outlier", "feat_entropy_nats")
             if any(c in r for r in rows)]
    for r in rows:
        k = input_key(r)
        if k in seen:
            continue
        seen.add(k)
        shape = f"{r.get('batch')}x{r.get('heads_q')}x{r.get('heads_kv')}x{r.get('seq_q')}x{_hd(r)}"
        mask = "causal" if r.get("causal") else "full"
        if r.get("window"):
            mask += f", window {r['window']}"
        fsha = str(r.get("input_file_sha256") or "-")[:16]
        body.append([r["input"], group_of(r), shape, mask, str(r.get("dtype", "-")),
                     str(r.get("input_content_hash", "-")), fsha, *(fmt(r.get(c), "feat") for c in feats)])
    doc.table("t-inputs", ["input", "source", "b x hq x hkv x s x d", "mask", "dtype", "content hash",
                           "file sha256", *feats], body)


def section_all(doc: Doc, rows: list, recipes: list) -> None:
    doc.h(2, "Every result")
    doc.p("Relative L2 error (deq) of every (input, recipe) row.")
    cell, inputs = {}, []
    for r in rows:
        k = input_key(r)
        if k not in cell:
            cell[k] = {}
            inputs.append((k, r["input"]))
        cell[k][r["recipe"]] = r
    body = [[name, *(fmt(cell[k][n].get("deq_rel_l2"), "err") if n in cell[k] else "-" for n in recipes)]
            for k, name in inputs]
    doc.table("t-all", ["input", *recipes], body)
