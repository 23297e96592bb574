"""The report of a study, composed: accuracy rows, benchmark JSON and model-impact rows into one document.

``zyfa study`` (after its run) and ``zyfa report`` (from result files) both render through :func:`render`, so
the two give the same report from the same files. The quantization section and the closing recommendation table
(:mod:`zyfa.accuracy.report.quantization`) come from the accuracy rows, the impact rows and the benchmark rows.

Exposed: ``split_paths(values)``, ``find_bench(root)``, ``ReportInputs``, ``load_report_inputs(...)``,
``render(...)``, ``REPO_ROOT``.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from zyfa.accuracy.impact.rows import load_rows, prepare_rows
from zyfa.accuracy.impact.section import report_section, summarize
from zyfa.accuracy.io.schemas import mixed_code_notice
from zyfa.accuracy.report.build import build_report
from zyfa.accuracy.report.claims import claims_headline
from zyfa.accuracy.report.document import Doc, write_report
from zyfa.accuracy.report.front import source_label, sources_of
from zyfa.accuracy.report.hd128 import hd128_section
from zyfa.accuracy.report.quantization import quantization_section, recommendation_section
from zyfa.accuracy.report.real_kernels import report_section as real_kernels_section
from zyfa.accuracy.report.real_kernels import split_real, unavailable_of
from zyfa.accuracy.report.results import Results
from zyfa.accuracy.report.speed import load_bench
from zyfa.accuracy.study.hd128_answer import lead_section

# the repository this package sits in (the committed reports and datasets are found from here, not from the
# current directory)
REPO_ROOT = Path(__file__).resolve().parents[2]


def split_paths(values: Sequence[str] | None) -> list[str]:
    """Paths of comma-separated and/or repeated values; globs (``*?[``) expanded in sorted order."""
    out = []
    for v in values or []:
        for s in v.split(","):
            s = s.strip()
            if not s:
                continue
            hits = sorted(glob.glob(s)) if any(ch in s for ch in "*?[") else [s]
            out += hits
    return out


def find_bench(root: str | Path = REPO_ROOT) -> list[str]:
    """The current benchmark JSON of ``root``: ``reports/bench/bench.json``, else the last by name of
    ``reports/bench/bench*.json`` (names carry the date); [] when there is none."""
    reports = Path(root).resolve() / "reports" / "bench"
    found = [reports / "bench.json"] if (reports / "bench.json").is_file() else [
        Path(p) for p in sorted(glob.glob(str(reports / "bench*.json")))[-1:]]
    return [_shown(p) for p in found]


def _shown(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it (as a user would type it)."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@dataclass
class ReportInputs:
    """What a report shows besides the accuracy rows: benchmark files and model-impact files, loaded."""

    bench_paths: list[str] = field(default_factory=list)
    bench: list = field(default_factory=list)  # accuracy.report.speed.load_bench
    impact_paths: list[str] = field(default_factory=list)
    impact: tuple[list, list] | None = None  # (rows, files) of accuracy.impact.rows.load_rows
    longctx_paths: list[str] = field(default_factory=list)
    longctx: tuple[list, list] | None = None  # (rows, provenances) of accuracy.longctx.scores.load_rows
    cliffs_path: str | None = None  # the length-cliff finder's JSONL, tabled in the long-context section


def load_report_inputs(bench_paths: Sequence[str | Path] = (),
                       impact_paths: Sequence[str | Path] = (), longctx_paths: Sequence[str | Path] = (),
                       cliffs_path: str | Path | None = None) -> ReportInputs:
    """Load the benchmark, impact and long-context files (ValueError, FileNotFoundError or OSError naming the bad
    one)."""
    # lazy: imports torch; zyfa report reads results without torch
    from zyfa.accuracy.longctx.scores import BASELINES, baseline_of
    from zyfa.accuracy.longctx.scores import load_rows as load_longctx

    bench = load_bench(bench_paths)
    impact = load_rows(impact_paths) if impact_paths else None
    longctx = load_longctx([str(p) for p in longctx_paths]) if longctx_paths else None
    if longctx is not None and longctx[0] and baseline_of(longctx[0]) is None:  # refused before anything is written
        raise ValueError(f"--longctx: {', '.join(map(str, longctx_paths))} has no rows of a baseline implementation "
                         f"({', '.join(BASELINES)}) that ran, so no implementation can be compared with it")
    if cliffs_path is not None and not Path(cliffs_path).is_file():
        raise FileNotFoundError(f"--cliffs: no such file: {cliffs_path}")
    return ReportInputs([str(p) for p in bench_paths], bench, [str(p) for p in impact_paths], impact,
                        [str(p) for p in longctx_paths], longctx, str(cliffs_path) if cliffs_path else None)


def _cliffs_section(path: str):
    """The length-cliff finder's flags (``zyfa cliffs``) as a report section of their own."""
    # lazy: imports torch; zyfa report reads results without torch
    from zyfa.accuracy.longctx.section import cliff_table

    header, rows = cliff_table(path)

    def add(doc: Doc, plots: bool) -> None:
        doc.h(2, "Length cliffs")
        doc.p(f"Flags of the length-cliff finder (`zyfa cliffs`, docs/CLIFFS.md) from `{path}`: NaN rows, error jumps "
              "above 3x the median of the lengths within ±16, and lengths a kernel refuses.")
        doc.table("longctx-cliffs", header, rows, text=True)

    return add


def _longctx_section(inputs: ReportInputs):
    """The long-context section as a report section (``add(doc, plots)``), and its one-sentence finding."""
    # lazy: imports torch; zyfa report reads results without torch
    from zyfa.accuracy.longctx.section import cliff_table, section_blocks

    rows, provs = inputs.longctx
    table = cliff_table(inputs.cliffs_path) if inputs.cliffs_path else None
    blocks, images, headline = section_blocks(rows, provs, table, level=2)

    def add(doc: Doc, plots: bool) -> None:
        for b in blocks:
            if b[0] == "img":
                if plots:
                    doc.img(b[1], images[b[1]], b[2])
            else:
                doc.blocks.append(b)

    return add, headline


def _longctx_source(inputs: ReportInputs) -> str:
    """The source labels of the long-context files (:func:`zyfa.accuracy.report.front.source_label`), each once."""
    provs = inputs.longctx[1]
    paths = split_paths(inputs.longctx_paths)
    names = paths if len(paths) == len(provs) else [f"{', '.join(inputs.longctx_paths)} ({i + 1})"
                                                     for i in range(len(provs))]
    return "; ".join(dict.fromkeys(source_label(n, p) for n, p in zip(names, provs, strict=True))) or "files"


def render(res: Results, out: str | Path, inputs: ReportInputs, *, command: str = "", title: str,
           plots: bool = True, this_run: Sequence[str] = (), lead_hd128: bool = True) -> tuple[Doc, dict[str, Path]]:
    """Build the report of ``res`` with ``inputs`` and write it into ``out``; (document, written paths).
    ``this_run``: the labels of ``res``' files that this command wrote (the front page calls them "this run").
    ``lead_hd128``: open with the answer at head dim 128 (:mod:`zyfa.accuracy.study.hd128_answer`: this run's hd128
    capture rows, or the committed ones)."""
    all_rows = res.rows
    recipe_rows, real_rows = split_real(res.rows)
    # (copies: prepare_rows corrects rows in place, and the impact section prepares them again, with its notes)
    impact = summarize(prepare_rows([dict(r) for r in inputs.impact[0]])[0]) if inputs.impact is not None else None
    # the paper's claims compare zyfa with its peers: where the rows have zyfa
    has_zyfa = any(r.get("recipe") == "zyfa" for r in recipe_rows)
    sections = [hd128_section(recipe_rows)] if has_zyfa else []
    sections += [quantization_section(recipe_rows)]
    sections += [report_section(*inputs.impact)] if inputs.impact is not None else []
    front_lines = [f"**The paper's claims at head dim 128** ([details](#t-claims); from "
                   f"{sources_of(recipe_rows, res.provenances, this_run)}): {claims_headline(recipe_rows)}"
                   ] if has_zyfa else []
    mixed = mixed_code_notice([p for _, p in res.provenances] + (inputs.longctx[1] if inputs.longctx else []))
    if mixed:  # rows of several commits or a dirty tree: said first, where the findings are
        front_lines.insert(0, f"**{mixed}** ([provenance](#t-provenance))")
    if inputs.longctx is not None and inputs.longctx[0]:
        add, headline = _longctx_section(inputs)
        sections.append(add)
        if headline:
            front_lines.append(f"**Long context** ([details](#longctx-baseline); from "
                               f"{_longctx_source(inputs)}): {headline}")
    elif inputs.cliffs_path:  # the length-cliff table alone, until long-context rows exist
        sections.append(_cliffs_section(inputs.cliffs_path))
    closing = [recommendation_section(recipe_rows, impact, inputs.bench)]
    provs = [p for _, p in res.provenances]
    if real_rows or unavailable_of(provs):  # real kernels: their own section, and rows beside their recipes
        kept = {r["recipe"] for r in recipe_rows}
        res = Results(recipe_rows, res.provenances, [x for x in res.recipes if x in kept], res.replaced,
                      res.orphans)
        sections.append(real_kernels_section(real_rows, provs))
    lead = [lead_section(all_rows, res.provenances, this_run)] if lead_hd128 else []
    doc = build_report(res, bench=inputs.bench, command=command, title=title, plots=plots, sections=sections,
                       front_rows=all_rows, real_rows=real_rows, closing=closing, front_lines=front_lines,
                       this_run=this_run, lead=lead)
    return doc, write_report(doc, out)
