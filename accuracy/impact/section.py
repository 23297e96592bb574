"""The model-impact section: tables of perplexity and next-token KL per model and recipe (CIs over windows),
the per-layer sweep, and a figure of the KL per recipe; as report blocks, as Markdown alone (``impact.md``), or
as a section of the study report (:func:`report_section`).

Exposed: ``summarize``, ``group_title``, ``section_blocks``, ``render_markdown``, ``write_markdown``,
``results_paths``, ``impact_files_beside``, ``report_section``, ``kl_figure``.
"""

from __future__ import annotations

import glob
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats
from zyfa.accuracy.impact.rows import BLOCK_TOKENS, load_rows, prepare_rows, row_date
from zyfa.accuracy.io.results_io import IMPACT_KINDS
from zyfa.accuracy.report.blocks import blocks_markdown as _blocks_markdown
from zyfa.accuracy.report.blocks import fmt, fmt_ci, sharding_line, slug
from zyfa.accuracy.report.document import Doc
from zyfa.accuracy.report.plots import png, pyplot
from zyfa.accuracy.scoring.verdict import spearman_with_p

from zyfa.outputs import atomic_write_text


def _ci(values, *, seed: int = 0):
    # lazy: imports torch; zyfa report reads results without torch
    from zyfa.accuracy.scoring.metrics import bootstrap_ci

    return bootstrap_ci(np.asarray(values, dtype=np.float64), seed=seed)


def summarize(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """All-layer rows aggregated per (model, n_tokens, text) and recipe, recipes by mean KL (prepared rows).

    Each entry: recipe, windows (sorted window indices), rows, and the CIs over windows
    (``zyfa.accuracy.scoring.metrics.CI``)
    ``ppl_ratio``, ``delta_ppl``, ``kl``; ``kl_blocks`` (pooled 256-token blocks, or None); means ``kl_p99``,
    ``top1``, ``p_flushed`` (NaN where a row has none, and for a real implementation, whose P is not seen).
    """
    groups: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("kind") == "impact_window":
            groups[(r["model"], r.get("n_tokens"), r.get("text"))][r["recipe"]].append(r)
    out = {}
    for g, per_recipe in groups.items():
        entries = []
        for rc, rs in per_recipe.items():
            rs = sorted(rs, key=lambda r: r["window"])
            blocks = [b for r in rs for b in r.get("kl_blocks") or []]
            # a real implementation's row has no P to count (rows written before this rule hold 0.0 there)
            pf = [float(r["p_flushed_mean"]) if isinstance(r.get("p_flushed_mean"), (int, float))
                  and not r.get("implementation") else math.nan for r in rs]
            entries.append({
                "recipe": rc, "windows": [r["window"] for r in rs], "rows": rs,
                "ppl_ratio": _ci([r["ppl_ratio"] for r in rs]), "delta_ppl": _ci([r["delta_ppl"] for r in rs]),
                "kl": _ci([r["kl_mean"] for r in rs]), "kl_blocks": _ci(blocks) if blocks else None,
                "kl_p99": float(np.mean([r["kl_p99"] for r in rs])),
                "top1": float(np.mean([r["top1_agree"] for r in rs])), "p_flushed": float(np.mean(pf)),
            })
        entries.sort(key=lambda e: (e["kl"].estimate if math.isfinite(e["kl"].estimate) else math.inf, e["recipe"]))
        out[g] = entries
    return dict(sorted(out.items(), key=lambda kv: tuple(str(x) for x in kv[0])))


def group_title(key: tuple, keys: Iterable[tuple]) -> str:
    """The model's name, plus its tokens and text when the model was measured in several configurations."""
    model, n_tokens, text = key
    several = sum(1 for k in keys if k[0] == model) > 1
    return f"{model}, {n_tokens} tokens of {text}" if several else str(model)


INTRO = (
    "Every attention layer of each model runs a recipe's tiled emulator (`zyfa.emulator.emulate`) or, in a row "
    "named by a real implementation (`triton:...`, `cudnn-fp8`, `sdpa-bf16:...`), that kernel (the row's `ran` "
    "names what ran in each layer) instead of the model's own attention (transformers `sdpa`, fp32), on {devices}, "
    "on held-out windows of the {texts} text "
    "({tokens} tokens each; the odd slices of the token stream, disjoint from the capture windows). "
    "Δppl = ppl(recipe) − ppl(stock) over each window's own next tokens; KL = mean over positions of "
    "KL(stock ‖ recipe) of the next-token distributions, in nats/token (float64 from fp32 logits); top-1 = "
    "fraction of positions whose argmax is unchanged; P flushed = fraction of the unmasked probabilities the "
    "recipe rounds to 0, mean over layers (– for a real implementation, whose P is not seen). Brackets: 95% "
    "bootstrap CI over windows (scipy; with 2–3 windows this "
    "is rough; none with 1 window); the last column pools {block}-token blocks of all windows (correlated, so "
    "optimistic). Recipes are sorted by mean KL. `fp32` (no quantization) is the control: its KL shows the "
    "emulator's own summation-order noise.")

IMPACT_HEADER = ["recipe", "windows", "ppl ratio", "Δppl", "KL (nats/token)", "KL p99", "top-1 agree",
                 "P flushed", "KL, block CI"]


def section_blocks(rows: list[dict[str, Any]], *, command: str | None = None, files: list[dict] | None = None,
                   level: int = 2, key_prefix: str = "t-impact") -> list[tuple]:
    """The impact section as blocks, rendered by :func:`render_markdown` here and by ``zyfa.accuracy.report``:
    ("h", level, text), ("p", text), ("code", text), ("table", key, header, rows, prose?)."""
    rows, notes = prepare_rows(rows)
    win = [r for r in rows if r.get("kind") == "impact_window"]
    lay = [r for r in rows if r.get("kind") == "impact_layer"]
    blocks: list[tuple] = [("h", level, "Model impact: perplexity and next-token KL with each recipe swapped in")]
    if not rows:
        return blocks + [("p", "No results yet.")]
    texts = sorted({str(r.get("text")) for r in rows})
    tokens = sorted({int(r.get("n_tokens") or 0) for r in rows})
    devices = sorted({str(r.get("device") or "cpu") for r in rows})
    blocks.append(("p", INTRO.format(texts=", ".join(texts), tokens=", ".join(map(str, tokens)),
                                     devices=" and ".join(d.upper() for d in devices)
                                     + (" (each row's `device`)" if len(devices) > 1 else ""),
                                     block=BLOCK_TOKENS)))
    blocks += [("p", n) for n in notes]
    commands = []
    for r in sorted(rows, key=row_date):
        cmd = command_of((r.get("provenance") or {}).get("argv") or [])
        if cmd and cmd not in commands:
            commands.append(cmd)
    if command and command not in commands:
        commands.append(command)
    if commands:
        blocks += [("p", "Commands (by start; `--resume` runs add rows to their file):"),
                   ("code", "\n".join(commands))]
    blocks += _provenance_blocks(rows, files, key_prefix)

    summary = summarize(win)
    for g, entries in summary.items():
        model = g[0]
        p = entries[0]["rows"][0].get("provenance") or {}
        stock = {r["window"]: r["ppl_stock"] for e in entries for r in e["rows"]}
        n_win = sorted({len(e["windows"]) for e in entries})
        blocks += [
            ("h", level + 1, group_title(g, summary)),
            ("p", f"{p.get('model_description', model)}; model file sha256 "
                  f"`{str(p.get('model_sha256', ''))[:16]}…`; {g[1]} tokens of {g[2]}. Stock perplexity per "
                  "window: " + ", ".join(f"w{w}: {v:.3f}" for w, v in sorted(stock.items())) + ". "
                  f"{len(entries)} recipes, "
                  f"{n_win[0] if len(n_win) == 1 else f'{n_win[0]}-{n_win[-1]}'} window(s) each."),
        ]
        body = []
        for e in entries:
            body.append([e["recipe"], str(len(e["windows"])), fmt_ci(e["ppl_ratio"], ".5f"),
                         fmt_ci(e["delta_ppl"], "+.4f"), fmt_ci(e["kl"], ".2e"), fmt(e["kl_p99"], ".2e"),
                         fmt(e["top1"], ".4f"), fmt(e["p_flushed"], ".3f") if math.isfinite(e["p_flushed"]) else "–",
                         fmt_ci(e["kl_blocks"], ".2e") if e["kl_blocks"] is not None else "nan"])
        blocks.append(("table", f"{key_prefix}-{slug('-'.join(map(str, g)))}", IMPACT_HEADER, body, False))
    if lay:
        blocks += _layer_blocks(lay, win, stats, level, key_prefix)
    return blocks


def _provenance_blocks(rows, files, key_prefix) -> list[tuple]:
    by_file: dict[str, list] = defaultdict(list)
    for r in rows:
        by_file[str(r.get("_file") or "rows")].append(r)
    info = {f["label"]: f for f in files or []}
    body = []
    for label in list(info) + [x for x in by_file if x not in info]:
        rs = by_file.get(label, [])
        ps = [r.get("provenance") or {} for r in rs]
        dates = sorted(row_date(r) for r in rs if row_date(r))
        commits = list(dict.fromkeys(str(p.get("git_commit") or "-")[:7] for p in ps))
        dirty = " (dirty)" if any(p.get("git_dirty") for p in ps) else ""
        sha = info.get(label, {}).get("sha256")
        body.append([label, sha[:16] if sha else "-", str(info.get(label, {}).get("rows", len(rs))), str(len(rs)),
                     f"{dates[0]} to {dates[-1]}" if dates else "-",
                     ", ".join(commits[:4]) + (f" (+{len(commits) - 4})" if len(commits) > 4 else "") + dirty,
                     *(_uniq(ps, k) for k in ("torch", "transformers", "cpu"))])
    sharded = []  # files written by a sharded run (torchrun): its ranks, backend and wall time
    for label in list(info) + [x for x in by_file if x not in info]:
        runs = list(dict.fromkeys(line for r in by_file.get(label, [])
                                  if (line := sharding_line((r.get("provenance") or {}).get("sharding") or {}))))
        sharded += [("p", f"`{label}` was a sharded run (torchrun, docs/SHARDING.md): {line}.") for line in runs]
    return [("p", "Result files (rows: in the file / shown after merging; commits: HEAD when each row was written; "
                  "sha256: first 16 hex digits):"),
            ("table", f"{key_prefix}-files", ["file", "sha256", "rows", "shown", "written (UTC)", "commits", "torch",
                                              "transformers", "cpu"], body, True), *sharded]


def _uniq(provs: list[dict], key: str) -> str:
    return ", ".join(dict.fromkeys(str(p.get(key)) for p in provs if p.get(key))) or "-"


def _layer_blocks(lay, win, stats, level, key_prefix) -> list[tuple]:
    blocks: list[tuple] = [
        ("h", level + 1, "Per-layer sensitivity (one layer swapped at a time)"),
        ("p", "Each row swaps only that layer; the layer then sees exactly the stock q/k/v, so the recipe's "
              "operator error there (rel-L2 of its output against `reference.attention_fp64` of the original "
              "q/k/v, which includes input quantization) comes from the same forward pass. Share = the layer's "
              "KL over the sum of all layers' KLs. ρ: Spearman correlation over layers between operator error "
              "and KL (two-sided p and n, the layers with both values, in parentheses; a correlation, not a "
              "cause: with n = 8, |ρ| below 0.74 is not significant at 5%). Σ layers / all: the sum of one-layer "
              "KLs over the KL with all "
              "layers swapped (same window): 1 means the damage adds up.")]
    groups: dict[tuple, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in lay:
        groups[(r["model"], r["window"], r.get("n_tokens"), r.get("text"))][r["recipe"]][r["layer"]] = r
    for (model, w, n_tokens, text), per_recipe in groups.items():
        recipes = list(per_recipe)
        layers = sorted({lyr for d in per_recipe.values() for lyr in d})
        key = f"{key_prefix}-layers-{slug(f'{model}-w{w}-{n_tokens}-{text}')}"
        blocks.append(("h", level + 2, f"{model}, window {w}"))
        body = []
        for rc in recipes:
            d = per_recipe[rc]
            ls = sorted(d)
            kl = np.array([d[i]["kl_mean"] for i in ls])
            op = np.array([d[i].get("op_rel_l2", math.nan) for i in ls], dtype=np.float64)
            opk = np.array([d[i].get("op_rel_l2_deq", math.nan) for i in ls], dtype=np.float64)
            total = kl.sum()
            top = np.argsort(-kl)[:5]
            tops = ", ".join(f"{ls[i]} ({kl[i] / total:.0%})" for i in top) if total > 0 else "-"
            all_kl = [r["kl_mean"] for r in win if r["model"] == model and r["recipe"] == rc and r["window"] == w
                      and r.get("n_tokens") == n_tokens and r.get("text") == text]
            ratio = f"{total / all_kl[0]:.2f}" if all_kl and all_kl[0] > 0 else "-"
            body.append([rc, str(len(ls)), _spearman(stats, op, kl), _spearman(stats, opk, kl), tops, ratio])
        blocks.append(("table", f"{key}-summary", ["recipe", "layers", "ρ(op rel-L2, KL)",
                                                    "ρ(kernel-only rel-L2, KL)", "top layers by KL (share)",
                                                    "Σ layers / all"], body, False))
        head = ["layer", *(c for rc in recipes for c in (f"KL {rc}", "share", f"op rel-L2 {rc}")), "max|k|"]
        totals = {rc: sum(x["kl_mean"] for x in per_recipe[rc].values()) for rc in recipes}
        body = []
        for i in layers:
            cells = []
            kamax = math.nan
            for rc in recipes:
                x = per_recipe[rc].get(i)
                if x is None:
                    cells += ["", "", ""]
                    continue
                kamax = x.get("k_amax", kamax)
                share = x["kl_mean"] / totals[rc] if totals[rc] > 0 else math.nan
                cells += [fmt(x["kl_mean"], ".2e"), fmt(share, ".1%"), fmt(x.get("op_rel_l2", math.nan), ".2e")]
            body.append([str(i), *cells, fmt(kamax, ".1f")])
        blocks.append(("table", key, head, body, False))
    return blocks


def blocks_markdown(blocks: list[tuple]) -> str:
    """Markdown of :func:`section_blocks` (the section alone; ``zyfa.accuracy.report`` renders it in the report)."""
    return "\n".join(_blocks_markdown(blocks)).rstrip() + "\n"


def render_markdown(rows: list[dict[str, Any]], *, command: str | None = None,
                    files: list[dict] | None = None) -> str:
    """The report section (Markdown): per-model impact tables with CIs, per-layer sensitivity, correlation."""
    return blocks_markdown(section_blocks(rows, command=command, files=files))


def command_of(argv: list[str]) -> str | None:
    """``zyfa impact ...`` from a recorded argv (python -m zyfa.cli impact ..., or the zyfa script)."""
    if "impact" not in argv:
        return None
    return "zyfa impact " + " ".join(argv[argv.index("impact") + 1:])


def _spearman(stats, x: np.ndarray, y: np.ndarray) -> str:
    """ρ with its two-sided p and n (the layers where both values are finite):
    accuracy.scoring.verdict.spearman_with_p."""
    rho, p, n = spearman_with_p(x, y)
    return "-" if not math.isfinite(rho) else f"{rho:+.2f} (p={p:.2g}, n={n})"


def results_paths(spec: str | Iterable[str]) -> list[Path]:
    """Files of a comma-separated list (or several), globs expanded in sorted order, duplicates dropped."""
    items = [spec] if isinstance(spec, str) else list(spec)
    out: list[Path] = []
    for item in items:
        for s in (x.strip() for x in str(item).split(",")):
            if not s:
                continue
            hits = sorted(glob.glob(s)) if any(c in s for c in "*?[") else [s]
            out += [Path(h) for h in hits if Path(h) not in out]
    return out


def impact_files_beside(out: str | Path) -> list[Path]:
    """``out`` and the other impact results files in its folder (``*.jsonl`` whose first line is an impact row),
    sorted by name: what a run's default ``impact.md`` renders, so that a second run into a folder keeps the
    first run's rows in the section instead of writing over it (``reports/impact/`` holds several runs' files)."""
    out = Path(out)
    found = []
    for p in out.parent.glob("*.jsonl"):
        if p == out:
            continue
        try:
            with open(p, encoding="utf-8") as f:
                first = json.loads(f.readline() or "null")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(first, dict) and first.get("kind") in IMPACT_KINDS:
            found.append(p)
    return sorted([*found, out], key=lambda p: p.name)


def write_markdown(rows_path: str | Path | Iterable[str | Path], md_path: str | Path, *,
                   command: str | None = None) -> Path:
    """Render the section of one or several results files (missing files are skipped) to ``md_path``."""
    md_path = Path(md_path)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    paths = [rows_path] if isinstance(rows_path, (str, Path)) else list(rows_path)
    rows, files = load_rows([p for p in paths if Path(p).exists()])
    atomic_write_text(md_path, render_markdown(rows, command=command, files=files))  # never a half-written section
    return md_path


def report_section(rows: list[dict[str, Any]], files: list[dict]) -> Callable[[Doc, bool], None]:
    """The section for :func:`zyfa.accuracy.report.build.build_report` (``sections=``): :func:`section_blocks` (its
    tables, notes, per-layer sweep), plus :func:`kl_figure` after the per-model tables when ``plots``."""

    def add(doc: Doc, plots: bool) -> None:
        blocks = section_blocks(rows, files=files, level=2, key_prefix="t-impact")
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
                fig = kl_figure(rows)
                if fig is not None:
                    doc.img(*fig)

    return add


def kl_figure(rows: list) -> tuple[str, bytes, str] | None:
    """(file name, PNG, caption) of the mean KL per FP8 recipe and model with its CI; None without rows."""
    controls = ("fp32", "bf16")  # orders of magnitude below the FP8 recipes: in the tables, not on this axis
    summary = {g: [e for e in es if e["recipe"] not in controls] for g, es in
               summarize(prepare_rows(rows)[0]).items()}
    summary = {g: es for g, es in summary.items() if es}
    if not summary:
        return None
    plt = pyplot()
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
        ax.set_title(group_title(g, summary), fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return ("fig_impact_kl.png", png(fig), "Model impact: mean next-token KL against the stock model per FP8 recipe "
            "(all layers swapped; zyfa in red), with its 95% CI over windows where there are several; the fp32 "
            "and bf16 controls are in the tables")


