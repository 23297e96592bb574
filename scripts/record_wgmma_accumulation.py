#!/usr/bin/env python3
"""Record what the H200's FP8 wgmma computes, operands and results, for fitting the h200 platform model (GPU).

Each experiment runs Triton FP8 dots, D = C + A·Bᵀ over 64×64 output blocks, with FP8 A (64×K) and B (64×K)
(e4m3fn, e5m2, or one of each: Hopper's wgmma takes any pair) and an fp32 C, and stores the operands and the
results bit for bit in one compressed ``.npz``: ``<name>.a`` / ``<name>.b`` (uint8 FP8 bytes, blocks×64×K),
``<name>.c`` / ``<name>.d`` (float32, blocks×64×64), plus a JSON ``meta`` entry (versions, device, each
experiment's settings: ``formats`` are A's and B's FP8 formats, e4m3fn where a recording has none; ``wgmma`` the
wgmma instructions of the compiled dot, read from its PTX). The CPU side (``zyfa.platforms``, its tests,
scripts/fit_wgmma_accumulation.py) reads the file; nothing here needs the project.

Experiments vary what decides the accumulator's rounding: how many of the 32 products of one k step are non-zero
(2, 3, 4, 8, 32), their signs (positive, signed), the spread of their exponents (Gaussian, every finite FP8
value), an incoming accumulator C (none, of similar or very different magnitude), and the chain length (one
k = 32 step; K = 64, 128, 1024 steps chained in the accumulator; K = 128 with Triton's per-step flush into fp32,
``max_num_imprecise_acc=32``), and the operand formats: the e5m2 and e4m3fn × e5m2 experiments (Gaussian, every
finite e5m2 byte equally likely, and ``tiny``: every finite byte of the two smallest exponent fields, subnormals
included, against every finite byte of the other operand) record where the unit counts an e5m2 subnormal, which
the e4m3fn experiments cannot tell.

    python3 scripts/record_wgmma_accumulation.py --out wgmma.npz [--blocks 16] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time

import numpy as np
import torch

E4M3 = torch.float8_e4m3fn
DTYPES = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


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


def _fp8(x: torch.Tensor, dtype: torch.dtype = E4M3) -> torch.Tensor:
    """x rounded to ``dtype``, saturating (torch's e5m2 cast would give inf past the largest finite value)."""
    top = torch.finfo(dtype).max
    return x.clamp(-top, top).to(dtype)


def _finite_codes(dtype: torch.dtype, max_field: int | None = None) -> torch.Tensor:
    """The bytes of ``dtype``'s finite values in increasing byte order (NaN, and e5m2's infinities, left out);
    with ``max_field``, only those whose exponent field is at most it (0: zero and the subnormals)."""
    codes = torch.arange(256, dtype=torch.int32)
    keep = codes.to(torch.uint8).view(dtype).float().isfinite()
    if max_field is not None:
        mbits = 2 if dtype == torch.float8_e5m2 else 3
        keep &= ((codes & 0x7F) >> mbits) <= max_field
    return codes[keep].to("cuda")


def _every_finite(shape, g, dtype: torch.dtype = E4M3, max_field: int | None = None) -> torch.Tensor:
    """Uniform over the finite bytes of ``dtype`` (e4m3fn: NaN codes 0x7f and 0xff excluded; e5m2: NaNs and
    infinities): every exponent equally likely. ``max_field``: only the bytes of the smallest exponent fields."""
    table = _finite_codes(dtype, max_field)
    idx = torch.randint(0, table.numel(), shape, generator=g, device="cuda", dtype=torch.int32)
    return table[idx].to(torch.uint8).view(dtype)


def _sparsify(a: torch.Tensor, nonzero: int, g) -> torch.Tensor:
    """Keep ``nonzero`` entries of each row in each group of 32 along k (positions at random), zero the rest."""
    blocks, m, k = a.shape
    keys = torch.rand((blocks, m, k // 32, 32), generator=g, device="cuda")
    keep = keys.argsort(-1) < nonzero
    return torch.where(keep.reshape(a.shape), a.float(), 0.0)


# A and B formats of the experiments below without their own (all recorded before e5m2 was)
DEFAULT_FORMATS = ("e4m3fn", "e4m3fn")
EXPERIMENTS = (
    # name, K, distribution, non-zero per step (None: all), C, flush[, (A format, B format)]
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
    # e5m2 operands, both and mixed with e4m3fn (after the e4m3fn ones: a seed draws the same e4m3fn operands)
    ("e5m2_signed_k32", 32, "gauss", None, "none", False, ("e5m2", "e5m2")),
    ("e5m2_signed_k128", 128, "gauss", None, "none", False, ("e5m2", "e5m2")),
    ("e5m2_wide_k32", 32, "finite", None, "none", False, ("e5m2", "e5m2")),
    ("e5m2_wide_k32_n2", 32, "finite", 2, "none", False, ("e5m2", "e5m2")),
    ("e5m2_tiny_k32_n2", 32, "tiny", 2, "none", False, ("e5m2", "e5m2")),
    ("e5m2_wide_k32_c", 32, "finite", None, "similar", False, ("e5m2", "e5m2")),
    ("e4m3fn_e5m2_signed_k32", 32, "gauss", None, "none", False, ("e4m3fn", "e5m2")),
    ("e4m3fn_e5m2_wide_k32", 32, "finite", None, "none", False, ("e4m3fn", "e5m2")),
    ("e4m3fn_e5m2_wide_k32_n2", 32, "finite", 2, "none", False, ("e4m3fn", "e5m2")),
    ("e4m3fn_e5m2_tiny_k32_n2", 32, "tiny", 2, "none", False, ("e4m3fn", "e5m2")),
    ("e5m2_e4m3fn_wide_k32_n2", 32, "finite", 2, "none", False, ("e5m2", "e4m3fn")),
    ("e5m2_e4m3fn_tiny_k32_n2", 32, "tiny", 2, "none", False, ("e5m2", "e4m3fn")),
)


def _wgmma_instructions(compiled) -> list[str]:
    """The distinct wgmma.mma_async instructions (shape and types) in a compiled kernel's PTX; [] if unreadable."""
    try:
        ptx = compiled.asm["ptx"]
    except (AttributeError, KeyError, TypeError):
        return []
    return sorted(set(re.findall(r"wgmma\.mma_async[.\w]*", ptx)))


def run(blocks: int, seed: int) -> dict[str, np.ndarray]:
    kern = _kernel()
    g = torch.Generator(device="cuda").manual_seed(seed)
    arrays: dict[str, np.ndarray] = {}
    settings = []
    for name, k, dist, nonzero, c_kind, flush, *fmts in EXPERIMENTS:
        formats = tuple(fmts[0]) if fmts else DEFAULT_FORMATS
        ta, tb = DTYPES[formats[0]], DTYPES[formats[1]]
        shape = (blocks, 64, k)
        if dist == "positive":
            a, b = (_fp8(torch.rand(shape, generator=g, device="cuda") + 1, t) for t in (ta, tb))
        elif dist == "gauss":
            a, b = (_fp8(torch.randn(shape, generator=g, device="cuda"), t) for t in (ta, tb))
        elif dist == "finite":
            a, b = _every_finite(shape, g, ta), _every_finite(shape, g, tb)
        elif dist == "tiny":  # the e5m2 operand (A if both are) from its two smallest exponent fields only
            tiny_a = formats[0] == "e5m2"
            a = _every_finite(shape, g, ta, max_field=1 if tiny_a else None)
            b = _every_finite(shape, g, tb, max_field=None if tiny_a else 1)
        else:  # outlier: K-like channels with a few large columns, Q-like rows Gaussian
            a = _fp8(torch.randn(shape, generator=g, device="cuda"), ta)
            big = torch.randn((blocks, 1, k), generator=g, device="cuda") * 40 * (
                torch.rand((blocks, 1, k), generator=g, device="cuda") < 0.1
            )
            b = _fp8(torch.randn(shape, generator=g, device="cuda") + big, tb)
        if nonzero is not None:
            a = _fp8(_sparsify(a, nonzero, g), ta)
        if c_kind == "none":
            c = torch.zeros((blocks, 64, 64), device="cuda")
        else:
            ref = (a.float() @ b.float().transpose(-1, -2)).abs().mean()
            c = torch.randn((blocks, 64, 64), generator=g, device="cuda") * ref
            if c_kind == "wide":  # C from 2^-12 to 2^12 of the products' scale
                c = c * torch.exp2(torch.randint(-12, 13, c.shape, generator=g, device="cuda").float())
        d = torch.empty_like(c)
        compiled = kern[(blocks,)](a, b, c, d, K=k, USE_C=c_kind != "none", FLUSH=flush, num_warps=4)
        torch.cuda.synchronize()
        wgmma = _wgmma_instructions(compiled)
        arrays[f"{name}.a"] = a.view(torch.uint8).cpu().numpy()
        arrays[f"{name}.b"] = b.view(torch.uint8).cpu().numpy()
        arrays[f"{name}.c"] = c.cpu().numpy()
        arrays[f"{name}.d"] = d.cpu().numpy()
        settings.append({"name": name, "k": k, "distribution": dist, "nonzero_per_step": nonzero, "c": c_kind,
                         "flush_each_step": flush, "formats": list(formats), "wgmma": wgmma})
        print(f"{name}: {'x'.join(formats)} K={k} {dist} nonzero={nonzero} C={c_kind} flush={flush} "
              f"wgmma={','.join(wgmma) or 'NONE FOUND'}", flush=True)
        types = [f"e{f[1]}m{f[3]}" for f in formats]  # wgmma's operand type suffixes: e4m3, e5m2 (either order)
        if wgmma and not any(w.endswith((f".{types[0]}.{types[1]}", f".{types[1]}.{types[0]}")) for w in wgmma):
            print(f"  warning: {name}: no wgmma with {' x '.join(types)} operands in the PTX: not a native FP8 dot",
                  file=sys.stderr)
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
