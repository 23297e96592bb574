"""Fill Triton's on-disk cache in parallel for the A/B and bench variants of scripts/gpu_session2.sh.

Each variant is launched once on a 256-token input with the same head counts as the timed run: sequence
lengths that are multiples of 16 give the same Triton specialization (the same cache key) as 8K-32K, so the
timed runs later load the compiled kernels instead of compiling them one after another. Runs in worker
processes (one CUDA context each) while the GPU tests run; failures are printed, never raised.

PYTHONPATH=. python3 scripts/gpu_session2_warm.py [--set session3] [--workers 12] [--recipes 'a;b']
    [--recipes-other 'a;b']
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

SHAPES = {"hd64": (64, 64, 32), "hd128": (128, 128, 16), "hd256": (256, 256, 8), "mla": (192, 128, 16)}


def _task(args):
    shape, causal, recipe, over = args
    t0 = time.time()
    try:
        import torch

        from zyfa.bench import gaussian_qkv
        from zyfa.kernels import attention_fp8 as A

        d_qk, d_v, h = SHAPES[shape]
        s = 256
        q, k, v = gaussian_qkv(1, h, h, s, d_qk, d_v)
        q8, k8, v8, qd, kd, vd = A.quantize_for_kernel(q, k, v, recipe)
        vt = A.prepare_vt(v8, permute_k32=A.vt_key_order_for(over))
        A.launch(q8, k8, vt, qd, kd, vd, plan=A.kernel_plan(recipe), seq_k=s, causal=causal,
                 sm_scale=1 / math.sqrt(d_qk), window=None, config=over or None)
        torch.cuda.synchronize()
        return f"ok   {time.time() - t0:5.1f}s {shape} causal={causal} {recipe} {over}"
    except Exception as e:  # noqa: BLE001
        err = f"{type(e).__name__}: {str(e)[:200]}"
        return f"FAIL {time.time() - t0:5.1f}s {shape} causal={causal} {recipe} {over}: {err}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--recipes", default="", help="bench recipes for hd128 (';'-separated)")
    ap.add_argument("--recipes-other", default="", help="bench recipes for the other shapes")
    ap.add_argument("--set", default="session2", help="A/B variant matrix",
                    choices=("session2", "session3", "session3b", "session3c", "session3d"))
    a = ap.parse_args()
    from gpu_session2_ab import RECIPE, variants

    tasks = [(shape, causal, over.get("recipe", RECIPE), {k_: v_ for k_, v_ in over.items() if k_ != "recipe"})
             for shape, causal, over in variants(a.set)]
    for shape in SHAPES:
        recs = a.recipes if shape == "hd128" else a.recipes_other
        for r in [x for x in recs.split(";") if x.strip()]:
            for causal in (False, True):
                t = (shape, causal, r, {})
                if t not in tasks:
                    tasks.append(t)
    t0 = time.time()
    print(f"warming {len(tasks)} variants on {a.workers} workers", flush=True)
    with mp.get_context("spawn").Pool(a.workers) as pool:
        for line in pool.imap_unordered(_task, tasks):
            print(line, flush=True)
    print(f"warm-up done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(main())
