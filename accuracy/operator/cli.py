"""``zyfa accuracy``: each recipe's error against the FP64 oracle, as a table (and optionally a result file).

Examples::

    zyfa accuracy --inputs gaussian --seq 4096 --head-dim 128 \\
        --recipes zyfa,ck,aiter,aiter-triton,triton-amd,fa3,bf16
    zyfa accuracy --inputs gaussian --seq 8192 --head-dim 192 --head-dim-v 128 --heads 8 --kv-heads 2 --causal
    zyfa accuracy --inputs gaussian --outliers 0.001 --outlier-scale 10 --out results.jsonl
    zyfa accuracy --inputs captures/smollm2.h5 --layers 0,3 --heads 0,1,2 --max-tokens 1024 --out r.csv
    zyfa accuracy --inputs gaussian --recipes zyfa-hopper,cudnn-fp8 --implementations triton:zyfa-hopper,cudnn-fp8
    zyfa accuracy --inputs gaussian --kernel examples/fp8_torch_attention.py:attention --kernel-recipe zyfa
    zyfa accuracy --inputs gaussian --recipes zyfa,ck,fa3 --platform h200   # every recipe on the H200's arithmetic
    zyfa accuracy --inputs datasets/smollm2-lee-2048.h5 --ablate triton:fa3 accum_flush_tiles=0,1  # one field, paired
    zyfa accuracy --inputs synthetic:entropy=2.0,sink=0.3,k_outliers=4,k_bias=30,rope=1,seq=2048,heads=12,kv_heads=2

Real kernels run beside the recipes on the same inputs: ``--implementations`` (built-ins, ``all`` or
``available``; docs/real_kernels.md) and ``--kernel module:function`` (a kernel of your own, repeatable; the
contract is in docs/CONTRACTS.md). Each gets one row per input, labelled by its name; a kernel that fails gets a
failed row with the reason and the run goes on; built-ins this machine lacks (device, package) are listed as
not run, with the reason.

Bad input (an unknown recipe, an unsupported head dim, a missing file, an input too large for the device's
memory, a ``--kernel`` that does not load) exits with status 2 and one line on stderr naming the problem. A run
whose rows include failed or nonconforming ones writes every row, prints each implementation's verdict with its
reason on stderr (:func:`zyfa.accuracy.scoring.kernel_verdicts.verdict_lines`) and exits with status 3
(``--allow-failed``: 0). ``--kernel`` imports the named module or file: its top-level code runs in this
process.

``--out``: checked before any work (its folder must exist and be writable, with free space for the rows). An
existing file is refused unless ``--force`` (start over; the old file is replaced only when the new run
finishes) or ``--resume`` (keep its rows, run only the (input, recipe) pairs not done). Rows are appended to
``<out>.partial`` as they finish, so a killed run keeps them and ``--resume`` continues it; the finished file
is written atomically and equals an uninterrupted run's rows (provenance and wall times aside).

Sharded (docs/SHARDING.md): ``torchrun --nproc-per-node N -m zyfa accuracy ... --out r.jsonl`` gives each rank a
share of the rows (:mod:`zyfa.accuracy.io.shard`: longest first to the least-loaded rank, cost batch x heads x s_q x
s_k x (d + d_v)); ranks write ``<out>.partial/rank-K.jsonl`` and rank 0 merges them into the file one process writes;
``--resume`` works across any change of N; ``--dry-run [N]`` prints the plan and runs nothing.

The flags are parsed and checked in :mod:`zyfa.accuracy.operator.args`, the table printed by
:mod:`zyfa.accuracy.operator.table`.

Exposed: ``add_arguments(parser)``, ``check_args(args)``, ``main(args) -> int``,
``cell_cost(shape, recipe, device_type)``, ``key_cost(shape, key, recipes, device_type)``, ``read_provenance(path)``,
``read_finished(path)``.
"""


from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from zyfa.accuracy.implementations.names import check_kernel_flags, kernel_namespace
from zyfa.accuracy.io.command import UsageError
from zyfa.accuracy.io.cost_model import TRUNCATING_UNITS_PER_SCORE, estimate_s, scores
from zyfa.accuracy.io.shard import wants_sharding
from zyfa.accuracy.operator.args import (
    DEFAULT_COLUMNS,
    DEFAULT_RECIPES,
    ablation_tagger,
    ablations_of,
    check_out,
    implementations_of,
    load_inputs,
    parse_columns,
    parse_recipe_flag,
    plan_inputs,
    repro_command,
)
from zyfa.accuracy.operator.table import EXIT_FAILED_ROWS, failed_rows_status, print_report
from zyfa.accuracy.scoring.metric_names import ERROR_METRICS

from zyfa.outputs import OutputError, check_writable
from zyfa.platforms import get_platform
from zyfa.plugins import add_wall_arguments
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import Recipe

__all__ = ["add_arguments", "cell_cost", "check_args", "key_cost", "main", "read_finished", "read_provenance"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``zyfa accuracy`` flags."""
    parser.epilog = (
        "deq_* metrics compare with the FP64 oracle on the dequantized inputs the recipe saw (the kernel's own "
        "arithmetic); orig_* with the FP64 oracle on the original inputs (adds the Q/K/V quantization).")
    parser.add_argument("--inputs", default="gaussian",
                        help="'gaussian', 'synthetic:KEY=VALUE,...' (controlled attention entropy, sink, K outliers: "
                             "accuracy/inputs/synthetic.py), or capture file(s) (.h5), comma-separated (default: "
                             "gaussian)")
    parser.add_argument("--recipes", default=None,
                        help=f"comma-separated recipe specs, or 'all' (default: {DEFAULT_RECIPES}; none with "
                             "--ablate); NAME@PLATFORM runs one on another platform, NAME:field=value,... with "
                             "fields changed (docs/CONTRACTS.md 'Recipe specs')")
    parser.add_argument("--ablate", nargs=2, action="append", metavar=("IMPL", "FIELD=V1,V2"),
                        help="a one-factor ablation: IMPL (a recipe spec, or triton:SPEC for our kernel) once per "
                             "value of FIELD, on the same inputs; rows carry ablation_base/_field/_value "
                             "(accuracy.scoring.ablation pairs them per input). Repeatable")
    parser.add_argument("--platform", default=None,
                        help="emulate every recipe on this GPU's arithmetic: h200 or mi355x (default: each "
                             "recipe's own; a recipe moved off its own platform is named NAME@PLATFORM)")
    g = parser.add_argument_group("Gaussian inputs")
    g.add_argument("--seq", type=int, help="tokens (queries = keys), default 4096")
    g.add_argument("--seq-q", type=int, metavar="N",
                   help="queries, when fewer than the keys (decode: 1; chunked prefill: the chunk), aligned "
                        "bottom-right to the keys; with --seq-k instead of --seq")
    g.add_argument("--seq-k", type=int, metavar="N", help="keys (the KV cache), with --seq-q (default: --seq-q)")
    g.add_argument("--head-dim", type=int,
                   help="QK head dim, any >= 1 for the emulations (default 128); the real kernels ship 64, 128, "
                        "256, 192 (V 128) and 576 (V 512) and refuse others in their rows")
    g.add_argument("--head-dim-v", type=int, help="V head dim if different (MLA: 192/128, 576/512)")
    g.add_argument("--heads", help="query heads (default 4); for captures: comma-separated head indices")
    g.add_argument("--kv-heads", type=int, help="KV heads (default: --heads; fewer for GQA/MQA)")
    g.add_argument("--batch", type=int, help="batch size (default 1)")
    g.add_argument("--std", type=float, help="standard deviation of the entries (default 1.0)")
    g.add_argument("--outliers", type=float, metavar="FRAC",
                   help="fraction of entries with an outlier added (FA3 paper: 0.001; default 0)")
    g.add_argument("--outlier-scale", type=float, metavar="S",
                   help="outlier standard deviation relative to --std (default 10)")
    g.add_argument("--outlier-tensors", metavar="QKV", help="which tensors get outliers (default qk)")
    g.add_argument("--dtype", choices=("bf16", "fp32"), help="dtype of the original inputs (default bf16)")
    m = parser.add_argument_group("masking (Gaussian inputs; captures carry their own)")
    m.add_argument("--causal", action="store_true", help="causal mask")
    m.add_argument("--window", type=int, metavar="N", help="sliding window of N keys (HF convention)")
    c = parser.add_argument_group("capture inputs")
    c.add_argument("--layers", help="comma-separated layer indices (default: all)")
    c.add_argument("--max-tokens", type=int, metavar="N", help="keep the first N tokens")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Gaussian inputs and the run (default 0)")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto",
                        help="where the emulator and the oracle run (default auto: cuda if available)")
    parser.add_argument("--out", metavar="PATH",
                        help="write result rows to PATH (.jsonl or .csv); rows are kept in PATH.partial as they "
                             "finish")
    parser.add_argument("--force", action="store_true", help="replace an existing --out (when the run finishes)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted or finished --out: keep its rows, run the missing ones")
    parser.add_argument("--metrics", metavar="LIST",
                        help="table columns: row keys (deq_rel_l2, p_flushed_frac, ...) or bare metric names "
                             f"({', '.join(ERROR_METRICS)}) meaning deq_ and orig_; default "
                             f"{','.join(DEFAULT_COLUMNS)}")
    parser.add_argument("--per-input", action="store_true",
                        help="one table row per (input, recipe) instead of per recipe over all inputs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--allow-failed", action="store_true",
                        help=f"exit 0 even when rows failed or a kernel is nonconforming (default: exit "
                             f"{EXIT_FAILED_ROWS} after writing every row)")
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.io.shard import add_shard_arguments

    add_shard_arguments(parser, "accuracy", "rows")
    r = parser.add_argument_group("real kernels (beside the recipes' emulations)")
    r.add_argument("--implementations", metavar="LIST",
                   help="built-in real implementations, comma-separated (triton:<recipe>, cudnn-fp8, "
                        "cudnn-fp8:oracle-scale, sdpa-bf16:cudnn, sdpa-bf16:flash, flash-attn-triton-amd), "
                        "'available' or 'all'")
    r.add_argument("--kernel", action="append", metavar="MODULE:FUNCTION",
                   help="your own attention kernel, [NAME=]module:function or [NAME=]path/to/file.py:function, "
                        "with fn(q, k, v, *, causal, sm_scale, window) -> out | (out, lse) (repeatable; NAME names "
                        "its rows). This imports the module or file and so runs its top-level code, in a worker "
                        "process (in this process with --kernel-in-process): name only code you trust")
    r.add_argument("--kernel-recipe", action="append", metavar="NAME",
                   help="pair --kernel with this recipe: also scored on its dequantized inputs and compared with "
                        "its emulation (once for every kernel, or once per --kernel)")
    add_wall_arguments(r)


def check_args(args: argparse.Namespace) -> None:
    """The command line's checks that need no heavy import (torch, the kernels, the inputs' data): run by the
    ``zyfa`` dispatch before :func:`main`, so that a bad argument is refused in a fraction of a second; a
    :class:`ValueError` (or FileNotFoundError) names the problem."""
    if args.kernel_recipe and not args.kernel:
        raise UsageError("--kernel-recipe pairs a --kernel with a recipe; no --kernel given")
    parse_recipe_flag(args.recipes if args.recipes is not None else ("none" if args.ablate else DEFAULT_RECIPES))
    if getattr(args, "platform", None) is not None:
        get_platform(args.platform)
    parse_columns(args.metrics)
    out = check_out(args.out)
    if out is None and (args.force or args.resume):
        raise UsageError("--force and --resume apply to --out")
    check_kernel_flags(args)  # --implementations, --kernel: the registry's lines, before torch
    plan_inputs(args)


def main(args: argparse.Namespace) -> int:
    """Run ``zyfa accuracy``; 0 on success, 2 on bad input (message on stderr, no traceback)."""
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.io.results_io import ROW_BYTES_ESTIMATE, ResultsFile

    results = None
    try:
        if args.recipes is None:
            args.recipes = "none" if args.ablate else DEFAULT_RECIPES
        recipes = parse_recipe_flag(args.recipes)
        recipes += [get_recipe(s) for a in ablations_of(args) if kernel_namespace(a.base) is None for s in a.specs]
        if getattr(args, "platform", None) is not None:
            recipes = [r.on(args.platform) for r in recipes]
        columns = parse_columns(args.metrics)
        out = check_out(args.out)
        if out is None and (args.force or args.resume):
            raise UsageError("--force and --resume apply to --out")
        if wants_sharding(args, out):
            return _main_sharded(args, recipes, columns, out)
        results = ResultsFile.open(out, force=args.force, resume=args.resume, reader=read_finished) \
            if out is not None else None
        # lazy: imports torch, numpy; the command's flags are checked before it
        from zyfa.accuracy.io.device import resolve_device

        # lazy: kept off the refusal path, which imports only what checking the flags needs
        from zyfa.accuracy.io.results_io import write_results

        # lazy: imports torch, scipy; the command's flags are checked before it
        from zyfa.accuracy.operator.runner import input_key, run_accuracy

        device = resolve_device(args.device)
        impls = implementations_of(args)
        tag = ablation_tagger(args)
        inputs = load_inputs(args, device)
        usable = [i for i in impls if i.available()[0]]
        keys = [k for inp in inputs for k in [input_key(inp, r.name) for r in recipes]
                + [input_key(inp, i.recipe, i.name) for i in usable]]
        if results is not None:
            check_writable(out, need_bytes=len(keys) * ROW_BYTES_ESTIMATE)
            results.check_plan(keys)
    except (ValueError, FileNotFoundError) as e:
        if results is not None:
            results.release()
        return _fail(e)

    first_prov = results.provenance if results is not None and results.resumed_from else {}  # what is resumed
    if results is not None and results.resumed_from is not None:
        print(f"resuming {results.resumed_from}: {len(results.done)} of {len(keys)} rows done")
    shapes, by_name = {inp.name: inp.shape for inp in inputs}, {r.name: r for r in recipes}
    to_run = [k for k in keys if results is None or k not in results.done]  # this run's rows, for the cost record
    t0 = time.perf_counter()
    try:
        rows = run_accuracy(inputs, recipes, device=device, progress=not args.no_progress, seed=args.seed,
                            skip=results.done if results is not None else (),
                            on_start=results.start if results is not None else None,
                            on_row=tag if results is None else (lambda row: (tag(row), results.add(row))),
                            implementations=impls)  # a resume too: a new run_id, its segment's
    except ValueError as e:
        return _fail(e, results)
    except KeyboardInterrupt:
        return _fail("interrupted", results, status=130)
    wall = time.perf_counter() - t0

    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.io.cost_model import add_record

    prov = rows.provenance  # this segment's; resumed, it lists the earlier ones (ResultsFile.start)
    # the --dry-run estimate of the rows this run made, beside their measured time (accuracy/io/cost_model.py), after
    # the records of the runs it continues
    add_record(prov, first_prov, sum(key_cost(shapes[k[0]], k, by_name, device.type) for k in to_run), wall,
               device.type, command="accuracy", cells=len(to_run))
    if results is not None:
        rows = results.rows_in_order(keys)
    print_report(rows, prov, inputs, columns, args)
    if results is not None:
        try:
            results.finish(rows, prov, write_results)
        except ValueError as e:
            return _fail(e, results)
        print(f"wrote {len(rows)} rows to {out}")
    print(f"wall time {wall:.1f} s;  repro: {repro_command(args)}")
    return failed_rows_status(rows, "zyfa accuracy", allow=args.allow_failed)


# ------------------------------------------------------------------------------------ row costs (--dry-run)

def cell_cost(shape: dict, recipe: Recipe | str | None = None, device_type: str = "cpu") -> float:
    """The estimated cost of one row on an input of ``shape``: batch x query heads x s_q x s_k x (d + d_v); on a
    device type of :data:`TRUNCATING_UNITS_PER_SCORE` (the CPU), a row of an emulated ``recipe`` (a Recipe or spec)
    whose emulation runs a truncating accumulator (:meth:`zyfa.recipes.Recipe.truncated_gemms`) costs that many
    units per score instead. A real implementation's row is costed with no recipe (its paired emulation, run where
    the run has no row of that recipe, is not counted)."""
    d_v = shape.get("head_dim_v") or shape["head_dim"]
    n = scores(shape)
    per_score = TRUNCATING_UNITS_PER_SCORE.get(device_type)
    if per_score is not None and recipe is not None and any(get_recipe(recipe).truncated_gemms()):
        return n * per_score
    return n * (shape["head_dim"] + d_v)


def key_cost(shape: dict, key: tuple, recipes: dict[str, Recipe] | None = None, device_type: str = "cpu") -> float:
    """:func:`cell_cost` on ``device_type`` of the row whose :func:`zyfa.accuracy.io.results_io.row_key` is ``key``
    (input, content hash, recipe, implementation) on an input of ``shape``; ``recipes``: the run's recipes by name
    (a name not there is read as a spec)."""
    if key[3] is not None:
        return cell_cost(shape)
    return cell_cost(shape, (recipes or {}).get(key[2], key[2]), device_type)


# ---------------------------------------------------------------------------------------------- sharded runs

def _main_sharded(args: argparse.Namespace, recipes, columns, out: Path | None) -> int:
    """One rank of a sharded run (or its --dry-run): its share of the rows, rank 0 merging them into --out."""
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    import uuid

    from zyfa.accuracy.io.results_io import ROW_BYTES_ESTIMATE
    from zyfa.accuracy.io.shard import (
        Dist,
        ShardedResults,
        announce,
        dry_run_world,
        give_up,
        launch,
        plan,
        print_dry_run,
        rank_device,
        sharding_summary,
    )

    dry = args.dry_run is not None
    if dry:
        try:
            dry_run_world(args.dry_run)
        except OutputError as e:
            return _fail(str(e))
    if not dry and out is None:
        return _fail("a sharded run (torchrun) needs --out: the ranks' rows are merged into it")
    results = None
    dist = Dist(rank=int(os.environ.get("RANK", 0) or 0)) if dry else None
    try:
        if dist is None:
            dist = launch(args.backend)
        # lazy: imports torch, numpy; the command's flags are checked before it
        from zyfa.accuracy.io.device import resolve_device

        # lazy: kept off the refusal path, which imports only what checking the flags needs
        from zyfa.accuracy.io.results_io import write_results

        # lazy: imports torch, scipy; the command's flags are checked before it
        from zyfa.accuracy.operator.runner import input_key, run_accuracy

        device = rank_device(resolve_device(args.device), dist)
        impls = implementations_of(args)
        tag = ablation_tagger(args)
        inputs = load_inputs(args, device)
        usable = [i for i in impls if i.available()[0]]
        cells = [(inp, input_key(inp, r.name), r.name) for inp in inputs for r in recipes]
        cells += [(inp, input_key(inp, i.recipe, i.name), i.name) for inp in inputs for i in usable]
        keys = [k for _, k, _ in cells]
        costs = [key_cost(inp.shape, key, {r.name: r for r in recipes}, device.type) for inp, key, _ in cells]
        if dry:
            print_dry_run(args.dry_run, [f"{inp.name} {name}" for inp, _, name in cells], costs,
                          [estimate_s("accuracy", device.type, c, 1) for c in costs])
            return 0
        results = ShardedResults.open(out, dist, force=args.force, resume=args.resume, planned=keys,
                                      reader=read_finished, need_bytes=len(keys) * ROW_BYTES_ESTIMATE,
                                      cells=list(zip(keys, costs, strict=True)))
    except (ValueError, FileNotFoundError, OutputError) as e:
        status = _fail(e)
        if dist is not None:
            give_up(dist, e)
        return status

    todo = [i for i, k in enumerate(keys) if k not in results.done]
    shares = plan([costs[i] for i in todo], dist.world)
    mine = {keys[todo[j]] for j in shares[dist.rank]}
    run_id = dist.broadcast(uuid.uuid4().hex[:12])  # this segment's, shared by the ranks (a resume too)
    if dist.rank == 0 and results.done:
        print(f"resuming {results.folder}: {len(results.done)} of {len(keys)} rows done")
    announce("", dist, shares, "rows")

    def add(row: dict) -> None:
        row.setdefault("device", str(device))
        tag(row)
        results.add(row)

    t0 = time.perf_counter()
    try:
        made = run_accuracy(inputs, recipes, device=device, progress=not args.no_progress and dist.rank == 0,
                            seed=args.seed, skip=set(keys) - mine, on_start=results.start, on_row=add,
                            run_id=run_id, implementations=impls)
    except ValueError as e:
        dist.close()
        return _fail(e, results)
    except KeyboardInterrupt:
        dist.close()
        return _fail("interrupted", results, status=130)

    def merged_provenance(rows: list[dict]) -> dict:  # rank 0's segment (listing the earlier ones, resumed)
        return {**made.provenance, **sharding_summary(dist, rows, time.perf_counter() - t0)}

    try:
        rows = results.finish(keys, merged_provenance, write_results)
    except (ValueError, RuntimeError, OutputError) as e:
        dist.close()
        return _fail(e, results)
    dist.close()
    if rows is None:  # not rank 0: its rows are merged there
        return 0
    prov = read_provenance(out)
    print_report(rows, prov, inputs, columns, args)
    print(f"wrote {len(rows)} rows to {out} ({dist.world} rank(s), wall time {prov.get('wall_time_s', 0):.1f} s)")
    print(f"repro: {repro_command(args)}")
    return failed_rows_status(rows, "zyfa accuracy", allow=args.allow_failed)


def read_provenance(path: Path) -> dict:
    """The provenance of a finished result file (empty if it has none)."""
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.io.results_io import read_results

    try:
        return read_results(path).provenance
    except (ValueError, OSError):
        return {}


def read_finished(path: Path):
    """(rows, provenance) of a finished ``zyfa accuracy`` results file (the reader of resumed outputs)."""
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.io.results_io import read_results

    rows = read_results(path)
    return list(rows), rows.provenance


def _fail(e: BaseException | str, results=None, status: int = 2) -> int:
    kept = ""
    if results is not None:
        results.close()
        if results.partial.exists():
            kept = f"; the rows finished so far are in {results.partial} (rerun with --resume to continue)"
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.io.shard import say

    say(f"zyfa accuracy: error: {e}{kept}")
    return status
