"""``zyfa tasks``: tasks scored on what the model generates, with an attention implementation in every step.

``zyfa tasks humaneval``: HumanEval pass@1 (greedy) under each implementation, the generated code run in a sandbox,
compared per problem against the baseline (the first of ``--implementations``), with the per-token drift along the
baseline's generation (docs/TASKS.md).

Examples::

    zyfa tasks humaneval --model smollm2 --implementations stock,zyfa --problems 2 --max-new-tokens 32
    zyfa tasks humaneval --device cuda --dtype bf16 --model qwen25coder \\
        --implementations stock,sdpa-fp32,triton:zyfa,triton:fa3,cudnn-fp8,flashinfer-fa3 \\
        --out humaneval/qwen05.jsonl --max-seconds 540        # then the same with --resume
    zyfa tasks humaneval --summarize humaneval/qwen05.jsonl
    zyfa tasks humaneval --plan studies/humaneval.toml --device cuda --out he/plan.jsonl   # a study plan's run
    zyfa tasks humaneval --summarize he/plan.jsonl --plan studies/humaneval.toml          # its verdict table

Output: ``--out`` (default ``./zyfa-tasks/humaneval.jsonl``) as in ``zyfa longctx``: refused if it exists unless
``--force`` or ``--resume``; rows appended to ``<out>.partial`` problem by problem; ``--max-seconds`` stops between
problems (rerun with ``--resume``); a summary (pass@1, paired differences, McNemar, drift by position) is printed
when the run finishes. ``--plan FILE`` (:mod:`zyfa.accuracy.tasks.plan`) supplies the implementations and settings
and writes the plan's hash in every row; with ``--summarize`` it adds the verdict by the plan's rule. Exit status:
0 done (or stopped by ``--max-seconds``), 2 bad input (one line), 3 when rows failed (``--allow-failed`` gives 0).

Exposed: ``add_arguments(parser)``, ``check_args(args)``, ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from zyfa.accuracy.implementations.names import check_attention_names, check_decoding, check_kernels
from zyfa.accuracy.io.command import UsageError
from zyfa.accuracy.io.cost_model import add_record, generation_units
from zyfa.accuracy.io.results_io import row_key
from zyfa.accuracy.io.shard import say
from zyfa.accuracy.tasks.sandbox import Limits, network_isolation

from zyfa.outputs import OutputError, atomic_write_text

DEFAULT_OUT = "zyfa-tasks/humaneval.jsonl"
DEFAULT_MODEL = "qwen25coder"
DEFAULT_IMPLEMENTATIONS = {
    "cuda": "stock,sdpa-fp32,triton:zyfa,triton:zyfa-hopper,triton:fa3,cudnn-fp8,flashinfer-fa3",
    "cpu": "stock,zyfa",
}
EXIT_FAILED_ROWS = 3
# how a refusal's line starts, before torch (the zyfa dispatch reads it) and after
REFUSAL = "zyfa tasks humaneval: "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="task", metavar="TASK")
    he = sub.add_parser("humaneval", help="HumanEval pass@1 under each implementation (sandboxed execution)",
                        description="HumanEval pass@1 (greedy) under each attention implementation")
    he.add_argument("--model", default=None,
                    help="registry name (qwen25coder, qwen25coder-1.5b where present, smollm2 for tests); default "
                         f"{DEFAULT_MODEL}, or with --plan the plan's first model")
    he.add_argument("--implementations", default=None,
                    help="comma-separated, the baseline first: stock, built-ins, recipe specs (the emulator); default "
                         f"on a GPU {DEFAULT_IMPLEMENTATIONS['cuda']}; on a CPU {DEFAULT_IMPLEMENTATIONS['cpu']}")
    he.add_argument("--kernel", action="append", metavar="MODULE:FUNCTION", help="your own attention kernel")
    he.add_argument("--kernel-recipe", action="append", metavar="NAME", help="the recipe a --kernel claims")
    he.add_argument("--problems", default=None,
                    help="N (the first N), A-B (indices), or a list of indices, ranges and task ids (HumanEval/7); "
                         "default all 164")
    he.add_argument("--max-new-tokens", type=int, default=384, help="generation limit per problem (default 384)")
    he.add_argument("--fallback", choices=("none", "stock"), default="none",
                    help="layers an implementation refuses: none (its rows are unsupported) or stock (with "
                         "--coverage equal they run stock attention for every implementation)")
    he.add_argument("--coverage", choices=("equal", "own"), default="equal",
                    help="equal (default): the layers any implementation refuses run stock attention for all of "
                         "them; own: each implementation swaps every layer it takes")
    he.add_argument("--cpu-seconds", type=int, default=10, help="sandbox CPU limit per sample (default 10)")
    he.add_argument("--wall-seconds", type=float, default=20.0, help="sandbox wall limit per sample (default 20)")
    he.add_argument("--memory-mb", type=int, default=2048, help="sandbox address-space limit (default 2048 MiB)")
    he.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    he.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="the model's weights (default fp32)")
    he.add_argument("--max-seconds", type=float, default=None, help="stop between problems (then --resume)")
    he.add_argument("--out", default=None, help=f"results JSONL (default ./{DEFAULT_OUT})")
    he.add_argument("--force", action="store_true", help="replace an existing --out when the run finishes")
    he.add_argument("--resume", action="store_true", help="continue --out: run only the missing rows")
    he.add_argument("--allow-failed", action="store_true", help="exit 0 even when rows failed")
    he.add_argument("--no-progress", action="store_true", help="no progress bar")
    he.add_argument("--summarize", default=None, metavar="RESULTS",
                    help="print the Markdown summary of RESULTS (JSONL files, comma-separated); runs nothing")
    he.add_argument("--plan", default=None, metavar="FILE",
                    help="a study plan (studies/humaneval.toml): a run takes its implementations, dtype, "
                         "max-new-tokens, fallback and coverage (--model one of its models, default its first) and "
                         "records its hash in every row; with --summarize, the verdict table by its rule")


def check_args(args: argparse.Namespace) -> None:
    """The ``--implementations`` and ``--kernel`` checks that need no heavy import, run by the ``zyfa`` dispatch
    before :func:`main` (whose run checks them again with the registry, in the same lines): ValueError in one line."""
    if getattr(args, "task", None) != "humaneval" or args.summarize is not None or args.plan is not None:
        return
    plugins = check_kernels(args.kernel, args.kernel_recipe)
    if args.implementations is not None:
        names = implementation_names(args.implementations)
        names += [p.name for p in plugins if p.name not in names]
        if len(set(names)) != len(names):
            raise UsageError(f"--implementations names one twice: {','.join(names)}")
        check_attention_names(names, plugins)
        check_decoding(names)


def implementation_names(text: str) -> list[str]:
    """``--implementations`` as names, in order (comma-separated)."""
    return [n.strip() for n in text.split(",") if n.strip()]


def main(args: argparse.Namespace) -> int:
    if getattr(args, "task", None) != "humaneval":
        say("zyfa tasks: name a task: humaneval")
        return 2
    try:
        plan = _plan(args)
        if args.summarize is not None:
            return _summarize(args.summarize, plan)
        return _run(args, plan)
    except UsageError as e:
        say(f"{REFUSAL}{e}")
        return 2


def _plan(args: argparse.Namespace):
    """The ``--plan``, loaded and checked before anything else (None without one); a run takes its settings."""
    if getattr(args, "plan", None) is None:
        return None
    # lazy: kept off the refusal path of runs without a plan
    from zyfa.accuracy.scoring.plan import PlanError
    from zyfa.accuracy.tasks.plan import load_humaneval_plan

    try:
        plan = load_humaneval_plan(args.plan)
    except PlanError as e:
        raise UsageError(str(e)) from None
    if args.summarize is not None:
        return plan
    if args.implementations is not None or args.kernel:
        raise UsageError("--plan names the implementations: leave out --implementations and --kernel")
    model = args.model or plan.models[0]
    if model not in plan.all_models:
        raise UsageError(f"--model {model} is not in plan {plan.source} ({', '.join(plan.all_models)})")
    args.model = model
    args.implementations = ",".join(plan.implementations)
    args.dtype, args.max_new_tokens = plan.dtype, plan.max_new_tokens
    args.fallback, args.coverage = plan.fallback, plan.coverage
    return plan


def _summarize(paths: str, plan=None) -> int:
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.io.schemas import read_rows

    # lazy: imports torch, scipy; the command's flags are checked before it
    from zyfa.accuracy.tasks.stats import summary_markdown

    rows = []
    where: dict[tuple, tuple[int, str]] = {}  # a HumanEval row's key -> the file it came from (its place in the list)
    for n, p in enumerate(x.strip() for x in paths.split(",") if x.strip()):
        if not Path(p).is_file():
            raise UsageError(f"--summarize: {p} is not a file")
        try:
            got = read_rows(p)[0]  # every line checked by its schema: file:line: field: problem
        except ValueError as e:
            raise UsageError(str(e)) from None
        for r in got:  # a row in two files would count twice: refused before anything is printed
            if r.get("kind") != "humaneval":
                continue
            m, q = where.setdefault(row_key(r, across_runs=True), (n, p))
            if m != n:
                raise UsageError(f"--summarize: the row of {r['model']} {r.get('task_id')} under {r['implementation']} "
                                 f"is in both {q} and {p}; give each row once")
        rows += got
    if not any(r.get("kind") == "humaneval" for r in rows):
        raise UsageError(f"--summarize: {paths} holds no HumanEval rows")
    print(summary_markdown(rows), end="")
    if plan is not None:
        # lazy: imports scipy; the command's flags are checked before it
        from zyfa.accuracy.scoring.plan import PlanError
        from zyfa.accuracy.tasks.plan import verdict_markdown

        try:
            verdict = verdict_markdown(plan, rows)
        except PlanError as e:
            raise UsageError(str(e)) from None
        print("\n" + verdict, end="")
    return 0


def _run(args: argparse.Namespace, plan=None) -> int:
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    import uuid

    # lazy: imports torch, numpy; the command's flags are checked before it
    import torch
    from zyfa.accuracy.impact.model import STOCK, model_attention
    from zyfa.accuracy.implementations.plugins import load_plugins
    from zyfa.accuracy.io.device import resolve_device
    from zyfa.accuracy.io.provenance import provenance
    from zyfa.accuracy.io.results_io import ResultsFile, jsonl_text
    from zyfa.accuracy.tasks.humaneval import HumanEvalSpec, load_problems, run_humaneval, select_problems

    # lazy: imports torch, scipy; the command's flags are checked before it
    from zyfa.accuracy.tasks.stats import summary_markdown
    from zyfa.capture.fetch import FetchError
    from zyfa.capture.models import check_model_names, prepare_sources

    args.model = args.model or DEFAULT_MODEL
    try:
        check_model_names([args.model])
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be at least 1")
    try:
        limits = Limits(cpu_seconds=args.cpu_seconds, wall_seconds=args.wall_seconds,
                        memory_bytes=args.memory_mb << 20)
        device = resolve_device(args.device)
        plugins = load_plugins(args.kernel or [], args.kernel_recipe or [])
    except (ValueError, RuntimeError) as e:
        raise UsageError(str(e)) from None
    names = implementation_names(args.implementations or DEFAULT_IMPLEMENTATIONS[device.type])
    names += [p.name for p in plugins if p.name not in names]
    if len(set(names)) != len(names):
        raise UsageError(f"--implementations names one twice: {','.join(names)}")
    for n in names:
        if n == STOCK or any(p.name == n for p in plugins):
            continue
        try:
            fn = model_attention(n)
            check_decoding([n], prefix="")  # every problem is decoded greedily
        except ValueError as e:
            raise UsageError(f"--implementations: {e}") from None
        if fn.impl is not None:
            ok, why = fn.impl.available()
            if not ok:
                raise UsageError(f"implementation {n} cannot run here: {why}")
    try:
        select_problems(load_problems()[0], args.problems)  # a bad selection is refused before any file
        prepare_sources([args.model])  # the cached model file checked (a bad one fetched again) before any file
    except (ValueError, FetchError) as e:
        raise UsageError(str(e)) from None
    out = Path(args.out or DEFAULT_OUT)
    if args.out is None:
        out.parent.mkdir(parents=True, exist_ok=True)
    try:
        results = ResultsFile.open(out, force=args.force, resume=args.resume)
    except OutputError as e:
        raise UsageError(str(e)) from None
    if plan is not None:  # resuming rows of another plan (or of none) would mix two rules in one file
        # lazy: kept off the refusal path, which imports only what checking the flags needs
        from zyfa.accuracy.scoring.plan import PlanError, check_rows

        try:
            check_rows(plan, [r for r in results.kept if r.get("kind") == "humaneval"], str(results.partial))
        except PlanError as e:
            results.close()
            raise UsageError(str(e)) from None
    spec = HumanEvalSpec(model=args.model, implementations=names, problems=args.problems,
                         max_new_tokens=args.max_new_tokens, limits=limits,
                         fallback=None if args.fallback == "none" else "stock", coverage=args.coverage,
                         plan=(plan.name, plan.hash) if plan is not None else None)
    prov = provenance({"command": "zyfa tasks " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
                       "device": str(device), "model": args.model, "implementations": names, "baseline": names[0],
                       "problems": args.problems, "max_new_tokens": args.max_new_tokens, "model_dtype": args.dtype,
                       "fallback": args.fallback, "coverage": args.coverage, "sandbox_network": network_isolation()[1],
                       "plugins": {p.name: p.description for p in plugins},
                       **({"plan": plan.source, "plan_hash": plan.hash} if plan is not None else {})})
    prov["run_id"] = uuid.uuid4().hex[:12]  # this segment's, a resume too (its rows carry it)
    results.start(prov)  # resumed: prov lists the earlier segments, and goes to finish()
    t0 = time.perf_counter()
    try:
        try:
            res = run_humaneval(spec, results=results, device=device, dtype=args.dtype, plugins=plugins,
                                max_seconds=args.max_seconds, run_id=prov["run_id"],
                                progress=not getattr(args, "no_progress", False))
        except ValueError as e:
            raise UsageError(str(e)) from None
        if device.type == "cuda":
            torch.cuda.synchronize()
    finally:
        results.close()
    if not res["complete"]:
        print(f"zyfa tasks humaneval: stopped at the --max-seconds budget with {res['made']} new rows in "
              f"{results.partial}; run the same command with --resume to continue", file=sys.stderr)
        return 0
    rows = results.rows_in_order(res["keys"])
    made = [(int(r.get("prompt_tokens") or 0), int(r.get("generated_tokens") or 0)) for r in results.made]
    add_record(prov, results.provenance, sum(generation_units(p, g) for p, g in made), time.perf_counter() - t0,
               device.type, command="tasks", cells=len(made),  # this run's rows: the estimate beside the time
               work={"rows": len(made), "prompt_tokens": sum(p for p, _ in made),
                     "generated_tokens": sum(g for _, g in made), "model": args.model})
    results.finish(rows, prov, lambda rs, path, p: atomic_write_text(path, jsonl_text(rs, p)))
    failed = sum(1 for r in rows if r.get("status") == "failed")
    print(summary_markdown(rows), end="")
    print(f"zyfa tasks humaneval: wrote {len(rows)} rows to {out}" + (f" ({failed} failed)" if failed else ""),
          file=sys.stderr)
    return EXIT_FAILED_ROWS if failed and not args.allow_failed else 0
