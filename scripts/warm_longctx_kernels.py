"""Compile, in parallel, the Triton kernel variants `zyfa longctx` launches in the three models (GPU).

Each (recipe, model geometry, sliding window) is launched once on a 256-token causal input with the model's head
counts, in worker processes with one CUDA context each, so the long-context run loads its kernels from Triton's
on-disk cache instead of compiling them one after another (sequence lengths that are multiples of 16 share the
specialization with 1K..32K prompts). Failures are printed, never raised.

    PYTHONPATH=. python3 scripts/warm_longctx_kernels.py [--workers 12] [--recipes zyfa-hopper,zyfa,fa3,ck,aiter]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

# (name, query heads, kv heads, head dim, sliding window) of the registry models' attention layers
GEOMETRIES = (("smollm2", 9, 3, 64, None), ("qwen25coder", 14, 2, 64, None), ("gemma3", 4, 1, 256, None),
              ("gemma3-local", 4, 1, 256, 512))


def _task(task: tuple[str, str, int, int, int, int | None]) -> str:
    recipe, geo, h, h_kv, d, window = task
    t0 = time.time()
    try:
        import torch

        from zyfa.kernels.attention_fp8 import attention_fp8_quantized

        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(2, h, 256, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(2, h_kv, 256, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(2, h_kv, 256, d, device="cuda", dtype=torch.bfloat16, generator=g)
        attention_fp8_quantized(q, k, v, recipe=recipe, causal=True, sm_scale=d ** -0.5, window=window)
        torch.cuda.synchronize()
        return f"ok   {time.time() - t0:5.1f}s {recipe} {geo}"
    except Exception as e:  # noqa: BLE001
        return f"FAIL {time.time() - t0:5.1f}s {recipe} {geo}: {type(e).__name__}: {str(e)[:200]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--recipes", default="zyfa-hopper,zyfa,fa3,ck,aiter")
    a = ap.parse_args()
    tasks = [(r, *geo) for r in a.recipes.split(",") for geo in GEOMETRIES]
    t0 = time.time()
    with mp.get_context("spawn").Pool(min(a.workers, len(tasks))) as pool:
        for line in pool.imap_unordered(_task, tasks):
            print(line, flush=True)
    print(f"warmed {len(tasks)} kernel variants in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
