"""``zyfa report``: render result files (and benchmark JSON, and model-impact rows) into Markdown, PNG plots and
one HTML file.

    zyfa report --results reports/study/results.jsonl --out reports/study
    zyfa report --results a.jsonl,b.jsonl --bench reports/bench/bench.json --out reports/mine
    zyfa report --results reports/study/results.jsonl --impact 'reports/impact/results*.jsonl' --out reports/mine

Writes ``report.md`` (with ``fig_*.png`` next to it) and ``report.html`` (self-contained: the same content,
plots inlined as base64 data URIs, inline CSS, no script, no external resource). It reads result files
only and never runs a kernel. The content is :func:`zyfa.accuracy.report.build.build_report`'s; with ``--impact``
(``zyfa impact`` result files, merged), the model-impact section of :mod:`zyfa.accuracy.impact.section`
(perplexity and next-token KL per model and recipe with CIs over windows, the per-layer sweep) comes after
the model and Gaussian sections, with a figure of the KL per recipe. The report is composed as
:mod:`zyfa.accuracy.study.compose` composes the study's, so both commands give the same report from the same files.

A hand-written ``report.md`` or ``report.html`` already in ``--out`` (one without the "Regenerate" command every
report carries) is never overwritten without ``--force``. Duplicate rows (one measurement made twice) keep the
later one (a later file on the command line, or a later line of a file), with a one-line notice counting them;
rows whose ``run_id`` no provenance record names are counted in a notice and flagged in the report.

Without ``--bench`` the speed tables come from the bench file ``zyfa study`` finds
(:func:`zyfa.accuracy.study.compose.find_bench`).

Exposed: ``main(args) -> int``, ``report_command(...)``, ``check_not_hand_written``; the flags are in
:mod:`zyfa.accuracy.study.report_args` (``add_arguments``, ``check_args``), read before this module is imported.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from zyfa.accuracy.report.document import save_screenshot
from zyfa.accuracy.report.results import load_results, select_recipes
from zyfa.accuracy.study.compose import find_bench, load_report_inputs, render, split_paths

from zyfa.outputs import check_dir_writable

# Free space a report needs (Markdown, HTML with inlined plots, PNGs), checked before rendering.
REPORT_BYTES = 32 << 20
# Files zyfa report replaces in --out, and the text each one it wrote carries (its "Regenerate" command): a file
# of these names without it was written by someone else and is replaced only with --force.
WRITTEN = ("report.md", "report.html")
WRITTEN_MARK = "zyfa report --results"


def check_not_hand_written(out: Path) -> None:
    """ValueError naming the file when ``out`` holds a :data:`WRITTEN` file that zyfa report did not write (it
    lacks :data:`WRITTEN_MARK`): such a file is replaced only with ``--force``."""
    for name in WRITTEN:
        f = out / name
        if not f.is_file():
            continue
        try:
            ours = WRITTEN_MARK in f.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise ValueError(f"cannot read {f}: {e.strerror or e}") from None
        if not ours:
            raise ValueError(f"{f} was not written by zyfa report (it has no \"{WRITTEN_MARK}\" command): not "
                             "overwritten; move it, choose another --out, or add --force to replace it")


def report_command(results: Sequence[str], out: str, bench: Sequence[str] = (), title: str | None = None,
                   shot: bool = False, recipes: str | None = None, impact: Sequence[str] = (),
                   longctx: Sequence[str] = (), cliffs: str | None = None) -> str:
    parts = ["zyfa", "report", "--results", ",".join(map(str, results))]
    if recipes:
        parts += ["--recipes", recipes]
    if bench:
        parts += ["--bench", ",".join(map(str, bench))]
    if impact:
        parts += ["--impact", ",".join(map(str, impact))]
    if longctx:
        parts += ["--longctx", ",".join(map(str, longctx))]
    if cliffs:
        parts += ["--cliffs", str(cliffs)]
    parts += ["--out", str(out)]
    if title and title != "FP8 attention accuracy report":
        parts += ["--title", title]
    if shot:
        parts.append("--screenshot")
    return shlex.join(parts)


def main(args: argparse.Namespace) -> int:
    """Render the report; 0 on success, 2 on bad input (one line on stderr)."""
    results = split_paths(args.results)
    bench_paths = split_paths(args.bench) if args.bench else find_bench()  # the bench zyfa study finds
    impact_paths = split_paths(args.impact)
    longctx_paths = split_paths(getattr(args, "longctx", None))
    cliffs = getattr(args, "cliffs", None)
    try:
        check_dir_writable(args.out, need_bytes=REPORT_BYTES)  # before any rendering
        if not getattr(args, "force", False):
            check_not_hand_written(Path(args.out))
        if not results:
            raise ValueError("--results names no file")
        res = load_results(results)
        if args.recipes:
            res = select_recipes(res, [x.strip() for x in args.recipes.split(",") if x.strip()])
        if args.impact is not None and not impact_paths:
            raise FileNotFoundError(f"--impact: no such file: {', '.join(args.impact)}")
        if getattr(args, "longctx", None) is not None and not longctx_paths:
            raise FileNotFoundError(f"--longctx: no such file: {', '.join(args.longctx)}")
        extra = load_report_inputs(bench_paths, impact_paths, longctx_paths, cliffs)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"zyfa report: error: {e}", file=sys.stderr)
        return 2
    if res.replaced:
        print(f"notice: {res.replaced} duplicate row{'s' if res.replaced != 1 else ''} (same input, content hash, "
              "recipe, implementation, platform and pairing): the later measurement is kept (a later file on the "
              "command line, or a later line of one file), the earlier left out")
    if res.orphans:
        print(f"notice: {res.orphans} row{'s' if res.orphans != 1 else ''} with no provenance record (no provenance "
              "line names their run_id): flagged in the report")
    cmd = report_command(results, args.out, bench_paths, args.title, args.screenshot, args.recipes, impact_paths,
                         longctx_paths, cliffs)
    try:
        doc, paths = render(res, args.out, extra, command=cmd, title=args.title, plots=not args.no_plots)
    except OSError as e:
        print(f"zyfa report: error: cannot write the report into {args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {paths['markdown']} and {paths['html']} ({len(doc.images)} plots)")
    if args.screenshot:
        return save_screenshot(paths["html"])
    stale = Path(args.out) / "report_screenshot.png"
    if stale.is_file():  # it showed the report just replaced: never left beside the new one
        stale.unlink()
        print(f"removed {stale}: it showed the previous report (--screenshot makes a new one)")
    return 0
