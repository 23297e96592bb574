"""Compare the fitted H200 FP8 accumulator (zyfa.platforms.truncating_mma) with mmaemu's Hopper model and the H200.

mmaemu (https://github.com/astding/mmaemu, ``pip install mmaemu``) emulates cuBLAS FP8 GEMMs of an H100 PCIe bit for
bit; its instruction model (``mmaemu.model.dot``, preset ``hopper``) is a block FMA adapted from Khattak and
Mikaitis' MATLAB tensor-core toolbox: blocks of 32 products, each product at the sum of its operands' exponents,
the products and the incoming accumulator truncated 13 bits below the block's largest exponent, the sum truncated
to 13 fraction bits. This script runs that model and ours on the same e4m3fn operands and counts bit-identical
fp32 outputs (int32 patterns: signs of zero and NaN payloads count):

1. every experiment of the committed H200 recording (tests/data/wgmma_h200_sample.npz: operands and the outputs
   the H200 computed through Triton's FP8 ``tl.dot``): mmaemu vs H200, ours vs H200, mmaemu vs ours;
2. random operands (Gaussian, positive, every finite e4m3fn byte, two non-zero products per step, with and
   without an incoming accumulator of similar or very different magnitude; also e5m2 and e4m3fn x e5m2, which
   the H200 recording lacks), K = 32, 64, 128, 1024: mmaemu vs ours;
3. the GEMM level: ``mmaemu.accumulate`` (cuBLAS schedule, unsplit) with fast accumulation (one chain over K)
   against ``truncating_mma``, and with slow accumulation (a new chain every 128 elements of K, the chains added
   in fp32) against ``truncating_mma`` run on each 128-wide chunk and added the same way, and against our
   kernel's per-step flush (``stepwise_mma``: a new chain every 32);
4. outside the recording: an accumulator below 2^-136 entering a step whose products are all zero, and a NaN
   operand.

mmaemu has no per-step flush schedule; the recording's flushed experiment is compared with mmaemu's step
(``dot`` over 32 elements from +0) added in fp32 in k order, which is what ``stepwise_mma`` does with ours.

Usage: ``python3 scripts/compare_mmaemu.py [--m 64] [--seed 0]`` (CPU, about half a minute at --m 64). Needs mmaemu;
prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from zyfa.formats import get_format
from zyfa.platforms import stepwise_mma, truncating_mma

SAMPLE = Path(__file__).resolve().parents[1] / "tests" / "data" / "wgmma_h200_sample.npz"
K_STEP = 32


def _mmaemu():
    try:
        import mmaemu
        from mmaemu.model import dot
    except ImportError:
        sys.exit("compare_mmaemu: mmaemu is not installed (pip install mmaemu)")
    return mmaemu, dot


# ------------------------------------------------------------------------------------------------ the two models

def mmaemu_chain(a8: torch.Tensor, b8: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
    """mmaemu's Hopper instruction model: a8 [M, K], b8 [N, K] (float8_e4m3fn), c [M, N] fp32 or None (+0);
    one chain of 32-product blocks over all of K. Returns fp32 [M, N]."""
    _, dot = _mmaemu()
    m, k = a8.shape
    n = b8.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    rows = max(1, (1 << 21) // max(1, n * k))  # bound the [rows, N, K] float64 temporaries
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        a = a8[r0:r1, None, :].expand(r1 - r0, n, k).contiguous()
        b = b8[None, :, :].expand(r1 - r0, n, k).contiguous()
        out[r0:r1] = dot(a, b, None if c is None else c[r0:r1], preset="hopper")
    return out


def mmaemu_stepwise(a8: torch.Tensor, b8: torch.Tensor, step: int = K_STEP) -> torch.Tensor:
    """mmaemu's step from +0 over each ``step`` elements of K, the results added in fp32 in k order."""
    out = None
    for k0 in range(0, a8.shape[1], step):
        part = mmaemu_chain(a8[:, k0:k0 + step], b8[:, k0:k0 + step], None)
        out = part if out is None else out + part
    return out


def _min_exp(x: torch.Tensor) -> int:
    """The smallest normal exponent of an FP8 operand's format (e4m3fn -6, e5m2 -14), from the format table."""
    return get_format(str(x.dtype).removeprefix("torch.float8_")).emin


def ours_chain(a8: torch.Tensor, b8: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
    return truncating_mma(a8.float(), b8.float().T, c, 13, min_exp=(_min_exp(a8), _min_exp(b8)))


def ours_chunked(a8: torch.Tensor, b8: torch.Tensor, chunk: int) -> torch.Tensor:
    """truncating_mma from +0 over each ``chunk`` elements of K, the chunk results added in fp32 in k order."""
    out = None
    for k0 in range(0, a8.shape[1], chunk):
        part = ours_chain(a8[:, k0:k0 + chunk], b8[:, k0:k0 + chunk], None)
        out = part if out is None else out + part
    return out


def same_bits(x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of identical fp32 bit patterns."""
    return float((x.view(torch.int32) == y.view(torch.int32)).double().mean())


# ------------------------------------------------------------------------------------------------ operands

def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(torch.float8_e4m3fn)


def every_finite_byte(shape: tuple[int, ...], g: torch.Generator,
                      dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """Uniform over the finite codes of ``dtype`` (e4m3fn: 254, both zeros, every subnormal, +-448; e5m2: 248)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    finite = codes[torch.isfinite(codes.view(dtype).float())]
    return finite[torch.randint(0, len(finite), shape, generator=g)].view(dtype)


def sparse_signed(shape: tuple[int, int], per_step: int, g: torch.Generator) -> torch.Tensor:
    """Gaussian e4m3fn with only ``per_step`` non-zero values in every 32 elements of K (cancellation cases)."""
    x = torch.randn(shape, generator=g) * 8
    keep = torch.zeros(shape, dtype=torch.bool)
    for k0 in range(0, shape[1], K_STEP):
        width = min(K_STEP, shape[1] - k0)
        idx = torch.rand(shape[0], width, generator=g).argsort(dim=1)[:, :per_step]
        keep[:, k0:k0 + width].scatter_(1, idx, True)
    return e4m3(torch.where(keep, x, torch.zeros_like(x)))


def random_experiments(m: int, seed: int) -> list[tuple[str, int, torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in (32, 64, 128, 1024):
        a, b = e4m3(torch.randn(m, k, generator=g) * 4), e4m3(torch.randn(m, k, generator=g) * 4)
        out.append(("gaussian, signed", k, a, b, None))
        out.append(("gaussian, positive", k, a.float().abs().to(a.dtype), b.float().abs().to(b.dtype), None))
        c = torch.randn(m, m, generator=g) * 16 * k ** 0.5
        out.append(("gaussian, signed, C of similar size", k, a, b, c))
        a, b = every_finite_byte((m, k), g), every_finite_byte((m, k), g)
        out.append(("every finite byte", k, a, b, None))
        wide = torch.randn(m, m, generator=g) * torch.exp2(torch.randint(-40, 41, (m, m), generator=g).float())
        out.append(("every finite byte, C from 2^-40 to 2^40", k, a, b, wide))
        a, b = sparse_signed((m, k), 2, g), sparse_signed((m, k), 2, g)
        out.append(("2 non-zero per step, signed", k, a, b, None))
        wide = torch.randn(m, m, generator=g) * torch.exp2(torch.randint(-40, 41, (m, m), generator=g).float())
        a, b = every_finite_byte((m, k), g, torch.float8_e5m2), every_finite_byte((m, k), g, torch.float8_e5m2)
        out.append(("e5m2 x e5m2, every finite byte, C from 2^-40 to 2^40 (ours: subnormals at -14)", k, a, b, wide))
        a = every_finite_byte((m, k), g)
        out.append(("e4m3fn x e5m2, every finite byte, C from 2^-40 to 2^40", k, a, b, wide))
    return out


# ------------------------------------------------------------------------------------------------ experiments

def fixture_rows() -> list[dict]:
    z = np.load(SAMPLE)
    meta = json.loads(bytes(z["meta"]).decode())
    rows = []
    for e in meta["experiments"]:
        name = e["name"]
        fa, fb = e.get("formats") or ("e4m3fn", "e4m3fn")  # the first recordings name none: e4m3fn
        a8 = torch.from_numpy(z[f"{name}.a"][0]).view(getattr(torch, f"float8_{fa}"))
        b8 = torch.from_numpy(z[f"{name}.b"][0]).view(getattr(torch, f"float8_{fb}"))
        c = torch.from_numpy(z[f"{name}.c"][0]) if e["c"] != "none" else None
        d = torch.from_numpy(z[f"{name}.d"][0])
        if e["flush_each_step"]:
            mm = mmaemu_stepwise(a8, b8)
            ours = stepwise_mma(a8.float(), b8.float().T, 13, min_exp=(_min_exp(a8), _min_exp(b8)))
        else:
            mm, ours = mmaemu_chain(a8, b8, c), ours_chain(a8, b8, c)
        rows.append({"experiment": f"H200 {name}", "k": int(a8.shape[1]), "outputs": d.numel(),
                     "mmaemu_h200": same_bits(mm, d), "ours_h200": same_bits(ours, d),
                     "mmaemu_ours": same_bits(mm, ours)})
    return rows


def random_rows(m: int, seed: int) -> list[dict]:
    rows = []
    for name, k, a, b, c in random_experiments(m, seed):
        rows.append({"experiment": name, "k": k, "outputs": m * m, "mmaemu_h200": None, "ours_h200": None,
                     "mmaemu_ours": same_bits(mmaemu_chain(a, b, c), ours_chain(a, b, c))})
    return rows


def gemm_rows(m: int, seed: int) -> list[dict]:
    """mmaemu's GEMM level (cuBLAS on the H100 PCIe, unsplit) against our model under the same schedule."""
    mmaemu, _ = _mmaemu()
    g = torch.Generator().manual_seed(seed + 1)
    rows = []
    for k in (128, 1024):
        a, b = e4m3(torch.randn(m, k, generator=g) * 4), e4m3(torch.randn(m, k, generator=g) * 4)
        fast = mmaemu.accumulate(a, b, use_fast_accum=True, profile="hopper", splitk=1)
        slow = mmaemu.accumulate(a, b, use_fast_accum=False, profile="hopper", splitk=1)
        rows.append({"experiment": "mmaemu.accumulate fast vs truncating_mma (one chain)", "k": k, "outputs": m * m,
                     "mmaemu_h200": None, "ours_h200": None, "mmaemu_ours": same_bits(fast, ours_chain(a, b, None))})
        rows.append({"experiment": "mmaemu.accumulate slow vs truncating_mma per 128, fp32 adds", "k": k,
                     "outputs": m * m, "mmaemu_h200": None, "ours_h200": None,
                     "mmaemu_ours": same_bits(slow, ours_chunked(a, b, 128))})
        rows.append({"experiment": "mmaemu.accumulate slow vs stepwise_mma (flush every 32)", "k": k,
                     "outputs": m * m, "mmaemu_h200": None, "ours_h200": None,
                     "mmaemu_ours": same_bits(slow, stepwise_mma(a.float(), b.float().T, 13))})
    return rows


def tiny_accumulator_rows() -> list[dict]:
    """An incoming accumulator from 2^-149 to 2^-126 and a step of 32 zero products (the recording has none)."""
    c = torch.exp2(-torch.arange(126, 150, dtype=torch.float32))[:, None]  # 24 values, fp32 normal to subnormal
    c = torch.cat([c, -c])
    a = torch.zeros(c.shape[0], K_STEP, dtype=torch.float8_e4m3fn)
    b = torch.ones(1, K_STEP).to(torch.float8_e4m3fn)
    mm, ours = mmaemu_chain(a, b, c), ours_chain(a, b, c)
    return [{"experiment": "C in [2^-149, 2^-126], all 32 products zero", "k": K_STEP, "outputs": c.numel(),
             "mmaemu_h200": None, "ours_h200": None, "mmaemu_ours": same_bits(mm, ours),
             "note": f"ours NaN on {int(torch.isnan(ours).sum())}, mmaemu +0 on {int((mm == 0).sum())}"}]


def nan_operand_rows(m: int, seed: int) -> list[dict]:
    """One e4m3fn NaN code (0x7F) in every row of a: both give NaN; mmaemu's is the canonical 0x7FFFFFFF."""
    g = torch.Generator().manual_seed(seed + 2)
    a, b = e4m3(torch.randn(m, K_STEP, generator=g) * 4), e4m3(torch.randn(m, K_STEP, generator=g) * 4)
    a = a.view(torch.uint8).clone()
    a[:, 5] = 0x7F
    a = a.view(torch.float8_e4m3fn)
    mm, ours = mmaemu_chain(a, b, None), ours_chain(a, b, None)
    payloads = sorted({f"0x{v & 0xFFFFFFFF:08X}" for v in ours.view(torch.int32).flatten().tolist()})
    return [{"experiment": "a NaN operand in every row", "k": K_STEP, "outputs": m * m, "mmaemu_h200": None,
             "ours_h200": None, "mmaemu_ours": same_bits(mm, ours),
             "note": f"both NaN: {bool(torch.isnan(mm).all() and torch.isnan(ours).all())}; mmaemu "
                     f"0x{int(mm.view(torch.int32)[0, 0]) & 0xFFFFFFFF:08X}, ours {', '.join(payloads)}"}]


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.2f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=64, help="rows (= columns) of the random experiments (default 64)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.m < 1:
        ap.error("--m must be positive")
    mmaemu, _ = _mmaemu()
    torch.set_num_threads(1)
    print(f"# mmaemu {mmaemu.__version__}, torch {torch.__version__}, --m {args.m} --seed {args.seed}")
    print("| experiment | K | outputs | mmaemu = H200 | ours = H200 | mmaemu = ours | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    rows = (fixture_rows() + random_rows(args.m, args.seed) + gemm_rows(args.m, args.seed) + tiny_accumulator_rows()
            + nan_operand_rows(args.m, args.seed))
    for r in rows:
        print(f"| {r['experiment']} | {r['k']} | {r['outputs']} | {_pct(r['mmaemu_h200'])} | {_pct(r['ours_h200'])} "
              f"| {_pct(r['mmaemu_ours'])} | {r.get('note', '')} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
