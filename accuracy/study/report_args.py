"""``zyfa report``'s command line: its flags and the checks that need no heavy import, so that the ``zyfa``
dispatch refuses a bad argument in one line before :mod:`zyfa.accuracy.study.report_cli` (the report's builders,
scipy) is imported.

Exposed: ``add_arguments(parser)``, ``check_args(args)``.
"""

from __future__ import annotations

import argparse
import glob
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", action="append", required=True,
                        help="result files (.jsonl or .csv from zyfa accuracy/study), comma-separated or repeated")
    parser.add_argument("--bench", action="append", default=None,
                        help="benchmark JSON files (zyfa bench), comma-separated, repeated or a glob (default: the "
                        "bench file zyfa study finds: the repository's reports/bench/bench.json, else its newest "
                        "reports/bench/bench*.json)")
    parser.add_argument("--impact", action="append", default=None,
                        help="zyfa impact result files (JSONL) for the model-impact section: comma-separated, "
                        "repeated or a quoted glob (e.g. 'reports/impact/results*.jsonl'); several files are "
                        "merged (one per concurrent run)")
    parser.add_argument("--longctx", action="append", default=None,
                        help="zyfa longctx result files (JSONL) for the long-context section: comma-separated, "
                        "repeated or a quoted glob")
    parser.add_argument("--cliffs", default=None, help="zyfa cliffs results (JSONL) tabled in the long-context section")
    parser.add_argument("--out", required=True, help="output folder, e.g. reports/mine/")
    parser.add_argument("--title", default="FP8 attention accuracy report", help="report title")
    parser.add_argument("--recipes", default=None,
                        help="comma-separated recipes to report (default: every recipe in the results); the real "
                        "kernels paired with a named recipe stay beside it (--recipes triton-amd keeps "
                        "flash-attn-triton-amd, paired with triton-amd:p_scale=tile_amax), and a real "
                        "implementation's name (flash-attn-triton-amd, triton:zyfa) selects its rows")
    parser.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib needed)")
    parser.add_argument("--force", action="store_true",
                        help="replace a report.md or report.html in --out that zyfa report did not write (without "
                             "it, such a hand-written file is never overwritten)")
    parser.add_argument("--screenshot", action="store_true",
                        help="open report.html in headless Chromium, save report_screenshot.png, fail on console "
                        "errors")


def check_args(args: argparse.Namespace) -> None:
    """FileNotFoundError naming the first ``--results`` file that is not there (a glob that matches nothing
    included), ValueError when none is named."""
    named = [s.strip() for v in args.results for s in v.split(",") if s.strip()]
    if not named:
        raise ValueError("--results names no file")
    for s in named:
        if any(ch in s for ch in "*?[") and not glob.glob(s):
            raise FileNotFoundError(f"--results: no file matches {s}")
        if not any(ch in s for ch in "*?[") and not Path(s).is_file():
            raise FileNotFoundError(f"--results: result file not found: {s}")
