"""``zyfa longctx``: long-context retrieval (needle in a haystack, passkey) with each implementation as the model's
attention, scored against the FP32 and BF16 baselines on the same prompts.

Examples::

    zyfa longctx --models smollm2 --lengths 1024,2048 --seeds 2 --implementations sdpa-fp32,bf16,zyfa,fa3
    zyfa longctx --device cuda --dtype bf16 --implementations sdpa-fp32,stock,triton:zyfa-hopper,triton:fa3,cudnn-fp8 \\
        --fallback stock --out longctx/results.jsonl --max-seconds 500      # then again with --resume
    zyfa longctx --render longctx/results.jsonl --out longctx-report

Implementations (``--implementations``, comma-separated): ``stock`` (the model's own attention), any built-in of the
registry (``triton:<recipe>``, ``cudnn-fp8``, ``flashinfer-fa3``, ``sdpa-bf16:cudnn``, ``sdpa-fp32``, ...; the same
names as ``zyfa accuracy --implementations``), any recipe spec (the emulator: ``zyfa``, ``ck@mi355x``), and
``--kernel module:function`` plug-ins (their rows are named ``plugin:<spec>``). ``--layers`` swaps only some layers.
A layer an implementation refuses (e.g. a sliding window) stops that implementation on that model with one line,
unless ``--fallback stock`` runs such layers with the model's own attention; every row records what ran
(``ran``: what -> layers).

Output: ``--out`` (default ``./zyfa-longctx/results.jsonl``) as in ``zyfa accuracy``: refused if it exists unless
``--force`` or ``--resume``; rows appended to ``<out>.partial`` batch by batch; ``--max-seconds`` stops between
batches (rerun with ``--resume``). Exit status: 0 done (or stopped by ``--max-seconds``), 2 bad input (one line),
3 when rows failed (after writing everything; ``--allow-failed`` gives 0).

Exposed: ``add_arguments(parser)``, ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

DEFAULT_OUT = "zyfa-longctx/results.jsonl"
# the defaults by device: on a GPU the real kernels, on a CPU the emulator (slow: keep lengths short there)
DEFAULT_IMPLEMENTATIONS = {
    "cuda": "sdpa-fp32,stock,triton:zyfa-hopper,triton:zyfa,triton:fa3,triton:ck,triton:aiter,cudnn-fp8,flashinfer-fa3",
    "cpu": "sdpa-fp32,bf16,zyfa,zyfa-hopper,fa3",
}
EXIT_FAILED_ROWS = 3


class UsageError(ValueError):
    """A bad command line (exit status 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="smollm2,gemma3,qwen25coder",
                        help="comma-separated registry names (smollm2, gemma3, qwen25coder) or model paths")
    parser.add_argument("--implementations", default=None,
                        help="comma-separated: stock, built-in implementations, recipe specs (the emulator); default "
                             f"on a GPU {DEFAULT_IMPLEMENTATIONS['cuda']}; on a CPU {DEFAULT_IMPLEMENTATIONS['cpu']}")
    parser.add_argument("--kernel", action="append", metavar="MODULE:FUNCTION",
                        help="your own attention kernel (docs/CONTRACTS.md); imports and runs the named file or "
                             "module (repeatable)")
    parser.add_argument("--kernel-recipe", action="append", metavar="NAME", help="the recipe a --kernel claims")
    parser.add_argument("--tasks", default="needle,passkey", help="needle, passkey (default both)")
    parser.add_argument("--lengths", default=None,
                        help="context lengths in tokens, comma-separated, 'k' = 1024 (e.g. 1k,2k,4k); default "
                             "1k..32k up to each model's context")
    parser.add_argument("--depths", default=None,
                        help="needle depths as fractions of the haystack, comma-separated (default 0,0.1,...,1)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per (length, depth) cell (default 3)")
    parser.add_argument("--text", default="lee", help="haystack text of the needle task: lee, shakespeare, pydoc")
    parser.add_argument("--layers", default=None, help="swap only these layers (comma-separated); others stock")
    parser.add_argument("--op-layers", type=int, default=3,
                        help="layers whose operator error against FP64 is measured in the pass (default 3)")
    parser.add_argument("--fallback", choices=("none", "stock"), default="none",
                        help="layers an implementation refuses: none (its rows are unsupported) or stock (run them "
                             "with the model's own attention; recorded in each row)")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="the model's weights and activations (default fp32); attention implementations "
                             "receive q/k/v in this dtype")
    parser.add_argument("--batch-tokens", type=int, default=None,
                        help="tokens per forward pass (prompts of one length are batched; default 8192 on a CPU, "
                             "131072 on a GPU)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop between batches after this many seconds (then --resume)")
    parser.add_argument("--out", default=None, help=f"results JSONL (default ./{DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="replace an existing --out when the run finishes")
    parser.add_argument("--resume", action="store_true", help="continue --out: run only the missing rows")
    parser.add_argument("--allow-failed", action="store_true", help="exit 0 even when rows failed")
    parser.add_argument("--render", default=None, metavar="RESULTS",
                        help="render RESULTS (JSONL files, comma-separated or a quoted glob) into --out (a folder: "
                             "longctx.md and figures); runs nothing")
    parser.add_argument("--cliffs", default=None, metavar="JSONL",
                        help="with --render: the cliff finder's results to table beside it")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _ints(text: str, what: str) -> list[int]:
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


def _depths(text: str | None) -> list[float]:
    from accuracy.longctx.run import DEFAULT_DEPTHS

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


def main(args: argparse.Namespace) -> int:
    if args.render is not None:
        return _render(args)
    try:
        return _run(args)
    except UsageError as e:
        print(f"zyfa longctx: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    import torch

    from accuracy.impact.model import STOCK, model_attention
    from accuracy.implementations import load_plugins
    from accuracy.longctx.run import GridSpec, run_longctx
    from accuracy.longctx.tasks import TASKS
    from accuracy.provenance import provenance
    from accuracy.results_io import ResultsFile, jsonl_text
    from accuracy.runner import resolve_device
    from zyfa.outputs import OutputError, atomic_write_text

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise UsageError("--models names no model")
    _check_models(models)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise UsageError(f"--tasks: unknown task {bad[0] if bad else '(none)'!r}; tasks: {', '.join(TASKS)}")
    if args.seeds < 1:
        raise UsageError("--seeds must be at least 1")
    lengths = _ints(args.lengths, "--lengths") if args.lengths else None
    depths = _depths(args.depths)
    layers = [n - 1 for n in _ints(",".join(str(int(t) + 1) if t.strip().isdigit() else t
                                            for t in args.layers.split(",")), "--layers")] if args.layers else None
    try:
        device = resolve_device(args.device)
    except (ValueError, RuntimeError) as e:
        raise UsageError(str(e)) from None
    names = [n.strip() for n in (args.implementations or DEFAULT_IMPLEMENTATIONS[device.type]).split(",")
             if n.strip()]
    try:
        plugins = load_plugins(args.kernel or [], args.kernel_recipe or [])
    except ValueError as e:
        raise UsageError(str(e)) from None
    names += [p.name for p in plugins if p.name not in names]
    if not names:
        raise UsageError("no implementations to run")
    unavailable = {}
    for n in names:
        if n == STOCK or any(p.name == n for p in plugins):
            continue
        try:
            fn = model_attention(n)
        except ValueError as e:
            raise UsageError(f"--implementations: {e}") from None
        if fn.impl is not None:
            ok, why = fn.impl.available()
            if not ok:
                unavailable[n] = why
    if unavailable:
        first = next(iter(unavailable))
        raise UsageError(f"implementation {first} cannot run here: {unavailable[first]}"
                         + (f" (and {len(unavailable) - 1} more)" if len(unavailable) > 1 else ""))
    # conformance probes (accuracy.conformance) before any model loads: a kernel that ignores the mask or maps
    # heads wrongly is not scored; its rows say why
    from accuracy.conformance import probe_cached

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
    out = Path(args.out or DEFAULT_OUT)
    if args.out is None:
        out.parent.mkdir(parents=True, exist_ok=True)
    spec = GridSpec(models=models, implementations=names, tasks=tasks, lengths=lengths, depths=depths,
                    seeds=list(range(args.seeds)), text=args.text, layers=layers, op_layers=args.op_layers,
                    fallback=None if args.fallback == "none" else "stock")
    try:
        results = ResultsFile.open(out, force=args.force, resume=args.resume)
    except OutputError as e:
        raise UsageError(str(e)) from None
    prov = provenance({"command": "zyfa longctx " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
                       "device": str(device), "models": models, "implementations": names, "tasks": tasks,
                       "lengths": lengths, "depths": depths, "seeds": spec.seeds, "text": args.text,
                       "model_dtype": args.dtype, "fallback": args.fallback, "layers": layers,
                       "plugins": {p.name: p.description for p in plugins}, "nonconforming": nonconforming})
    if results.provenance.get("run_id"):
        prov["run_id"] = results.provenance["run_id"]
    else:
        import uuid

        prov["run_id"] = uuid.uuid4().hex[:12]
    results.start(prov)
    batch_tokens = args.batch_tokens or (131072 if device.type == "cuda" else 8192)
    try:
        try:
            res = run_longctx(spec, results=results, device=device, dtype=args.dtype, plugins=plugins,
                              batch_tokens=batch_tokens, max_seconds=args.max_seconds,
                              progress=not args.no_progress, run_id=prov["run_id"], nonconforming=nonconforming)
        except ValueError as e:
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
    results.finish(rows, prov, lambda rs, path, p: atomic_write_text(path, jsonl_text(rs, p)))
    failed = sum(1 for r in rows if r.get("status") in ("failed", "nonconforming"))
    print(f"zyfa longctx: wrote {len(rows)} rows to {out}" + (f" ({failed} failed)" if failed else ""),
          file=sys.stderr)
    if failed and not args.allow_failed:
        return EXIT_FAILED_ROWS
    return 0


def _check_models(models: list[str]) -> None:
    from capture.models import MODELS

    for m in models:
        if m in MODELS or Path(m).expanduser().exists() or ("/" in m and not m.startswith(("/", ".", "~"))):
            continue
        raise UsageError(f"unknown model {m!r}: give a registry name ({', '.join(MODELS)}), a model directory or "
                         ".gguf file, or a hub id (owner/name)")


def _render(args: argparse.Namespace) -> int:
    from accuracy.longctx.section import RenderError, render_folder

    try:
        path = render_folder(args.render, Path(args.out or "zyfa-longctx-report"), cliffs=args.cliffs,
                             force=args.force)
    except RenderError as e:
        print(f"zyfa longctx: {e}", file=sys.stderr)
        return 2
    print(f"zyfa longctx: wrote {path}", file=sys.stderr)
    return 0
