"""Compile, in parallel, the Triton kernel variants `zyfa longctx` launches in the registry models (GPU).

Each (recipe, model geometry, sliding window) is launched once on a 256-token causal input with the model's head
counts, in worker processes with one CUDA context each, so the long-context run loads its kernels from Triton's
on-disk cache instead of compiling them one after another (sequence lengths that are multiples of 16 share the
specialization with 1K..32K prompts). ``--models`` keeps the geometries of those registry models (default: all).
Failures are printed, never raised.

    PYTHONPATH=. python3 scripts/warm_longctx_kernels.py [--workers 12] [--recipes zyfa-hopper,zyfa,fa3,ck,aiter]
        [--models qwen25coder-1.5b]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

# (name, query heads, kv heads, head dim, sliding window) of the registry models' attention layers; a name is the
# registry model's, or the model's name and "-" and a kind of layer (gemma3-local: its sliding-window layers)
GEOMETRIES = (("smollm2", 9, 3, 64, None), ("qwen25coder", 14, 2, 64, None), ("gemma3", 4, 1, 256, None),
              ("gemma3-local", 4, 1, 256, 512), ("qwen25coder-1.5b", 12, 2, 128, None))
LAYER_KINDS = ("local",)  # the suffixes of GEOMETRIES' names that are a model's kind of layer, not another model


def model_of(geometry: str) -> str:
    """The registry model a geometry belongs to (``gemma3-local`` -> ``gemma3``; ``qwen25coder-1.5b`` is a model)."""
    base, dash, kind = geometry.rpartition("-")
    return base if dash and kind in LAYER_KINDS else geometry


def tasks(recipes: list[str], models: list[str] | None = None) -> list[tuple]:
    """(recipe, *geometry) for each recipe and each geometry of ``models`` (None: every geometry); ValueError for a
    model with no geometry here."""
    known = {model_of(g[0]) for g in GEOMETRIES}
    unknown = [m for m in models or () if m not in known]
    if unknown:
        raise ValueError(f"--models: no geometry for {unknown[0]!r} (known: {', '.join(sorted(known))})")
    geos = [g for g in GEOMETRIES if models is None or model_of(g[0]) in models]
    return [(r, *g) for r in recipes for g in geos]


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
    ap.add_argument("--models", default="", help="comma- or space-separated registry models (default: all)")
    a = ap.parse_args()
    models = [m for m in a.models.replace(",", " ").split() if m] or None
    try:
        todo = tasks([r for r in a.recipes.split(",") if r], models)
    except ValueError as e:
        print(f"warm_longctx_kernels: {e}", file=sys.stderr)
        return 2
    t0 = time.time()
    with mp.get_context("spawn").Pool(max(1, min(a.workers, len(todo)))) as pool:
        for line in pool.imap_unordered(_task, todo):
            print(line, flush=True)
    print(f"warmed {len(todo)} kernel variants in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
