"""``zyfa longctx``'s command line: its flags and the checks that need no heavy import, so that the ``zyfa``
dispatch refuses a bad argument in one line before :mod:`zyfa.accuracy.longctx.cli` runs anything (torch is imported
only inside the run).

Exposed: ``add_arguments(parser)``, ``check_args(args)``, ``grid_flags(args)``, ``plan_generate(flag, planned, plan)``,
``parse_ints(text, what)``, ``parse_depths(text)``, ``DEFAULT_OUT``, ``DEFAULT_MODELS``, ``DEFAULT_IMPLEMENTATIONS``,
``REFUSAL``.
"""

from __future__ import annotations

import argparse

from zyfa.accuracy.implementations.names import check_attention_names, check_decoding, check_kernels
from zyfa.accuracy.io.command import UsageError
from zyfa.accuracy.io.shard import add_shard_arguments
from zyfa.accuracy.longctx.tasks import TASKS
from zyfa.capture.models import check_model_names
from zyfa.capture.text import UnknownTextError, check_text

from zyfa.plugins import add_wall_arguments, wall_options
from zyfa.recipe_spec import split_spec_list

DEFAULT_OUT = "zyfa-longctx/results.jsonl"
DEFAULT_MODELS = "smollm2,gemma3,qwen25coder"
# the defaults by device: on a GPU the real kernels, on a CPU the emulator (slow: keep lengths short there)
DEFAULT_IMPLEMENTATIONS = {
    "cuda": "sdpa-fp32,stock,triton:zyfa-hopper,triton:zyfa,triton:fa3,triton:ck,triton:aiter,cudnn-fp8,flashinfer-fa3",
    "cpu": "sdpa-fp32,bf16,zyfa,zyfa-hopper,fa3",
}
# how a refusal's line starts, before torch (the zyfa dispatch reads it) and after
REFUSAL = "zyfa longctx: "

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=None,
                        help="comma-separated registry names (default smollm2,gemma3,qwen25coder) or model paths; "
                             "with --plan, a subset of the plan's models (one process per model)")
    parser.add_argument("--implementations", default=None,
                        help="comma-separated: stock, built-in implementations, recipe specs (the emulator); default "
                             f"on a GPU {DEFAULT_IMPLEMENTATIONS['cuda']}; on a CPU {DEFAULT_IMPLEMENTATIONS['cpu']}")
    parser.add_argument("--kernel", action="append", metavar="MODULE:FUNCTION",
                        help="your own attention kernel (docs/CONTRACTS.md); imports and runs the named file or "
                             "module (repeatable)")
    parser.add_argument("--kernel-recipe", action="append", metavar="NAME", help="the recipe a --kernel claims")
    parser.add_argument("--ablate", nargs=2, action="append", metavar=("IMPL", "FIELD=V1,V2"),
                        help="a one-factor ablation: IMPL (a recipe spec, or triton:SPEC / cute:SPEC for our "
                             "kernels) once per value of FIELD, on the same prompts; rows carry "
                             "ablation_base/_field/_value (accuracy.scoring.ablation pairs them per prompt). "
                             "Repeatable; without --implementations only the ablation runs")
    add_wall_arguments(parser)
    parser.add_argument("--tasks", default="needle,passkey",
                        help="needle, passkey (default both); niah (the standard Paul Graham needle test), multikey, "
                             "multivalue, vartrack (RULER-style, on the Paul Graham essays; docs/TASKS.md)")
    parser.add_argument("--lengths", default=None,
                        help="context lengths in tokens, comma-separated, 'k' = 1024 (e.g. 1k,2k,4k); default "
                             "1k..32k up to each model's context")
    parser.add_argument("--depths", default=None,
                        help="needle depths as fractions of the haystack, comma-separated (default 0,0.1,...,1)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per (length, depth) cell (default 3)")
    parser.add_argument("--text", default="lee",
                        help="haystack text of the needle task: lee, shakespeare, pydoc, paulgraham, or a UTF-8 text "
                             "file of your own")
    parser.add_argument("--layers", default=None, help="swap only these layers (comma-separated); others stock")
    parser.add_argument("--op-layers", type=int, default=3,
                        help="layers whose operator error against FP64 is measured in the pass (default 3)")
    parser.add_argument("--fallback", choices=("none", "stock"), default="none",
                        help="layers an implementation refuses: none (its rows are unsupported) or stock (run them "
                             "with the model's own attention; recorded in each row)")
    parser.add_argument("--coverage", choices=("equal", "own"), default="equal",
                        help="with --fallback stock: equal (default) swaps only the layers every implementation "
                             "takes, the rest run stock attention for all; own: each falls back on its own")
    parser.add_argument("--generate", type=int, default=None, metavar="N",
                        help="also decode each answer greedily (the implementation in the prefill and every step), "
                             "at most len(answer) + N tokens, and score it (gen_exact, gen_contains); default 0: off, "
                             "or with --plan the plan's generate (a plan that sets it refuses another N)")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="the model's weights and activations (default fp32); attention implementations "
                             "receive q/k/v in this dtype")
    parser.add_argument("--batch-tokens", type=int, default=None,
                        help="tokens per forward pass (prompts of one length are batched; default 131072 on a GPU, "
                             "one prompt per forward pass on a CPU, where batching gains nothing and the progress "
                             "bar then moves per prompt)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop between batches after this many seconds of scoring (loading models is not "
                             "counted; above 0 at least one batch runs), then --resume")
    parser.add_argument("--out", default=None, help=f"results JSONL (default ./{DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="replace an existing --out when the run finishes")
    parser.add_argument("--resume", action="store_true", help="continue --out: run only the missing rows")
    parser.add_argument("--allow-failed", action="store_true", help="exit 0 even when rows failed")

    add_shard_arguments(parser, "longctx", "cells (model, task, length, implementation)")
    parser.add_argument("--render", default=None, metavar="RESULTS",
                        help="render RESULTS (JSONL files, comma-separated or a quoted glob) into --out (a folder: "
                             "longctx.md and figures); runs nothing")
    parser.add_argument("--cliffs", default=None, metavar="JSONL",
                        help="with --render: the cliff finder's results to table beside it")
    parser.add_argument("--plan", default=None, metavar="FILE",
                        help="a study plan (TOML, accuracy/scoring/plan.py; e.g. studies/accumulator.toml): it "
                             "supplies the models, tasks, lengths, depths, implementations and facts (seeds), "
                             "overriding those flags, and every row records its hash; with --render: the verdicts by "
                             "its rule")
    parser.add_argument("--calibrate", default=None, metavar="RESULTS",
                        help="print, per (model, task, length), the baseline's accuracy in RESULTS (JSONL, "
                             "comma-separated) and whether it lies in the 60-90%% band; runs nothing")
    parser.add_argument("--baseline", default="stock", help="with --calibrate: the implementation (default stock)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def parse_ints(text: str, what: str) -> list[int]:
    out = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        mult = 1024 if tok.lower().endswith("k") else 1
        try:
            n = int(tok[:-1] if mult > 1 else tok) * mult
        except ValueError:
            raise UsageError(f"{what}: {tok!r} is not an integer") from None
        if n < 1:
            raise UsageError(f"{what}: {tok!r} must be at least 1")
        out.append(n)
    if not out:
        raise UsageError(f"{what} names nothing")
    return out


def parse_depths(text: str | None) -> list[float]:
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.longctx.run import DEFAULT_DEPTHS

    if text is None:
        return list(DEFAULT_DEPTHS)
    out = []
    for tok in (t.strip() for t in text.split(",") if t.strip()):
        try:
            d = float(tok)
        except ValueError:
            raise UsageError(f"--depths: {tok!r} is not a number") from None
        if not 0.0 <= d <= 1.0:
            raise UsageError(f"--depths: {tok} is outside 0..1 (a fraction of the haystack)")
        out.append(d)
    if not out:
        raise UsageError("--depths names nothing")
    return out


def check_args(args: argparse.Namespace) -> None:
    """The flags' checks that need no heavy import, run by the ``zyfa`` dispatch before :func:`main` (which repeats
    them with the rest): the grid's numbers, the text, the model and task names. A ``--plan`` supplies the grid,
    and ``--render``/``--calibrate`` take none: those are checked in :func:`main`."""
    if args.render is not None or args.calibrate is not None or getattr(args, "plan", None):
        return
    grid_flags(args)
    if args.lengths:
        parse_ints(args.lengths, "--lengths")
    if args.depths is not None:
        parse_depths(args.depths)
    try:
        check_text(args.text)
    except UnknownTextError as e:
        raise UsageError(f"--text: {e}") from None
    wall_options(args)
    plugins = check_kernels(args.kernel, args.kernel_recipe)  # the registry's lines, before torch
    if args.implementations is not None:
        check_attention_names(split_spec_list(args.implementations), plugins)
        if args.generate:
            check_decoding(split_spec_list(args.implementations), prefix="--implementations with --generate: ")


def grid_flags(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The models and tasks of the flags (or of a plan applied to them), with the seeds and --generate checked;
    UsageError in one line. Torch-free: :func:`check_args` runs it before any heavy import, the run
    (:mod:`zyfa.accuracy.longctx.cli`) after a plan has filled the flags."""
    models = [m.strip() for m in (args.models or DEFAULT_MODELS).split(",") if m.strip()]
    try:
        check_model_names(models)
    except ValueError as e:
        raise UsageError(str(e)) from None
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise UsageError(f"--tasks: unknown task {bad[0] if bad else '(none)'!r}; tasks: {', '.join(TASKS)}")
    if args.seeds < 1:
        raise UsageError("--seeds must be at least 1")
    if args.generate is not None and args.generate < 0:
        raise UsageError("--generate must be 0 (off) or more")
    return models, tasks


def plan_generate(flag: int | None, planned: int, plan: str) -> int:
    """The tokens to generate past each answer under a plan: the plan's ``generate`` where it sets one (``planned``
    > 0; the flag left out, or the same N), else the flag's (0 without it). The plan fixed N before its rows, so
    another ``--generate`` is refused (UsageError, one line naming both)."""
    if planned > 0 and flag is not None and flag != planned:
        raise UsageError(f"--generate {flag}: plan {plan} generates {planned} tokens past each answer (its generate "
                         f"= {planned}, part of its hash); leave --generate out or give --generate {planned}")
    return planned if planned > 0 else (flag or 0)
