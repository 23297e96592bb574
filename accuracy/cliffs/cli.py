"""``zyfa cliffs``: the length-cliff finder. Operator error against FP64 at every sequence length, for any
implementations, with NaN/Inf rows, error jumps and refused lengths flagged (docs/CLIFFS.md).

Examples::

    zyfa cliffs --recipes zyfa,fa3 --lengths 1-256 --mask both --device cpu --out cliffs-cpu
    zyfa cliffs --implementations triton:zyfa,cudnn-fp8,flashinfer-fa3 --mask both --shapes both --out cliffs
    zyfa cliffs --kernel examples/fp8_torch_attention.py:attention --kernel-recipe zyfa --lengths 1-512
    zyfa cliffs --inputs datasets/smollm2-lee-2048.h5 --layer 3 --recipes zyfa-hopper --lengths 1-2048:1
    zyfa cliffs --render cliffs/cliffs.jsonl --out cliffs-rendered      # no kernel runs: CPU is enough

Writes into the ``--out`` folder: ``cliffs.jsonl`` (one row per implementation x length x mask x shape, the
first line the provenance; rows appended to ``cliffs.jsonl.partial`` as they finish, so ``--resume`` continues
a killed run and the finished file is written atomically), ``cliffs.png`` (error against length, flagged
points marked) and ``cliffs.md`` (the table of flags with a one-line reproducer each, and the smallest
reproducer per implementation). Bad input exits with status 2 and one line on stderr.

The sweep is :mod:`zyfa.accuracy.cliffs.sweep`, the rendering :mod:`zyfa.accuracy.cliffs.section`.

Exposed: ``add_arguments(parser)``, ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from zyfa.accuracy.implementations.names import check_kernel_flags
from zyfa.accuracy.io.command import UsageError
from zyfa.accuracy.io.run_harness import refuse_unavailable
from zyfa.accuracy.scoring.kernel_verdicts import verdict_lines

from zyfa.platforms import get_platform
from zyfa.plugins import add_wall_arguments, wall_options
from zyfa.recipe_spec import parse_recipes

PROG = "zyfa cliffs"
JSONL = "cliffs.jsonl"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``zyfa cliffs`` flags."""
    parser.epilog = ("Default lengths: 1..1024 step 1, then +-64 (step --coarse-step) around every m*2^k > 1024 "
                     "with m in 64, 128, 176, 224, up to --max-length (32768). Flag rule (docs/CLIFFS.md): "
                     "error(L) > --factor x the median over the measured lengths within +-16 of L (at least 8) "
                     "and > --floor; any NaN/Inf query row; a kernel that refuses a length.")
    s = parser.add_argument_group("what to sweep")
    s.add_argument("--recipes", default="none", help="recipes through the emulator, comma-separated (default none)")
    s.add_argument("--platform", default=None, help="emulate the recipes on this platform (h200, mi355x)")
    s.add_argument("--implementations", metavar="LIST",
                   help="built-in real kernels, comma-separated (triton:<recipe>, cudnn-fp8, flashinfer-fa3, "
                        "flash-attn-triton-amd, sdpa-bf16:cudnn, ...), 'available' or 'all'")
    s.add_argument("--kernel", action="append", metavar="MODULE:FUNCTION",
                   help="your own kernel (module:function or path/to/file.py:function; repeatable)")
    s.add_argument("--kernel-recipe", action="append", metavar="NAME",
                   help="pair --kernel with a recipe: also scored on that recipe's dequantized inputs")
    add_wall_arguments(s)
    L = parser.add_argument_group("lengths, masks, shapes")
    L.add_argument("--lengths", metavar="SPEC",
                   help="e.g. 1-1024,2000-2100:4,4096 (N, A-B, A-B:STEP; 'default' = the default ranges)")
    L.add_argument("--max-length", type=int, metavar="N", help="drop lengths above N (default 32768, or the capture's)")
    L.add_argument("--coarse-step", type=int, default=1, metavar="S",
                   help="step of the default ranges above 1024 (default 1)")
    L.add_argument("--mask", choices=("none", "causal", "both"),
                   help="no mask, causal, or both (default: none for Gaussian inputs, a capture's own)")
    L.add_argument("--causal", action="store_true", help="the same as --mask causal")
    L.add_argument("--shapes", choices=("equal", "chunk", "both"), default="equal",
                   help="equal: s_q = s_k = L; chunk: the last --chunk query rows against all L keys (chunked "
                        "prefill, at L > --chunk); both (default equal)")
    L.add_argument("--chunk", type=int, metavar="N", help="query rows of the chunk shape (default 128)")
    g = parser.add_argument_group("inputs")
    g.add_argument("--inputs", default="gaussian", help="'gaussian' or a capture file (.h5) (default gaussian)")
    g.add_argument("--layer", type=int, help="the capture's layer (default: its first)")
    g.add_argument("--heads", help="query heads (Gaussian, default 2); for a capture: comma-separated head indices")
    g.add_argument("--kv-heads", type=int, help="KV heads (Gaussian; default --heads)")
    g.add_argument("--head-dim", type=int, help="head dim (Gaussian; default 128)")
    g.add_argument("--head-dim-v", type=int, help="V head dim if different (Gaussian)")
    g.add_argument("--batch", type=int, help="batch (Gaussian; default 1)")
    g.add_argument("--std", type=float, help="entry standard deviation (Gaussian; default 1)")
    g.add_argument("--outliers", type=float, metavar="FRAC", help="outlier fraction (Gaussian; default 0)")
    g.add_argument("--outlier-scale", type=float, metavar="S", help="outlier std relative to --std (default 10)")
    g.add_argument("--outlier-tensors", metavar="QKV", help="tensors with outliers (default qk)")
    g.add_argument("--dtype", choices=("bf16", "fp32"), help="dtype of the inputs (Gaussian; default bf16)")
    g.add_argument("--seed", type=int, default=0, help="seed of the Gaussian inputs (default 0)")
    r = parser.add_argument_group("flag rule")
    r.add_argument("--metric", default=None,
                   help="the error the jump rule reads: orig_rel_l2 (default), deq_rel_l2, orig_lse_max_abs_err, "
                        "deq_lse_max_abs_err")
    r.add_argument("--factor", type=float, default=None, help="jump factor over the neighbour median (default 3)")
    r.add_argument("--floor", type=float, default=None, help="errors at or below this are never jumps (default 1e-3)")
    o = parser.add_argument_group("run and output")
    o.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto", help="default auto")
    o.add_argument("--out", default="cliffs", metavar="DIR",
                   help="output folder (default ./cliffs): cliffs.jsonl, cliffs.png, cliffs.md")
    o.add_argument("--force", action="store_true", help="replace an existing DIR/cliffs.jsonl (when the run finishes)")
    o.add_argument("--resume", action="store_true", help="continue an interrupted (or finished) run in DIR")
    o.add_argument("--render", metavar="JSONL",
                   help="only render cliffs.jsonl files (comma-separated: merged; an unfinished run's "
                        "cliffs.jsonl.partial too) into --out (runs nothing)")
    o.add_argument("--flagged-out", metavar="JSONL",
                   help="with --render: also write the flagged rows (and each jump's neighbours) to this JSONL, a "
                        "small file that gives the same flags (for reports that table them)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")


_METRICS = ("orig_rel_l2", "deq_rel_l2", "orig_lse_max_abs_err", "deq_lse_max_abs_err")
_GAUSSIAN_ONLY = ("kv_heads", "head_dim", "head_dim_v", "batch", "std", "outliers", "outlier_scale",
                  "outlier_tensors", "dtype")


def check_args(args: argparse.Namespace) -> None:
    """The flags' checks that need no heavy import (run by the ``zyfa`` dispatch before :func:`main`, and again by
    the plan): numbers, exclusive flags, recipe names and the platform."""
    if args.flagged_out and not args.render:
        raise UsageError("--flagged-out applies to --render")
    if args.render:
        return
    if args.force and args.resume:
        raise UsageError("--force and --resume exclude each other")
    if args.kernel_recipe and not args.kernel:
        raise UsageError("--kernel-recipe pairs a --kernel with a recipe; no --kernel given")
    check_kernel_flags(args)  # --implementations, --kernel: the registry's lines, before torch
    if args.max_length is not None and args.max_length < 1:
        raise UsageError(f"--max-length must be >= 1, got {args.max_length}")
    if args.coarse_step < 1:
        raise UsageError(f"--coarse-step must be >= 1, got {args.coarse_step}")
    if args.chunk is not None and args.shapes == "equal":
        raise UsageError("--chunk sets the chunk shape's query rows: add --shapes chunk or --shapes both")
    chunk = 128 if args.chunk is None else args.chunk
    if chunk < 1:
        raise UsageError(f"--chunk must be >= 1, got {chunk}")
    if args.causal and args.mask not in (None, "causal"):
        raise UsageError(f"--causal and --mask {args.mask} disagree")
    if args.recipes.strip() not in ("", "none"):
        parse_recipes(args.recipes)
    if args.platform is not None:
        get_platform(args.platform)


def main(args: argparse.Namespace) -> int:
    """Run (or with ``--render`` only render) a sweep; 0 on success, 2 on bad input (one line on stderr)."""
    try:
        if args.flagged_out and not args.render:
            raise UsageError("--flagged-out applies to --render")
        if args.render:
            return _render_only(args)
        plan = _plan(args)
    except (ValueError, FileNotFoundError, OSError) as e:
        return _fail(e)
    return _run(args, plan)


def _fail(e, results=None, status: int = 2) -> int:
    kept = ""
    if results is not None:
        results.close()
        if results.partial.is_file():
            kept = f"; the rows finished so far are in {results.partial} (rerun with --resume to continue)"
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"{PROG}: error: {msg}{kept}", file=sys.stderr)
    return status


def _rule(args, provenance: dict | None = None):
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.cliffs.flags import CliffRule

    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.cliffs.section import rule_of

    if args.metric is not None and args.metric not in _METRICS:
        raise UsageError(f"--metric {args.metric!r}: choose one of {', '.join(_METRICS)}")
    for name in ("factor", "floor"):
        v = getattr(args, name)
        if v is not None and not (v >= 0 and v < float("inf")):
            raise UsageError(f"--{name} must be a finite number >= 0, got {v}")
    over = {"metric": args.metric, "factor": args.factor, "floor": args.floor}
    return rule_of(provenance, **over) if provenance is not None else dataclasses.replace(
        CliffRule(), **{k: v for k, v in over.items() if v is not None})


def _render_only(args) -> int:
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.cliffs.flags import read_sweeps

    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.cliffs.section import render

    from zyfa.outputs import check_dir_writable

    rows, prov = read_sweeps(args.render, flag="--render")
    rule = _rule(args, prov)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder")
    check_dir_writable(out, need_bytes=8 << 20)
    paths = render(rows, prov, out, rule=rule)
    _print_summary(rows, prov, rule)
    print(f"wrote {paths['png']} and {paths['markdown']}")
    if args.flagged_out:
        # lazy: kept off the refusal path, which imports only what checking the flags needs
        from zyfa.accuracy.cliffs.flags import flagged_rows
        from zyfa.accuracy.io.results_io import write_results

        kept = flagged_rows(rows, rule)
        write_results(kept, Path(args.flagged_out), {**prov, "rows_kept": (
            f"the flagged rows and the +-{rule.half_window} neighbours of each jump only: {len(kept)} of "
            f"{len(rows)} rows of {args.render}")})
        print(f"wrote {len(kept)} of {len(rows)} rows (the flags and their neighbours) to {args.flagged_out}")
    return 0


@dataclasses.dataclass
class _Plan:
    source: object
    subjects: list
    usable: list
    lengths: list
    masks: list
    shapes: list
    chunk: int
    device: object
    rule: object
    results: object
    keys: list
    extra: dict
    out: Path


def _plan(args) -> _Plan:
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.cliffs.sweep import (
        DEFAULT_MAX_LENGTH,
        check_lengths_fit,
        default_lengths,
        parse_lengths,
        plan_keys,
        subjects,
    )
    from zyfa.accuracy.implementations.plugins import load_plugins
    from zyfa.accuracy.implementations.registry import parse_implementations
    from zyfa.accuracy.io.device import resolve_device

    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.io.results_io import ResultsFile

    rule = _rule(args)
    check_args(args)
    chunk = 128 if args.chunk is None else args.chunk
    lengths = parse_lengths(args.lengths) if args.lengths is not None else None

    recipes = [] if args.recipes.strip() in ("", "none") else parse_recipes(args.recipes)
    if args.platform is not None:
        recipes = [r.on(args.platform) for r in recipes]
    named = parse_implementations(args.implementations)
    if args.implementations and not {t.strip() for t in args.implementations.split(",")} & {"all", "available"}:
        refuse_unavailable((i.name, i) for i in named)  # named ones: refused here as by zyfa longctx
    impls = named + load_plugins(args.kernel or [], args.kernel_recipe or [], **wall_options(args))
    subs = subjects(recipes, impls)
    if not subs:
        raise UsageError("nothing to sweep: name --recipes, --implementations or --kernel")
    device = resolve_device(args.device)
    source, own_mask, repro, acc = _source(args, device)

    cap = args.max_length if args.max_length is not None else DEFAULT_MAX_LENGTH
    if source.max_length is not None:
        if args.max_length is not None and args.max_length > source.max_length:
            raise UsageError(f"--max-length {args.max_length} is above the capture's {source.max_length} tokens")
        cap = min(cap, source.max_length)
    if lengths is None:
        lengths = default_lengths(cap, coarse_step=args.coarse_step)
    elif args.max_length is not None:
        lengths = [n for n in lengths if n <= args.max_length]
        if not lengths:
            raise UsageError(f"--lengths has no length at or below --max-length {args.max_length}")
    mask = "causal" if args.causal else (args.mask or own_mask)
    masks = ["none", "causal"] if mask == "both" else [mask]
    shapes = ["equal", "chunk"] if args.shapes == "both" else [args.shapes]

    check_lengths_fit(source, lengths, device)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder")
    if not out.exists():
        if not out.parent.is_dir():
            raise FileNotFoundError(f"--out: folder {out.parent} does not exist")
        out.mkdir()
    results = ResultsFile.open(out / JSONL, force=args.force, resume=args.resume, flag="--out")
    usable = [s for s in subs if s.impl is None or s.impl.available()[0]]
    keys = plan_keys(source, usable, lengths, masks, shapes, chunk)
    results.check_plan(keys)
    rule_args = []
    for flag, v, d in (("--metric", rule.metric, "orig_rel_l2"), ("--factor", rule.factor, 3.0),
                       ("--floor", rule.floor, 1e-3)):
        if v != d:
            rule_args += [flag, str(v)]
    extra = {"rule": dataclasses.asdict(rule), "repro_args": repro + rule_args, "accuracy_args": acc}
    return _Plan(source, subs, usable, lengths, masks, shapes, chunk, device, rule, results, keys, extra, out)


def _source(args, device):
    """(source, its own mask, the zyfa cliffs argv of the input, the zyfa accuracy argv of it or None)."""
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.cliffs.sweep import DEFAULT_MAX_LENGTH, CaptureSource, GaussianSource
    from zyfa.accuracy.inputs.attention_input import GaussianSpec, capture_inputs

    dev = ["--device", device.type]
    if args.inputs.strip() == "gaussian":
        if args.layer is not None:
            raise UsageError("--layer applies to a capture (--inputs path/to/capture.h5)")
        try:
            heads = int(args.heads) if args.heads is not None else 2
        except ValueError:
            raise UsageError(f"for Gaussian inputs --heads is the number of query heads, got {args.heads!r}") from None
        spec = GaussianSpec(
            batch=args.batch or 1, heads_q=heads, heads_kv=args.kv_heads if args.kv_heads is not None else heads,
            seq=1, head_dim=args.head_dim or 128, head_dim_v=args.head_dim_v, std=args.std or 1.0,
            outlier_frac=args.outliers or 0.0, outlier_scale=10.0 if args.outlier_scale is None else args.outlier_scale,
            outlier_tensors=args.outlier_tensors or "qk", seed=args.seed, dtype=args.dtype or "bf16")
        argv = ["--inputs", "gaussian", "--head-dim", str(spec.head_dim)]
        if spec.head_dim_v is not None:
            argv += ["--head-dim-v", str(spec.head_dim_v)]
        argv += ["--heads", str(spec.heads_q), "--kv-heads", str(spec.heads_kv), "--batch", str(spec.batch)]
        if spec.std != 1.0:
            argv += ["--std", repr(spec.std)]
        if spec.outlier_frac > 0:
            argv += ["--outliers", repr(spec.outlier_frac), "--outlier-scale", repr(spec.outlier_scale),
                     "--outlier-tensors", spec.outlier_tensors]
        if spec.dtype != "bf16":
            argv += ["--dtype", spec.dtype]
        argv += ["--seed", str(spec.seed)]
        return GaussianSource(spec), "none", argv + dev, argv + dev
    path = args.inputs.strip()
    if "," in path:
        raise UsageError("--inputs takes 'gaussian' or one capture file")
    given = [f"--{k.replace('_', '-')}" for k in _GAUSSIAN_ONLY if getattr(args, k) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to Gaussian inputs; a capture "
                         "carries its own shape (use --layer, --heads)")
    if not Path(path).is_file():
        raise FileNotFoundError(f"no such input file: {path} (--inputs takes 'gaussian' or a capture .h5 file)")
    heads = None
    if args.heads is not None:
        try:
            heads = [int(h) for h in args.heads.split(",") if h.strip()]
        except ValueError:
            raise UsageError(f"for a capture --heads takes comma-separated head indices, got {args.heads!r}") from None
    cap = args.max_length or DEFAULT_MAX_LENGTH
    layers = [args.layer] if args.layer is not None else None
    inputs = capture_inputs(path, layers=layers, heads=heads, max_tokens=cap)
    base = inputs[0]
    source = CaptureSource(base)
    argv = ["--inputs", path, "--layer", str(base.meta["layer"])] + (["--heads", args.heads] if heads else [])
    acc = ["--inputs", path, "--layers", str(base.meta["layer"])] + (["--heads", args.heads] if heads else [])
    return source, ("causal" if base.causal else "none"), argv + dev, acc + dev


def _run(args, plan: _Plan) -> int:
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.cliffs.section import render
    from zyfa.accuracy.cliffs.sweep import run_cliffs

    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.io.results_io import write_results

    results = plan.results
    first = results.provenance if results.resumed_from is not None else {}
    if results.resumed_from is not None:
        print(f"resuming {results.resumed_from}: {len(results.done)} of {len(plan.keys)} rows done")
    n_lengths = len(plan.lengths)
    print(f"{PROG}: {len(plan.usable)} implementation(s) x {n_lengths} lengths x {len(plan.masks)} mask(s) x "
          f"{len(plan.shapes)} shape(s) = {len(plan.keys)} rows on {plan.device}", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        rows, prov = run_cliffs(plan.source, plan.subjects, plan.lengths, masks=plan.masks, shapes=plan.shapes,
                                chunk=plan.chunk, device=plan.device, progress=not args.no_progress, seed=args.seed,
                                skip=results.done, on_start=results.start, on_row=results.add,
                                extra_provenance=plan.extra)  # a resume too: a new run_id, its segment's
    except ValueError as e:
        return _fail(e, results)
    except KeyboardInterrupt:
        return _fail("interrupted", results, status=130)
    wall = time.perf_counter() - t0
    if first:  # prov (this segment's, given to results.start) lists the earlier ones; the hashes of every length
        prov["input_hashes"] = {**(first.get("input_hashes") or {}), **prov.get("input_hashes", {})}
    rows = results.rows_in_order(plan.keys)
    try:
        results.finish(rows, prov, write_results)
    except (ValueError, OSError) as e:
        return _fail(e, results)
    try:
        paths = render(rows, prov, plan.out, rule=plan.rule)
    except ImportError as e:  # no matplotlib here: the rows are written, render them elsewhere
        return _fail(f"wrote {len(rows)} rows to {results.path} but cannot render here ({e}); render them with "
                     f"zyfa cliffs --render {results.path} --out DIR where matplotlib is installed")
    except (ValueError, OSError) as e:
        return _fail(f"wrote {len(rows)} rows to {results.path} but rendering failed: {e}")
    _print_summary(rows, prov, plan.rule)
    print(f"wrote {len(rows)} rows to {results.path}, {paths['png']} and {paths['markdown']} ({wall:.1f} s)")
    return 0


def _print_summary(rows, prov, rule) -> None:
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.cliffs.section import flag_groups

    for line in verdict_lines(rows):
        print(line)
    groups = flag_groups(rows, prov, rule)
    names = list(dict.fromkeys(r["implementation"] for r in rows))
    for name in names:
        mine = [g for g in groups if g["implementation"] == name]
        if not mine:
            print(f"{name}: no flags")
            continue
        counts: dict[str, int] = {}
        for g in mine:
            counts[g["kind"]] = counts.get(g["kind"], 0) + len(g["lengths"])
        first = min(mine, key=lambda g: g["length"])
        print(f"{name}: " + ", ".join(f"{k} at {n} length(s)" for k, n in counts.items())
              + f"; shortest {first['kind']} at {first['length']}: {first['reproducer']}")
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.implementations.base import unavailable_lines

    for line in unavailable_lines(prov.get("implementations_unavailable") or {}):
        print(line)
