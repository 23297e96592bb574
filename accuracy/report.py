"""``zyfa report``: render accuracy result files (and benchmark JSON) into Markdown, PNG plots and one HTML file.

    zyfa report --results reports/study/results.jsonl --out reports/study
    zyfa report --results a.jsonl,b.jsonl --bench reports/bench_2026-11-29.json --out reports/mine
    zyfa report --results reports/study/results.jsonl --impact 'reports/impact/results*.jsonl' --out reports/mine

Writes ``report.md`` (with ``fig_*.png`` next to it) and ``report.html`` (self-contained: the same content,
plots inlined as base64 data URIs, inline CSS, no script, no external resource). It reads result files
only and never runs a kernel. Every number in both documents is computed from the result rows (or the
benchmark rows) by this module and formatted by :func:`fmt`, so a test can parse them back.

Content, per model (capture inputs) and for Gaussian inputs: a recipe x metric table with bootstrap 95%
confidence intervals over the inputs; ``zyfa``'s paired error ratio against each peer on the same inputs
(geometric mean, bootstrap CI); the ablation of ZYFA's techniques; per-layer tables and per-layer x
per-head heatmaps (captures); error against sequence length (Gaussian); then, over all inputs, the error
against its causes (Q/K outliers, attention entropy, flushed probabilities), the benchmark tables, every
(input, recipe) error, and the inputs with their hashes. Provenance and the regenerating command come first.
With ``--impact`` (``zyfa impact`` result files, merged), the model-impact section of :mod:`accuracy.impact`
(perplexity and next-token KL per model and recipe with CIs over windows, the per-layer sweep) comes after
the model and Gaussian sections, with a figure of the KL per recipe.

Exposed: ``add_arguments(parser)``, ``main(args) -> int``, ``load_results(paths)``, ``build_report(...)``,
``render_markdown(doc)``, ``render_html(doc)``, ``fmt(value, kind)``.
"""

from __future__ import annotations

import argparse
import base64
import glob
import html
import json
import math
import re
import shlex
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from accuracy.blocks import blocks_markdown
from accuracy.results_io import read_jsonl

__all__ = ["Doc", "add_arguments", "build_report", "fmt", "load_impact", "load_results", "main", "render_html",
           "render_markdown", "write_report"]

# ZYFA's ablation recipes: name -> what is switched off (DESIGN.md "The three ZYFA techniques")
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
GAUSSIAN = "Gaussian inputs"
METRIC_NOTE = ("`deq`: error against the FP64 oracle on the dequantized inputs the recipe saw (the error its "
               "arithmetic adds: P rounding, row sums, accumulation, output rounding); `orig`: against the "
               "FP64 oracle on the original inputs (adds the quantization of Q, K and V).")


# ---------------------------------------------------------------------------------------------- formatting

def fmt(v, kind: str = "err") -> str:
    """The one number format of the report.

    kinds: ``err`` (errors, fractions) 3 significant digits in scientific notation; ``db`` 2 decimals;
    ``ratio`` 3 decimals; ``corr`` signed 2 decimals; ``cos`` 6 decimals; ``feat`` 3 significant digits;
    ``int``; ``num`` (benchmark values) 4 significant digits. None -> "-"; NaN -> "nan"; infinities "inf".
    """
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, str):
        return v
    if isinstance(v, int) and kind in ("int", "num"):
        return str(v)
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if kind == "db":
        return f"{v:.2f}"
    if kind == "ratio":
        return f"{v:.3f}"
    if kind == "corr":
        return f"{v:+.2f}"
    if kind == "cos":
        return f"{v:.6f}"
    if kind == "feat":
        return f"{v:.3g}"
    if kind == "int":
        return str(int(v))
    if kind == "num":
        return f"{v:.4g}"
    return f"{v:.3e}"


def kind_of(metric: str) -> str:
    if metric.endswith("_db"):
        return "db"
    if metric.endswith("cosine"):
        return "cos"
    if metric.startswith("feat_"):
        return "feat"
    return "err"


def fmt_ci(ci, kind: str) -> str:
    est, lo, hi = (float(x) for x in ci)
    if (lo == est == hi) or math.isnan(lo) or math.isnan(hi):  # one value, or no interval
        return fmt(est, kind)
    return f"{fmt(est, kind)} [{fmt(lo, kind)}, {fmt(hi, kind)}]"


# ---------------------------------------------------------------------------------------------- document

@dataclass
class Doc:
    """Blocks rendered alike to Markdown and HTML: ("h", level, text), ("p", text), ("code", text),
    ("table", key, header, rows, text), ("img", path, caption)."""

    title: str
    blocks: list = field(default_factory=list)
    images: dict = field(default_factory=dict)  # file name -> PNG bytes

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def table(self, key: str, header: Sequence[str], rows: Sequence[Sequence[str]], *, text: bool = False) -> None:
        """text: cells hold prose (left-aligned, wrapped in HTML); else numbers (right-aligned, one line)."""
        self.blocks.append(("table", key, list(header), [list(r) for r in rows], text))

    def img(self, name: str, png: bytes, caption: str) -> None:
        self.images[name] = png
        self.blocks.append(("img", name, caption))


def render_markdown(doc: Doc) -> str:
    return "\n".join([f"# {doc.title}", "", *blocks_markdown(doc.blocks, anchors=True)]).rstrip() + "\n"


def _inline_html(text: str) -> str:
    s = html.escape(text, quote=False)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)
    return s


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#1a1a1a;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}h3{margin-top:1.5em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0 1em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right;white-space:nowrap}
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}
.tw{overflow-x:auto}pre{background:#f6f6f6;padding:.7em;overflow-x:auto;white-space:pre-wrap}
code{background:#f2f2f2;padding:0 .2em}figure{margin:1em 0}img{max-width:100%}
figcaption{font-size:.85em;color:#555}
table.text td{text-align:left;white-space:normal;max-width:48em;overflow-wrap:anywhere}
"""


def render_html(doc: Doc) -> str:
    """One self-contained HTML document: inline CSS, images as data URIs, no script."""
    body = [f"<h1>{_inline_html(doc.title)}</h1>"]
    for b in doc.blocks:
        if b[0] == "h":
            body.append(f"<h{b[1]}>{_inline_html(b[2])}</h{b[1]}>")
        elif b[0] == "p":
            body.append(f"<p>{_inline_html(b[1])}</p>")
        elif b[0] == "code":
            body.append(f"<pre><code>{html.escape(b[1], quote=False)}</code></pre>")
        elif b[0] == "table":
            _, key, header, rows, text = b
            cls = ' class="text"' if text else ""
            th = "".join(f"<th>{_inline_html(c)}</th>" for c in header)
            trs = "".join("<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in r) + "</tr>" for r in rows)
            body.append(f'<div class="tw"><table id="{html.escape(key)}"{cls}><thead><tr>{th}</tr></thead>'
                        f"<tbody>{trs}</tbody></table></div>")
        elif b[0] == "img":
            data = base64.b64encode(doc.images[b[1]]).decode("ascii")
            cap = _inline_html(b[2])
            body.append(f'<figure><img alt="{html.escape(b[2])}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{cap}</figcaption></figure>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(doc.title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


# ---------------------------------------------------------------------------------------------- data

@dataclass
class Results:
    rows: list
    provenances: list  # (path, provenance dict)
    recipes: list  # in run order, zyfa first


def _read_one(path: Path) -> tuple[list[dict], dict]:
    if path.suffix.lower() == ".jsonl":  # no torch import needed for JSONL
        return read_jsonl(path)
    from accuracy.runner import read_results

    rows = read_results(path)
    return list(rows), rows.provenance


def load_results(paths: Sequence[str | Path]) -> Results:
    """Rows of every result file (JSONL or CSV), each tagged with ``_file``; recipes in run order."""
    rows, provs, order = [], [], []
    names = [Path(p).name for p in paths]
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise FileNotFoundError(f"result file not found: {path}")
        label = path.name if names.count(path.name) == 1 else str(path)
        r, prov = _read_one(path)
        for row in r:
            row["_file"] = label
        rows += r
        provs.append((label, prov))
        order += [x for x in prov.get("recipes", []) if x not in order]
    if not rows:
        raise ValueError(f"no result rows in {', '.join(map(str, paths))}")
    order += [r["recipe"] for r in rows if r["recipe"] not in order]
    present = {r["recipe"] for r in rows}
    order = [x for x in order if x in present]
    if "zyfa" in order:
        order.remove("zyfa")
        order.insert(0, "zyfa")
    return Results(rows, provs, order)


def group_of(row: dict) -> str:
    if row.get("input_source") == "capture":
        model = str(row.get("input_model") or row.get("input_file") or "capture")
        return model.rstrip("/").split("/")[-1]
    return GAUSSIAN


def _val(row: dict, key: str) -> float:
    v = row.get(key)
    return math.nan if v is None else float(v)


def _ci(values, *, log: bool = False):
    """Mean and bootstrap 95% CI (scipy BCa via accuracy.metrics.bootstrap_ci); log: geometric mean."""
    from accuracy.metrics import bootstrap_ci

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            lx = np.log(x)
        if not np.all(np.isfinite(lx)):
            return (math.nan, math.nan, math.nan)
        est, lo, hi = bootstrap_ci(lx)
        return (math.exp(est), math.exp(lo), math.exp(hi))
    if np.isinf(x).any():
        m = float(np.mean(x))
        return (m, m, m)
    return tuple(bootstrap_ci(x))


def _hd(row: dict) -> str:
    d, dv = row.get("head_dim"), row.get("head_dim_v")
    return f"{d}" if dv in (None, d) else f"{d}/{dv}"


def _input_key(row: dict):
    """The same inputs pair across result files: name and content hash (the file when there is no hash)."""
    return (row["input"], row.get("input_content_hash") or row.get("_file"))


def _by_recipe(rows) -> dict[str, list[dict]]:
    out = defaultdict(list)
    for r in rows:
        out[r["recipe"]].append(r)
    return out


# ---------------------------------------------------------------------------------------------- plots

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    _plt().close(fig)
    return buf.getvalue()


def _style(name: str, recipes: list) -> dict:
    """One color per recipe (tab20, in report order) and a dashed line for ZYFA's ablations."""
    cmap = _plt().get_cmap("tab20" if len(recipes) > 10 else "tab10")
    i = recipes.index(name) if name in recipes else 0
    return {"color": cmap(i % cmap.N), "ls": "--" if name in ABLATIONS else "-"}


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


# ---------------------------------------------------------------------------------------------- sections

def _section_recipes(doc: Doc, gname: str, rows: list, recipes: list, plots: bool) -> None:
    slug = _slug(gname)
    by = _by_recipe(rows)
    n_inputs = len({_input_key(r) for r in rows})
    doc.h(3, f"{gname}: error by recipe")
    few = (" With so few inputs the intervals only show the spread; the per-head table below has more samples."
           if n_inputs < 5 else "")
    doc.p(f"Mean over {n_inputs} input(s) with its bootstrap 95% confidence interval over the inputs "
          f"(each capture input is one layer, all its captured heads).{few} {METRIC_NOTE}")
    header = ["recipe", "inputs", *MAIN_METRICS.values()]
    body, cis = [], {}
    for name in recipes:
        rs = by.get(name, [])
        if not rs:
            continue
        cells = [name, fmt(len(rs), "int")]
        for m in MAIN_METRICS:
            ci = _ci([_val(r, m) for r in rs])
            cis[(name, m)] = ci
            cells.append(fmt_ci(ci, kind_of(m)))
        body.append(cells)
    doc.table(f"t-{slug}-recipes", header, body)
    other = [m for m in OTHER_METRICS if any(m in r for r in rows)]
    if other:
        doc.p("Other metrics, mean over the inputs (maxima: the largest).")
        body2 = []
        for name in recipes:
            rs = by.get(name, [])
            if not rs:
                continue
            cells = [name]
            for m in other:
                vals = [_val(r, m) for r in rs]
                v = max(vals) if ("max" in m and not m.endswith("p50")) else float(np.mean(vals))
                cells.append(fmt(v, kind_of(m)))
            body2.append(cells)
        doc.table(f"t-{slug}-other", ["recipe", *other], body2)
    nan = sorted({r["recipe"] for r in rows if r.get("has_nan")})
    if nan:
        doc.p(f"NaN or Inf in the output of: {', '.join(nan)} (their intervals are nan).")
    if plots and body:
        plt = _plt()
        names = [b[0] for b in body]
        fig, ax = plt.subplots(figsize=(max(5.0, 0.55 * len(names)), 3.2))
        for i, (key, color) in enumerate((("deq_rel_l2", "#1f77b4"), ("orig_rel_l2", "#ff7f0e"))):
            est = np.array([cis[(n, key)][0] for n in names])
            lo = np.array([cis[(n, key)][1] for n in names])
            hi = np.array([cis[(n, key)][2] for n in names])
            x = np.arange(len(names)) + (i - 0.5) * 0.38
            ax.bar(x, est, width=0.38, color=color, label=MAIN_METRICS[key])
            ok = np.isfinite(lo) & np.isfinite(hi)
            ax.errorbar(x[ok], est[ok], yerr=[est[ok] - lo[ok], hi[ok] - est[ok]], fmt="none", ecolor="k",
                        lw=0.8, capsize=2)
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(names)), names, rotation=45, ha="right")
        ax.set_ylabel("relative L2 error")
        ax.set_title(f"{gname}: mean error, 95% CI")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="y", alpha=0.3)
        doc.img(f"fig_{slug}_recipes.png", _png(fig), f"{gname}: relative L2 error by recipe (mean, 95% CI)")


def _paired(rows: list, a: str, b: str, metric: str) -> list[float]:
    va = {_input_key(r): _val(r, metric) for r in rows if r["recipe"] == a}
    vb = {_input_key(r): _val(r, metric) for r in rows if r["recipe"] == b}
    return [va[k] / vb[k] for k in va if k in vb and vb[k] > 0]


def _section_ratios(doc: Doc, gname: str, rows: list, recipes: list) -> None:
    if "zyfa" not in recipes:
        return
    peers = [r for r in recipes if r != "zyfa" and r not in ABLATIONS]
    if not peers:
        return
    doc.h(3, f"{gname}: zyfa against each peer, on the same inputs")
    doc.p("Per input, the ratio zyfa / peer of the relative L2 error; the geometric mean of the ratios with "
          "a bootstrap 95% CI (over inputs, on the log ratios). Below 1: zyfa is more accurate.")
    body = []
    for p in peers:
        deq = _paired(rows, "zyfa", p, "deq_rel_l2")
        orig = _paired(rows, "zyfa", p, "orig_rel_l2")
        if not deq:
            continue
        wins = sum(x < 1 for x in deq)
        body.append([p, fmt(len(deq), "int"), fmt_ci(_ci(deq, log=True), "ratio"),
                     fmt_ci(_ci(orig, log=True), "ratio"), f"{wins}/{len(deq)}"])
    doc.table(f"t-{_slug(gname)}-ratios", ["peer", "pairs", "zyfa/peer rel L2 (deq)",
                                           "zyfa/peer rel L2 (orig)", "zyfa lower"], body)


def _section_summary(doc: Doc, groups: list, rows: list, recipes: list) -> None:
    if "zyfa" not in recipes:
        return
    peers = [r for r in recipes if r != "zyfa" and r not in ABLATIONS]
    doc.h(2, "Summary")
    doc.p("Per model and for the Gaussian inputs: zyfa's mean relative L2 error (deq), and the geometric mean "
          "over the same inputs of zyfa's error divided by each peer's (deq; below 1: zyfa is more accurate). "
          "Intervals are in the sections below.")
    body = []
    for g in groups:
        grows = [r for r in rows if group_of(r) == g]
        z = [_val(r, "deq_rel_l2") for r in grows if r["recipe"] == "zyfa"]
        cells = [g, fmt(len(z), "int"), fmt(float(np.mean(z)) if z else None, "err")]
        for p in peers:
            ratios = _paired(grows, "zyfa", p, "deq_rel_l2")
            ok = ratios and all(x > 0 and math.isfinite(x) for x in ratios)
            cells.append(fmt(math.exp(float(np.mean(np.log(ratios)))), "ratio") if ok else "-")
        body.append(cells)
    doc.table("t-summary", ["inputs", "n", "zyfa rel L2 (deq)", *(f"zyfa/{p}" for p in peers)], body)


def _section_ablation(doc: Doc, gname: str, rows: list, recipes: list) -> None:
    abl = [r for r in recipes if r in ABLATIONS]
    if "zyfa" not in recipes or not abl:
        return
    doc.h(3, f"{gname}: ablation of ZYFA's techniques")
    doc.p("Each variant switches one choice of `zyfa` off; the ratio variant / zyfa is paired per input "
          "(geometric mean, bootstrap 95% CI). Above 1: the technique reduces error; below 1: it costs "
          "accuracy (technique 1 is a speed technique). Technique 2, the ping-pong schedule, changes no "
          "numerics (it reorders independent work between warp groups), so it has no accuracy ablation: its "
          "effect is on speed, see the speed section.")
    by = _by_recipe(rows)
    body = []
    for name in ["zyfa", *abl]:
        rs = by.get(name, [])
        if not rs:
            continue
        tech, what = ("-", "all three techniques on (reference)") if name == "zyfa" else ABLATIONS[name]
        mean = fmt_ci(_ci([_val(r, "deq_rel_l2") for r in rs]), "err")
        if name == "zyfa":
            ratio_d = ratio_o = "1"
        else:
            ratio_d = fmt_ci(_ci(_paired(rows, name, "zyfa", "deq_rel_l2"), log=True), "ratio")
            ratio_o = fmt_ci(_ci(_paired(rows, name, "zyfa", "orig_rel_l2"), log=True), "ratio")
        flushed = fmt(float(np.mean([_val(r, "p_flushed_frac") for r in rs])), "err")
        body.append([name, tech, what, mean, ratio_d, ratio_o, flushed])
    doc.table(f"t-{_slug(gname)}-ablation", ["recipe", "technique", "change", "rel L2 (deq)",
                                             "variant/zyfa (deq)", "variant/zyfa (orig)", "P flushed to 0"], body,
              text=True)


def _heads_of(row: dict) -> list:
    hs = row.get("input_q_heads")
    if isinstance(hs, list):
        return hs
    n = row.get("heads_q") or 0
    return list(range(int(n)))


def _section_layers(doc: Doc, gname: str, rows: list, recipes: list, plots: bool) -> None:
    slug = _slug(gname)
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
            by[(int(r["input_layer"]), r["recipe"])].append(_val(r, "deq_rel_l2"))
    body = [[f"{lay}" + (f" ({typ})" if typ and typ != "None" else "")]
            + [fmt(float(np.mean(by[(lay, n)])), "err") if by.get((lay, n)) else "-" for n in recipes]
            for lay, typ in layers]
    doc.table(f"t-{slug}-layers", ["layer", *recipes], body)

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
    body.append(["mean [95% CI]", *(fmt_ci(_ci(grid[n][~np.isnan(grid[n])]), "err") for n in with_heads)])
    doc.table(f"t-{slug}-heads", ["layer, head", *with_heads], body)
    if plots:
        plt = _plt()
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
        doc.img(f"fig_{slug}_heads.png", _png(fig), f"{gname}: relative L2 error (deq) by layer and query head")


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


def _section_seq(doc: Doc, gname: str, rows: list, recipes: list, plots: bool) -> None:
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
            cell[(r["seq_q"], r["recipe"])].append(_val(r, "deq_rel_l2"))
        names = [n for n in recipes if any((s, n) in cell for s in seqs)]
        doc.p(f"**{label}**")
        body = [[fmt(s, "int"), *(fmt(float(np.mean(cell[(s, n)])), "err") if (s, n) in cell else "-"
                                  for n in names)] for s in seqs]
        slug = _slug(f"{gname} {label}")
        doc.table(f"t-{slug}-seq", ["seq", *names], body)
        if plots:
            plt = _plt()
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
            doc.img(f"fig_{slug}_seq.png", _png(fig), f"{gname}, {label}: error against sequence length")


def _section_headdim(doc: Doc, gname: str, rows: list, recipes: list) -> None:
    hds = sorted({_hd(r) for r in rows}, key=lambda s: [int(x) for x in s.split("/")])
    if len(hds) < 2:
        return
    doc.h(3, f"{gname}: error by head dim")
    doc.p("Mean relative L2 error (deq) over the inputs of each head dim (all lengths, masks and outlier "
          "settings), and the number of inputs.")
    cell = defaultdict(list)
    for r in rows:
        cell[(_hd(r), r["recipe"])].append(_val(r, "deq_rel_l2"))
    body = []
    for h in hds:
        n_in = len({_input_key(r) for r in rows if _hd(r) == h})
        body.append([h, fmt(n_in, "int"), *(fmt(float(np.mean(cell[(h, n)])), "err") if (h, n) in cell else "-"
                                            for n in recipes)])
    doc.table(f"t-{_slug(gname)}-headdim", ["head dim", "inputs", *recipes], body)


def _section_causes(doc: Doc, rows: list, recipes: list, plots: bool) -> None:
    from scipy import stats

    doc.h(2, "Error against its causes")
    present = [c for c in CAUSES if any(r.get(c) is not None for r in rows)]
    missing = [c for c in CAUSES if c not in present]
    doc.p("Spearman's rank correlation between each recipe's relative L2 error and a property of the input: "
          "the outlier ratio max|x| / rms(x) of K and Q (a per-tensor FP8 scale maps max|x| to 448, so large "
          "ratios leave typical values few codes: this acts on the quantization of Q and K, so it is shown "
          "against the `orig` error too), the mean attention entropy of the exact softmax (low: peaked "
          "attention, many tiny probabilities), and the fraction of probabilities the recipe rounds to zero. "
          "Over all inputs the correlations also carry the differences between sources (captures against "
          "Gaussian inputs), hence the tables per source.")
    if missing:
        doc.p(f"Not in the results: {', '.join(f'`{c}`' for c in missing)} (`zyfa study` adds the input "
              "features; the runner's rows alone carry `p_flushed_frac`).")
    if not present:
        return
    by = _by_recipe(rows)
    columns = [(c, "deq_rel_l2", CAUSES[c]) for c in present]
    columns += [(c, "orig_rel_l2", f"{CAUSES[c]} (orig)") for c in ("feat_k_outlier", "feat_q_outlier")
                if c in present]
    captures = [r for r in rows if r.get("input_source") == "capture"]
    gaussian = [r for r in rows if r.get("input_source") != "capture"]
    populations = [("all inputs", rows, "t-causes")]
    if captures and gaussian:
        populations += [("captures", captures, "t-causes-captures"), (GAUSSIAN, gaussian, "t-causes-gaussian")]
    for label, prow, key in populations:
        pby = _by_recipe(prow)
        body = []
        for n in recipes:
            rs = pby.get(n, [])
            cells = [n, fmt(len(rs), "int")]
            for c, err, _ in columns:
                pairs = [(_val(r, c), _val(r, err)) for r in rs if r.get(c) is not None]
                pairs = [(a, b) for a, b in pairs if math.isfinite(a) and math.isfinite(b)]
                if len(pairs) < 3 or len({a for a, _ in pairs}) < 2 or len({b for _, b in pairs}) < 2:
                    cells.append("-")
                    continue
                rho = stats.spearmanr([a for a, _ in pairs], [b for _, b in pairs]).statistic
                cells.append(fmt(float(rho), "corr"))
            body.append(cells)
        doc.p(f"**{label}** (error: deq unless marked orig):")
        doc.table(key, ["recipe", "inputs", *(h for _, _, h in columns)], body)
    if plots:
        plt = _plt()
        shown = [n for n in recipes if n not in ABLATIONS][:8]
        from matplotlib.ticker import NullFormatter

        fig, axes = plt.subplots(1, len(present), figsize=(3.4 * len(present), 3.0), squeeze=False, sharey=True)
        for ax, c in zip(axes[0], present, strict=True):
            for n in shown:
                pts = [(_val(r, c), _val(r, "deq_rel_l2")) for r in by.get(n, []) if r.get(c) is not None]
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
        doc.img("fig_causes.png", _png(fig), "Error against its causes, one point per input (inputs with no "
                "flushed probability are left out of the last panel)")


# ---------------------------------------------------------------------------------------------- impact

def load_impact(paths: Sequence[str | Path]) -> tuple[list[dict], list[dict]]:
    """(rows, files) of ``zyfa impact`` result files (several are merged by :mod:`accuracy.impact`)."""
    from accuracy import impact

    return impact.load_rows(paths)


def _section_impact(doc: Doc, rows: list, files: list, plots: bool) -> None:
    """The model-impact section: :func:`accuracy.impact.section_blocks` (its tables, notes, per-layer sweep),
    plus a figure of the KL per recipe and model."""
    from accuracy import impact

    blocks = impact.section_blocks(rows, files=files, level=2, key_prefix="t-impact")
    model_tables = [i for i, b in enumerate(blocks) if b[0] == "table" and b[1] != "t-impact-files"
                    and not b[1].startswith("t-impact-layers-")]
    for i, b in enumerate(blocks):
        if b[0] == "h":
            doc.h(b[1], b[2])
        elif b[0] == "p":
            doc.p(b[1])
        elif b[0] == "code":
            doc.code(b[1])
        elif b[0] == "table":
            doc.table(b[1], b[2], b[3], text=b[4])
        if plots and model_tables and i == model_tables[-1]:
            _impact_figure(doc, impact, rows)


def _impact_figure(doc: Doc, impact, rows: list) -> None:
    controls = ("fp32", "bf16")  # orders of magnitude below the FP8 recipes: in the tables, not on this axis
    summary = {g: [e for e in es if e["recipe"] not in controls] for g, es in
               impact.summarize(impact.prepare_rows(rows)[0]).items()}
    summary = {g: es for g, es in summary.items() if es}
    if not summary:
        return
    plt = _plt()
    n = max(len(v) for v in summary.values())
    fig, axes = plt.subplots(1, len(summary), figsize=(3.3 * len(summary) + 1.0, 0.9 + 0.24 * n), squeeze=False)
    for ax, (g, entries) in zip(axes[0], summary.items(), strict=True):
        names = [e["recipe"] for e in entries]
        est = np.array([e["kl"].estimate for e in entries])
        lo = np.array([e["kl"].low for e in entries])
        hi = np.array([e["kl"].high for e in entries])
        y = np.arange(len(names))
        ok = np.isfinite(lo) & np.isfinite(hi) & (hi > lo)
        ax.errorbar(est[ok], y[ok], xerr=[est[ok] - lo[ok], hi[ok] - est[ok]], fmt="none", ecolor="k", lw=0.8,
                    capsize=2)
        ax.scatter(est, y, s=14, c=["#d62728" if x == "zyfa" else "#1f77b4" for x in names], zorder=3)
        ax.set_yticks(y, names, fontsize=7)
        ax.invert_yaxis()
        top = np.nanmax(np.concatenate([est, hi[ok]]))
        if np.isfinite(top) and top > 0:
            ax.set_xlim(0, top * 1.08)
        ax.set_xlabel("KL(stock ‖ recipe), nats/token", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(impact.group_title(g, summary), fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    doc.img("fig_impact_kl.png", _png(fig), "Model impact: mean next-token KL against the stock model per FP8 recipe "
            "(all layers swapped; zyfa in red), with its 95% CI over windows where there are several; the fp32 "
            "and bf16 controls are in the tables")


# ---------------------------------------------------------------------------------------------- speed

_BENCH_PREFERRED = ("input", "impl", "recipe", "kernel", "backend", "b", "batch", "h", "heads", "heads_q", "h_kv",
                    "heads_kv", "s", "seq", "seq_q", "seq_k", "d_qk", "head_dim", "d_v", "head_dim_v", "causal",
                    "tflops", "ms", "time_ms", "v_transpose_ms", "tflops_incl_transpose", "rel_l2_vs_sdpa_bf16",
                    "sm_clock_mhz", "power_w", "error")


def load_bench(paths: Sequence[str | Path]) -> list[tuple[str, dict, list[dict]]]:
    """(file name, metadata, rows) of each benchmark JSON (``zyfa bench``: ``{"meta": {...}, "rows": [...]}``;
    a bare list of rows is accepted too)."""
    out = []
    for p in paths:
        path = Path(p)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e.msg})") from None
        meta: dict = {}
        if isinstance(data, dict):
            rows = next((data[k] for k in ("rows", "results") if isinstance(data.get(k), list)), None)
            for k in ("meta", "provenance"):
                if isinstance(data.get(k), dict):
                    meta.update(data[k])
            if rows is None:
                raise ValueError(f"{path}: no 'rows' list in the benchmark JSON")
        elif isinstance(data, list):
            rows = data
        else:
            raise ValueError(f"{path}: benchmark JSON must be a list of rows or an object holding one")
        out.append((path.name, meta, [r for r in rows if isinstance(r, dict)]))
    return out


def _bench_label(r: dict) -> str:
    impl, rec = r.get("impl") or r.get("kernel") or "", r.get("recipe") or ""
    return f"{impl} {rec}".strip() if rec and rec != impl else str(impl or rec)


def _section_speed(doc: Doc, bench: list) -> None:
    doc.h(2, "Speed")
    if not bench:
        doc.p("No benchmark results given (`zyfa bench` on a GPU writes `reports/bench_<date>.json`; pass it "
              "with `--bench`). Technique 2 of ZYFA (ping-pong) acts on speed only and is measured there.")
        return
    doc.p("From the benchmark files as written by `zyfa bench` (values as recorded: TFLOP/s = FLOPs / median "
          "kernel time, FLOPs = 4·b·h·s²·d, 2·(d_qk+d_v) for MLA, halved for causal; SM clock and power: means "
          "during the timed run). Technique 2 of ZYFA (ping-pong) acts on speed only.")
    for i, (name, meta, rows) in enumerate(bench):
        info = []
        for k in ("device", "date", "git_commit", "command", "inputs_note"):
            if meta.get(k):
                info.append(f"{k}: `{meta[k]}`" if k == "command" else f"{k}: {meta[k]}")
        if isinstance(meta.get("versions"), dict):
            info.append("versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
        doc.p(f"**{name}**" + ("; " + "; ".join(info) if info else ""))
        ok = [r for r in rows if "error" not in r and r.get("tflops") is not None]
        shape_keys = [k for k in ("input", "h", "h_kv", "d_qk", "d_v", "s", "causal") if any(k in r for r in ok)]
        if ok and shape_keys and any(("impl" in r or "kernel" in r) for r in ok):
            labels = list(dict.fromkeys(_bench_label(r) for r in ok))
            cases = list(dict.fromkeys(tuple(r.get(k) for k in shape_keys) for r in ok))
            val = {(tuple(r.get(k) for k in shape_keys), _bench_label(r)): r["tflops"] for r in ok}
            doc.p("TFLOP/s by implementation, one row per input shape (same run):")
            body = [[*(fmt(v, "num") for v in case), *(fmt(val.get((case, lab)), "num") for lab in labels)]
                    for case in cases]
            doc.table(f"t-bench-{i}-tflops", [*shape_keys, *labels], body)
        cols = [c for c in _BENCH_PREFERRED if any(c in r for r in rows)]
        extra = [c for c in dict.fromkeys(k for r in rows for k in r) if c not in cols
                 and all(isinstance(r.get(c), (int, float, str, bool, type(None))) for r in rows)]
        cols += extra[: max(0, 18 - len(cols))]
        body = [[fmt(r.get(c), "num") if c != "error" else str(r.get(c, ""))[:80] for c in cols] for r in rows]
        doc.p("Every benchmark row:")
        doc.table(f"t-bench-{i}", cols, body)


# ---------------------------------------------------------------------------------------------- provenance

_PROV_KEYS = ("run_id", "date_utc", "zyfa_version", "git_commit", "git_dirty", "python", "torch", "numpy", "scipy",
              "platform", "cpu", "cpu_count", "device", "device_name", "cuda_device", "torch_cuda", "seed")


def _section_provenance(doc: Doc, res: Results) -> None:
    doc.h(2, "Provenance")
    keys = [k for k in _PROV_KEYS if any(k in p for _, p in res.provenances)]
    extra = sorted({k for _, p in res.provenances for k, v in p.items()
                    if k not in keys and k not in ("recipes", "inputs", "argv", "study_notes")
                    and isinstance(v, (str, int, float, bool))})
    body = []
    for k in [*keys, *extra, "argv"]:
        vals = []
        for _, p in res.provenances:
            v = p.get(k)
            if isinstance(v, list):
                v = shlex.join(str(x) for x in v)
            vals.append("-" if v is None else (fmt(v, "num") if isinstance(v, float) else str(v)))
        body.append([k, *vals])
    doc.table("t-provenance", ["", *(name for name, _ in res.provenances)], body, text=True)


def _section_inputs(doc: Doc, rows: list) -> None:
    doc.h(2, "Inputs")
    doc.p("Every input, its shape and mask, the hash of its Q/K/V (sha256 of dtypes, shapes and bytes, first "
          "16 hex digits) and of its capture file, and the features the study computed from it.")
    seen, body = set(), []
    feats = [c for c in ("feat_q_outlier", "feat_k_outlier", "feat_v_outlier", "feat_entropy_nats")
             if any(c in r for r in rows)]
    for r in rows:
        k = _input_key(r)
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


def _section_all(doc: Doc, rows: list, recipes: list) -> None:
    doc.h(2, "Every result")
    doc.p("Relative L2 error (deq) of every (input, recipe) row.")
    cell, inputs = {}, []
    for r in rows:
        k = _input_key(r)
        if k not in cell:
            cell[k] = {}
            inputs.append((k, r["input"]))
        cell[k][r["recipe"]] = r
    body = [[name, *(fmt(cell[k][n].get("deq_rel_l2"), "err") if n in cell[k] else "-" for n in recipes)]
            for k, name in inputs]
    doc.table("t-all", ["input", *recipes], body)


# ---------------------------------------------------------------------------------------------- build

def build_report(res: Results, *, bench=(), command: str = "", extra_commands: Sequence[str] = (),
                 title: str = "FP8 attention accuracy report", notes: Sequence[str] = (), plots: bool = True,
                 impact: tuple[list, list] | None = None) -> Doc:
    """The report document for the result rows (and benchmark rows, and ``impact``: (rows, files) of
    :func:`load_impact`, the model-impact section)."""
    doc = Doc(title=title)
    rows, recipes = res.rows, res.recipes
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            plots = False
            notes = [*notes, "matplotlib is not installed, so this report has no plots "
                     "(`pip install -e '.[plots]'`)."]
    study_cmds = [p["study_command"] for _, p in res.provenances if p.get("study_command")]
    cmds = list(dict.fromkeys([*extra_commands, *study_cmds, *([command] if command else [])]))
    doc.p("Regenerate this report with" + (" (the study, then the report alone from its results):"
                                           if len(cmds) > 1 else ":"))
    doc.code("\n".join(cmds))
    groups = list(dict.fromkeys(group_of(r) for r in rows))
    groups.sort(key=lambda g: (g == GAUSSIAN, g))
    n_inputs = len({_input_key(r) for r in rows})
    doc.p(f"{len(rows)} result rows: {n_inputs} inputs ({', '.join(groups)}) x {len(recipes)} recipes "
          f"({', '.join(recipes)}), from {', '.join(f'`{n}`' for n, _ in res.provenances)}.")
    many = len(res.provenances) > 1
    for n in [*notes, *((f"`{name}`: " if many else "") + x for name, p in res.provenances
                        for x in (p.get("study_notes") or []))]:
        doc.p(n)
    _section_summary(doc, groups, rows, recipes)
    _section_provenance(doc, res)
    for g in groups:
        grows = [r for r in rows if group_of(r) == g]
        doc.h(2, g if g == GAUSSIAN else f"Model: {g}")
        _section_recipes(doc, g, grows, recipes, plots)
        _section_ratios(doc, g, grows, recipes)
        _section_ablation(doc, g, grows, recipes)
        if g == GAUSSIAN:
            _section_headdim(doc, g, grows, recipes)
            _section_seq(doc, g, grows, recipes, plots)
        else:
            _section_layers(doc, g, grows, recipes, plots)
    if GAUSSIAN not in groups:
        doc.h(2, GAUSSIAN)
        doc.p("No Gaussian inputs in these results.")
    if impact is not None:
        _section_impact(doc, impact[0], impact[1], plots)
    _section_causes(doc, rows, recipes, plots)
    _section_speed(doc, list(bench))
    _section_all(doc, rows, recipes)
    _section_inputs(doc, rows)
    return doc


def write_report(doc: Doc, out_dir: str | Path) -> dict[str, Path]:
    """Write report.md, the PNGs and report.html into ``out_dir``; old fig_*.png there are removed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("fig_*.png"):
        if old.name not in doc.images:
            old.unlink()
    for name, png in doc.images.items():
        (out / name).write_bytes(png)
    md = out / "report.md"
    md.write_text(render_markdown(doc), encoding="utf-8")
    page = out / "report.html"
    page.write_text(render_html(doc), encoding="utf-8")
    return {"markdown": md, "html": page}


# ---------------------------------------------------------------------------------------------- screenshot

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0")


def screenshot(page: str | Path, png: str | Path, *, width: int = 1280, height: int = 3000,
               timeout: float = 120) -> list[str]:
    """Open ``page`` in headless Chromium (fresh profile, no network) and save a screenshot of its top.

    Returns the console lines Chromium logged (errors, uncaught exceptions): empty for a clean page.
    Raises FileNotFoundError without chromium, RuntimeError if no screenshot was written.
    """
    import os
    import shutil
    import subprocess
    import tempfile

    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        raise FileNotFoundError("chromium not found (Debian: apt-get install chromium)")
    png = Path(png).resolve()
    with tempfile.TemporaryDirectory() as prof:
        res = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={prof}", f"--window-size={width},{height}",
                              f"--screenshot={png}", Path(page).resolve().as_uri()],
                             capture_output=True, text=True, timeout=timeout, env={**os.environ, "HOME": prof})
    if not png.is_file():
        raise RuntimeError(f"chromium wrote no screenshot (exit {res.returncode}): {res.stderr[-500:]}")
    return [line for line in res.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


# ---------------------------------------------------------------------------------------------- CLI

def _split(values: Sequence[str] | None) -> list[str]:
    out = []
    for v in values or []:
        for s in v.split(","):
            s = s.strip()
            if not s:
                continue
            hits = sorted(glob.glob(s)) if any(ch in s for ch in "*?[") else [s]
            out += hits
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", action="append", required=True,
                        help="result files (.jsonl or .csv from zyfa accuracy/study), comma-separated or repeated")
    parser.add_argument("--bench", action="append", default=None,
                        help="benchmark JSON files (zyfa bench), comma-separated, repeated or a glob")
    parser.add_argument("--impact", action="append", default=None,
                        help="zyfa impact result files (JSONL) for the model-impact section: comma-separated, "
                        "repeated or a quoted glob (e.g. 'reports/impact/results*.jsonl'); several files are "
                        "merged (one per concurrent run)")
    parser.add_argument("--out", required=True, help="output folder, e.g. reports/mine/")
    parser.add_argument("--title", default="FP8 attention accuracy report", help="report title")
    parser.add_argument("--recipes", default=None,
                        help="comma-separated recipes to report (default: every recipe in the results)")
    parser.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib needed)")
    parser.add_argument("--screenshot", action="store_true",
                        help="open report.html in headless Chromium, save report_screenshot.png, fail on console "
                        "errors")


def report_command(results: Sequence[str], out: str, bench: Sequence[str] = (), title: str | None = None,
                   shot: bool = False, recipes: str | None = None, impact: Sequence[str] = ()) -> str:
    parts = ["zyfa", "report", "--results", ",".join(map(str, results))]
    if recipes:
        parts += ["--recipes", recipes]
    if bench:
        parts += ["--bench", ",".join(map(str, bench))]
    if impact:
        parts += ["--impact", ",".join(map(str, impact))]
    parts += ["--out", str(out)]
    if title and title != "FP8 attention accuracy report":
        parts += ["--title", title]
    if shot:
        parts.append("--screenshot")
    return shlex.join(parts)


def main(args: argparse.Namespace) -> int:
    """Render the report; 0 on success, 2 on bad input (one line on stderr)."""
    results = _split(args.results)
    bench_paths = _split(args.bench)
    impact_paths = _split(args.impact)
    try:
        if not results:
            raise ValueError("--results names no file")
        res = load_results(results)
        if args.recipes:
            keep = [x.strip() for x in args.recipes.split(",") if x.strip()]
            unknown = [x for x in keep if x not in res.recipes]
            if unknown:
                raise ValueError(f"--recipes: not in the results: {', '.join(unknown)} (have {', '.join(res.recipes)})")
            res = Results([r for r in res.rows if r["recipe"] in keep], res.provenances,
                          [x for x in res.recipes if x in keep])
        bench = load_bench(bench_paths)
        if args.impact is not None and not impact_paths:
            raise FileNotFoundError(f"--impact: no such file: {', '.join(args.impact)}")
        impact = load_impact(impact_paths) if impact_paths else None
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"zyfa report: error: {e}", file=sys.stderr)
        return 2
    cmd = report_command(results, args.out, bench_paths, args.title, args.screenshot, args.recipes, impact_paths)
    doc = build_report(res, bench=bench, command=cmd, title=args.title, plots=not args.no_plots, impact=impact)
    paths = write_report(doc, args.out)
    print(f"wrote {paths['markdown']} and {paths['html']} ({len(doc.images)} plots)")
    if args.screenshot:
        return _screenshot(paths["html"])
    return 0


def _screenshot(page: Path) -> int:
    png = page.with_name("report_screenshot.png")
    try:
        console = screenshot(page, png)
    except (FileNotFoundError, RuntimeError, OSError) as e:
        print(f"zyfa report: no screenshot: {e}", file=sys.stderr)
        return 1
    if console:
        print("zyfa report: console errors in report.html:\n" + "\n".join(console), file=sys.stderr)
        return 1
    print(f"wrote {png} (headless Chromium, no console errors)")
    return 0
