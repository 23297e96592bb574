"""Platforms: a GPU's own arithmetic, as the emulator models it (docs/PLATFORMS.md).

A recipe (:mod:`zyfa.recipes`) is a kernel's algorithm; a :class:`Platform` is the GPU that runs it: how its
matrix units accumulate the products of the two matrix multiplications of attention (Q·K and P·V) for FP8 and
for BF16 operands, and which conversions it has. Every recipe names a default platform (``Recipe.platform``:
AMD peers and ZYFA the ``mi355x``, NVIDIA peers the ``h200``); any recipe can be emulated on either.

The only reduced-precision accumulation modelled is Hopper's FP8 wgmma (:func:`truncating_mma`), fitted bit-exactly
on the H200 (every recorded output, signed and positive operands, chains and flushed steps). Where a platform's
arithmetic is not known, the platform says so and the emulator takes true fp32 accumulation of exact products.

Exposed: :class:`Platform`, :data:`PLATFORMS`, :data:`PLATFORM_NAMES`, :func:`get_platform`,
:func:`truncating_mma`, :func:`stepwise_mma`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported inside the arithmetic below, not here: the platform table is read by zyfa.recipes, which the
# CLIs use to check their arguments before any heavy import (importing torch costs 1.5 s on a warm cache, 8-14 s
# on a cold one; scripts/bench_refusal_time.py).

# Accumulation models of a matrix unit: "fp32" (exact products, fp32 sums: the emulator's matmul) or
# "align_truncate" (truncating_mma: each k step aligned to its largest exponent, truncated, the sum truncated).
ACCUMULATIONS = ("fp32", "align_truncate")


@dataclass(frozen=True)
class Platform:
    """One GPU's arithmetic, as far as it decides an attention kernel's numerics.

    Attributes:
        name: registry name (``h200``, ``mi355x``).
        gpu: the GPU and its architecture, in words.
        fp8_qk, fp8_pv: accumulation of FP8 operands in Q·K and in P·V, one of :data:`ACCUMULATIONS`.
        bf16_qk, bf16_pv: the same for BF16 operands.
        k_step: products the matrix unit sums per instruction step for FP8 operands (the model's unit; the
            emulator's truncating steps take it from here).
        accum_bits: mantissa bits kept below the largest term at each step (``align_truncate`` only, where it is
            required; None where nothing truncates). The emulator's truncating steps take it from here, the only
            place it is set (a recipe cannot override it: it describes the hardware).
        conversions: the conversions kernels use on it (float to bf16, float to FP8, ...), in words.
        status: ``modelled`` (fitted by measurement) or ``assumed`` (not known: fp32 accumulation taken).
        sources: where each statement comes from.
        unknown: what is not known and is assumed.
    """

    name: str
    gpu: str
    fp8_qk: str
    fp8_pv: str
    bf16_qk: str
    bf16_pv: str
    k_step: int
    accum_bits: int | None
    conversions: tuple[str, ...]
    status: str
    sources: str
    unknown: str

    def __post_init__(self) -> None:
        for f in ("fp8_qk", "fp8_pv", "bf16_qk", "bf16_pv"):
            if getattr(self, f) not in ACCUMULATIONS:
                raise ValueError(f"platform {self.name!r}: {f}={getattr(self, f)!r} is not one of {ACCUMULATIONS}")
        truncating = any(getattr(self, f) == "align_truncate" for f in ("fp8_qk", "fp8_pv", "bf16_qk", "bf16_pv"))
        bits = self.accum_bits
        if truncating and (isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 23):
            raise ValueError(f"platform {self.name!r}: an align_truncate accumulator needs accum_bits an int in "
                             f"[1, 23], got {bits!r}")

    def truncates(self, gemm: str, fp8: bool) -> bool:
        """Whether ``gemm`` ("qk" or "pv") with FP8 (else BF16) operands accumulates with truncation here."""
        if gemm not in ("qk", "pv"):
            raise ValueError(f"gemm must be 'qk' or 'pv', got {gemm!r}")
        model = getattr(self, f"{'fp8' if fp8 else 'bf16'}_{gemm}")
        return model == "align_truncate"


H200 = Platform(
    name="h200",
    gpu="NVIDIA H200 (Hopper, sm_90a): FP8 and BF16 wgmma into fp32 registers",
    fp8_qk="align_truncate", fp8_pv="align_truncate", bf16_qk="fp32", bf16_pv="fp32",
    k_step=32, accum_bits=13,
    conversions=("fp32 -> bf16 round to nearest even (cvt.rn.bf16x2.f32)",
                 "fp32 -> e4m3fn round to nearest even, saturating (cvt.rn.satfinite.e4m3x2.f32)",
                 "fp32 -> integer round to nearest even or toward zero (cvt.rni / cvt.rzi)"),
    status="modelled",
    sources=("FP8 wgmma accumulation fitted on this project's H200 through Triton 3.6's FP8 tl.dot "
             "(scripts/record_wgmma_accumulation.py records operands and results, scripts/fit_wgmma_accumulation.py "
             "tests candidate rules; docs/PLATFORMS.md): at each k = 32 step every non-zero product counts at the "
             "sum of its operands' exponents (a subnormal at its format's smallest normal exponent: e4m3fn -6, "
             "e5m2 -14) and the incoming accumulator at its own; the "
             "products and the accumulator are truncated toward zero 13 bits below the largest of these, summed "
             "exactly, and the sum truncated toward zero to 13 bits below its own leading bit. It reproduces 100% "
             "of 65,536 outputs per experiment in 29 experiments (e4m3fn, e5m2 and mixed operands; 2 to 32 non-zero "
             "products per step, Gaussian "
             "and every-finite-value operands, an incoming accumulator of similar or very different magnitude, "
             "chains of 2 to 32 steps, per-step flush, K outliers); the rule before this fit (products at their "
             "own exponent, no truncation of the sum) reproduced 25.0-99.8% of signed outputs. Published: "
             "SageAttention2 (arXiv 2411.10958, FP22 accumulator), DeepSeek-V3 (arXiv 2412.19437, about 14 bits); "
             "Fasi et al. 2021 (tensor-core accumulation without rounding). Q.K uses the same wgmma, so the same "
             "model"),
    unknown=("e4m3fnuz operands are not measured (taken to count at their smallest normal exponent, -7, as "
             "e4m3fn and e5m2 were measured to); only Triton 3.6's wgmma m64n64k32 on one H200 was recorded; BF16 "
             "wgmma accumulation is not measured here and is taken as fp32"))

MI355X = Platform(
    name="mi355x",
    gpu="AMD Instinct MI355X (CDNA4, gfx950): FP8 and BF16 MFMA into fp32 registers",
    fp8_qk="fp32", fp8_pv="fp32", bf16_qk="fp32", bf16_pv="fp32",
    k_step=64, accum_bits=None,
    conversions=("fp32 -> bf16 round to nearest even (v_cvt_pk_bf16_f32; CK's gfx950 branch, docs/PLATFORMS.md)",
                 "fp32 -> e4m3fn (OCP) round to nearest even, saturating (v_cvt_pk_fp8_f32)"),
    status="assumed",
    sources=("AMD ROCm blog 'Matrix Core Programming on AMD CDNA3 and CDNA4 architecture' "
             "(https://rocm.blogs.amd.com/software-tools-optimization/matrix-cores-cdna/README.html): MFMA computes "
             "D = A*B + C with the output matrix held in FP32, FP8 (OCP e4m3/e5m2) operands on CDNA4, instruction "
             "shapes up to 32x32x64 and 16x16x128 for FP8; AITER's gfx950 FP8 attention uses the 32x32x64 FP8 "
             "MFMA (disassembly, docs/DESIGN.md)"),
    unknown=("how an MFMA sums its k products inside one instruction (order, width, rounding) is not published "
             "and was not measured (no MI355X here): exact products summed in fp32 are assumed, for FP8 and BF16, "
             "in Q.K and P.V"),
)

PLATFORMS: dict[str, Platform] = {p.name: p for p in (H200, MI355X)}
PLATFORM_NAMES: tuple[str, ...] = tuple(PLATFORMS)


def get_platform(name: str | Platform) -> Platform:
    """The named platform; a :class:`Platform` passes through. ValueError (one line) lists the known names."""
    if isinstance(name, Platform):
        return name
    try:
        return PLATFORMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown platform {name!r}; known platforms: {', '.join(PLATFORMS)}") from None


# exponent of fp32's smallest subnormal, 2^-149: the finest quantum an fp32 sum can have
FP32_MIN_EXP = -149


def _alignment_exponents(x: torch.Tensor, min_exp: int) -> torch.Tensor:
    """2^e for every operand, e = its exponent as the matrix unit sees it: floor(log2|x|) for a normal value,
    ``min_exp`` for a subnormal one (the format's smallest normal exponent), 0 where x is zero."""
    import torch

    e = torch.frexp(x)[1].sub_(1).clamp_(min=min_exp)
    return torch.where(x == 0, torch.zeros_like(x), torch.ldexp(torch.ones_like(x), e))


def truncating_mma(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor | None, bits: int,
                   k_step: int = 32, *, min_exp: int | tuple[int, int] = -6) -> torch.Tensor:
    """acc + a @ b through an accumulator that truncates: Hopper's FP8 wgmma as fitted bit-exactly on the H200
    (docs/PLATFORMS.md, scripts/fit_wgmma_accumulation.py).

    At each step of ``k_step`` products along k:

    1. every non-zero product a_i·b_i is given the exponent ea_i + eb_i, the sum of its operands' exponents
       (before the product of the two significands, in [1, 4), is normalised; a subnormal operand counts
       ``min_exp``, -6 for e4m3fn); the incoming accumulator (none at the first step when ``acc`` is None)
       its own exponent; E is the largest of these;
    2. every product and the accumulator are truncated toward zero to a multiple of 2^(E - ``bits``) and summed
       exactly;
    3. the sum is truncated toward zero to ``bits`` bits below its own leading bit (it changes only when the
       sum carried above 2^(E+1)).

    The chain runs over all of k: the accumulator is never flushed inside one call. Every intermediate is
    exact in fp32, so it computes in fp32. ``a``: (..., m, k), ``b``: (..., k, n), ``acc``: (..., m, n) or
    None; ``a`` and ``b`` hold FP8 values: ``min_exp`` is the smallest normal exponent of their format, one for
    both or (a's, b's): -6 for e4m3fn, -14 for e5m2 (both fitted on the H200, e4m3fn x e5m2 included).
    """
    import torch

    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out = torch.empty((*lead, m, n), dtype=torch.float32, device=a.device)
    bt = b.transpose(-1, -2)
    min_a, min_b = (min_exp, min_exp) if isinstance(min_exp, int) else min_exp
    a2, bt2 = _alignment_exponents(a, min_a), _alignment_exponents(bt, min_b)
    # rows per pass: bound the (rows, n, k_step) product tensor to ~2^20 elements on a CPU (cache-sized: 2.7x
    # faster than 2^24), 2^26 on a GPU (fewer launches)
    budget = 1 << (20 if a.device.type == "cpu" else 26)
    step_rows = max(1, budget // max(1, n * k_step * math.prod(lead)))
    for r0 in range(0, m, step_rows):
        r1 = min(m, r0 + step_rows)
        c = None if acc is None else acc[..., r0:r1, :]
        for k0 in range(0, k, k_step):
            prod = a[..., r0:r1, None, k0:k0 + k_step] * bt[..., None, :, k0:k0 + k_step]
            # 2^E: products of powers of two are exact; zero operands give 0 and so never set E
            mx = (a2[..., r0:r1, None, k0:k0 + k_step] * bt2[..., None, :, k0:k0 + k_step]).amax(-1)
            if c is not None:
                mx = torch.maximum(mx, c.abs())  # floor(log2) of the max is the max of the exponents
            # quantum = 2^(floor(log2 mx) - bits); frexp gives mx = f·2^e with f in [0.5, 1)
            # (at least 2^-149, fp32's smallest step: every fp32 value is a multiple of it, so a tiny accumulator
            # over zero products passes unchanged instead of dividing by an underflowed 0)
            quantum = torch.ldexp(torch.ones_like(mx), (torch.frexp(mx)[1] - (1 + bits)).clamp_(min=FP32_MIN_EXP))
            # x / quantum is exact (a power of two): one fused divide-and-truncate pass
            total = torch.div(prod, quantum[..., None], rounding_mode="trunc").sum(-1).mul_(quantum)
            if c is not None:
                total = total + torch.div(c, quantum, rounding_mode="trunc") * quantum
            # step 3: quantum 2^(floor(log2 |total|) - bits); below 2^(E+1) total is already a multiple of it
            q_sum = torch.ldexp(torch.ones_like(total), (torch.frexp(total)[1] - (1 + bits)).clamp_(min=FP32_MIN_EXP))
            c = torch.div(total, q_sum, rounding_mode="trunc").mul_(q_sum)
        if c is None:  # k == 0
            c = torch.zeros((*lead, r1 - r0, n), dtype=torch.float32, device=a.device)
        out[..., r0:r1, :] = c
    return out


def stepwise_mma(a: torch.Tensor, b: torch.Tensor, bits: int, k_step: int = 32, *,
                 min_exp: int | tuple[int, int] = -6) -> torch.Tensor:
    """a @ b with the truncating accumulator flushed into fp32 after every k step: each step of ``k_step``
    products starts from zero (:func:`truncating_mma` without an incoming accumulator) and the step results
    are added in fp32, in k order. This is what a kernel that keeps a true fp32 sum does on Hopper (our Triton
    kernel's ``accumulator="fp32"`` mode: QK_K32 and PV_MODE 1)."""
    import torch

    out = None
    for k0 in range(0, a.shape[-1], k_step):
        part = truncating_mma(a[..., k0:k0 + k_step], b[..., k0:k0 + k_step, :], None, bits, k_step,
                              min_exp=min_exp)
        out = part if out is None else out + part
    if out is None:
        lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        out = torch.zeros((*lead, a.shape[-2], b.shape[-1]), dtype=torch.float32, device=a.device)
    return out
