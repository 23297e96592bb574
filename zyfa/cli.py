"""The ``zyfa`` command: one entry point, one subcommand per capability.

Each subcommand lives in the module that owns it and exposes ``add_arguments(parser)`` and ``main(args)``, and
optionally ``check_args(args)``; modules are imported only when their subcommand runs, so ``zyfa --help`` stays
fast and a CPU machine never imports Triton. A subcommand's module imports nothing heavy at its top (no torch):
the command line is parsed and ``check_args`` run first, so a bad argument is refused in one line (status 2) in a
fraction of a second, and only then does ``main`` import what the work needs (tests/test_fast_refusals.py,
scripts/bench_refusal_time.py).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from zyfa.capture.version import git_label, git_state

DESCRIPTION = "zyfa: speed and numerical error of FP8 FlashAttention, one subcommand per capability."

# name -> (module, one-line help). The module provides add_arguments(parser) and main(args) -> int.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "accuracy": ("zyfa.accuracy.operator.cli", "error of FP8 attention recipes against the FP64 oracle"),
    "recipes": ("zyfa.recipes_cli", "list the named recipes and their numerics"),
    "capture": ("zyfa.capture.cli", "capture Q/K/V from a real model into HDF5"),
    "bench": ("zyfa.bench.cli", "benchmark the Triton FP8 kernels against cuDNN and SDPA (GPU)"),
    "report": ("zyfa.accuracy.study.report_cli", "render result files into Markdown, PNG and HTML reports"),
    "study": ("zyfa.accuracy.study.cli", "the one-command study: captures + Gaussian inputs -> accuracy -> report"),
    "impact": ("zyfa.accuracy.impact.cli", "perplexity and next-token KL with each recipe swapped into a model"),
    "longctx": ("zyfa.accuracy.longctx.cli",
                "long-context retrieval (needle, passkey) with any implementation in a model"),
    "tasks": ("zyfa.accuracy.tasks.cli",
              "generated-output tasks (HumanEval pass@1, sandboxed) with any implementation"),
    "cliffs": ("zyfa.accuracy.cliffs.cli",
               "the length-cliff finder: error, NaN rows and refusals at every length"),
    "compare": ("zyfa.accuracy.study.compare_cli",
                "two result files compared: the change in error (and speed) of each implementation"),
}


# name -> the module holding add_arguments(parser) and check_args(args), where they live apart from the subcommand's
# own module (which may import heavy packages at its top: torch, scipy): the dispatch parses and checks with it, then
# imports the subcommand's.
ARGUMENTS: dict[str, str] = {
    "study": "zyfa.accuracy.study.study_args",
    "report": "zyfa.accuracy.study.report_args",
    "impact": "zyfa.accuracy.impact.impact_args",
    "bench": "zyfa.bench.args",
    "longctx": "zyfa.accuracy.longctx.args",
}


def _available() -> dict[str, tuple[str, str]]:
    """Subcommands whose module is present in this checkout."""
    found = {}
    for name, (module, help_) in SUBCOMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            found[name] = (module, help_)
    return found


def version_string() -> str:
    """'zyfa 0.1.0 (git <commit>[+dirty])' (:func:`capture.version.git_label`), the commit only where there is one."""
    from zyfa import __version__

    state = git_state()
    return f"zyfa {__version__}" + (f" (git {git_label(state)})" if state.commit else "")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zyfa", description=DESCRIPTION)
    parser.add_argument("--version", action="store_true", help="print the version (and git commit) and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. A closed stdout (``zyfa recipes | head``) ends it quietly with status 141."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away: send what is still buffered nowhere, so the interpreter's exit flush cannot
        # raise again, and exit as a process killed by SIGPIPE would (128 + 13).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    available = _available()
    if argv and argv[0] in available:
        name = argv[0]
        arguments = importlib.import_module(ARGUMENTS.get(name, available[name][0]))
        parser = argparse.ArgumentParser(prog=f"zyfa {name}", description=available[name][1])
        arguments.add_arguments(parser)
        args = parser.parse_args(argv[1:])
        check = getattr(arguments, "check_args", None)
        if check is not None:
            try:
                check(args)
            except (ValueError, FileNotFoundError) as e:
                # REFUSAL: the prefix a command's run gives its own refusals, so a line is the same before torch
                print(f"{getattr(arguments, 'REFUSAL', f'zyfa {name}: error: ')}{e}", file=sys.stderr)
                return 2
        module = importlib.import_module(available[name][0])
        return int(module.main(args) or 0)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(version_string())
        return 0
    if args.command is None:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
