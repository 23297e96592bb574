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
s_k x
(d + d_v)); ranks write ``<out>.partial/rank-K.jsonl`` and rank 0 merges them into the file one process writes;
``--resume`` works across any change of N; ``--dry-run [N]`` prints the plan and runs nothing.

Exposed: ``add_arguments(parser)``, ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from zyfa.accuracy.io.command import UsageError
from zyfa.accuracy.io.shard import wants_sharding
from zyfa.accuracy.scoring.kernel_verdicts import verdict_lines
from zyfa.accuracy.scoring.metric_names import ERROR_METRICS

from zyfa.plugins import add_wall_arguments, wall_flags, wall_options

DEFAULT_RECIPES = "zyfa,ck,aiter,aiter-triton,triton-amd,fa3,bf16"
# Table columns by default: row keys of accuracy.operator.runner.run_accuracy
DEFAULT_COLUMNS = ("deq_rel_l2", "orig_rel_l2", "deq_sqnr_db", "deq_max_abs_err", "deq_row_rel_err_p99",
                   "deq_lse_max_abs_err", "p_flushed_frac", "time_emulate_s")
# Columns --metrics may name, besides deq_/orig_ + ERROR_METRICS (a bare metric name means both)
OTHER_COLUMNS = ("has_nan", "nonfinite_frac", "p_flushed_frac", "time_emulate_s", "time_ref_deq_s", "real_emu_ratio",
                 "real_vs_emu_rel_l2", "status", "time_real_s",
                 "time_ref_orig_s", "ref_deq_source", "recipe_short", "deq_zero_ref_rows_max_abs_err",
                 "orig_zero_ref_rows_max_abs_err")
GAUSSIAN_DEFAULTS = {"seq": 4096, "head_dim": 128, "heads": "4", "batch": 1, "std": 1.0, "outliers": 0.0,
                     "outlier_scale": 10.0, "outlier_tensors": "qk", "dtype": "bf16"}


# Exit status of a run that wrote everything but has failed or nonconforming rows (--allow-failed: 0).
EXIT_FAILED_ROWS = 3
# Real-kernel row statuses that count as failures for the exit status.
FAILED_STATUSES = ("failed", "nonconforming")


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
    _parse_recipes(args.recipes if args.recipes is not None else ("none" if args.ablate else DEFAULT_RECIPES))
    if getattr(args, "platform", None) is not None:
        from zyfa.platforms import get_platform

        get_platform(args.platform)
    _parse_columns(args.metrics)
    out = _check_out(args.out)
    if out is None and (args.force or args.resume):
        raise UsageError("--force and --resume apply to --out")
    _plan_inputs(args)


def main(args: argparse.Namespace) -> int:
    """Run ``zyfa accuracy``; 0 on success, 2 on bad input (message on stderr, no traceback)."""
    from zyfa.accuracy.io.results_io import ROW_BYTES_ESTIMATE, ResultsFile

    from zyfa.outputs import check_writable
    from zyfa.recipes import get_recipe

    results = None
    try:
        if args.recipes is None:
            args.recipes = "none" if args.ablate else DEFAULT_RECIPES
        recipes = _parse_recipes(args.recipes)
        recipes += [get_recipe(s) for a in _ablations(args) if not a.base.startswith("triton:") for s in a.specs]
        if getattr(args, "platform", None) is not None:
            recipes = [r.on(args.platform) for r in recipes]
        columns = _parse_columns(args.metrics)
        out = _check_out(args.out)
        if out is None and (args.force or args.resume):
            raise UsageError("--force and --resume apply to --out")
        if wants_sharding(args, out):
            return _main_sharded(args, recipes, columns, out)
        results = ResultsFile.open(out, force=args.force, resume=args.resume, reader=read_finished) \
            if out is not None else None
        from zyfa.accuracy.io.device import resolve_device
        from zyfa.accuracy.io.results_io import write_results
        from zyfa.accuracy.operator.runner import input_key, run_accuracy

        device = resolve_device(args.device)
        impls = _parse_implementations(args)
        tag = _ablation_tagger(args)
        inputs = _load_inputs(args, device)
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

    first_prov = results.provenance if results is not None and results.resumed_from else {}
    if results is not None and results.resumed_from is not None:
        print(f"resuming {results.resumed_from}: {len(results.done)} of {len(keys)} rows done")
    cost = {inp.name: cell_cost(inp.shape) for inp in inputs}
    to_run = [k for k in keys if results is None or k not in results.done]  # this run's rows, for the cost record
    t0 = time.perf_counter()
    try:
        rows = run_accuracy(inputs, recipes, device=device, progress=not args.no_progress, seed=args.seed,
                            skip=results.done if results is not None else (),
                            on_start=results.start if results is not None else None,
                            on_row=tag if results is None else (lambda row: (tag(row), results.add(row))),
                            run_id=first_prov.get("run_id"), implementations=impls)
    except ValueError as e:
        return _fail(e, results)
    except KeyboardInterrupt:
        return _fail("interrupted", results, status=130)
    wall = time.perf_counter() - t0

    from zyfa.accuracy.io.cost_model import PROVENANCE_KEY, record

    prov = rows.provenance
    if first_prov:  # a resumed run: its first provenance, and this run's
        prov = {**first_prov, "resumed": [*first_prov.get("resumed", []), {
            k: rows.provenance.get(k) for k in ("date_utc", "git_commit", "git_dirty", "zyfa_version", "argv",
                                                "device", "device_name")}]}
    # the --dry-run estimate of the rows this run made, beside their measured time (accuracy/io/cost_model.py)
    prov[PROVENANCE_KEY] = [*prov.get(PROVENANCE_KEY, []), record(
        sum(cost[k[0]] for k in to_run), wall, device.type, command="accuracy", cells=len(to_run))]
    if results is not None:
        rows = results.rows_in_order(keys)
    _print_report(rows, prov, inputs, columns, args)
    if results is not None:
        try:
            results.finish(rows, prov, write_results)
        except ValueError as e:
            return _fail(e, results)
        print(f"wrote {len(rows)} rows to {out}")
    print(f"wall time {wall:.1f} s;  repro: {repro_command(args)}")
    return failed_rows_status(rows, "zyfa accuracy", allow=args.allow_failed)


def _print_report(rows, prov: dict, inputs, columns, args) -> None:
    commit = (prov.get("git_commit") or "no git")[:10] + ("+dirty" if prov.get("git_dirty") else "")
    print(f"zyfa accuracy  run {prov.get('run_id')}  zyfa {prov.get('zyfa_version')} @ {commit}  "
          f"torch {prov.get('torch')}  device {prov.get('device')} ({prov.get('device_name')})")
    names = [inp.name for inp in inputs]
    print("input: " + (names[0] if len(names) == 1 else f"{len(names)} inputs ({names[0]}, ..., {names[-1]})"))
    print()
    if any(r.get("real") for r in rows):  # real kernels: their error over their emulation's, and status
        columns = [*columns, *(c for c in ("real_emu_ratio", "real_vs_emu_rel_l2", "status") if c not in columns)]
    print(format_table(rows, columns, per_input=args.per_input or len(inputs) == 1))
    print()
    print("deq_: vs FP64 on the dequantized inputs the recipe saw (its arithmetic); "
          "orig_: vs FP64 on the original inputs (adds Q/K/V quantization).")
    nan_recipes = sorted({_label(r) for r in rows if r.get("has_nan")})
    if nan_recipes:
        print(f"NaN/Inf in the output of: {', '.join(nan_recipes)}")
    for r in rows:
        if not r.get("real") and r.get("status") == "refused":
            print(f"refused: {r['recipe']} on {r['input']}: {r['reason']}")
        if r.get("real") and r.get("status") in ("failed", "unsupported", "nonconforming", "suspect"):
            print(f"{r['status']}: {r['implementation']} on {r['input']}: {r.get('error') or r.get('reason')}")
    for w in (prov.get("implementations_pairing_warnings") or {}).values():
        print(f"warning: {w}")
    from zyfa.accuracy.implementations.base import unavailable_lines

    for line in unavailable_lines(prov.get("implementations_unavailable") or {}):
        print(line)


# ---------------------------------------------------------------------------------------------- sharded runs

def cell_cost(shape: dict) -> float:
    """The estimated cost of one row on an input of ``shape``: batch x query heads x s_q x s_k x (d + d_v)."""
    d_v = shape.get("head_dim_v") or shape["head_dim"]
    return float(shape["batch"] * shape["heads_q"] * shape["seq_q"] * shape["seq_k"] * (shape["head_dim"] + d_v))


def _main_sharded(args: argparse.Namespace, recipes, columns, out: Path | None) -> int:
    """One rank of a sharded run (or its --dry-run): its share of the rows, rank 0 merging them into --out."""
    import os
    import uuid

    from zyfa.accuracy.io.results_io import ROW_BYTES_ESTIMATE
    from zyfa.accuracy.io.shard import (
        UNITS_PER_SECOND,
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

    from zyfa.outputs import OutputError

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
        from zyfa.accuracy.io.device import resolve_device
        from zyfa.accuracy.io.results_io import write_results
        from zyfa.accuracy.operator.runner import input_key, run_accuracy

        device = rank_device(resolve_device(args.device), dist)
        impls = _parse_implementations(args)
        tag = _ablation_tagger(args)
        inputs = _load_inputs(args, device)
        usable = [i for i in impls if i.available()[0]]
        cells = [(inp, input_key(inp, r.name), r.name) for inp in inputs for r in recipes]
        cells += [(inp, input_key(inp, i.recipe, i.name), i.name) for inp in inputs for i in usable]
        keys = [k for _, k, _ in cells]
        costs = [cell_cost(inp.shape) for inp, _, _ in cells]
        if dry:
            print_dry_run(args.dry_run, [f"{inp.name} {name}" for inp, _, name in cells], costs,
                          UNITS_PER_SECOND.get(device.type, UNITS_PER_SECOND["cpu"]))
            return 0
        results = ShardedResults.open(out, dist, force=args.force, resume=args.resume, planned=keys,
                                      reader=read_finished, need_bytes=len(keys) * ROW_BYTES_ESTIMATE,
                                      cells=list(zip(keys, costs, strict=True)))
    except (ValueError, FileNotFoundError, OutputError) as e:
        status = _fail(e)
        if dist is not None:
            give_up(dist, e)
        return status

    first_prov = results.provenance
    todo = [i for i, k in enumerate(keys) if k not in results.done]
    shares = plan([costs[i] for i in todo], dist.world)
    mine = {keys[todo[j]] for j in shares[dist.rank]}
    run_id = first_prov.get("run_id") or dist.broadcast(uuid.uuid4().hex[:12])
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

    def merged_provenance(rows: list[dict]) -> dict:
        prov = made.provenance
        if first_prov:
            prov = {**first_prov, "resumed": [*first_prov.get("resumed", []), {
                k: made.provenance.get(k) for k in ("date_utc", "git_commit", "git_dirty", "zyfa_version", "argv",
                                                    "device", "device_name")}]}
        return {**prov, **sharding_summary(dist, rows, time.perf_counter() - t0)}

    try:
        rows = results.finish(keys, merged_provenance, write_results)
    except (ValueError, RuntimeError, OutputError) as e:
        dist.close()
        return _fail(e, results)
    dist.close()
    if rows is None:  # not rank 0: its rows are merged there
        return 0
    prov = read_provenance(out)
    _print_report(rows, prov, inputs, columns, args)
    print(f"wrote {len(rows)} rows to {out} ({dist.world} rank(s), wall time {prov.get('wall_time_s', 0):.1f} s)")
    print(f"repro: {repro_command(args)}")
    return failed_rows_status(rows, "zyfa accuracy", allow=args.allow_failed)


def read_provenance(path: Path) -> dict:
    """The provenance of a finished result file (empty if it has none)."""
    from zyfa.accuracy.io.results_io import read_results

    try:
        return read_results(path).provenance
    except (ValueError, OSError):
        return {}


def failed_rows_status(rows: Sequence[dict], command: str, *, allow: bool) -> int:
    """The exit status of a finished run, after its verdicts on stderr (one line per implementation that is not
    a clean ``ok`` with its reason, then the clean ones: :func:`zyfa.accuracy.scoring.kernel_verdicts.verdict_lines`):
    :data:`EXIT_FAILED_ROWS` when rows failed (``status`` in :data:`FAILED_STATUSES`), unless ``allow``
    (``--allow-failed``); else 0."""
    for line in verdict_lines(rows):
        print(f"{command}: {line}", file=sys.stderr)
    bad = [r for r in rows if r.get("status") in FAILED_STATUSES]
    if not bad:
        return 0
    kinds = ", ".join(f"{sum(r.get('status') == s for r in bad)} {s}" for s in FAILED_STATUSES
                      if any(r.get("status") == s for r in bad))
    if allow:
        print(f"{command}: {len(bad)} of {len(rows)} rows failed ({kinds}); exit 0 (--allow-failed)",
              file=sys.stderr)
        return 0
    print(f"{command}: {len(bad)} of {len(rows)} rows failed ({kinds}); every row was written; exit "
          f"{EXIT_FAILED_ROWS} (--allow-failed: 0)", file=sys.stderr)
    return EXIT_FAILED_ROWS


def read_finished(path: Path):
    """(rows, provenance) of a finished ``zyfa accuracy`` results file (the reader of resumed outputs)."""
    from zyfa.accuracy.io.results_io import read_results

    rows = read_results(path)
    return list(rows), rows.provenance


def _fail(e: BaseException | str, results=None, status: int = 2) -> int:
    kept = ""
    if results is not None:
        results.close()
        if results.partial.exists():
            kept = f"; the rows finished so far are in {results.partial} (rerun with --resume to continue)"
    from zyfa.accuracy.io.shard import say

    say(f"zyfa accuracy: error: {e}{kept}")
    return status


def _parse_recipes(spec: str):
    from zyfa.recipes import parse_recipes

    if spec.strip() == "none":
        return []
    return parse_recipes(spec)


def _parse_implementations(args: argparse.Namespace) -> list:
    """Built-ins of --implementations, then the --kernel plug-ins (a kernel that does not load fails its rows)."""
    from zyfa.accuracy.implementations.plugins import load_plugins
    from zyfa.accuracy.implementations.registry import get_implementation, parse_implementations

    if args.kernel_recipe and not args.kernel:
        raise UsageError("--kernel-recipe pairs a --kernel with a recipe; no --kernel given")
    impls = parse_implementations(args.implementations)
    have = {i.name for i in impls}
    for a in _ablations(args):
        if a.base.startswith("triton:"):
            impls += [i for i in (get_implementation(s) for s in a.specs) if i.name not in have]
    impls += load_plugins(args.kernel or [], args.kernel_recipe or [], **wall_options(args))
    return impls


def _ablations(args: argparse.Namespace) -> list:
    """--ablate IMPL FIELD=V1,V2 -> :class:`accuracy.scoring.ablation.Ablation` each (SpecError, one line, for a bad
    one)."""
    from zyfa.accuracy.scoring.ablation import parse_ablation

    return [parse_ablation(base, assignment) for base, assignment in (getattr(args, "ablate", None) or [])]


def _ablation_tagger(args: argparse.Namespace):
    """A function adding a row's ablation group (ablation_base, _field, _value) to it, in place; rows are matched
    by the name they carry (the recipe's canonical name on --platform, or the implementation's)."""
    from zyfa.accuracy.implementations.registry import get_implementation
    from zyfa.accuracy.scoring.ablation import ablation_tags

    from zyfa.recipes import get_recipe

    ablations = _ablations(args)
    names = {}
    for a in ablations:
        for s in a.specs:
            if s.startswith("triton:"):
                names[s] = get_implementation(s).name
            else:
                r = get_recipe(s)
                names[s] = r.on(args.platform).name if getattr(args, "platform", None) is not None else r.name
    tags = ablation_tags(ablations, names)

    def tag(row: dict) -> None:
        row.update(tags.get(row.get("implementation") or row.get("recipe"), {}))

    return tag


def _label(row: dict) -> str:
    """A row's name in tables: the implementation's for a real kernel, else the recipe's."""
    return row.get("implementation") or row["recipe"]


def _parse_columns(spec: str | None) -> list[str]:
    if not spec:
        return list(DEFAULT_COLUMNS)
    known = {f"{p}{m}" for p in ("deq_", "orig_") for m in ERROR_METRICS} | set(OTHER_COLUMNS)
    cols: list[str] = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        expanded = [f"deq_{name}", f"orig_{name}"] if name in ERROR_METRICS else [name]
        for col in expanded:
            if col not in known:
                raise UsageError(f"unknown metric {name!r}; known: {', '.join(ERROR_METRICS)}, "
                                 f"or a column such as {', '.join(OTHER_COLUMNS[:5])}")
            if col not in cols:
                cols.append(col)
    if not cols:
        raise UsageError("--metrics names no metric")
    return cols


def _check_out(out: str | None) -> Path | None:
    if out is None:
        return None
    path = Path(out)
    if path.suffix.lower() not in (".jsonl", ".csv"):
        raise UsageError(f"--out must end in .jsonl or .csv, got {out!r}")
    if path.parent != Path("") and not path.parent.exists():
        raise FileNotFoundError(f"--out: directory {path.parent} does not exist")
    if path.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name ending in .jsonl or .csv")
    return path


def _int_list(spec: str, flag: str) -> list[int]:
    try:
        return [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated integers, got {spec!r}") from None


def _plan_inputs(args: argparse.Namespace):
    """The inputs the flags name, checked without drawing or reading anything (no torch: :func:`check_args`):
    (GaussianSpec or None, SyntheticSpecs, capture files)."""
    from zyfa.accuracy.inputs.gaussian_spec import GaussianSpec
    from zyfa.accuracy.inputs.synthetic_spec import is_synthetic, parse_synthetic, split_inputs

    items = split_inputs(args.inputs)
    if not items:
        raise UsageError("--inputs is empty")
    synthetic = [parse_synthetic(s) for s in items if is_synthetic(s)]
    files = [s for s in items if s != "gaussian" and not is_synthetic(s)]
    gaussian = len(files) + len(synthetic) < len(items)
    if not gaussian:
        gaussian_only = [k for k in GAUSSIAN_DEFAULTS if k != "heads"] + ["kv_heads", "head_dim_v", "window",
                                                                          "seq_q", "seq_k"]
        given = [f"--{k.replace('_', '-')}" for k in gaussian_only if getattr(args, k, None) is not None]
        if args.causal:
            given.append("--causal")
        if given:
            raise UsageError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to Gaussian inputs; "
                             "captures and synthetic inputs carry their own shape and mask (captures: use "
                             "--max-tokens, --layers, --heads; synthetic: its KEY=VALUE list)")
    if not files and (args.layers is not None or args.max_tokens is not None):
        raise UsageError("--layers and --max-tokens apply to capture inputs (--inputs path/to/capture.h5)")
    if not files and not gaussian and args.heads is not None:
        raise UsageError("--heads applies to Gaussian inputs and captures; a synthetic input takes heads=N")
    if files and gaussian and args.heads is not None:
        raise UsageError("--heads means a head count for Gaussian inputs and head indices for captures; "
                         "run them separately")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    for f in files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"no such input file: {f} (--inputs takes 'gaussian' or capture .h5 files)")
    spec = None
    if gaussian:
        opts = {k: (getattr(args, k) if getattr(args, k) is not None else d) for k, d in GAUSSIAN_DEFAULTS.items()}
        try:
            heads = int(opts["heads"])
        except ValueError:
            raise UsageError(f"for Gaussian inputs --heads is the number of query heads, got {opts['heads']!r}") \
                from None
        seq_q, seq_k = getattr(args, "seq_q", None), getattr(args, "seq_k", None)
        if args.seq is not None and (seq_q is not None or seq_k is not None):
            raise UsageError("--seq sets queries and keys alike; give either --seq or --seq-q/--seq-k")
        seq = seq_k if seq_k is not None else (seq_q if seq_q is not None else opts["seq"])
        spec = GaussianSpec(
            batch=opts["batch"], heads_q=heads, heads_kv=args.kv_heads if args.kv_heads is not None else heads,
            seq=seq, seq_q=seq_q if seq_q is not None and seq_q != seq else None,
            head_dim=opts["head_dim"], head_dim_v=args.head_dim_v, causal=args.causal,
            window=args.window, std=opts["std"], outlier_frac=opts["outliers"],
            outlier_scale=opts["outlier_scale"], outlier_tensors=opts["outlier_tensors"], seed=args.seed,
            dtype=opts["dtype"])
    return spec, synthetic, files


def _load_inputs(args: argparse.Namespace, device="cpu") -> list:
    from zyfa.accuracy.inputs.attention_input import capture_inputs, make_gaussian
    from zyfa.accuracy.inputs.synthetic import make_synthetic
    from zyfa.accuracy.io.device import check_memory

    spec, synthetic, files = _plan_inputs(args)
    gaussian = spec is not None
    inputs = []
    if gaussian:
        d_v = spec.head_dim_v or spec.head_dim
        check_memory({"batch": spec.batch, "heads_q": spec.heads_q, "heads_kv": spec.heads_kv, "seq_q": spec.s_q,
                      "seq_k": spec.seq, "head_dim": spec.head_dim, "head_dim_v": d_v}, device,
                     what="the Gaussian input")
        inputs.append(make_gaussian(spec))
    for spec in synthetic:
        check_memory({"batch": spec.batch, "heads_q": spec.heads, "heads_kv": spec.n_kv, "seq_q": spec.seq,
                      "seq_k": spec.seq, "head_dim": spec.head_dim, "head_dim_v": spec.head_dim}, device,
                     what=f"the synthetic input {spec.name}")
        inputs.append(make_synthetic(spec))
    layers = _int_list(args.layers, "--layers") if args.layers is not None else None
    heads = _int_list(args.heads, "--heads") if (files and args.heads is not None) else None
    for f in files:
        inputs.extend(capture_inputs(f, layers=layers, heads=heads, max_tokens=args.max_tokens, device=device))
    return inputs


# ---------------------------------------------------------------------------------------------- table

def _fmt(col: str, v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, str):
        return v
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if col.endswith("_db"):
        return f"{v:.2f}"
    if col.endswith("_ratio"):
        return f"{v:.4f}"
    if col.endswith("cosine"):
        return f"{v:.6f}"
    if col.endswith("_s"):
        return f"{v:.2f}"
    if col.endswith("_frac"):
        return f"{v:.3g}"
    if isinstance(v, int):
        return str(v)
    return f"{v:.3e}"


def _aggregate(rows: list[dict], col: str):
    vals = [r.get(col) for r in rows if r.get(col) is not None]
    if not vals:
        return None
    if all(isinstance(v, bool) for v in vals):
        return any(vals)
    if any(isinstance(v, str) for v in vals):
        return vals[0] if len(set(vals)) == 1 else "mixed"
    if col.endswith("_max") or "max_abs" in col:
        return max(vals)
    if col.startswith("time_"):
        return sum(vals)
    return sum(vals) / len(vals)


def format_table(rows: Sequence[dict], columns: Sequence[str], *, per_input: bool = True) -> str:
    """A Markdown (GitHub) table, recipes in the order run: one line per row, or per recipe aggregated over
    the inputs (mean; max for maxima; sum for times)."""
    if per_input:
        lead = ["recipe"] + (["input"] if len({r["input"] for r in rows}) > 1 else [])
        body = [[_label(r)] + ([r["input"]] if len(lead) > 1 else []) + [_fmt(c, r.get(c)) for c in columns]
                for r in rows]
    else:
        lead = ["recipe", "inputs"]
        order = list(dict.fromkeys(_label(r) for r in rows))
        body = []
        for name in order:
            group = [r for r in rows if _label(r) == name]
            body.append([name, str(len(group))] + [_fmt(c, _aggregate(group, c)) for c in columns])
    header = lead + list(columns)
    widths = [max(len(header[i]), *(len(b[i]) for b in body)) for i in range(len(header))]
    n_lead = len(lead)

    def line(cells):
        return "| " + " | ".join(c.ljust(w) if i < n_lead else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))) + " |"

    sep = "|" + "|".join(("-" * (w + 2)) if i < n_lead else ("-" * (w + 1) + ":")
                         for i, w in enumerate(widths)) + "|"
    out = [line(header), sep, *(line(b) for b in body)]
    if not per_input:
        out.append("(per recipe: mean over inputs; max for maxima; sum for times)")
    return "\n".join(out)


def repro_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (flags at their defaults left out)."""
    parts = ["zyfa", "accuracy", "--inputs", args.inputs, "--recipes", args.recipes]
    if getattr(args, "platform", None) is not None:
        parts += ["--platform", args.platform]
    for flag in ("seq", "seq_q", "seq_k", "head_dim", "head_dim_v", "heads", "kv_heads", "batch", "std", "outliers",
                 "outlier_scale", "outlier_tensors", "dtype", "window", "layers", "max_tokens"):
        v = getattr(args, flag)
        if v is not None:
            parts += [f"--{flag.replace('_', '-')}", str(v)]
    if args.causal:
        parts.append("--causal")
    if args.seed:
        parts += ["--seed", str(args.seed)]
    if args.device != "auto":
        parts += ["--device", args.device]
    if getattr(args, "implementations", None):
        parts += ["--implementations", args.implementations]
    for base, assignment in getattr(args, "ablate", None) or []:
        parts += ["--ablate", base, assignment]
    for spec in getattr(args, "kernel", None) or []:
        parts += ["--kernel", spec]
    for name in getattr(args, "kernel_recipe", None) or []:
        parts += ["--kernel-recipe", name]
    parts += wall_flags(args)
    return shlex.join(parts)
