"""The long-context section of a report: what the baseline retrieves, each implementation's accuracy and paired
log-probability difference against length (with intervals), the error curves beside them, the needle heatmaps
(depth x length), the finding on Hopper's FP8 accumulator, and the length-cliff table when given.

Exposed: ``RenderError``, ``section_blocks(rows, provs, cliff_table=None) -> (blocks, images, headline)``,
``headline(rows)``, ``hypothesis(rows)``, ``never_flushed_lower(v)``,
``render_folder(results, out_dir, cliffs=None, force=False, plan=None) -> Path``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from zyfa.accuracy.io.results_io import run_provenances
from zyfa.accuracy.io.schemas import mixed_code_notice
from zyfa.accuracy.longctx.scores import (
    BASELINE_MIN,
    accumulator_comparison,
    baseline_of,
    cell_table,
    length_table,
    load_rows,
    retrieving_lengths,
)
from zyfa.accuracy.longctx.verdicts import plan_blocks
from zyfa.accuracy.report.blocks import md_cell, sharding_line, slug
from zyfa.accuracy.report.document import Doc, write_report
from zyfa.accuracy.report.plots import png, pyplot
from zyfa.accuracy.scoring.plan import PlanError, check_rows, load_plan

__all__ = ["RenderError", "accumulator_group", "cliff_table", "headline", "hypothesis", "never_flushed_lower",
           "render_folder", "section_blocks"]

# which accumulator an implementation's FP8 dots have (the hypothesis of docs/LONGCTX.md)
GROUPS = ("never flushed (Hopper FP8 accumulator)", "flushed per KV tile", "fp32 accumulation", "baseline / bf16")


class RenderError(ValueError):
    """Results that cannot be rendered (missing, not long-context rows, an output that exists)."""


def accumulator_group(name: str, accumulation: str | None = None) -> str:
    """The accumulator class of an implementation: from its rows' ``accumulation`` (what its paired recipe does
    on the platform it ran on, :func:`zyfa.accuracy.longctx.run.accumulation`), else guessed from its name."""
    if accumulation:
        unit = accumulation.startswith("matrix_unit")
        if unit and "never" in accumulation:
            return GROUPS[0]
        if unit:
            return GROUPS[1]
        if accumulation.startswith("fp32"):
            return GROUPS[2]
        return GROUPS[3]
    n = name.lower()
    if "mi355x" in n or "accumulator=fp32" in n:
        return GROUPS[2]
    if any(t in n for t in ("fa3", "cudnn-fp8")):
        return GROUPS[0]
    if "hopper" in n or "flush" in n:
        return GROUPS[1]
    if any(t in n for t in ("fp32", "bf16", "stock")):
        return GROUPS[3]
    return GROUPS[1] if n.startswith(("triton:", "cute:")) else GROUPS[2]


def _fmt_pct(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def _gen(s: dict) -> str:
    """The generated answers' score beside the teacher-forced one, where the rows have generated answers."""
    return f" · gen {_fmt_pct(s['gen_acc'])} (n {s['gen_n']})" if s.get("gen_n") else ""


def _fmt(x, spec=".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _groups(rows: Sequence[dict]) -> dict[str, str]:
    """implementation -> its accumulator group, from its rows."""
    acc = {}
    for r in rows:
        if r.get("implementation") and r.get("accumulation"):
            acc[r["implementation"]] = r["accumulation"]
    names = {r.get("implementation") for r in rows if r.get("implementation")}
    return {n: accumulator_group(n, acc.get(n)) for n in names}


def _order(names: Sequence[str], baseline: str | None, groups: dict[str, str]) -> list[str]:
    rank = {g: i for i, g in enumerate(GROUPS)}
    return sorted(set(names), key=lambda n: (n != baseline, rank[groups.get(n, GROUPS[3])] if n != baseline else -1,
                                             n))


def hypothesis(rows: Sequence[dict]) -> tuple[dict[tuple, dict], list[str]]:
    """The accumulator hypothesis (docs/LONGCTX.md) per (model, task, length): the never-flushed class against
    each other FP8 class present (flushed per KV tile, fp32 accumulation), paired per prompt
    (:func:`zyfa.accuracy.longctx.scores.accumulator_comparison`); and the classes compared."""
    groups = _groups(rows)
    present = set(groups.values())
    others = [g for g in GROUPS[1:3] if g in present]
    if GROUPS[0] not in present or not others:
        return {}, others
    return accumulator_comparison(rows, groups, GROUPS[0], others), others


# a log-p difference smaller than this (nats) is not called a loss, however tight its interval
MATERIAL_NATS = 0.05
# the headline counts and picks only comparisons with at least this many paired prompts
MIN_PROMPTS = 20
# an accuracy drop against the baseline larger than this (a fraction) is a loss in the headline
LOSS_POINTS = 0.05


def never_flushed_lower(v: dict) -> bool:
    """Whether the never-flushed class is below every other class beyond the 95% intervals of the paired
    differences: in exact match, or in log p(answer) by more than :data:`MATERIAL_NATS`."""
    diffs = v["diffs"].values()
    return (all(d["acc"][2] < 0 for d in diffs)
            or all(not math.isnan(d["dlogp"][2]) and d["dlogp"][2] < -MATERIAL_NATS for d in diffs))


_SHORT = {GROUPS[0]: "never flushed", GROUPS[1]: "flushed per tile", GROUPS[2]: "fp32 accumulation"}


def headline(rows: Sequence[dict]) -> str | None:
    """One sentence on the accumulator hypothesis: in how many (model, task, length) comparisons the
    never-flushed Hopper FP8 accumulator is below every other FP8 class beyond the intervals, where the largest
    loss against the baseline is and what each class scores there, and which models lose nothing."""
    lt = length_table(rows)
    return _headline(*hypothesis(rows), lt, _groups(rows))


def _headline(comp: dict, others: list[str], lt: dict, groups: dict[str, str]) -> str | None:
    comp = {k: v for k, v in comp.items() if v["n"] >= MIN_PROMPTS}
    if not comp:
        return None
    lower = [k for k, v in comp.items() if never_flushed_lower(v)]
    longest = max(n for _m, _t, n in comp)
    verdict = ("is not supported" if len(lower) * 4 < len(comp) else "holds in part" if len(lower) * 2 < len(comp)
               else "is supported")
    text = (f"The hypothesis that a never-flushed Hopper FP8 accumulator loses long-context retrieval which "
            f"{' and '.join(_SHORT[o] for o in others)} keep {verdict} up to {longest} tokens: the never-flushed "
            f"class is below every other FP8 class beyond the 95% intervals in {len(lower)} of {len(comp)} "
            f"(model, task, length) comparisons with at least {MIN_PROMPTS} prompts")
    if lower:
        text += " (" + ", ".join(f"{m} {t} {n}" for m, t, n in lower[:3]) + ("; ..." if len(lower) > 3 else "") + ")"
    worst = max(comp.items(), key=lambda kv: kv[1]["base_acc"] - min(c["acc"] for c in kv[1]["classes"].values()))
    (m, t, n), v = worst
    losing = [c for c, x in v["classes"].items() if v["base_acc"] - x["acc"] > LOSS_POINTS]
    who = ("shared by every class" if len(losing) == len(v["classes"])
           else "in " + ", ".join(_SHORT[c] for c in losing) if losing else "within 5 points for every class")
    text += (f". The largest loss is {m} {t} at {n} tokens, {who}: baseline "
             f"{_fmt_pct(v['base_acc'])} exact, " + ", ".join(f"{_SHORT[c]} {_fmt_pct(x['acc'])}"
                                                            for c, x in v["classes"].items()))
    keep = sorted({mm for mm, _t, _n in comp} - {mm for (mm, _t, _n), x in comp.items()
                                                if any(x["base_acc"] - c["acc"] > LOSS_POINTS
                                                       for c in x["classes"].values())})
    if keep:
        text += (f"; {', '.join(keep)} stay{'s' if len(keep) == 1 else ''} within 5 points of the baseline at "
                 "every length")
    growth = _op_growth(lt, groups)
    if growth is not None:
        (gm, gt, impl, lo_n, hi_n, a, b), (fa, fb) = growth
        text += (f". Operator error grows with length most for a never-flushed kernel: `{impl}` on {gm} {gt}, rel-L2 "
                 f"{a:.3f} at {lo_n} to {b:.3f} at {hi_n} tokens, against {fa:.3f} to {fb:.3f} flushed per tile")
    return text + "."


def _class_op(lt: dict, groups: dict[str, str], cls: str, key: tuple) -> float | None:
    """The median operator rel-L2 over the kernels of class ``cls`` at ``key`` = (model, task, length)."""
    vals = sorted(x for i, g in groups.items() if g == cls for x in [(lt.get((*key, i)) or {}).get("op_rel_l2")]
                  if x)
    return vals[len(vals) // 2] if vals else None


def _op_growth(lt: dict, groups: dict[str, str]):
    """((model, task, kernel, shortest, longest, op there, op there), (flushed class's median op at both)) for the
    never-flushed kernel whose operator rel-L2 grows most from the shortest to the longest length, or None."""
    best = None
    for m, t in sorted({(k[0], k[1]) for k in lt}):
        lengths = sorted({k[2] for k in lt if k[:2] == (m, t)})
        if len(lengths) < 2:
            continue
        lo_n, hi_n = lengths[0], lengths[-1]
        fa, fb = _class_op(lt, groups, GROUPS[1], (m, t, lo_n)), _class_op(lt, groups, GROUPS[1], (m, t, hi_n))
        if fa is None or fb is None:
            continue
        for impl, g in groups.items():
            a, b = ((lt.get((m, t, n, impl)) or {}).get("op_rel_l2") for n in (lo_n, hi_n))
            if g == GROUPS[0] and a and b and (best is None or b / a > best[0]):
                best = (b / a, (m, t, impl, lo_n, hi_n, a, b), (fa, fb))
    return best[1:] if best is not None else None


def _hypothesis_block(comp: dict, others: list[str], lt: dict, groups: dict[str, str]) -> tuple | None:
    if not comp:
        return None
    header = (["model", "task", "length", "prompts", "baseline"] + [_SHORT[c] for c in (GROUPS[0], *others)]
              + [f"never − {_SHORT[o]}: Δ exact, Δ log p [95% CI]" for o in others]
              + ["operator rel-L2 (" + " / ".join(_SHORT[c] for c in (GROUPS[0], *others)) + ")",
                 "never flushed lower?"])
    trs = []
    for (m, t, n), v in comp.items():
        cls = []
        for c in (GROUPS[0], *others):
            each = ", ".join(f"{i} {_fmt_pct(a)}" for i, a in v["classes"][c]["impls"].items())
            cls.append(f"{_fmt_pct(v['classes'][c]['acc'])} ({each})")
        ds = []
        for o in others:
            a, d = v["diffs"][o]["acc"], v["diffs"][o]["dlogp"]
            ds.append(f"{100 * a[0]:+.0f} [{100 * a[1]:+.0f}, {100 * a[2]:+.0f}] pts, {_fmt(d[0], '+.2f')} "
                      f"[{_fmt(d[1], '+.2f')}, {_fmt(d[2], '+.2f')}]")
        ops = [_fmt(_class_op(lt, groups, c, (m, t, n)), ".3f") for c in (GROUPS[0], *others)]
        trs.append([m, t, str(n), str(v["n"]), _fmt_pct(v["base_acc"]), *cls, *ds, " / ".join(ops),
                    "**yes**" if never_flushed_lower(v) else "no"])
    return ("table", "longctx-hypothesis", header, trs, True)


def _fig_curves(rows, lt, model, task, names, base) -> bytes:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    lengths = sorted({n for (m, t, n, _i) in lt if m == model and t == task})
    for impl in names:
        pts = [(n, lt.get((model, task, n, impl))) for n in lengths]
        pts = [(n, s) for n, s in pts if s is not None and s["n"] > 0]
        if not pts:
            continue
        xs = [n for n, _ in pts]
        style = {"ls": "--", "color": "k"} if impl == base else {}
        acc = [s["acc"] for _, s in pts]
        err = [[s["acc"] - s["low"] for _, s in pts], [s["high"] - s["acc"] for _, s in pts]]
        axes[0].errorbar(xs, acc, yerr=err, marker="o", ms=3, capsize=2, label=impl, **style)
        if impl != base:
            d = [s["dlogp"] for _, s in pts]
            de = [[s["dlogp"] - s["dlogp_low"] for _, s in pts], [s["dlogp_high"] - s["dlogp"] for _, s in pts]]
            axes[1].errorbar(xs, d, yerr=de, marker="o", ms=3, capsize=2, label=impl)
        ops = [(n, s["op_rel_l2"]) for n, s in pts if s.get("op_rel_l2")]
        if ops:
            axes[2].plot([n for n, _ in ops], [v for _, v in ops], marker="o", ms=3, label=impl, **style)
    for ax, title in zip(axes, ("exact match (retrieving cells, 95% Wilson)", "Δ log p(answer) vs baseline [nats]",
                                "operator rel-L2 vs FP64 (sampled layers)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length [tokens]")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.05, 1.05)
    axes[1].axhline(0, color="k", lw=0.5)
    if any(ax.get_lines() for ax in axes[2:]):
        axes[2].set_yscale("log")
    axes[0].legend(fontsize=6, loc="lower left")
    fig.suptitle(f"{model} — {task}", fontsize=10)
    return png(fig)


def _fig_heatmaps(cells, model, task, names, base) -> bytes:
    plt = pyplot()

    lengths = sorted({n for (m, t, n, _d, _i) in cells if m == model and t == task})
    depths = sorted({d for (m, t, _n, d, _i) in cells if m == model and t == task})
    cols = min(4, len(names))
    rows_n = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.2 * cols, 2.6 * rows_n), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, impl in zip(axes.flat, names, strict=False):
        grid = np.full((len(depths), len(lengths)), np.nan)
        for i, d in enumerate(depths):
            for j, n in enumerate(lengths):
                c = cells.get((model, task, n, d, impl))
                if c is not None:
                    grid[i, j] = c["acc"]
        ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
        for i, d in enumerate(depths):
            for j, n in enumerate(lengths):
                b = cells.get((model, task, n, d, base))
                if b is not None and not b["baseline_ok"]:
                    ax.text(j, i, "×", ha="center", va="center", fontsize=7, color="k")
        ax.set_xticks(range(len(lengths)), [f"{n // 1024}K" if n >= 1024 else str(n) for n in lengths], fontsize=6)
        ax.set_yticks(range(len(depths)), [f"{round(100 * d)}" for d in depths], fontsize=6)
        ax.set_title(impl, fontsize=7)
    fig.suptitle(f"{model} — {task}: exact match by needle depth [%] (rows) and length (columns); "
                 "× = the baseline fails there", fontsize=8)
    return png(fig)


def section_blocks(rows: Sequence[dict], provs: Sequence[dict], cliff_table=None, *, level: int = 2,
                   under_plan: bool = False):
    """(blocks, images, headline) of the long-context section. ``cliff_table``: (header, rows) of the length-cliff
    finder's flags, tabled as given. ``under_plan``: the rows answer a study plan whose verdicts lead the report;
    the class comparison below (a rule written after the 2-December data) is then not stated as a finding, and the
    section says its tables are descriptive."""
    base = baseline_of(rows)
    if base is None:
        raise RenderError("no long-context rows with a baseline (sdpa-fp32, fp32 or stock) that ran")
    blocks: list[tuple] = []
    images: dict[str, bytes] = {}
    lt = length_table(rows, base)
    cells = cell_table(rows, base)
    retr = retrieving_lengths(rows, base)
    groups = _groups(rows)
    comp, others = hypothesis(rows)
    h = _headline(comp, others, lt, groups)
    blocks.append(("h", level, "Long-context retrieval" + (" (descriptive, outside the plan's rule)" if under_plan
                                                           else "")))
    if under_plan:
        h = None
        blocks.append(("p", "The verdicts are the plan's, above. The tables below describe the same rows against the "
                            "baseline; no finding is drawn from them."))
    if h:
        blocks.append(("p", f"**Finding.** {h}"))
    blocks.append(("p", (f"Retrieval prompts (docs/LONGCTX.md), every implementation as the "
                         f"model's attention in every layer for the whole prefill, the answer scored by teacher "
                         f"forcing. Baseline: `{base}`. A cell (model, task, length, depth) counts only where the "
                         f"baseline is exact on at least {BASELINE_MIN:.0%} of its seeds; Δ log p is paired per "
                         f"prompt against the baseline.")))
    models = sorted({r["model"] for r in rows})
    tasks = sorted({r["task"] for r in rows})
    lines = []
    for m in models:
        for t in tasks:
            ls = retr.get((m, t), [])
            all_ls = sorted({int(r["length"]) for r in rows if r["model"] == m and r["task"] == t})
            lines.append([m, t, ", ".join(map(str, ls)) or "none", ", ".join(str(n) for n in all_ls if n not in ls)
                          or "–"])
    blocks.append(("table", "longctx-baseline", ["model", "task", "baseline retrieves at", "baseline fails at"],
                   lines, True))
    hyp = _hypothesis_block(comp, others, lt, groups)
    if hyp is not None:
        blocks.append(("h", level + 1, "The accumulator hypothesis"))
        blocks.append(("p", "Each FP8 class's exact match on the baseline's retrieving cells (per prompt the mean over "
                            "the class's kernels, then over the prompts; each kernel's own in brackets), and the "
                            "never-flushed class minus each other class, paired per prompt, with 95% bootstrap "
                            "intervals (points of exact match; nats of log p(answer) against the baseline). "
                            "\"Lower\": below every other class beyond the interval, in exact match or in log p."))
        blocks.append(hyp)
    for m in models:
        for t in tasks:
            names = _order([impl for (mm, tt, _n, impl) in lt if mm == m and tt == t], base, groups)
            if not names:
                continue
            lengths = sorted({n for (mm, tt, n, _i) in lt if mm == m and tt == t})
            blocks.append(("h", level + 1, f"{m} — {t}"))
            header = ["implementation", "accumulator"] + [f"{n}" for n in lengths]
            trs = []
            for impl in names:
                cellv = []
                for n in lengths:
                    s = lt.get((m, t, n, impl))
                    if s is None or s["n"] == 0:
                        cellv.append("–")
                    elif impl == base:
                        cellv.append(f"{_fmt_pct(s['acc'])} ({s['cells_kept']}/{s['cells']} cells){_gen(s)}")
                    else:
                        cellv.append(f"{_fmt_pct(s['acc'])} Δ{s['dlogp']:+.2f}{_gen(s)}")
                trs.append([md_cell(impl), groups.get(impl, "")] + cellv)
            blocks.append(("table", f"longctx-{slug(m)}-{slug(t)}", header, trs, False))
            blocks.append(("p", "Cells: exact match on the baseline's retrieving cells (teacher-forced), and the mean "
                                "paired Δ log p(answer) in nats against the baseline (negative: less sure of the "
                                "answer)" + (
                                    "; \"gen\": the generated answer's score on the same prompts (greedy decoding "
                                    "with the implementation in every step, `gen_contains`: every part of the "
                                    "expected answer in the text), with the prompts that have one" if any(
                                        lt[k]["gen_n"] for k in lt if k[0] == m and k[1] == t) else
                                    "; no generated answers in these rows (`zyfa longctx --generate N` makes them)")
                                + "."))
            name = f"fig_longctx_{slug(m)}_{slug(t)}.png"
            images[name] = _fig_curves(rows, lt, m, t, names, base)
            blocks.append(("img", name, f"{m}, {t}: accuracy, Δ log p and operator error against length"))
            hname = f"fig_longctx_heat_{slug(m)}_{slug(t)}.png"
            images[hname] = _fig_heatmaps(cells, m, t, names, base)
            blocks.append(("img", hname, f"{m}, {t}: exact match by depth and length per implementation"))
    unsupported = sorted({(r["model"], r["implementation"], r.get("error") or "") for r in rows
                          if r.get("status") in ("unsupported", "failed")})
    if unsupported:
        blocks.append(("h", level + 1, "Not run"))
        blocks.append(("table", "longctx-not-run", ["model", "implementation", "why"],
                       [[m, md_cell(i), md_cell(e)] for m, i, e in unsupported], True))
    fallbacks = sorted({(r["model"], r["implementation"], what) for r in rows if isinstance(r.get("ran"), dict)
                        for what in r["ran"] if what.startswith("stock sdpa (fallback")})
    if fallbacks:
        blocks.append(("p", "Layers run by the model's own attention because the implementation refuses them: "
                       + "; ".join(f"{m} `{i}`: {w}" for m, i, w in fallbacks) + "."))
    if cliff_table is not None:
        header, trs = cliff_table
        blocks.append(("h", level + 1, "Length cliffs"))
        blocks.append(("table", "longctx-cliffs", list(header), [list(r) for r in trs], True))
    runs = [seg for p in provs for seg in run_provenances(p)]  # every segment of a resumed file: where rows ran
    cmds = sorted({p.get("command") for p in runs if p.get("command")})
    commits = sorted({str(p.get("git_commit")) for p in runs if p.get("git_commit")})
    devices = sorted({str(p.get("device_name") or (p.get("cuda_device") if str(p.get("device")).startswith("cuda")
                                                    else None) or p.get("device"))
                      for p in runs if p.get("device_name") or p.get("device")})
    shards = [line for p in provs for line in [sharding_line(p)] if line]
    if shards:
        blocks.append(("p", "Sharded (torchrun, docs/SHARDING.md): " + "; ".join(shards) + "."))
    if cmds:
        blocks.append(("p", "Made by: " + "; ".join(f"`{c}`" for c in cmds) + (f" (commit {', '.join(commits)}"
                       f", {', '.join(devices)})" if commits else "")))
    return blocks, images, h


def render_folder(results, out_dir: str | Path, cliffs: str | None = None, force: bool = False,
                  plan: str | None = None) -> Path:
    """Render long-context results (JSONL paths or globs) into ``out_dir``: report.md, report.html, figures.
    An existing report.md there is kept unless ``force``. ``plan``: a study plan file; its verdicts lead the
    report, and rows not written under the plan as it is now are refused
    (:func:`zyfa.accuracy.scoring.plan.check_rows`)."""
    try:
        rows, provs = load_rows(results)
    except (FileNotFoundError, ValueError) as e:
        raise RenderError(str(e)) from None
    if not rows:
        raise RenderError(f"{results}: no long-context rows (kind 'longctx')")
    lead: list[tuple] = []
    if plan is not None:
        try:
            the_plan = load_plan(plan)
            check_rows(the_plan, rows, str(results))
        except PlanError as e:
            raise RenderError(str(e)) from None
        lead = plan_blocks(the_plan, rows, level=2)
    out = Path(out_dir)
    if (out / "report.md").exists() and not force:
        raise RenderError(f"{out / 'report.md'} exists: add --force to replace it, or choose another --out")
    table = cliff_table(cliffs) if cliffs is not None else None
    if plan is not None and baseline_of(rows) is None:  # a plan whose arms are all kernels (no stock): its verdicts
        blocks, images = [("p", "The rows have no baseline of the descriptive tables (sdpa-fp32, fp32 or stock): "
                                "the plan's verdicts above are the whole report.")], {}
    else:
        blocks, images, _ = section_blocks(rows, provs, table, level=2, under_plan=plan is not None)
    doc = Doc(title="ZYFA long-context retrieval")
    mixed = mixed_code_notice(provs)
    doc.blocks = ([("p", f"**{mixed}**")] if mixed else []) + lead + blocks
    doc.images = images
    return write_report(doc, out)["markdown"]


def cliff_table(path: str):
    """(header, rows) of the cliff finder's flags in ``path`` (its JSONL), by its own renderer."""
    try:
        from zyfa.accuracy.cliffs.section import flag_table  # the cliff finder's table, where that module exists
    except ImportError:
        raise RenderError("the cliff finder's renderer (accuracy.cliffs.section) is not installed") from None
    return flag_table(path)
