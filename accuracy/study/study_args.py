"""``zyfa study``'s command line: its flags and the checks that need no heavy import, so that the ``zyfa``
dispatch refuses a bad argument in one line before :mod:`zyfa.accuracy.study.cli` (torch, scipy, the kernels) is
imported.

Exposed: ``add_arguments(parser)``, ``check_args(args)``, ``DEFAULT_OUT``.
"""

from __future__ import annotations

import argparse
import re

from zyfa.accuracy.implementations.names import check_kernel_flags
from zyfa.accuracy.io.shard import add_shard_arguments
from zyfa.accuracy.study.run import DEFAULT_CLIFFS, DEFAULT_IMPACT, DEFAULT_LONGCTX

from zyfa.platforms import get_platform
from zyfa.plugins import add_wall_arguments
from zyfa.recipe_spec import parse_recipes

# Default output folders, in the current directory: a study never writes into the repository unless asked.
DEFAULT_OUT = {"default": "zyfa-study", "quick": "zyfa-study-quick", "long": "zyfa-study-long"}

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None,
                        help=f"output folder (default ./{DEFAULT_OUT['default']}, ./{DEFAULT_OUT['quick']} with "
                        f"--quick, ./{DEFAULT_OUT['long']} with --long, in the current directory); the committed "
                        "reports/study is rewritten only when named here (with --force)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing --out folder (when the new study is finished)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted study in --out (its rows are kept in <out>.partial/)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a smaller study (shorter inputs, fewer recipes)")
    mode.add_argument("--long", action="store_true",
                      help="the committed long-context study (captures: datasets/long/*.h5 unless --captures)")
    parser.add_argument("--captures", default=None,
                        help="capture .h5 files, comma-separated or a glob (default: datasets/*.h5, with --long "
                        "datasets/long/*.h5; 'none': Gaussian inputs only)")
    parser.add_argument("--recipes", default=None, help="comma-separated recipes (default: every FP8 recipe + bf16)")
    parser.add_argument("--platform", default=None,
                        help="emulate every recipe on this GPU's arithmetic: h200 or mi355x (default: each recipe's "
                             "own; a recipe moved off its own platform is named NAME@PLATFORM)")
    parser.add_argument("--max-seq", type=int, default=None, help="cap the Gaussian sequence lengths")
    parser.add_argument("--gaussian-filter", default=None, metavar="REGEX",
                        help="keep only the Gaussian inputs whose name matches, e.g. 'd128-causal' or '^$' for none")
    parser.add_argument("--max-tokens", type=int, default=None, help="use the first N tokens of each capture")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda when present)")
    parser.add_argument("--bench", default=None, help="benchmark JSON files for the speed tables (default: the "
                        "repository's reports/bench/bench.json, else its newest reports/bench/bench*.json, when "
                        "present)")
    parser.add_argument("--impact", default=None,
                        help="zyfa impact result files for the report's model-impact section, comma-separated or "
                        f"a glob (default: {DEFAULT_IMPACT} when present, none with --long; 'none': no impact section)")
    parser.add_argument("--longctx", default=None,
                        help="zyfa longctx result files for the long-context section, comma-separated or a glob "
                        f"(default with --long: {DEFAULT_LONGCTX} when present; 'none': no such section)")
    parser.add_argument("--cliffs", default=None,
                        help=f"zyfa cliffs results to table in the long-context section (default with --long: "
                        f"{DEFAULT_CLIFFS} when present; 'none': no table)")
    parser.add_argument("--no-progress", action="store_true", help="no progress output")
    parser.add_argument("--allow-failed", action="store_true",
                        help="exit 0 even when real-kernel rows failed or are nonconforming (default: exit 3 once "
                             "the study is written)")
    r = parser.add_argument_group("real kernels (beside their recipes' emulations; docs/real_kernels.md)")
    r.add_argument("--implementations", default=None, metavar="LIST",
                   help="built-in real implementations to run where this machine has them (default 'all': each "
                        "one this machine lacks is listed in the report with the reason; 'none' for none)")
    r.add_argument("--kernel", action="append", metavar="MODULE:FUNCTION",
                   help="your own attention kernel (module:function or path/to/file.py:function; contract in "
                        "docs/CONTRACTS.md), repeatable. This imports the module or file and so runs its top-level "
                        "code, in a worker process (in this process with --kernel-in-process): name only code you "
                        "trust")
    r.add_argument("--kernel-recipe", action="append", metavar="NAME",
                   help="pair --kernel with a recipe's emulation (once for every kernel, or once per --kernel)")
    add_wall_arguments(r)
    add_shard_arguments(parser, "study", "accuracy rows")


def check_args(args: argparse.Namespace) -> None:
    """The checks of the flags alone (numbers, recipe names, the platform, the filter): a ValueError names the
    first bad one. The files named are checked by :func:`zyfa.accuracy.study.cli.main`, before any work."""
    for flag, value in (("--max-seq", args.max_seq), ("--max-tokens", args.max_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.device not in ("cpu", "cuda", "auto"):
        raise ValueError(f"--device must be cpu, cuda or auto, got {args.device!r}")
    if args.recipes is not None:
        parse_recipes(args.recipes)
    if args.platform is not None:
        get_platform(args.platform)
    if args.gaussian_filter is not None:
        try:
            re.compile(args.gaussian_filter)
        except re.error as e:
            raise ValueError(f"--gaussian-filter is not a regular expression: {e}") from None
    if args.kernel_recipe and not args.kernel:
        raise ValueError("--kernel-recipe pairs a --kernel with a recipe; no --kernel given")
    check_kernel_flags(args, "all")  # --implementations (default all), --kernel: the registry's lines, before torch
