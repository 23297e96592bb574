"""The ``zyfa`` command: one entry point, one subcommand per capability.

Each subcommand lives in the module that owns it and exposes ``add_arguments(parser)`` and ``main(args)``;
modules are imported only when their subcommand runs, so ``zyfa --help`` stays fast and a CPU machine never
imports Triton.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# name -> (module, one-line help). The module provides add_arguments(parser) and main(args) -> int.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "accuracy": ("accuracy.cli", "error of FP8 attention recipes against the FP64 oracle"),
    "recipes": ("zyfa.recipes_cli", "list the named recipes and their numerics"),
    "capture": ("capture.cli", "capture Q/K/V from a real model into HDF5"),
    "bench": ("zyfa.bench", "benchmark the Triton FP8 kernels against cuDNN and SDPA (GPU)"),
    "report": ("accuracy.report", "render result files into Markdown, PNG and HTML reports"),
    "study": ("accuracy.study", "the one-command study: captures + Gaussian inputs -> accuracy -> report"),
    "impact": ("accuracy.impact", "perplexity and next-token KL with each recipe swapped into a model"),
}


def _available() -> dict[str, tuple[str, str]]:
    """Subcommands whose module is present in this checkout."""
    found = {}
    for name, (module, help_) in SUBCOMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            found[name] = (module, help_)
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zyfa", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    available = _available()
    if argv and argv[0] in available:
        name = argv[0]
        module = importlib.import_module(available[name][0])
        parser = argparse.ArgumentParser(prog=f"zyfa {name}", description=available[name][1])
        module.add_arguments(parser)
        args = parser.parse_args(argv[1:])
        return int(module.main(args) or 0)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
