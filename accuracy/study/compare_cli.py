"""``zyfa compare A.jsonl B.jsonl [--bench A.json B.json] [--out DIR]``: two result files of ``zyfa accuracy`` or
``zyfa study`` compared per implementation and input (:mod:`zyfa.accuracy.study.compare`; docs/API.md).

Markdown goes to stdout, or to ``DIR/compare.md`` with ``--out DIR`` (an existing one only with ``--force``). Bad
input (a missing file, a file that is not a result file, no implementation and input in common) is one line on
stderr and exit status 2, before any file is written; the arguments and files are checked before the statistics
libraries are imported.

Exposed: ``add_arguments(parser)``, ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zyfa.outputs import OutputError, atomic_write_text, check_writable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``zyfa compare`` arguments."""
    parser.add_argument("a", metavar="A.jsonl", help="the first result file (zyfa accuracy --out, or a study's "
                        "results.jsonl): 'before'")
    parser.add_argument("b", metavar="B.jsonl", help="the second result file: 'after'")
    parser.add_argument("--bench", nargs=2, metavar=("A.json", "B.json"),
                        help="two zyfa bench files: adds the ratio of kernel times B / A per implementation")
    parser.add_argument("--threshold", type=float, default=None,
                        help="the smallest change that matters, a fraction of 1 (default: "
                             "zyfa.accuracy.study.compare.THRESHOLD, 2%%)")
    parser.add_argument("--out", metavar="DIR", help="write DIR/compare.md (the folder is created) instead of "
                        "printing to stdout")
    parser.add_argument("--force", action="store_true", help="replace an existing DIR/compare.md")


def main(args: argparse.Namespace) -> int:
    """Run ``zyfa compare``: 0, or 2 with one line on stderr for bad input."""
    try:
        if args.threshold is not None and not (0 < args.threshold < 1):
            raise ValueError(f"--threshold must lie in (0, 1), got {args.threshold}")
        target = None
        if args.out is not None:
            target = Path(args.out) / "compare.md"
            if Path(args.out).exists() and not Path(args.out).is_dir():
                raise ValueError(f"--out {args.out} is a file; give a folder")
            if target.exists() and not args.force:
                raise ValueError(f"{target} exists; add --force to replace it or choose another --out")
        for p in (args.a, args.b, *(args.bench or ())):
            if not Path(p).exists():
                raise ValueError(f"no such file: {p}")
        from zyfa.accuracy.study.compare import (  # after the checks
            THRESHOLD,
            compare,
            compare_speed,
            load_results,
            render,
        )

        threshold = THRESHOLD if args.threshold is None else args.threshold
        a, b = load_results(args.a), load_results(args.b)
        cmp = compare(a, b, threshold=threshold)
        if args.bench:
            cmp.speed, cmp.speed_meta_diff = compare_speed(*args.bench, threshold=threshold)
        text = render(cmp)
        if target is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            check_writable(target)
    except (ValueError, OSError, OutputError) as e:
        print(f"zyfa compare: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 2
    if target is None:
        sys.stdout.write(text)
    else:
        atomic_write_text(target, text)
        print(f"wrote {target}")
    return 0
