"""Per-call overhead of the plug-in worker process (accuracy/implementations/plugin_worker.py) against an in-process
call.

The same plug-in (examples/fp8_torch_attention.py:attention) is called through
:func:`zyfa.accuracy.implementations.base.call_implementation` on one Gaussian input, loaded once in the worker and
once in this process; each is timed over ``--calls`` calls after ``--warmup`` (the worker's start-up is reported apart).
The overhead per call is the difference of the medians: the inputs' copies, their transfer (shared memory on the
CPU, CUDA IPC on a GPU), the check for writes and the output's copy back.

    python scripts/plugin_overhead.py --device cpu --seq 1024 --heads 8 --head-dim 64
    python scripts/plugin_overhead.py --device cpu --kernel examples/noop_attention.py:attention
    python scripts/plugin_overhead.py --device cuda --seq 1024 --heads 8 --head-dim 64
    python scripts/plugin_overhead.py --device cuda --kernel examples/noop_attention.py:attention
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from zyfa.accuracy.implementations.base import call_implementation
from zyfa.accuracy.implementations.plugin_worker import shutdown_shared_worker
from zyfa.accuracy.implementations.plugins import load_plugin
from zyfa.accuracy.inputs.attention_input import GaussianSpec, make_gaussian

EXAMPLE = str(Path(__file__).resolve().parents[1] / "examples" / "fp8_torch_attention.py") + ":attention"


def _times(impl, x, calls: int, warmup: int, sync) -> list[float]:
    for _ in range(warmup):
        call_implementation(impl, x)
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call_implementation(impl, x)
        sync()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kernel", default=EXAMPLE, help="the plug-in timed (default the example); "
                    "examples/noop_attention.py:attention isolates the transfer")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device(args.device)
    x = make_gaussian(GaussianSpec(seq=args.seq, heads_q=args.heads, heads_kv=args.heads,
                                   head_dim=args.head_dim)).to(dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    t0 = time.perf_counter()
    worker = load_plugin(args.kernel)
    start = time.perf_counter() - t0
    inproc = load_plugin(args.kernel, in_process=True)
    t_in = _times(inproc, x, args.calls, args.warmup, sync)
    t_wk = _times(worker, x, args.calls, args.warmup, sync)
    shutdown_shared_worker()
    med_in, med_wk = statistics.median(t_in), statistics.median(t_wk)
    print(json.dumps({
        "device": str(dev), "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "kernel": args.kernel, "threads": torch.get_num_threads(), "shape": list(x.q.shape), "dtype": str(x.q.dtype),
        "calls": args.calls,
        "worker_start_and_load_s": round(start, 3), "in_process_median_ms": round(1e3 * med_in, 3),
        "worker_median_ms": round(1e3 * med_wk, 3), "overhead_per_call_ms": round(1e3 * (med_wk - med_in), 3),
    }))


if __name__ == "__main__":
    main()
