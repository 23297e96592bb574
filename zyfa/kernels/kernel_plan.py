"""A recipe as the Triton FP8 kernel's constexpr switches (:class:`KernelPlan`), and the bounds on the MAD codes.

:func:`kernel_plan` maps a recipe onto the kernel's switches. Recipe fields the kernel honours (others are refused
with ``ValueError`` naming field and value):
``q/k/v_format`` e4m3fn; ``q_scale/k_scale`` tensor, head, head_kv, block (``scale_block_q`` any,
``scale_block_kv`` a multiple of ``block_n``); ``v_scale`` tensor, head, head_kv, channel, block (with
``v_descale`` tile); ``k_smoothing`` and ``qk_rotation`` (both in the quantizer); ``block_n`` 64 or 128
(``block_m`` too when the P exponent is per tile); ``log2e_folded`` True; ``exp_method`` exp2 or mad_fp8
(``mad_offset``, ``mad_rounding``); ``p_format`` e4m3fn; ``p_scale`` none, fmax (exp2 only), pow2, pow2_block
(``p_scale_granularity`` row/tile, ``p_block_max_log2``); ``rowsum`` fp32/rounded; ``v_descale`` end (tile with
per-block V); ``accumulator`` fp32 (Triton's partial accumulator flushed into fp32 every k=32 step: the closest Triton
gets to true fp32 on Hopper) or matrix_unit with ``accum_flush_tiles`` 0 (never), 1 or N; ``reciprocal``
div/rcp; ``out_format`` bf16_rne, bf16_trunc, fp32. The accumulator's kept bits describe the hardware
(``Platform.accum_bits``) and are not a kernel choice.

The MAD bounds decide where the kernel may leave out the clamp at code 126 (:func:`mad_code_bound`,
:func:`mad_codes_bounded`, :func:`mad_m_safe`) and which conversion a launch uses (:func:`default_mad_cvt`);
docs/KERNEL.md, "Technique 1 and the rounding boundary", derives them. Nothing here imports Triton.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from zyfa.recipe_spec import get_recipe, triton_kernel_recipe
from zyfa.recipes import Recipe

__all__ = [
    "FP8_MAX_SQ",
    "LOG2E",
    "LOG2_448",
    "MAD_FUSED_DRIFT",
    "MAD_FUSED_DRIFT0",
    "KernelPlan",
    "default_mad_cvt",
    "fused_mad_is_exact",
    "kernel_plan",
    "kernel_recipe",
    "mad_code_bound",
    "mad_codes_bounded",
    "mad_cvt_for_descales",
    "mad_m_safe",
    "recipe_from_spec",
]

LOG2E = 1.4426950408889634
LOG2_448 = math.log2(448.0)
# 448²: |q·k| <= d·448² for e4m3fn operands, so every row max of s·c is at most d·448²·c in magnitude (the bound a
# program checks against mad_m_safe before it leaves out the clamp at code 126)
FP8_MAX_SQ = 448.0 * 448.0


@dataclass(frozen=True)
class KernelPlan:
    """The kernel's constexpr switches for one recipe (see :func:`kernel_plan`)."""

    recipe: str
    block_n: int
    block_m: int | None  # fixed by the recipe (tile-granular P exponent), else chosen by the config
    exp_mad: bool
    mad_bias: float
    mad_rounding: str
    p_scale: int  # 0 none, 1 fmax, 2 pow2, 3 pow2_block
    e_fixed: float
    tile_gran: bool
    e_cap: float
    rowsum_rounded: int  # 0 fp32 sum of unrounded P, 1 fp32 sum of the rounded P, 2 rounded P summed as P8·1
    qk_k32: bool
    pv_mode: int  # 0 chain, 1 k32 flush, 2/4 per-tile flush (Triton partial acc / explicit add), 3 every N
    flush: int
    rcp: bool
    out_mode: int  # 0 bf16 rne, 1 bf16 trunc, 2 fp32
    vd_mode: int = 0  # V descale: 0 per (batch, kv head), 1 per channel (applied at the end), 2 per KV tile
    notes: tuple[str, ...] = field(default=())


def _refuse(recipe: Recipe, fld: str, value, allowed) -> ValueError:
    return ValueError(f"recipe {recipe.name!r}: the Triton FP8 kernel does not support {fld}={value!r} "
                      f"(supported: {allowed})")


def kernel_plan(recipe: Recipe | str) -> KernelPlan:
    """Map a recipe onto the kernel's switches; ValueError names any field the kernel cannot honour."""
    r = get_recipe(recipe)
    for fld in ("q_format", "k_format", "v_format", "p_format"):
        if getattr(r, fld) != "e4m3fn":
            raise _refuse(r, fld, getattr(r, fld), "'e4m3fn'")
    for fld in ("q_scale", "k_scale"):
        if getattr(r, fld) not in ("tensor", "head", "head_kv", "block"):
            raise _refuse(r, fld, getattr(r, fld), "'tensor', 'head', 'head_kv', 'block'")
    if r.v_scale not in ("tensor", "head", "head_kv", "block", "channel"):
        raise _refuse(r, "v_scale", r.v_scale, "'tensor', 'head', 'head_kv', 'block', 'channel'")
    if r.block_n not in (64, 128):
        raise _refuse(r, "block_n", r.block_n, "64, 128")
    if "block" in (r.k_scale, r.v_scale) and r.scale_block_kv % r.block_n:
        raise _refuse(r, "scale_block_kv", r.scale_block_kv,
                      f"a multiple of block_n={r.block_n} with k_scale or v_scale='block': one descale per KV tile")
    if not r.log2e_folded:
        raise _refuse(r, "log2e_folded", r.log2e_folded, "True")
    if r.exp_method not in ("exp2", "mad_fp8"):
        raise _refuse(r, "exp_method", r.exp_method, "'exp2', 'mad_fp8'")
    p_scales = {"none": 0, "fmax": 1, "pow2": 2, "pow2_block": 3}
    if r.p_scale not in p_scales:
        raise _refuse(r, "p_scale", r.p_scale, ", ".join(map(repr, p_scales)))
    if r.exp_method == "mad_fp8" and r.p_scale == "fmax":
        raise _refuse(r, "p_scale", r.p_scale, "'none', 'pow2', 'pow2_block' with exp_method='mad_fp8'")
    tile_gran = r.p_scale == "pow2_block" and r.p_scale_granularity == "tile"
    if tile_gran and r.block_m not in (64, 128):
        raise _refuse(r, "block_m", r.block_m, "64, 128 with a per-tile P exponent")
    if r.v_descale != ("tile" if r.v_scale == "block" else "end"):
        raise _refuse(r, "v_descale", r.v_descale, "'end', or 'tile' with v_scale='block'")
    if r.reciprocal not in ("div", "rcp"):
        raise _refuse(r, "reciprocal", r.reciprocal, "'div', 'rcp'")
    out_modes = {"bf16_rne": 0, "bf16_trunc": 1, "fp32": 2}
    if r.out_format not in out_modes:
        raise _refuse(r, "out_format", r.out_format, ", ".join(map(repr, out_modes)))
    if r.accumulator == "fp32":
        qk_k32, pv_mode, flush = True, 1, 0
    elif r.accumulator == "matrix_unit":
        n = int(r.accum_flush_tiles)
        if n < 0:
            raise _refuse(r, "accum_flush_tiles", n, ">= 0")
        qk_k32, pv_mode, flush = False, (0 if n == 0 else 4 if n == 1 else 3), n
    else:
        raise _refuse(r, "accumulator", r.accumulator, "'fp32', 'matrix_unit'")
    mad_bias = 56.0 + float(r.mad_offset)
    if r.exp_method == "mad_fp8" and r.mad_rounding == "trunc":
        mad_bias -= 0.5  # magic-number path: floor(x) = RNE(x - 0.5) except at exact odd integers (ties)
    e_fixed = {"none": 0.0, "fmax": LOG2_448, "pow2": float(r.p_scale_log2), "pow2_block": 0.0}[r.p_scale]
    return KernelPlan(
        recipe=r.name, block_n=r.block_n, block_m=r.block_m if tile_gran else None,
        exp_mad=r.exp_method == "mad_fp8", mad_bias=mad_bias, mad_rounding=r.mad_rounding,
        p_scale=p_scales[r.p_scale], e_fixed=e_fixed, tile_gran=tile_gran,
        e_cap=float(r.p_block_max_log2), rowsum_rounded={"fp32": 0, "rounded": 1, "rounded_mma": 2}[r.rowsum],
        qk_k32=qk_k32,
        pv_mode=pv_mode, flush=flush, rcp=r.reciprocal == "rcp", out_mode=out_modes[r.out_format],
        vd_mode={"channel": 1, "block": 2}.get(r.v_scale, 0))


def kernel_recipe(spec: Recipe | str) -> Recipe:
    """The recipe as this kernel computes it (:func:`zyfa.recipe_spec.triton_kernel_recipe`): FA3's head-dim tiles
    (``head_dim_tiles``: 224 keys at hd128, 160 at hd64 and hd192) are no Triton block size, so the kernel keeps
    the recipe's ``block_m`` x ``block_n``; and it visits KV tiles from key 0 on (``kv_order`` forward). An
    emulation meant to match the kernel must do the same. Fields as the recipe's; named as the recipe where
    nothing differs (the spec ``triton:NAME`` gives the same recipe)."""
    r = get_recipe(spec)
    kr = triton_kernel_recipe(r)
    return r if kr is r else kr.replace(name=r.name)


def recipe_from_spec(spec: Recipe | str) -> Recipe:
    """A recipe spec -> Recipe: :func:`zyfa.recipe_spec.get_recipe`, the one grammar (kept as a name for scripts)."""
    return get_recipe(spec)


# ---------------------------------------------------------------------------------------------- MAD bounds

def fused_mad_is_exact(plan: KernelPlan) -> bool:
    """Whether the one-FFMA MAD (MAD_T=0) gives the emulator's codes at each row max.

    At the row max t = 0, so the code is bias + 8e; the fused multiply-add leaves t off zero by an ulp of the
    product, which only matters when bias + 8e sits on the conversion's rounding boundary (a tie of the
    magic-number RNE: fractional part 1/2). The zyfa family's +1/16 code offset keeps it 1/16 away.
    """
    if not plan.exp_mad:
        return False
    frac = plan.mad_bias - math.floor(plan.mad_bias)
    return abs(frac - 0.5) >= 1.0 / 64


def mad_code_bound(plan: KernelPlan) -> float:
    """The largest MAD value x = 8·(t + e) + bias a recipe can reach in exact arithmetic (t <= 0 is the score
    minus the row max; the magic-number code is RNE(x)).

    With a per-block P exponent e = floor(log2(448) - t_max) (capped lower by ``p_block_max_log2``), so
    t + e <= log2(448); with a fixed exponent, t + e <= e. zyfa: 8·8.807 + 55.5625 = 126.02.
    """
    top = LOG2_448 if plan.p_scale == 3 else plan.e_fixed
    return 8.0 * top + plan.mad_bias


def mad_codes_bounded(plan: KernelPlan) -> bool:
    """Whether the recipe's codes stay <= 126 (the largest finite e4m3fn code) without a clamp when t is exact
    (MAD_T=1): RNE(x) <= 126 needs x < 126.5 (0.125 codes of margin kept)."""
    return plan.exp_mad and mad_code_bound(plan) <= 126.375


# How far the fused MAD's code at a row max can sit above the recipe's exact bound: the roundings of m = fl(s·c), of
# t_max, of the row bias and of the FFMA add at most (2^-21 + 2^-20)·|m| (|m| the row max in log2 units) and a few
# 1e-5 that do not grow with |m| (derivation and the measured worst case in docs/KERNEL.md); 2e-6 per unit of |m| and
# 1e-4 keep a margin on both, and tests/kernels replay the arithmetic in fp32 to check it.
MAD_FUSED_DRIFT = 2e-6
MAD_FUSED_DRIFT0 = 1e-4


def mad_m_safe(plan: KernelPlan) -> float:
    """The largest |row max| (of s·c, log2 units) up to which the fused MAD's codes provably stay below 126.5 (0 if
    the recipe's exact bound leaves no room): x <= mad_code_bound + MAD_FUSED_DRIFT·|m| + MAD_FUSED_DRIFT0, with the
    0.125 codes of margin :func:`mad_codes_bounded` keeps. zyfa: (126.375 - 126.021 - 1e-4) / 2e-6 = 177K."""
    if not plan.exp_mad:
        return 0.0
    return max(0.0, (126.375 - mad_code_bound(plan) - MAD_FUSED_DRIFT0) / MAD_FUSED_DRIFT)


def mad_cvt_for_descales(mad_cvt: int, qd_row: int, kd_tile: bool) -> int:
    """MAD_CVT 6's per-program bound needs one score scale c for the whole program: with per-row Q descales
    (QD_ROW 1) or per-tile K descales the kernel keeps the clamp (3). Other conversions pass unchanged."""
    if mad_cvt == 6 and (qd_row == 1 or kd_tile):
        return 3
    return mad_cvt


def default_mad_cvt(plan: KernelPlan, mad_t: int) -> int:
    """How MAD values become codes: fma.rn.sat of x/128 (the clamp at 0 for free) and the magic-number add,
    with no clamp at 126 where it provably cannot bind: 4 for exact t and :func:`mad_codes_bounded`; 6 for the
    fused MAD, whose codes drift by up to MAD_FUSED_DRIFT·|m|: the kernel bounds every row max |m| of a program by
    DQK·448²·c before its loops and runs them without the clamp where that is at most :func:`mad_m_safe`, with
    one fp32 min (3) otherwise (the same bits as 3 either way). 3 where the recipe leaves no margin.
    0 for exp2 recipes (unused)."""
    if not plan.exp_mad:
        return 0
    if mad_t == 1 and mad_codes_bounded(plan):
        return 4
    return 6 if mad_m_safe(plan) > 0 else 3
