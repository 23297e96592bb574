"""``zyfa longctx``: long-context retrieval (needle in a haystack, passkey) with each implementation as the model's
attention, scored against the FP32 and BF16 baselines on the same prompts.

Examples::

    zyfa longctx --models smollm2 --lengths 1024,2048 --seeds 2 --implementations sdpa-fp32,bf16,zyfa,fa3
    zyfa longctx --device cuda --dtype bf16 --implementations sdpa-fp32,stock,triton:zyfa-hopper,triton:fa3,cudnn-fp8 \\
        --fallback stock --out longctx/results.jsonl --max-seconds 500      # then again with --resume
    zyfa longctx --render longctx/results.jsonl --out longctx-report
    zyfa longctx --plan studies/accumulator.toml --device cuda --out study/results.jsonl   # a study plan
    zyfa longctx --render study/results.jsonl --plan studies/accumulator.toml --out study-report  # its verdicts

Implementations (``--implementations``, comma-separated): ``stock`` (the model's own attention), any built-in of the
registry (``triton:<recipe>``, ``cudnn-fp8``, ``flashinfer-fa3``, ``sdpa-bf16:cudnn``, ``sdpa-fp32``, ...; the same
names as ``zyfa accuracy --implementations``), any recipe spec (the emulator: ``zyfa``, ``ck@mi355x``), and
``--kernel module:function`` plug-ins (their rows are named ``plugin:<spec>``). ``--layers`` swaps only some layers.
A layer an implementation refuses (e.g. a sliding window) stops that implementation on that model with one line,
unless ``--fallback stock`` runs such layers with the model's own attention; every row records what ran
(``ran``: what -> layers).

Output: ``--out`` (default ``./zyfa-longctx/results.jsonl``) as in ``zyfa accuracy``: refused if it exists unless
``--force`` or ``--resume``; rows appended to ``<out>.partial`` batch by batch; ``--max-seconds`` stops between
batches once scoring has taken that long (rerun with ``--resume``). A ``--resume`` whose command asks for less than
the file holds keeps the other rows (after the planned ones). Nothing is written before the first model's checks.
Exit status: 0 done (or stopped by ``--max-seconds``), 2 bad input (one line),
3 when rows failed (after writing everything; ``--allow-failed`` gives 0).

One-factor ablation: ``--ablate triton:fa3 accum_flush_tiles=0,1`` runs the kernel (or a recipe's emulation) once
per value of that one field on the same prompts; rows carry ``ablation_base``/``_field``/``_value`` and
:func:`zyfa.accuracy.scoring.ablation.ablation_pairs` pairs them per prompt.

Sharded (docs/SHARDING.md): ``torchrun --nproc-per-node N -m zyfa longctx ...`` splits the (model, task, length,
implementation) cells over the ranks; each rank loads only its models and rank 0 merges the rows in the grid's order;
``--dry-run [N]`` prints the plan.

Exposed: ``main(args) -> int``, ``cell_cost``, ``grid_order``, ``implementation_kind(name)``; the flags and their
torch-free checks are in :mod:`zyfa.accuracy.longctx.args`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from zyfa.accuracy.implementations.names import check_decoding
from zyfa.accuracy.io.command import UsageError
from zyfa.accuracy.io.cost_model import add_record, estimate_s
from zyfa.accuracy.io.results_io import ResultsFile, jsonl_text, read_jsonl
from zyfa.accuracy.io.run_harness import WorkBudget, refuse_unavailable
from zyfa.accuracy.io.schemas import read_rows
from zyfa.accuracy.io.shard import (
    Dist,
    ShardedResults,
    SharedOutputError,
    announce,
    give_up,
    launch,
    plan,
    print_dry_run,
    rank_device,
    say,
    sharding_summary,
    wants_sharding,
)
from zyfa.accuracy.longctx.args import (
    DEFAULT_IMPLEMENTATIONS,
    DEFAULT_OUT,
    REFUSAL,
    grid_flags,
    parse_depths,
    parse_ints,
    plan_generate,
)
from zyfa.accuracy.longctx.calibrate import difficulty_markdown
from zyfa.accuracy.longctx.tasks import TASKS
from zyfa.accuracy.scoring.kernel_verdicts import verdict_lines
from zyfa.capture.fetch import FetchError
from zyfa.capture.models import MODELS, prepare_sources
from zyfa.capture.text import UnknownTextError, check_text

from zyfa.outputs import OutputError, atomic_write_text
from zyfa.plugins import wall_options
from zyfa.recipe_spec import split_spec_list

EXIT_FAILED_ROWS = 3


def main(args: argparse.Namespace) -> int:
    if args.render is not None:
        return _render(args)
    if args.calibrate is not None:
        return _calibrate(args)
    try:
        if getattr(args, "plan", None):
            _apply_plan(args)
        return _run(args)
    except UsageError as e:
        say(f"{REFUSAL}{e}")
        return 2


def implementation_kind(name: str) -> str:
    """What runs ``name`` as the model's attention: "stock", "kernel" or "emulator" (ValueError: unknown)."""
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.impact.model import STOCK, model_attention

    if name == STOCK:
        return "stock"
    return "kernel" if model_attention(name).impl is not None else "emulator"


def _apply_plan(args: argparse.Namespace) -> None:
    """Check the plan before any work and let it supply the grid (models, tasks, lengths, depths, implementations,
    facts as seeds); its name and hash go into every row (``args.plan_fields``)."""
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.scoring.plan import PlanError, check_plan, load_plan

    try:
        plan = load_plan(args.plan)
        check_plan(plan, tasks=TASKS, implementation_kind=implementation_kind)
    except PlanError as e:
        raise UsageError(str(e)) from None
    if args.models is not None:
        subset = [m.strip() for m in args.models.split(",") if m.strip()]
        outside = [m for m in subset if m not in plan.models]
        if outside or not subset:
            raise UsageError(f"--models: {outside[0] if outside else '(none)'!r} is not a model of plan {plan.name} "
                             f"({', '.join(plan.models)})")
        args.models = ",".join(m for m in plan.models if m in subset)
    else:
        args.models = ",".join(plan.models)
    args.tasks = ",".join(plan.tasks)
    args.lengths = ",".join(map(str, plan.lengths))
    args.depths = ",".join(map(str, plan.depths))
    args.implementations = ",".join(plan.implementations)
    args.seeds = plan.facts
    args.first_seed = plan.first_fact
    args.generate = plan_generate(args.generate, plan.generate, plan.name)
    for key in ("text", "dtype", "fallback"):
        if getattr(plan, key) is not None:
            setattr(args, key, getattr(plan, key))
    args.plan_fields = {"plan": plan.name, "plan_hash": plan.hash}
    n_models = len(args.models.split(","))
    print(f"zyfa longctx: plan {plan.name} ({args.plan}, hash {plan.short_hash}): {n_models} model(s), "
          f"{len(plan.tasks)} task(s), lengths {args.lengths}, {len(plan.depths)} depths x {plan.facts} facts, "
          f"implementations {args.implementations}"
          + (f", answers generated (len(answer) + {args.generate} tokens at most)" if args.generate else ""),
          file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    # lazy: imports torch, numpy; the command's flags are checked before it
    import torch
    from zyfa.accuracy.impact.model import STOCK, model_attention
    from zyfa.accuracy.implementations.plugins import load_plugins
    from zyfa.accuracy.io.device import resolve_device
    from zyfa.accuracy.io.provenance import provenance
    from zyfa.accuracy.longctx.run import GridSpec, run_longctx
    from zyfa.accuracy.scoring.ablation import ablation_tags, parse_ablation

    models, tasks = grid_flags(args)  # again: a plan may have supplied them after check_args
    lengths = parse_ints(args.lengths, "--lengths") if args.lengths else None
    depths = parse_depths(args.depths)
    layers = [n - 1 for n in parse_ints(",".join(str(int(t) + 1) if t.strip().isdigit() else t
                                            for t in args.layers.split(",")), "--layers")] if args.layers else None
    try:
        device = resolve_device(args.device)
    except (ValueError, RuntimeError) as e:
        raise UsageError(str(e)) from None
    try:
        ablations = [parse_ablation(base, assignment) for base, assignment in args.ablate or []]
    except ValueError as e:
        raise UsageError(str(e)) from None
    default = "" if ablations else DEFAULT_IMPLEMENTATIONS[device.type]
    names = split_spec_list(args.implementations if args.implementations is not None else default)
    names += [s for a in ablations for s in a.specs if s not in names]
    try:
        plugins = load_plugins(args.kernel or [], args.kernel_recipe or [], **wall_options(args))
    except ValueError as e:
        raise UsageError(str(e)) from None
    names += [p.name for p in plugins if p.name not in names]
    if not names:
        raise UsageError("no implementations to run")
    checked = []
    for n in names:
        if n == STOCK or any(p.name == n for p in plugins):
            continue
        try:
            checked.append((n, model_attention(n).impl))
        except ValueError as e:
            raise UsageError(f"--implementations: {e}") from None
    if args.generate:  # a plan's generate too
        try:
            check_decoding(names, prefix="--implementations with --generate: ")
        except ValueError as e:
            raise UsageError(str(e)) from None
    try:
        refuse_unavailable(checked)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        check_text(args.text)
    except UnknownTextError as e:
        raise UsageError(f"--text: {e}") from None
    try:
        WorkBudget(args.max_seconds)
    except ValueError as e:
        raise UsageError(str(e)) from None
    # conformance probes (accuracy.implementations.conformance) before any model loads: a kernel that ignores the mask
    # or maps heads wrongly is not scored; its rows say why
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.implementations.conformance import probe_cached

    nonconforming = {}
    for n in names:
        impl = next((p for p in plugins if p.name == n), None)
        if impl is None and n != STOCK:
            impl = model_attention(n).impl
        if impl is not None:
            conf = probe_cached(impl, device)
            if not conf.ok:
                nonconforming[n] = conf.line()
                print(f"zyfa longctx: {n} is nonconforming: {conf.line()}", file=sys.stderr)
    try:  # every cached model file and text checked (a bad one fetched again) before anything is written
        prepare_sources(models, [args.text])
    except FetchError as e:
        raise UsageError(str(e)) from None
    out = Path(args.out or DEFAULT_OUT)
    if args.out is None:
        out.parent.mkdir(parents=True, exist_ok=True)
    first_seed = getattr(args, "first_seed", 0)  # a plan's first_fact (fresh facts); 0 without a plan
    spec = GridSpec(models=models, implementations=names, tasks=tasks, lengths=lengths, depths=depths,
                    seeds=list(range(first_seed, first_seed + args.seeds)), text=args.text, layers=layers,
                    op_layers=args.op_layers,
                    fallback=None if args.fallback == "none" else "stock", row_tags=ablation_tags(ablations),
                    row_fields=getattr(args, "plan_fields", None) or {}, coverage=args.coverage,
                    generate=args.generate or 0)
    if wants_sharding(args, out):
        return _run_sharded(args, spec, device, plugins, nonconforming, out)
    try:
        results = ResultsFile.open(out, force=args.force, resume=args.resume)
    except OutputError as e:
        raise UsageError(str(e)) from None
    prov = provenance({"command": "zyfa longctx " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
                       "device": str(device), "models": models, "implementations": names, "tasks": tasks,
                       "lengths": lengths, "depths": depths, "seeds": spec.seeds, "text": args.text,
                       "model_dtype": args.dtype, "fallback": args.fallback, "layers": layers,
                       "coverage": args.coverage, "generate": args.generate or 0,
                       "plugins": {p.name: p.description for p in plugins}, "nonconforming": nonconforming,
                       **(getattr(args, "plan_fields", None) or {})})
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    import uuid

    prov["run_id"] = uuid.uuid4().hex[:12]  # this segment's, a resume too (the results file lists earlier ones)
    batch_tokens = args.batch_tokens or (131072 if device.type == "cuda" else 1)
    t0 = time.perf_counter()
    try:
        try:
            res = run_longctx(spec, results=results, device=device, dtype=args.dtype, plugins=plugins,
                              batch_tokens=batch_tokens, max_seconds=args.max_seconds,
                              progress=not args.no_progress, run_id=prov["run_id"], nonconforming=nonconforming,
                              on_start=lambda: results.start(prov))
        except (ValueError, FetchError) as e:
            raise UsageError(str(e)) from None
        if device.type == "cuda":
            torch.cuda.synchronize()
    finally:
        results.close()
    if not res["complete"]:
        print(f"zyfa longctx: stopped at the --max-seconds budget with {res['made']} new rows in "
              f"{results.partial}; run the same command with --resume to continue", file=sys.stderr)
        return 0
    rows = results.rows_in_order(res["keys"])
    lengths_made = [int(r.get("length") or 0) for r in results.made]  # this run's rows: the estimate beside the time
    add_record(prov, results.provenance, sum(cell_cost(n, 1) for n in lengths_made), time.perf_counter() - t0,
               device.type, command="longctx", cells=len(lengths_made),
               work={"prompts": len(lengths_made), "tokens": sum(lengths_made), "models": models,
                     "implementations": names})
    kept = len(results.unplanned(res["keys"]))
    if kept:
        prov["kept_unplanned_rows"] = kept
        print(f"zyfa longctx: kept {kept} rows of {results.resumed_from} that this command does not plan (other "
              "implementations, lengths or seeds); --force starts over without them", file=sys.stderr)
    results.finish(rows, prov, lambda rs, path, p: atomic_write_text(path, jsonl_text(rs, p)))
    failed = sum(1 for r in rows if r.get("status") in ("failed", "nonconforming"))
    print(f"zyfa longctx: wrote {len(rows)} rows to {out}", file=sys.stderr)
    for line in verdict_lines(rows):
        print(f"zyfa longctx: {line}", file=sys.stderr)
    if failed and not args.allow_failed:
        return EXIT_FAILED_ROWS
    return 0


def cell_cost(length: int, prompts: int) -> float:
    """Estimated cost of a (model, task, length, implementation) cell: prompts x length x (length + 2048), the
    attention (length^2) beside the rest of the prefill (linear in length; 2048 weighs it for a small model)."""
    return float(prompts * length * (length + 2048))


def grid_order(spec) -> Callable[[dict], tuple]:
    """The sort key that puts rows in a single-process run's order: model, task, length, depth, seed,
    implementation, each in the order asked."""
    lengths = {n: i for i, n in enumerate(spec.lengths)} if spec.lengths else {}

    def key(row: dict) -> tuple:
        def at(seq, v):
            return seq.index(v) if v in seq else len(seq)

        n = row.get("length") or 0
        return (at(spec.models, row.get("model")), at(spec.tasks, row.get("task")), lengths.get(n, n),
                at(spec.depths, row.get("depth")), at(spec.seeds, row.get("seed")),
                at(spec.implementations, row.get("implementation")), str(row.get("input")))
    return key


def _run_sharded(args: argparse.Namespace, spec, device, plugins, nonconforming: dict, out: Path) -> int:
    """One rank of a sharded ``zyfa longctx`` (or its --dry-run): cells (model, task, length, implementation)
    planned by :func:`zyfa.accuracy.io.shard.plan` over :func:`cell_cost`, rank 0 merging in :func:`grid_order`."""
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    import uuid

    # lazy: imports torch, numpy; the command's flags are checked before it
    import torch
    from zyfa.accuracy.io.provenance import provenance
    from zyfa.accuracy.longctx.run import DEFAULT_LENGTHS, plan_lengths, row_input, run_longctx

    cells = []
    for m in spec.models:
        ctx = MODELS[m].max_context if m in MODELS else None
        try:
            lengths = plan_lengths(spec.lengths, ctx, m)[0] if ctx is not None else list(spec.lengths or
                                                                                         DEFAULT_LENGTHS)
        except ValueError as e:
            raise UsageError(str(e)) from None
        cells += [(m, t, n, name) for t in spec.tasks for n in lengths for name in spec.implementations]
    per_cell = len(spec.depths) * len(spec.seeds)
    if args.dry_run is not None:
        costs = [cell_cost(n, per_cell) for _, _, n, _ in cells]
        try:  # a cell's rows: its prompts (a record's cells)
            print_dry_run(args.dry_run, [f"{m} {t} L{n} {name}" for m, t, n, name in cells], costs,
                          [estimate_s("longctx", device.type, c, per_cell) for c in costs])
        except OutputError as e:
            raise UsageError(str(e)) from None
        return 0
    dist = Dist()
    try:
        dist = launch(args.backend)
        device = rank_device(device, dist)
        results = ShardedResults.open(out, dist, force=args.force, resume=args.resume, reader=read_jsonl,
                                      cells=cells)
    except OutputError as e:
        if isinstance(e, SharedOutputError):  # said by each rank before they meet (give_up), not again by main
            say(f"zyfa longctx: {e}")
            give_up(dist, e)
            return 2
        give_up(dist, e)
        raise UsageError(str(e)) from None

    def left(cell) -> int:
        m, t, n, name = cell
        head = row_input(m, t, n, 0, 0).rsplit("/", 2)[0] + "/"
        return per_cell - sum(1 for k in results.done if str(k[0]).startswith(head) and k[3] == name)

    todo = [c for c in cells if left(c) > 0]
    shares = plan([cell_cost(c[2], left(c)) for c in todo], dist.world)
    owned = {todo[i] for i in shares[dist.rank]}
    run_id = dist.broadcast(uuid.uuid4().hex[:12])  # this segment's, shared by the ranks (a resume too)
    prov = provenance({"command": "zyfa longctx " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
                       "device": str(device), "models": spec.models, "implementations": spec.implementations,
                       "tasks": spec.tasks, "lengths": spec.lengths, "depths": spec.depths, "seeds": spec.seeds,
                       "text": spec.text, "model_dtype": args.dtype, "fallback": args.fallback,
                       "layers": spec.layers, "generate": spec.generate,
                       "plugins": {p.name: p.description for p in plugins},
                       "nonconforming": nonconforming, "run_id": run_id, **spec.row_fields})
    announce("zyfa longctx: ", dist, shares, "cells")
    batch_tokens = args.batch_tokens or (131072 if device.type == "cuda" else 1)
    t0 = time.perf_counter()
    try:
        res = run_longctx(spec, results=results, device=device, dtype=args.dtype, plugins=plugins,
                          batch_tokens=batch_tokens, max_seconds=args.max_seconds,
                          progress=not args.no_progress and dist.rank == 0, run_id=run_id,
                          nonconforming=nonconforming, owns=lambda m, t, n, name: (m, t, n, name) in owned,
                          on_start=lambda: results.start(prov))
    except (ValueError, FetchError) as e:
        results.close()
        dist.close()
        raise UsageError(str(e)) from None
    if device.type == "cuda":
        torch.cuda.synchronize()
    states = dist.gather((res["complete"], res["keys"]))
    if not all(c for c, _ in states):
        results.close()
        dist.close()
        if dist.rank == 0:
            print(f"zyfa longctx: stopped at the --max-seconds budget; the rows made are in {results.folder}; run "
                  "the same command with --resume to continue", file=sys.stderr)
        return 0
    keys = [tuple(k) for _, ks in states for k in ks]

    def merged_provenance(rows: list[dict]) -> dict:  # rank 0's segment (listing the earlier ones, resumed)
        return {**prov, **sharding_summary(dist, rows, time.perf_counter() - t0)}

    try:
        rows = results.finish(keys, merged_provenance, lambda rs, path, p: atomic_write_text(path, jsonl_text(rs, p)),
                              order=grid_order(spec))
    except (RuntimeError, OutputError) as e:
        results.close()
        dist.close()
        raise UsageError(str(e)) from None
    dist.close()
    if rows is None:
        return 0
    failed = sum(1 for r in rows if r.get("status") in ("failed", "nonconforming"))
    print(f"zyfa longctx: wrote {len(rows)} rows to {out} ({dist.world} rank(s))", file=sys.stderr)
    for line in verdict_lines(rows):
        print(f"zyfa longctx: {line}", file=sys.stderr)
    if failed and not args.allow_failed:
        return EXIT_FAILED_ROWS
    return 0


def _render(args: argparse.Namespace) -> int:
    # lazy: imports torch, scipy; the command's flags are checked before it
    from zyfa.accuracy.longctx.section import RenderError, render_folder

    try:
        path = render_folder(args.render, Path(args.out or "zyfa-longctx-report"), cliffs=args.cliffs,
                             force=args.force, plan=getattr(args, "plan", None))
    except RenderError as e:
        say(f"zyfa longctx: {e}")
        return 2
    print(f"zyfa longctx: wrote {path}", file=sys.stderr)
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    rows = []
    for p in (x.strip() for x in args.calibrate.split(",") if x.strip()):
        if not Path(p).is_file():
            say(f"zyfa longctx: --calibrate: {p} is not a file")
            return 2
        try:
            rows += read_rows(p)[0]  # every line checked by its schema
        except ValueError as e:
            say(f"zyfa longctx: {e}")
            return 2
    if not any(r.get("implementation") == args.baseline and r.get("status") == "ok" for r in rows):
        say(f"zyfa longctx: --calibrate: {args.calibrate} has no scored rows of {args.baseline} (--baseline)")
        return 2
    print(difficulty_markdown(rows, args.baseline), end="")
    return 0
