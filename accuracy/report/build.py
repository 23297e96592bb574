"""The accuracy report: tables and figures computed from result rows, in one :class:`Doc`.

Every number is computed from the result rows (or the benchmark rows) here and formatted by
:func:`zyfa.accuracy.report.blocks.fmt`, so a test can parse them back.

Content: a summary of each implementation's absolute error with its interval per model and for the Gaussian inputs
(and ``zyfa``'s paired ratios to each peer); then per model (capture inputs) and for Gaussian inputs: a recipe x
metric table with bootstrap 95% confidence intervals over the inputs; ``zyfa``'s paired error ratio against each
peer on the same inputs (geometric mean, bootstrap CI); the ablation of ZYFA's techniques; per-layer tables and
per-layer x per-head heatmaps (captures); error against sequence length (Gaussian); then, over all inputs, the
rank correlations of the error with input properties (Q/K outliers, attention entropy, flushed probabilities;
each ρ with its p and n), the benchmark tables, every (input, recipe) error, and the inputs with their hashes.
Provenance and the regenerating command come first. Sections made elsewhere (the model-impact section of
:mod:`zyfa.accuracy.impact.section`) are passed in as callables and placed after the model and Gaussian sections.

Real kernels (rows of :mod:`zyfa.accuracy.implementations.real_rows`, ``real: true``) passed as ``real_rows`` are rows
of their own in the summary, the recipe x metric tables and the paired ratio tables, labelled as measured on their
device (:func:`zyfa.accuracy.report.real_kernels.measured_label`: ``cudnn-fp8 (real, H200)``) and placed after the
recipe they are paired with, their emulation. The other tables (ablation, per layer and head, head dim, sequence length,
causes, every result) keep the emulated recipes.

The rows are loaded by :mod:`zyfa.accuracy.report.results`, their statistics computed by
:mod:`zyfa.accuracy.report.stats`, each section rendered by :mod:`zyfa.accuracy.report.sections`; this module puts
them in order.

Exposed: ``build_report(...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from zyfa.accuracy.report.document import Doc
from zyfa.accuracy.report.front import model_anchor, section_front
from zyfa.accuracy.report.real_kernels import measured_on, unavailable_of
from zyfa.accuracy.report.results import GAUSSIAN, Results, group_of, input_key
from zyfa.accuracy.report.sections import (
    section_ablation,
    section_all,
    section_causes,
    section_headdim,
    section_inputs,
    section_layers,
    section_provenance,
    section_ratios,
    section_recipes,
    section_seq,
    section_summary,
)
from zyfa.accuracy.report.speed import section_speed, speed_anchor

__all__ = ["build_report"]


def _real_count(real_rows: list) -> str:
    """" Besides them, N real-kernel rows: K implementations measured on <devices> (M ran, ...)." or ""."""
    if not real_rows:
        return ""
    impls = {r.get("implementation") for r in real_rows}
    devices = sorted({measured_on(r) for r in real_rows})
    ok = sum(r.get("status", "ok") in ("ok", "suspect") for r in real_rows)
    rest = "" if ok == len(real_rows) else \
        "; the others failed or could not take the input, see [not run](#t-real-not-run)"
    return (f" Besides them, {len(real_rows)} real-kernel rows: {len(impls)} implementations measured on "
            f"{', '.join(devices)} ({ok} ran{rest}).")


def build_report(res: Results, *, bench=(), command: str = "", extra_commands: Sequence[str] = (),
                 title: str = "FP8 attention accuracy report", notes: Sequence[str] = (), plots: bool = True,
                 sections: Sequence[Callable[[Doc, bool], None]] = (), front: bool = True,
                 front_rows: Sequence[dict] | None = None, real_rows: Sequence[dict] = (),
                 closing: Sequence[Callable[[Doc, bool], None]] = (), front_lines: Sequence[str] = (),
                 this_run: Sequence[str] = (), lead: Sequence[Callable[[Doc, bool], None]] = ()) -> Doc:
    """The report document for the result rows and benchmark rows (:func:`zyfa.accuracy.report.speed.load_bench`).

    ``res``: the recipes' rows. ``real_rows``: real kernels' rows (``real: true``), shown as rows of their own,
    marked as measured on their device, in the summary, the recipe x metric tables and the paired ratio tables
    (the real-vs-emulated section itself is :func:`zyfa.accuracy.report.real_kernels.report_section`, passed in
    ``sections``). ``front``: open on the front page (:mod:`zyfa.accuracy.report.front`), made from ``front_rows``
    (default: the rows and the real rows). ``sections``: callables ``add(doc, plots)`` that append further
    sections (e.g. the model-impact section, :func:`zyfa.accuracy.impact.section.report_section`), placed after the
    model and Gaussian sections. ``closing``: the same kind of callables, placed last (the recommendation table of
    :mod:`zyfa.accuracy.report.quantization`). ``front_lines``: findings of other sections stated on the front page
    (the long-context finding), one paragraph each. ``this_run``: the labels of the result files this command
    wrote (the front page says their numbers are "this run"; the others are named with their commit). ``lead``:
    sections the front page opens with, before its verdict-and-error table (the study's answer at head dim 128,
    :mod:`zyfa.accuracy.study.hd128_answer`).
    """
    doc = Doc(title=title)
    rows, recipes = res.rows, res.recipes
    real_rows = list(real_rows)
    unavailable = unavailable_of([p for _, p in res.provenances])
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            plots = False
            notes = [*notes, "matplotlib is not installed, so this report has no plots "
                     "(`pip install -e '.[plots]'`)."]
    groups = list(dict.fromkeys(group_of(r) for r in rows))
    groups.sort(key=lambda g: (g == GAUSSIAN, g))
    if front:
        for add in lead:
            add(doc, plots)
        links = [("summary", "t-summary-error")]
        links += [(g if g == GAUSSIAN else f"model {g}", model_anchor(g)) for g in groups]
        speed = speed_anchor(list(bench))  # the speed table that exists; no link without one
        links += [*([("speed", speed)] if speed else []), ("every result", "t-all"),
                  ("inputs", "t-inputs"), ("provenance", "t-provenance")]
        section_front(doc, [*rows, *real_rows] if front_rows is None else front_rows, list(bench), plots, links,
                      findings=front_lines, provenances=res.provenances, this_run=this_run)
        doc.h(2, "About this report")
    if res.replaced:
        notes = [*notes, f"{res.replaced} rows were measured again later (same input, recipe, implementation and "
                 "platform): the later measurement is used, the earlier one left out."]
    if res.orphans:
        files = sorted({str(r.get("_file")) for r in [*rows, *(real_rows or [])] if r.get("_no_provenance")})
        notes = [*notes, f"**{res.orphans} rows have no provenance record** (their `run_id` is named by no "
                 f"provenance line of {', '.join(f'`{f}`' for f in files) or 'the files'}): when, where and how "
                 "they were measured is unknown."]
    study_cmds = [p["study_command"] for _, p in res.provenances if p.get("study_command")]
    cmds = list(dict.fromkeys([*extra_commands, *study_cmds, *([command] if command else [])]))
    doc.p("Regenerate this report with" + (" (the study, then the report alone from its results):"
                                           if len(cmds) > 1 else ":"))
    doc.code("\n".join(cmds))
    n_inputs = len({input_key(r) for r in rows})
    doc.p(f"{len(rows)} result rows: {n_inputs} inputs ({', '.join(groups)}) x {len(recipes)} recipes "
          f"({', '.join(recipes)}), from {', '.join(f'`{n}`' for n, _ in res.provenances)}."
          + _real_count(real_rows))
    many = len(res.provenances) > 1
    for n in [*notes, *((f"`{name}`: " if many else "") + x for name, p in res.provenances
                        for x in (p.get("study_notes") or []))]:
        doc.p(n)
    section_summary(doc, groups, rows, recipes, real_rows, unavailable)
    section_provenance(doc, res)
    for g in groups:
        grows = [r for r in rows if group_of(r) == g]
        greal = [r for r in real_rows if group_of(r) == g]
        doc.h(2, g if g == GAUSSIAN else f"Model: {g}")
        section_recipes(doc, g, grows, recipes, plots, greal)
        section_ratios(doc, g, grows, recipes, greal)
        section_ablation(doc, g, grows, recipes)
        if g == GAUSSIAN:
            section_headdim(doc, g, grows, recipes)
            section_seq(doc, g, grows, recipes, plots)
        else:
            section_layers(doc, g, grows, recipes, plots)
    if GAUSSIAN not in groups:
        doc.h(2, GAUSSIAN)
        doc.p("No Gaussian inputs in these results.")
    for add in sections:
        add(doc, plots)
    section_causes(doc, rows, recipes, plots)
    section_speed(doc, list(bench))
    section_all(doc, rows, recipes)
    section_inputs(doc, rows)
    for add in closing:  # the report ends with these (the quantization recommendation table)
        add(doc, plots)
    return doc
