"""What one greedy decode step costs under each attention implementation: seconds per token, host syncs per token
and device kernels (GPU) or operators (CPU) per token, one implementation at a time, alone on the device.

    PYTHONPATH=.:/tmp/site python3 scripts/profile_decode.py --model qwen25coder-1.5b --device cuda \\
        --implementations stock,triton:fa3,triton:zyfa-hopper,cudnn-fp8 --tokens 32

Why: sharing one H100 among 16 HumanEval processes, the FP8 arms took 0.59-0.67 s per generated token and the
model's own attention 0.08 (reports/humaneval-plan/README.md). A decode step that waits on the host (a ``.item()``,
a ``bool(tensor)``, a synchronize) many times per layer gives up the GPU to the other processes each time; this
counts those waits. The decode is ``zyfa.accuracy.longctx.generate.greedy_generate``, the one the tasks run, on
HumanEval problem ``--problem``'s prompt, with no stop rule, so every run makes exactly the tokens asked for.

Per implementation: one warm-up generation, then generations of 1 and of ``--tokens`` tokens; the per-token figures
are the difference divided by ``tokens - 1`` (the prefill cancels). Host syncs are counted by
``torch.cuda.set_sync_debug_mode("warn")`` (CUDA only; torch warns at each synchronizing call it knows), kernels by
``torch.profiler`` (its device events on CUDA, its operator events on the CPU). Output: one markdown table and,
with ``--out``, one JSON line per implementation with the versions and device, each written as soon as it is
measured. Below the table: per implementation, the lines of Python that synchronize most per token and the kernels
(operators on the CPU) launched most per token, by name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zyfa.accuracy.impact.model import STOCK, model_attention  # noqa: E402
from zyfa.accuracy.longctx.generate import greedy_generate  # noqa: E402
from zyfa.accuracy.tasks.humaneval import load_problems  # noqa: E402
from zyfa.capture.models import MODELS, load_model  # noqa: E402

TOP = 12  # sync sites and kernel names listed per implementation
KERNEL_NAME = 90  # characters of a kernel name kept (templated names run to thousands)


def _generate(model, ids, fn, n: int, device) -> float:
    t0 = time.perf_counter()
    greedy_generate(model, ids, fn, max_new_tokens=n, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _syncs(model, ids, fn, n: int, device) -> Counter | None:
    """Synchronizing calls torch warns about in a generation of ``n`` tokens, by the line of Python that made
    them (``file:line``, relative to the repository where it lies inside; None off CUDA)."""
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            greedy_generate(model, ids, fn, max_new_tokens=n, device=device)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return Counter(_site(w.filename, w.lineno) for w in caught if "synchroniz" in str(w.message).lower())


def _site(filename: str, lineno: int) -> str:
    path = Path(filename)
    with contextlib.suppress(ValueError):
        path = path.resolve().relative_to(ROOT)
    return f"{path}:{lineno}"


def _per_token(many: Counter, one: Counter, steps: int, top: int = TOP) -> dict[str, float]:
    """The ``top`` keys whose count grows most per decode step, with that growth (the prefill cancels)."""
    grow = {k: (many[k] - one.get(k, 0)) / steps for k in many}
    return {k: round(v, 1) for k, v in sorted(grow.items(), key=lambda kv: -kv[1])[:top] if v > 0}


def _events(model, ids, fn, n: int, device) -> Counter:
    """Device kernels (CUDA) or operators (CPU) the profiler records in a generation of ``n`` tokens, by name."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        greedy_generate(model, ids, fn, max_new_tokens=n, device=device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.events()
    if device.type == "cuda":
        return Counter(e.name[:KERNEL_NAME] for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return Counter(e.name for e in events if e.name.startswith("aten::"))


def profile(model, ids, name: str, n: int, device) -> dict:
    fn = None if name == STOCK else model_attention(name)
    _generate(model, ids, fn, min(n, 4), device)  # warm-up: compiles, builds graphs, fills caches
    one, many = _generate(model, ids, fn, 1, device), _generate(model, ids, fn, n, device)
    s1, sn = _syncs(model, ids, fn, 1, device), _syncs(model, ids, fn, n, device)
    e1, en = _events(model, ids, fn, 1, device), _events(model, ids, fn, n, device)
    steps = n - 1
    what = "kernels" if device.type == "cuda" else "operators"
    return {"implementation": name, "tokens": n, "prefill_seconds": round(one, 4),
            "seconds_per_token": round((many - one) / steps, 5),
            "syncs_per_token": None if s1 is None else round((sn.total() - s1.total()) / steps, 1),
            f"{what}_per_token": round((en.total() - e1.total()) / steps, 1),
            "sync_sites_per_token": None if s1 is None else _per_token(sn, s1, steps),
            f"top_{what}_per_token": _per_token(en, e1, steps)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help=f"one of {', '.join(MODELS)}")
    ap.add_argument("--implementations", default="stock", help="comma-separated, as zyfa tasks takes them")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bf16", help="the model's weights and activations (bf16, fp32)")
    ap.add_argument("--tokens", type=int, default=32, help="decode steps to time (at least 2)")
    ap.add_argument("--problem", type=int, default=0, help="the HumanEval problem whose prompt is the prefill")
    ap.add_argument("--out", type=Path, default=None, help="write one JSON line per implementation here")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.implementations.split(",") if n.strip()]
    if args.model not in MODELS:
        print(f"profile_decode: unknown model {args.model!r}; one of {', '.join(MODELS)}", file=sys.stderr)
        return 2
    if args.tokens < 2 or not names:
        print("profile_decode: --tokens must be at least 2 and --implementations name one", file=sys.stderr)
        return 2
    try:
        for n in names:
            if n != STOCK:
                model_attention(n)  # an unknown name refused before the model loads
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device here")
        problems, _ = load_problems()
        if not 0 <= args.problem < len(problems):
            raise ValueError(f"--problem {args.problem}: give 0..{len(problems) - 1}")
        if args.out is not None and args.out.exists():
            raise ValueError(f"--out {args.out} exists; nothing is overwritten, name a new file")
    except ValueError as e:
        print(f"profile_decode: {e}", file=sys.stderr)
        return 2
    loaded = load_model(args.model, dtype=args.dtype)
    model = loaded.model.to(device)
    ids = list(loaded.tokenizer(problems[args.problem].prompt)["input_ids"])
    env = {"model": args.model, "dtype": args.dtype, "prompt_tokens": len(ids), "device": str(device),
           "cuda_device": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
           "torch": torch.__version__, "python": platform.python_version()}
    print(f"{args.model} ({args.dtype}, {len(ids)} prompt tokens) on {env['cuda_device'] or args.device}\n")
    if args.out is not None:
        args.out.write_text("")
    rows = []
    for n in names:
        # each implementation's line as soon as it is measured: a run cut by its time limit keeps what it made
        print(f"[profile_decode] {n} ...", file=sys.stderr)
        rows.append({**profile(model, ids, n, args.tokens, device), **env})
        if args.out is not None:
            with args.out.open("a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
        cols = [k for k in rows[0] if k not in env and not k.startswith(("sync_sites", "top_"))]
        if len(rows) == 1:
            print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        print("| " + " | ".join(str(rows[-1][c]) for c in cols) + " |", flush=True)
    for r in rows:
        for k in ("sync_sites_per_token", f"top_{'kernels' if device.type == 'cuda' else 'operators'}_per_token"):
            if r.get(k):
                print(f"\n{r['implementation']}, {k.replace('_', ' ')}:")
                for site, per in r[k].items():
                    print(f"  {per:8.1f}  {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
