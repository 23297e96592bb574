#!/usr/bin/env python3
"""Record what the H200's FP8 wgmma computes, operands and results, for fitting the h200 platform model (GPU).

Each experiment runs Triton FP8 dots, D = C + A·Bᵀ over 64×64 output blocks, with e4m3fn A (64×K) and B (64×K)
and an fp32 C, and stores the operands and the results bit for bit in one compressed ``.npz``:
``<name>.a`` / ``<name>.b`` (uint8 FP8 bytes, blocks×64×K), ``<name>.c`` / ``<name>.d`` (float32, blocks×64×64),
plus a JSON ``meta`` entry (versions, device, each experiment's settings). The CPU side
(``zyfa.platforms``, its tests) reads the file; nothing here needs the project.

Experiments vary what decides the accumulator's rounding: how many of the 32 products of one k step are non-zero
(2, 3, 4, 8, 32), their signs (positive, signed), the spread of their exponents (Gaussian, every finite FP8
value), an incoming accumulator C (none, of similar or very different magnitude), and the chain length (one
k = 32 step; K = 64, 128, 1024 steps chained in the accumulator; K = 128 with Triton's per-step flush into fp32,
``max_num_imprecise_acc=32``).

    python3 scripts/record_wgmma_accumulation.py --out wgmma.npz [--blocks 16] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np
import torch

E4M3 = torch.float8_e4m3fn


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def dot_blocks(A, B, C, D, K: tl.constexpr, USE_C: tl.constexpr, FLUSH: tl.constexpr):
        blk = tl.program_id(0)
        om = tl.arange(0, 64)
        ok = tl.arange(0, 32)
        base = blk * 64 * K
        if USE_C:
            acc = tl.load(C + blk * 4096 + om[:, None] * 64 + om[None, :])
        else:
            acc = tl.zeros((64, 64), tl.float32)
        for k0 in tl.static_range(0, K, 32):
            a = tl.load(A + base + om[:, None] * K + k0 + ok[None, :])
            b = tl.load(B + base + om[:, None] * K + k0 + ok[None, :])
            if FLUSH:
                acc = tl.dot(a, b.T, acc, max_num_imprecise_acc=32)
            else:
                acc = tl.dot(a, b.T, acc)
        tl.store(D + blk * 4096 + om[:, None] * 64 + om[None, :], acc)

    return dot_blocks


def _fp8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(E4M3)


def _every_finite(shape, g) -> torch.Tensor:
    """Uniform over the finite e4m3fn bytes (NaN codes 0x7f and 0xff excluded): every exponent equally likely."""
    codes = torch.randint(0, 254, shape, generator=g, device="cuda", dtype=torch.int32)
    codes = codes + (codes >= 0x7F).int()  # skip 0x7f
    return codes.to(torch.uint8).view(E4M3)


def _sparsify(a: torch.Tensor, nonzero: int, g) -> torch.Tensor:
    """Keep ``nonzero`` entries of each row in each group of 32 along k (positions at random), zero the rest."""
    blocks, m, k = a.shape
    keys = torch.rand((blocks, m, k // 32, 32), generator=g, device="cuda")
    keep = keys.argsort(-1) < nonzero
    return torch.where(keep.reshape(a.shape), a.float(), 0.0)


EXPERIMENTS = (
    # name, K, distribution, non-zero per step (None: all), C, flush
    ("pos_k32", 32, "positive", None, "none", False),
    ("pos_k1024", 1024, "positive", None, "none", False),
    ("signed_k32_n2", 32, "gauss", 2, "none", False),
    ("signed_k32_n3", 32, "gauss", 3, "none", False),
    ("signed_k32_n4", 32, "gauss", 4, "none", False),
    ("signed_k32_n8", 32, "gauss", 8, "none", False),
    ("signed_k32", 32, "gauss", None, "none", False),
    ("wide_k32_n2", 32, "finite", 2, "none", False),
    ("wide_k32", 32, "finite", None, "none", False),
    ("signed_k32_n1_c", 32, "gauss", 1, "similar", False),
    ("signed_k32_c", 32, "gauss", None, "similar", False),
    ("signed_k32_cwide", 32, "gauss", None, "wide", False),
    ("signed_k64", 64, "gauss", None, "none", False),
    ("signed_k128", 128, "gauss", None, "none", False),
    ("signed_k1024", 1024, "gauss", None, "none", False),
    ("signed_k128_flush", 128, "gauss", None, "none", True),
    ("outlier_k64", 64, "outlier", None, "none", False),
)


def run(blocks: int, seed: int) -> dict[str, np.ndarray]:
    kern = _kernel()
    g = torch.Generator(device="cuda").manual_seed(seed)
    arrays: dict[str, np.ndarray] = {}
    settings = []
    for name, k, dist, nonzero, c_kind, flush in EXPERIMENTS:
        shape = (blocks, 64, k)
        if dist == "positive":
            a, b = (_fp8(torch.rand(shape, generator=g, device="cuda") + 1) for _ in range(2))
        elif dist == "gauss":
            a, b = (_fp8(torch.randn(shape, generator=g, device="cuda")) for _ in range(2))
        elif dist == "finite":
            a, b = _every_finite(shape, g), _every_finite(shape, g)
        else:  # outlier: K-like channels with a few large columns, Q-like rows Gaussian
            a = _fp8(torch.randn(shape, generator=g, device="cuda"))
            big = torch.randn((blocks, 1, k), generator=g, device="cuda") * 40 * (
                torch.rand((blocks, 1, k), generator=g, device="cuda") < 0.1
            )
            b = _fp8(torch.randn(shape, generator=g, device="cuda") + big)
        if nonzero is not None:
            a = _fp8(_sparsify(a, nonzero, g))
        if c_kind == "none":
            c = torch.zeros((blocks, 64, 64), device="cuda")
        else:
            ref = (a.float() @ b.float().transpose(-1, -2)).abs().mean()
            c = torch.randn((blocks, 64, 64), generator=g, device="cuda") * ref
            if c_kind == "wide":  # C from 2^-12 to 2^12 of the products' scale
                c = c * torch.exp2(torch.randint(-12, 13, c.shape, generator=g, device="cuda").float())
        d = torch.empty_like(c)
        kern[(blocks,)](a, b, c, d, K=k, USE_C=c_kind != "none", FLUSH=flush, num_warps=4)
        torch.cuda.synchronize()
        arrays[f"{name}.a"] = a.view(torch.uint8).cpu().numpy()
        arrays[f"{name}.b"] = b.view(torch.uint8).cpu().numpy()
        arrays[f"{name}.c"] = c.cpu().numpy()
        arrays[f"{name}.d"] = d.cpu().numpy()
        settings.append({"name": name, "k": k, "distribution": dist, "nonzero_per_step": nonzero, "c": c_kind,
                         "flush_each_step": flush})
        print(f"{name}: K={k} {dist} nonzero={nonzero} C={c_kind} flush={flush}", flush=True)
    import triton

    meta = {
        "device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "python": platform.python_version(), "seed": seed, "blocks": blocks, "layout": "D = C + A @ B^T per block",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "experiments": settings,
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    return arrays


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the .npz to write")
    ap.add_argument("--blocks", type=int, default=16, help="64x64 output blocks per experiment")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("record_wgmma_accumulation: needs a CUDA GPU (an H200 for the h200 platform)", file=sys.stderr)
        return 2
    np.savez_compressed(args.out, **run(args.blocks, args.seed))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
