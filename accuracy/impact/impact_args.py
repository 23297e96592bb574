"""``zyfa impact``'s command line: its flags, defaults and the checks that need no heavy import, so that the
``zyfa`` dispatch refuses a bad argument in one line before :mod:`zyfa.accuracy.impact.cli` (torch, the models) is
imported.

Exposed: ``add_arguments(parser)``, ``check_args(args)``, ``kernel_names(args)``, ``DEFAULT_OUT``, ``DEFAULT_RECIPES``,
``DEFAULT_LAYER_RECIPES``.
"""

from __future__ import annotations

import argparse

from zyfa.accuracy.implementations.names import attention_kind, check_kernels
from zyfa.accuracy.io.shard import add_shard_arguments
from zyfa.capture.models import check_model_names
from zyfa.capture.text import check_text

from zyfa.plugins import add_wall_arguments, wall_options
from zyfa.recipe_spec import get_recipe, split_spec_list

DEFAULT_RECIPES = "zyfa,zyfa-exp2,ck,aiter,fa3,bf16,fp32"
DEFAULT_LAYER_RECIPES = "zyfa,ck,aiter"
# Default results file, in the current directory (never the committed reports/impact/).
DEFAULT_OUT = "zyfa-impact/results.jsonl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="smollm2,gemma3,qwen25coder",
                        help="comma-separated registry names (smollm2, gemma3, qwen25coder) or model paths")
    parser.add_argument("--recipes", default=DEFAULT_RECIPES, help="comma-separated recipe names (the emulator)")
    parser.add_argument("--implementations", default=None,
                        help="real implementations as the model's attention, comma-separated: the registry's names "
                        "(triton:<recipe>, cudnn-fp8, flashinfer-fa3, sdpa-bf16:cudnn, sdpa-fp32, ...); their rows "
                        "carry the name in 'recipe' and what ran in each layer in 'ran'")
    parser.add_argument("--kernel", action="append", metavar="MODULE:FUNCTION",
                        help="your own attention kernel as the model's attention (docs/CONTRACTS.md); imports and "
                        "runs the named file or module (repeatable)")
    parser.add_argument("--kernel-recipe", action="append", metavar="NAME", help="the recipe a --kernel claims")
    add_wall_arguments(parser)
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                        help="where the model and its attention run (default cpu)")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per window (default 2048)")
    parser.add_argument("--windows", type=int, default=2, help="held-out windows per model (default 2)")
    parser.add_argument("--text", default="lee",
                        help="text source: lee, shakespeare, pydoc, paulgraham, or a UTF-8 text file of your own "
                        "(default lee)")
    parser.add_argument("--per-layer", default="", help="models to sweep one layer at a time (comma-separated)")
    parser.add_argument("--layer-recipes", default=DEFAULT_LAYER_RECIPES,
                        help=f"recipes of the per-layer sweep (default {DEFAULT_LAYER_RECIPES})")
    parser.add_argument("--layer-windows", type=int, default=1, help="windows of the per-layer sweep (default 1)")
    parser.add_argument("--layers", default=None, help="restrict the per-layer sweep to these layers (e.g. 0,5,29)")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"results JSONL (default ./{DEFAULT_OUT}); with --render-only: one or "
                        "several files, comma-separated or a quoted glob (e.g. 'reports/impact/results*.jsonl')")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing --out (the old file stays until the new run finishes)")
    parser.add_argument("--markdown", default=None,
                        help="Markdown section to write (default: impact.md next to --out, rendered from every impact "
                             "results file there)")
    parser.add_argument("--resume", action="store_true", help="keep the rows already in --out and skip them")
    parser.add_argument("--render-only", action="store_true",
                        help="only re-render the Markdown from --out (several files are merged)")
    parser.add_argument("--drop-rows", default=None, metavar="MODEL:RECIPE:WINDOW[:LAYER],...",
                        help="remove these rows from --out (moved to <out>.dropped with a note); "
                        "'*' matches anything, e.g. '*:fa3:0'; a later --resume run measures them again")
    parser.add_argument("--reason", default=None, help="with --drop-rows: why, recorded with the dropped rows")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_shard_arguments(parser, "impact", "cells: (model, window, recipe), and (model, window, layer recipe) of "
                                          "a per-layer sweep")


def check_args(args: argparse.Namespace) -> None:
    """The flags' checks that need no heavy import: counts, exclusive flags, model, recipe and text names, the
    implementations' names and the ``--kernel`` specs (their files parsed, not run). The output files, the kernels'
    import and whether they can run here are checked by :func:`zyfa.accuracy.impact.cli.main`, before any work."""
    if args.render_only or args.drop_rows is not None:
        return
    for flag, value in (("--tokens", args.tokens), ("--windows", args.windows), ("--layer-windows", args.layer_windows),
                        ("--threads", args.threads)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.force and args.resume:
        raise ValueError("--force and --resume exclude each other")
    check_model_names([s.strip() for s in args.models.split(",") if s.strip()])
    for spec in split_spec_list(args.recipes) + split_spec_list(args.layer_recipes):
        get_recipe(spec)
    check_text(args.text)
    wall_options(args)
    check_kernels(args.kernel, args.kernel_recipe)
    kernel_names(args)


def kernel_names(args: argparse.Namespace) -> list[str]:
    """The ``--implementations`` names, each a kernel (a built-in, ``triton:SPEC``): a recipe belongs in
    ``--recipes`` and the model's own attention is every row's reference. ValueError in one line. Torch-free."""
    names = split_spec_list(args.implementations or "")
    for n in names:
        kind = attention_kind(n)
        if kind == "emulator":
            raise ValueError(f"--implementations: {n!r} is a recipe; give it with --recipes")
        if kind == "stock":
            raise ValueError(f"--implementations: {n!r} is the model's own attention, the reference every row is "
                             "compared with; name kernels here")
    return names
