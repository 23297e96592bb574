"""Difficulty selection: the (model, task, length) cells where the baseline sits between 60% and 90%.

Ceiling cells (every arm at 100%) cannot show a loss (study_methods.md §2; RULER, arXiv 2404.06654, varies keys,
values and distractors for the same reason). The procedure, decided before any comparison is run:

1. run the baseline alone (``--implementations stock --dtype bf16 --generate 8``) over a ladder of lengths and
   the tasks, with the seeds (facts) and depths the study will use;
2. :func:`difficulty_table` gives, per cell, the baseline's accuracy by both scores (teacher-forced exact match
   and the generated answer's ``gen_contains``), the number of facts, and whether the cell lies in the band;
3. the study runs the cells in the band (by the generated score where rows have it), every implementation.

``zyfa longctx --calibrate RESULTS`` prints the table.

Exposed: ``TARGET_ACCURACY``, ``difficulty_table``, ``difficulty_markdown``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TARGET_ACCURACY", "difficulty_markdown", "difficulty_table"]

TARGET_ACCURACY = (0.60, 0.90)


def difficulty_table(rows: Sequence[dict], implementation: str,
                     band: tuple[float, float] = TARGET_ACCURACY) -> list[dict]:
    """Per (model, task, length) of ``implementation``'s scored rows: teacher-forced and generated accuracy, facts
    and prompts, and ``in_band`` (by the generated score where the rows have one, else teacher-forced)."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("kind") == "longctx" and r.get("implementation") == implementation and r.get("status") == "ok":
            cells.setdefault((r["model"], r["task"], int(r["length"])), []).append(r)
    out = []
    for (model, task, length), rs in sorted(cells.items()):
        tf = sum(bool(r.get("exact")) for r in rs) / len(rs)
        gen = [r["gen_contains"] for r in rs if isinstance(r.get("gen_contains"), bool)]
        gen_acc = sum(gen) / len(gen) if gen else None
        score = gen_acc if gen_acc is not None else tf
        out.append({"model": model, "task": task, "length": length, "prompts": len(rs),
                    "facts": len({r.get("fact_id") or (r["task"], r.get("seed")) for r in rs}),
                    "teacher_forced": tf, "generated": gen_acc, "in_band": band[0] <= score <= band[1]})
    return out


def difficulty_markdown(rows: Sequence[dict], implementation: str, band: tuple[float, float] = TARGET_ACCURACY) -> str:
    table = difficulty_table(rows, implementation, band)
    lines = [f"Baseline `{implementation}`; band {band[0]:.0%}–{band[1]:.0%} (by the generated score where present)",
             "", "| model | task | length | facts | prompts | teacher-forced % | generated % | in band |",
             "|---|---|---|---|---|---|---|---|"]
    for c in table:
        gen = "—" if c["generated"] is None else f"{100 * c['generated']:.1f}"
        lines.append(f"| {c['model']} | {c['task']} | {c['length']} | {c['facts']} | {c['prompts']} | "
                     f"{100 * c['teacher_forced']:.1f} | {gen} | {'yes' if c['in_band'] else 'no'} |")
    return "\n".join(lines) + "\n"
