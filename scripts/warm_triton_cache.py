"""Compile the kernel variants `zyfa bench` will time, in parallel, into Triton's on-disk cache (GPU).

`scripts/gpu_check.sh` runs this in the background while the GPU tests run, so the benchmark afterwards loads
its kernels instead of compiling them one after another. Each variant is launched once on a 256-token input
with the bench's head counts: sequence lengths that are multiples of 16 share Triton's specialization (the cache
key) with the timed 8K-32K runs. Worker processes, one CUDA context each; failures are printed, never raised.

    PYTHONPATH=. python3 scripts/warm_triton_cache.py [--workers 12] [--recipes 'a;b'] [--recipes-other 'a;b'|same]
        [--shapes hd128,mla,hd256,hd64]

The recipe lists default to `zyfa bench`'s own (zyfa.bench.cli.DEFAULT_RECIPES / OTHER_RECIPES).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))



def _task(task: tuple[str, bool, str]) -> str:
    shape, causal, spec = task
    t0 = time.time()
    try:
        import torch

        from zyfa.bench.cases import gaussian_kernel_call

        fn, _ = gaussian_kernel_call(shape, 256, causal, spec)  # spec: 'name' or 'name:field=value,...'
        fn()
        torch.cuda.synchronize()
        return f"ok   {time.time() - t0:5.1f}s {shape} causal={causal} {spec}"
    except Exception as e:  # noqa: BLE001
        return f"FAIL {time.time() - t0:5.1f}s {shape} causal={causal} {spec}: {type(e).__name__}: {str(e)[:200]}"


def main() -> int:
    from zyfa.bench.args import DEFAULT_RECIPES, OTHER_RECIPES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--recipes", default=";".join(DEFAULT_RECIPES), help="recipes for hd128 (';'-separated)")
    ap.add_argument("--recipes-other", default=";".join(OTHER_RECIPES),
                    help="recipes for the other shapes ('same' = --recipes, as zyfa bench takes it)")
    ap.add_argument("--shapes", default="hd128,mla,hd256,hd64")
    a = ap.parse_args()
    tasks = []
    for shape in [s for s in a.shapes.split(",") if s]:
        recipes = a.recipes if shape == "hd128" or a.recipes_other == "same" else a.recipes_other
        for spec in [x.strip() for x in recipes.split(";") if x.strip()]:
            for causal in (False, True):
                tasks.append((shape, causal, spec))
    t0 = time.time()
    print(f"warming {len(tasks)} variants on {a.workers} workers", flush=True)
    with mp.get_context("spawn").Pool(a.workers) as pool:
        for line in pool.imap_unordered(_task, tasks):
            print(line, flush=True)
    print(f"warm-up done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
