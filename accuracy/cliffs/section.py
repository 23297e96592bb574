"""Rendering of a length-cliff sweep (``zyfa cliffs``): the error-against-length plot with the flagged points
marked, the table of flags with reproducers, and the same as report blocks for the study.

Everything here reads sweep rows and their provenance only (:mod:`zyfa.accuracy.cliffs.sweep` makes them), so a GPU
run's JSONL renders on any machine.

Exposed:
    flag_groups(rows, provenance, rule=None) -> list[dict]   the flags, consecutive refused/NaN runs merged
    cliff_table(rows, provenance, rule=None) -> (header, body)   the table of flags (strings), for any renderer
    flag_table(paths, rule=None) -> (header, body)   the same, read from sweep files (zyfa study, zyfa longctx)
    smallest_reproducers(rows, provenance, rule=None) -> list[dict]   per subject/mask/shape/kind: shortest length
    plot_png(rows, provenance, rule=None) -> bytes
    add_section(doc, rows, provenance, *, rule=None, level=2, image="cliffs.png")   into a report Doc
    render(rows, provenance, out_dir, *, rule=None) -> {"markdown": Path, "png": Path}
    rule_of(provenance, **overrides) -> CliffRule
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from zyfa.accuracy.cliffs.flags import CliffRule, find_flags, read_sweeps, reproducers
from zyfa.accuracy.cliffs.sweep import WINDOW, format_lengths
from zyfa.accuracy.io.results_io import run_provenances
from zyfa.accuracy.io.schemas import mixed_code_notice
from zyfa.accuracy.report.blocks import blocks_markdown, fmt
from zyfa.accuracy.report.document import Doc
from zyfa.accuracy.report.plots import png, pyplot

from zyfa.outputs import atomic_write_bytes, atomic_write_text

__all__ = ["TABLE_HEADER", "add_section", "cliff_table", "flag_groups", "flag_table", "plot_png", "render",
           "rule_of", "smallest_reproducers"]

TABLE_HEADER = ("implementation", "mask/shape", "length", "kind", "error", "neighbour median", "ratio",
                "reproducer")
_RULE_FIELDS = ("metric", "factor", "half_window", "min_neighbours", "floor")


def rule_of(provenance: dict, **overrides) -> CliffRule:
    """The rule the run recorded (its provenance's ``rule``), with the given fields replaced (None: kept)."""
    rec = {k: v for k, v in (provenance.get("rule") or {}).items() if k in _RULE_FIELDS}
    rec.update({k: v for k, v in overrides.items() if v is not None})
    return CliffRule(**rec)


def _shape_label(r: dict) -> str:
    shape = "s_q=s_k" if r.get("shape") == "equal" else f"s_q={r.get('chunk')}<s_k"
    hd = f", d={r['head_dim']}" if r.get("head_dim") is not None else ""
    return f"{'causal' if r.get('mask') == 'causal' else 'no mask'}, {shape}{hd}"


def _key(r: dict) -> tuple:
    return (r.get("implementation"), r.get("mask"), r.get("shape"), r.get("head_dim"))


def flag_groups(rows: Sequence[dict], provenance: dict, rule: CliffRule | None = None) -> list[dict]:
    """The flags of ``rows`` for a table: jumps one by one; ``nonfinite``, ``refused`` and ``failed`` flags at
    consecutive measured lengths of one series (same reason) merged into one entry. Each entry is its first
    (shortest) flag with ``lengths`` (the merged lengths; reasons that differ only in their numbers merge, the
    first is kept), ``reproducer`` (``zyfa cliffs`` at that first length)
    and ``accuracy_reproducer``."""
    rule = rule or rule_of(provenance)
    flags = find_flags(rows, rule)
    measured: dict[tuple, list[int]] = {}
    for r in rows:
        measured.setdefault(_key(r), []).append(int(r["length"]))
    index = {k: {L: i for i, L in enumerate(sorted(set(v)))} for k, v in measured.items()}
    groups: list[dict] = []
    for f in flags:
        key = _key(f)
        last = groups[-1] if groups else None
        if (last is not None and f["kind"] != "jump" and last["kind"] == f["kind"] and _key(last) == key
                and _reason_kind(last.get("reason")) == _reason_kind(f.get("reason"))
                and index[key][f["length"]] == index[key][last["lengths"][-1]] + 1):
            last["lengths"].append(f["length"])
            if (f.get("nonfinite_rows") or 0) > (last.get("nonfinite_rows") or 0):
                last["nonfinite_rows"] = f["nonfinite_rows"]
            continue
        rep = reproducers(f, provenance)
        groups.append({**f, "lengths": [f["length"]], "reproducer": rep["cliffs"],
                       "accuracy_reproducer": rep["accuracy"]})
    return groups


def _reason_kind(reason) -> str | None:
    """A reason with its numbers blanked: refusals that differ only in the length they name merge."""
    return None if reason is None else re.sub(r"\d+", "N", str(reason))


# a flag's lengths written out in full up to this many characters; longer: first..last and the count
LENGTHS_CELL_MAX = 60


def _lengths_cell(ls: list[int]) -> str:
    if len(ls) == 1:
        return str(ls[0])
    spec = format_lengths(ls)
    if len(spec) > LENGTHS_CELL_MAX:
        spec = f"{ls[0]}..{ls[-1]}, not all"
    return f"{spec} ({len(ls)} lengths)"


def cliff_table(rows: Sequence[dict], provenance: dict, rule: CliffRule | None = None) -> tuple[list[str], list]:
    """(header, body) of the table of flags, cells as strings (:data:`TABLE_HEADER`). ``error`` is the rule's
    metric; for ``nonfinite`` flags it says how many query rows are non-finite (the most at any merged length),
    for ``refused``/``failed`` the reason is in the ratio's place."""
    body = []
    for g in flag_groups(rows, provenance, rule):
        if g["kind"] == "nonfinite":
            err, med, ratio = f"{g['nonfinite_rows']} of {_n_rows(rows, g)} rows NaN/Inf", "-", "-"
        elif g["kind"] in ("refused", "failed"):
            err, med, ratio = "-", "-", (g.get("reason") or "")[:160]
        else:
            err, med, ratio = fmt(g["error"]), fmt(g["neighbour_median"]), fmt(g["ratio"], ".2f") + "x"
        body.append([g["implementation"], _shape_label(g), _lengths_cell(g["lengths"]), g["kind"], err, med, ratio,
                     f"`{g['reproducer']}`"])
    return list(TABLE_HEADER), body


def _n_rows(rows, g) -> str:
    for r in rows:
        if _key(r) == _key(g) and int(r["length"]) == g["length"]:
            return str(r.get("n_rows"))
    return "?"


def flag_table(paths, rule: CliffRule | None = None) -> tuple[list[str], list]:
    """(header, body) of :func:`cliff_table` for sweep files (a path, a list or comma-separated; ``.partial``
    too: :func:`zyfa.accuracy.cliffs.flags.read_sweeps`), for a report that tables another command's sweep."""
    rows, prov = read_sweeps(paths, flag="cliffs")
    return cliff_table(rows, prov, rule)


def smallest_reproducers(rows: Sequence[dict], provenance: dict, rule: CliffRule | None = None) -> list[dict]:
    """Per (implementation, mask, shape, kind) with a flag: the shortest flagged length and its one-line
    reproducers (``cliffs``, ``accuracy``); real kernels (built-ins, plug-ins) before recipes."""
    best: dict[tuple, dict] = {}
    for g in flag_groups(rows, provenance, rule):
        key = (*_key(g), g["kind"])
        if key not in best:
            best[key] = g
    return sorted(best.values(), key=lambda g: (g.get("impl_kind") == "recipe", g["implementation"],
                                                str(g.get("head_dim")), g["mask"], g["shape"], g["kind"]))


# ---------------------------------------------------------------------------------------------- plot

_MARK = {"jump": ("o", "jump above neighbours"), "nonfinite": ("X", "NaN/Inf rows (at top)"),
         "refused": ("|", "refused (at bottom)"), "failed": ("x", "failed (at bottom)")}


def plot_png(rows: Sequence[dict], provenance: dict, rule: CliffRule | None = None) -> bytes:
    """Error (the rule's metric) against length, one panel per mask/shape, one line per implementation (a gap
    of more than the default window breaks it), log-log; flagged points marked: jumps circled in red, NaN/Inf
    rows as X along the top, refused/failed lengths along the bottom."""
    plt = pyplot()
    rule = rule or rule_of(provenance)
    flags = find_flags(rows, rule)
    panels = sorted({(r.get("mask"), r.get("shape"), r.get("head_dim")) for r in rows},
                    key=lambda k: (str(k[2]), k[1] != "equal", str(k)))
    names = list(dict.fromkeys(r["implementation"] for r in rows))
    cmap = plt.get_cmap("tab20" if len(names) > 10 else "tab10")
    colour = {n: cmap(i % cmap.N) for i, n in enumerate(names)}
    n = max(1, len(panels))
    cols = 2 if n > 1 else 1
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(7.5 * cols, 4.2 * nrows), squeeze=False)
    seen_kinds = set()
    for ax, (mask, shape, hd) in zip(axes.flat, panels, strict=False):
        sample = next(r for r in rows if (r.get("mask"), r.get("shape"), r.get("head_dim")) == (mask, shape, hd))
        any_err = False
        for name in names:
            pts = sorted((int(r["length"]), r.get(rule.metric)) for r in rows
                         if _key(r) == (name, mask, shape, hd))
            xs, ys, prev = [], [], None
            for L, e in pts:
                if prev is not None and L - prev > WINDOW:
                    xs.append(math.nan)
                    ys.append(math.nan)
                xs.append(L)
                ys.append(e if isinstance(e, (int, float)) and math.isfinite(e) and e > 0 else math.nan)
                prev = L
            any_err = any_err or any(not math.isnan(y) for y in ys)
            ax.plot(xs, ys, lw=0.8, color=colour[name], label=name, marker="." if len(pts) < 60 else None, ms=3)
        trans = ax.get_xaxis_transform()
        for f in flags:
            if (f["mask"], f["shape"], f.get("head_dim")) != (mask, shape, hd):
                continue
            seen_kinds.add(f["kind"])
            c = colour[f["implementation"]]
            if f["kind"] == "jump":
                ax.scatter([f["length"]], [f["error"]], s=60, facecolors="none", edgecolors="red", lw=1.4, zorder=5)
            elif f["kind"] == "nonfinite":
                ax.scatter([f["length"]], [0.96], marker="X", s=30, color=c, transform=trans, zorder=5, clip_on=False)
            else:
                ax.scatter([f["length"]], [0.03], marker=_MARK[f["kind"]][0], s=40, color=c, transform=trans,
                           zorder=5, clip_on=False)
        ls = [int(r["length"]) for r in rows if (r.get("mask"), r.get("shape"), r.get("head_dim")) == (mask, shape, hd)]
        lo, hi = min(ls), max(ls)
        if hi >= 20 * lo:
            ax.set_xscale("log")
            ax.set_xlim(lo / 1.15, hi * 1.15)
        else:
            pad = max(1.0, 0.03 * (hi - lo))
            ax.set_xlim(lo - pad, hi + pad)
        if any_err:
            ax.set_yscale("log")
        else:
            ax.set_ylim(0, 1)
        ax.set_xlabel("sequence length (keys)")
        ax.set_ylabel(rule.metric.replace("_", " "))
        ax.set_title(_shape_label(sample), fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    for kind in FLAG_ORDER:
        if kind in seen_kinds:
            marker, text = _MARK[kind]
            if kind == "jump":
                h = plt.Line2D([], [], marker=marker, ls="none", markerfacecolor="none", markeredgecolor="red")
            else:
                h = plt.Line2D([], [], marker=marker, ls="none", color="0.3")
            handles.append(h)
            labels.append(text)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(5, max(1, len(labels))),
               fontsize=8, frameon=False)
    src = provenance.get("input_source") or {}
    fig.suptitle(f"Error against FP64 by length ({src.get('source', 'input')}, {provenance.get('device_name', '')})",
                 fontsize=11)
    fig.tight_layout()
    return png(fig)


FLAG_ORDER = ("jump", "nonfinite", "refused", "failed")


# ---------------------------------------------------------------------------------------------- documents

def _summary(rows: Sequence[dict], provenance: dict, rule: CliffRule) -> str:
    src = provenance.get("input_source") or {}
    if src.get("source") == "capture":
        what = f"capture {src.get('file')} layer {src.get('layer')} (first L tokens)"
    else:
        spec = src.get("spec") or {}
        what = (f"Gaussian, batch {spec.get('batch')}, heads {spec.get('heads_q')}/{spec.get('heads_kv')}, head dim "
                f"{spec.get('head_dim')}, seed {spec.get('seed')}"
                + (f", outliers {spec.get('outlier_frac')}x{spec.get('outlier_scale')}"
                   if spec.get("outlier_frac") else ""))
    # where the rows ran: each segment of a resumed sweep (oldest first)
    ran = "; then ".join(f"{p.get('device_name')}, zyfa {p.get('zyfa_version')} @ "
                         f"{(p.get('git_commit') or 'no git')[:10]}, {p.get('date_utc')}"
                         for p in run_provenances(provenance) or [{}])
    shapes = provenance.get("shapes") or []
    chunk = (f" (chunk: the last {provenance.get('chunk')} query rows against all L keys, at L > "
             f"{provenance.get('chunk')})" if "chunk" in shapes else "")
    return (f"{len(rows)} rows: {what}; lengths {provenance.get('lengths')}; masks "
            f"{', '.join(provenance.get('masks') or [])}; shapes {', '.join(shapes)}{chunk}. Device "
            f"{ran}. Flag rule: {rule.describe()}; NaN/Inf rows, refused and failed lengths "
            "are flagged at every length where they occur."
            + (" Some runs were cut short: only the rows they finished are shown." if _partial(provenance) else ""))


def _partial(provenance: dict) -> bool:
    return bool(provenance.get("partial")) or any(m.get("partial") for m in provenance.get("merged_from") or [])


def add_section(doc: Doc, rows: Sequence[dict], provenance: dict, *, rule: CliffRule | None = None, level: int = 2,
                image: str = "cliffs.png", title: str = "Length cliffs") -> None:
    """The sweep as report blocks: a summary, the plot, the table of flags (key ``t-cliffs``), the smallest
    reproducers and the implementations without flags."""
    rule = rule or rule_of(provenance)
    doc.h(level, title)
    mixed = mixed_code_notice(provenance.get("merged_from") or [provenance])
    if mixed:
        doc.p(f"**{mixed}**")
    doc.p(_summary(rows, provenance, rule))
    doc.img(image, plot_png(rows, provenance, rule), f"{rule.metric} against length; flagged points marked")
    header, body = cliff_table(rows, provenance, rule)
    doc.h(level + 1, "Flags")
    if body:
        doc.table("t-cliffs", header, body, text=True)
    else:
        doc.p("No flags.")
    reps = smallest_reproducers(rows, provenance, rule)
    if reps:
        doc.h(level + 1, "Smallest reproducers")
        lines = []
        for g in reps:
            lines.append(f"# {g['implementation']} ({_shape_label(g)}): {g['kind']} at {g['length']}")
            lines.append(g["reproducer"])
            if g.get("accuracy_reproducer"):
                lines.append(g["accuracy_reproducer"])
        doc.code("\n".join(lines))
    flagged = {g["implementation"] for g in reps}
    clean = [n for n in dict.fromkeys(r["implementation"] for r in rows) if n not in flagged]
    if clean:
        doc.p("No flags: " + ", ".join(f"`{n}`" for n in clean) + ".")
    unavailable = provenance.get("implementations_unavailable") or {}
    if unavailable:
        doc.p("Not run: " + "; ".join(f"`{k}`: {v}" for k, v in unavailable.items()) + ".")


def render(rows: Sequence[dict], provenance: dict, out_dir: str | Path, *, rule: CliffRule | None = None) -> dict:
    """Write ``cliffs.png`` and ``cliffs.md`` (each atomically) into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = Doc("Length cliffs")
    add_section(doc, rows, provenance, rule=rule, level=2, title="Error against length")
    paths = {}
    for name, data in doc.images.items():
        atomic_write_bytes(out / name, data)
        paths["png"] = out / name
    md = "\n".join([f"# {doc.title}", "", *blocks_markdown(doc.blocks)]).rstrip() + "\n"
    atomic_write_text(out / "cliffs.md", md)
    paths["markdown"] = out / "cliffs.md"
    return paths
