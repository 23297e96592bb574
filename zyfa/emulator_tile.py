"""One KV tile of the emulation, step by step in the order of the kernel's ``_softmax_pv_tile``
(zyfa/kernels/_triton_fp8.py): scores (:func:`qk_tile`), the online max (:func:`online_max`), P's scale exponent
(:func:`p_exponent`), P rounded to its format (:func:`p_fp8`), the row sum (:func:`tile_row_sum`) and O += P·V
(:func:`pv_update`), with the arithmetic they share: the platform's matrix unit (:func:`mma`, :func:`gemm`), P's
rounding and Schraudolph's exp2. Each step is the recipe's arithmetic for every kernel the emulator models, not only
ours; :func:`zyfa.emulator.emulate` runs them over the query chunks and KV tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from zyfa.formats import e4m3fn_bits_from_log2, get_format, round_to_bf16, round_to_fp8_fast
from zyfa.platforms import stepwise_mma, truncating_mma
from zyfa.recipes import FP8_FORMATS, Recipe

__all__ = [
    "E4M3FN_MIN_EXP",
    "FP8_FORMATS",
    "SCHRAUDOLPH_BIAS",
    "TILE_AMAX_FLOOR",
    "WGMMA_K_FP8",
    "Tiling",
    "block_max",
    "decode_e4m3fn_fast",
    "exp2_bittrick",
    "gemm",
    "min_exp",
    "mma",
    "online_max",
    "p_exponent",
    "p_fp8",
    "pv_update",
    "qk_tile",
    "round_p",
    "row_blocks_seeing",
    "tile_row_sum",
    "zero_if_neginf",
]

# Hopper's FP8 wgmma consumes k = 32 per instruction; the accumulator model truncates after each step. The default of
# the step helpers only: emulate() takes the k step from its platform (zyfa.platforms.Platform.k_step).
WGMMA_K_FP8 = 32
# Tile-amax floor of AITER's Triton kernel (https://github.com/ROCm/aiter,
# aiter/ops/triton/_triton_kernels/attention/mha.py: max(|P|) >= 1e-9).
TILE_AMAX_FLOOR = 1e-9
# Schraudolph constant of CK unified attention / AITER hd256: 127*2^23 - 486411 (ROCm/composable_kernel
# include/ck_tile/ops/unified_attention/, UA_FA4_EXP2_APPROX; ROCm/aiter hsa/gfx950/fmha_v3_fwd/fwd_hd256_fp8.co).
SCHRAUDOLPH_BIAS = 127 * 2**23 - 486411


def min_exp(fmt: str) -> int:
    """The smallest normal exponent of an operand format: a subnormal operand of that format counts at it in
    Hopper's accumulator model (:func:`zyfa.platforms.truncating_mma`). FP8 formats from their table
    (e4m3fn -6, e4m3fnuz -7, e5m2 -14); bf16 and fp32 share float32's exponent range (-126)."""
    if fmt in FP8_FORMATS:
        return get_format(fmt).emin
    if fmt in ("bf16", "fp32"):  # tiny: the smallest normal, 2^-126
        return math.frexp(torch.finfo(torch.bfloat16 if fmt == "bf16" else torch.float32).tiny)[1] - 1
    raise ValueError(f"no accumulator operand exponent for format {fmt!r}")


# both operands e4m3fn: the default where a caller names no formats (as zyfa.platforms' own default)
E4M3FN_MIN_EXP = (min_exp("e4m3fn"), min_exp("e4m3fn"))


def mma(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor | None, hopper_bits: int | None, *,
        min_exp: tuple[int, int] | None = None, k_step: int = WGMMA_K_FP8) -> torch.Tensor:
    """acc + a @ b; ``hopper_bits`` models Hopper's FP8 wgmma accumulator (None: true fp32).

    The model is :func:`zyfa.platforms.truncating_mma` with k = 32 steps (fitted on the H200 through Triton's
    FP8 ``tl.dot``; docs/PLATFORMS.md): at each step the 32 products (each counted at the sum of its operands'
    exponents) and the incoming accumulator are aligned to the largest exponent among them, truncated toward
    zero to ``hopper_bits`` bits below it and summed exactly; the sum is truncated to ``hopper_bits`` bits below
    its own leading bit. It reproduces 100% of the H200's outputs on every recorded experiment, positive and
    signed operands (tests/zyfa/test_wgmma_h200_sample.py). ``min_exp``: (a's, b's) smallest normal exponent,
    the exponent a subnormal operand counts at (:func:`min_exp` of each operand's format; None: both e4m3fn).
    """
    if hopper_bits is None:
        out = a @ b
        return out if acc is None else acc + out
    return truncating_mma(a, b, acc, hopper_bits, k_step, min_exp=min_exp or E4M3FN_MIN_EXP)


def gemm(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor | None, bits: int | None, in_unit: bool, *,
         min_exp: tuple[int, int] | None = None, k_step: int = WGMMA_K_FP8):
    """acc + a @ b on the platform: fp32 (``bits`` None); the chain kept in the truncating accumulator
    (``in_unit``); or each k step flushed into fp32 (a kernel keeping a true fp32 sum on that platform).
    ``min_exp`` as in :func:`mma`."""
    if bits is None or in_unit:
        return mma(a, b, acc, bits, min_exp=min_exp, k_step=k_step)
    out = stepwise_mma(a, b, bits, k_step, min_exp=min_exp or E4M3FN_MIN_EXP)
    return out if acc is None else acc + out


def decode_e4m3fn_fast(bits: torch.Tensor) -> torch.Tensor:
    """e4m3fn codes -> float32 through torch's native dtype; bit-identical to :func:`zyfa.formats.decode_fp8`."""
    return bits.view(torch.float8_e4m3fn).float()


def row_blocks_seeing(r0: int, rows: int, block_m: int, s_q: int, s_k: int, c0: int, c1: int,
                      window: int | None) -> tuple[int, int] | None:
    """Rows ``[a, z)`` of the query chunk ``r0 .. r0 + rows - 1`` (blocks of ``block_m`` rows, one kernel program
    each) from the first to the last block that sees a key of the tile ``[c0, c1)`` under the causal
    (bottom-right: row r is at position r + s_k - s_q) mask and the window, or None when no block does. On the host:
    what reading the mask's nonzero blocks back from the device gave, without the wait.

    Rows at or past ``s_q`` (padding) see nothing. A row at position p sees a key of the tile iff c0 <= p (causal)
    and p <= c1 + window - 2 (some key j < c1 with j > p - window)."""
    off = s_k - s_q
    first = last = None
    for j in range(rows // block_m):
        ra = r0 + j * block_m
        if ra >= s_q:
            break
        pa, pb = ra + off, min(ra + block_m, s_q) - 1 + off
        top = pb if window is None else min(pb, c1 + window - 2)
        if max(pa, c0) <= top:
            first = j if first is None else first
            last = j
    return None if first is None else (first * block_m, (last + 1) * block_m)


def round_p(p_scaled: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """P (already scaled) rounded to the recipe's P format, saturating like the hardware casts."""
    if recipe.p_format == "fp32":
        return p_scaled
    if recipe.p_format == "bf16":
        return round_to_bf16(p_scaled)
    return round_to_fp8_fast(p_scaled, recipe.p_format)


def exp2_bittrick(t: torch.Tensor) -> torch.Tensor:
    """fp32 Schraudolph exp2: bits = u32(2^23·t + 127·2^23 − 486411), truncating, negatives -> 0."""
    y = t * float(2**23) + float(SCHRAUDOLPH_BIAS)
    bits = torch.where(torch.isfinite(y), y, torch.zeros_like(y)).clamp(min=0).to(torch.int64)
    return bits.to(torch.int32).view(torch.float32)


def block_max(x: torch.Tensor, block_m: int) -> torch.Tensor:
    """Max over rows of each block of ``block_m`` query rows (x: (..., rows, 1) with rows % block_m == 0)."""
    shape = x.shape
    blocks = x.reshape(*shape[:-2], shape[-2] // block_m, block_m, 1).amax(dim=-2, keepdim=True)
    return blocks.expand(*shape[:-2], shape[-2] // block_m, block_m, 1).reshape(shape)


def zero_if_neginf(m: torch.Tensor) -> torch.Tensor:
    """Row max with -inf (rows with nothing unmasked yet) replaced by 0, as kernels do before exp2."""
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


# ---------------------------------------------------------------------------------------------- tile steps
# One KV tile, step by step in the order of the kernel's _softmax_pv_tile (zyfa/kernels/_triton_fp8.py): scores
# (qk_tile), online max, P exponent, P rounded to its format, row sum, O += P·V. Each step is the recipe's
# arithmetic for every platform and kernel the emulator models, not only our Triton kernel's.

@dataclass(frozen=True)
class Tiling:
    """What every tile of one :func:`emulate` call shares: the recipe, its P scale constants, the score
    scale, the tiles, and the platform's accumulation (kept bits and operand exponents of Q·K and P·V; None bits:
    fp32)."""

    recipe: Recipe
    dev: torch.device
    fmax: float
    log2_fmax: float
    score_scale: torch.Tensor
    to_log2: object
    block_m: int
    block_n: int
    k_step: int
    in_unit: bool
    qk_bits: int | None
    qk_min: tuple[int, int] | None
    pv_bits: int | None
    pv_min: tuple[int, int] | None
    ones_min: tuple[int, int] | None
    two_level: bool
    tile_factor_needed: bool


def qk_tile(tg: Tiling, q_rows: torch.Tensor, k8t_tile: torch.Tensor, qd_rows: torch.Tensor,
            kd_tile: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Scores of one tile: Q·K as raw FP8 products in fp32, or through the platform's accumulator (a d/32-step
    chain from zero per tile in the unit, or each step flushed into fp32); scaled by c = (sm_scale·log2e·qd)·kd in
    that order; masked to -inf."""
    s_raw = gemm(q_rows, k8t_tile, None, tg.qk_bits, tg.in_unit, min_exp=tg.qk_min, k_step=tg.k_step)
    x = s_raw * ((tg.score_scale * qd_rows) * kd_tile)
    return x.masked_fill(~allowed, -math.inf)


def online_max(tg: Tiling, m: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The running row max after this tile, the rescale α of the running sums (0 where m was -inf) and
    t = c·S − m ≤ 0, the log2 probability (-inf where masked)."""
    m_new = torch.maximum(m, x.amax(dim=-1, keepdim=True))
    m_use = zero_if_neginf(m_new)
    alpha = torch.exp2(tg.to_log2(m - m_use))  # m = -inf -> 0
    t = tg.to_log2(x - m_use)  # log2 probability, <= 0; -inf where masked
    return m_new, alpha, t


def p_exponent(tg: Tiling, t: torch.Tensor, e_run: torch.Tensor, alpha: torch.Tensor):
    """P's scale exponent (``pow2``: fixed; ``pow2_block``: per row or tile from the block max, capped) and the
    matching rescale of the running sums: (e_new or None, e_run, alpha)."""
    recipe = tg.recipe
    if recipe.p_scale in ("pow2", "pow2_block"):
        if recipe.p_scale == "pow2":
            e_new = torch.full_like(e_run, float(recipe.p_scale_log2))
        else:
            t_max = t.amax(dim=-1, keepdim=True)
            if recipe.p_scale_granularity == "tile":
                t_max = block_max(t_max, tg.block_m)
            e_new = torch.floor(tg.log2_fmax - t_max).clamp(max=recipe.p_block_max_log2)
            e_new = torch.where(torch.isneginf(t_max), e_run, e_new)
        alpha = alpha * torch.exp2(e_new - e_run)
        e_run = e_new
    else:
        e_new = None
    return e_new, e_run, alpha


def p_fp8(tg: Tiling, t: torch.Tensor, e_new: torch.Tensor | None, e_run: torch.Tensor):
    """The probabilities, scaled and rounded to the P format (MAD codes, or exp2 / Schraudolph then a cast):
    (p8, the source of an fp32 row sum or None, the per-tile unscale of ``tile_amax`` or None)."""
    recipe = tg.recipe
    if recipe.exp_method == "mad_fp8":
        t_s = t + e_run if e_new is not None else t
        p8 = decode_e4m3fn_fast(e4m3fn_bits_from_log2(t_s, offset=recipe.mad_offset,
                                                      rounding=recipe.mad_rounding))
        p_sum_src = torch.exp2(t_s) if recipe.rowsum == "fp32" else None
        unscale = None
    else:
        p = torch.exp2(t) if recipe.exp_method == "exp2" else exp2_bittrick(t)
        unscale = None
        if e_new is not None:
            p_scaled = p * torch.exp2(e_run)  # exact power of two (exp2(t + e) in FA3)
        elif recipe.p_scale == "fmax":
            p_scaled = p * tg.fmax
        elif recipe.p_scale == "tile_amax":
            amax = block_max(p.amax(dim=-1, keepdim=True), tg.block_m).clamp(min=TILE_AMAX_FLOOR)
            p_scaled = p * (tg.fmax / amax)
            unscale = amax / tg.fmax
        else:
            p_scaled = p
        p8 = round_p(p_scaled, recipe)
        # Row sums from unscaled fp32 P (CK: l counts pre-rounding, pre-448 P); pow2: scaled units.
        p_sum_src = (p_scaled if e_new is not None else p) if recipe.rowsum == "fp32" else None
    return p8, p_sum_src, unscale


def tile_row_sum(tg: Tiling, p8: torch.Tensor, p_sum_src: torch.Tensor | None) -> torch.Tensor:
    """What this tile adds to l: the fp32 sum of the unrounded P, or of the rounded P (technique 3), or that sum
    on the matrix unit as P8·ones from a fresh accumulator (``rounded_mma``)."""
    recipe = tg.recipe
    if recipe.rowsum in ("rounded", "rounded_mma"):
        if recipe.rowsum == "rounded_mma":  # P8 · ones on the matrix unit, fresh every tile
            ones = torch.ones((p8.shape[-1], 1), dtype=torch.float32, device=tg.dev)
            row_sum = gemm(p8, ones, None, tg.pv_bits, tg.in_unit, min_exp=tg.ones_min, k_step=tg.k_step)
        else:
            row_sum = p8.sum(dim=-1, keepdim=True)
        if recipe.p_scale == "fmax":
            row_sum = row_sum / tg.fmax
    else:
        row_sum = p_sum_src.sum(dim=-1, keepdim=True)
    return row_sum


def pv_update(tg: Tiling, p8: torch.Tensor, v_tile: torch.Tensor, vd: torch.Tensor, acc: torch.Tensor,
              acc_tc: torch.Tensor | None, alpha: torch.Tensor, unscale: torch.Tensor | None, c0: int):
    """O += P·V: into the tensor-core accumulator (flushed into fp32 every ``accum_flush_tiles`` tiles), or scaled
    per tile and added to the fp32 accumulator, or chained into it: (acc, acc_tc)."""
    recipe = tg.recipe
    acc = acc * alpha
    if tg.tile_factor_needed:
        pv = gemm(p8, v_tile, None, tg.pv_bits, tg.in_unit, min_exp=tg.pv_min, k_step=tg.k_step)
        if unscale is not None:
            pv = pv * unscale
        if recipe.v_descale == "tile":
            pv = pv * (vd[..., c0:c0 + 1, :] if vd.shape[2] > 1 else vd)  # one block per tile
        acc = acc + pv
    elif tg.two_level:
        acc_tc = mma(p8, v_tile, acc_tc * alpha, tg.pv_bits, min_exp=tg.pv_min, k_step=tg.k_step)
        # every N tiles counted from key 0, as the kernel does (start_n // BLOCK_N), not from the first
        # tile this chunk sees: otherwise a window's result would depend on q_chunk
        if recipe.accum_flush_tiles and (c0 // tg.block_n + 1) % recipe.accum_flush_tiles == 0:
            acc, acc_tc = acc + acc_tc, torch.zeros_like(acc_tc)
    else:
        acc = gemm(p8, v_tile, acc, tg.pv_bits, tg.in_unit, min_exp=tg.pv_min, k_step=tg.k_step)
    return acc, acc_tc
