"""FP8 (e4m3fn) attention forward on Hopper through Triton: wrapper, recipe mapping and input validation.

:func:`attention_fp8` takes FP8 Q/K/V with fp32 descales and returns a bf16 output (fp32 for ``out_format="fp32"``
recipes) and the fp32 natural-log LSE. Descales: per tensor or per (batch, head); Q also per query row (a per-block
or per-token Q descale expanded to rows: the kernel's QD_ROW, one value per row of each program); K also per block
of keys, one value per KV tile (KD_TILE: the kernel reads one scalar per tile, so the recipe's ``scale_block_kv``
must be a multiple of ``block_n``); V also per channel (on the output's columns) or per block of keys with
``v_descale='tile'`` (each tile's P·V scaled before it is added). The scores are scaled by
c = (sm_scale·log2e·qd)·kd exactly where and in the order the emulator scales them. The per-head forms compile to
the same binary as before the other forms existed (constexpr switches; SASS compared, docs/KERNEL.md).
:func:`attention_fp8_quantized` quantizes float inputs exactly as the emulator does
(:func:`zyfa.emulator.quantize_inputs`: the recipe's ``qk_rotation`` and ``k_smoothing`` included) and calls it; with
K smoothing it adds sm_scale·q·mean(k) back to the LSE, as the emulator does, so the LSE is that of the unsmoothed
scores (the output needs nothing: softmax ignores a per-row constant).

Everything here runs before Triton is imported, so bad input gets a clear error on any machine (CPU CI has
no Triton): the order is types and dtypes, shapes, head dims, strides, descales, recipe fields, and last the
device. The kernel lives in :mod:`zyfa.kernels._triton_fp8`.

Recipe fields the kernel honours (others are refused with ``ValueError`` naming field and value):
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
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from zyfa.recipes import Recipe, get_recipe, triton_kernel_recipe

__all__ = [
    "KernelPlan",
    "SUPPORTED_HEAD_DIMS",
    "attention_fp8",
    "attention_fp8_quantized",
    "default_config",
    "default_mad_cvt",
    "fused_mad_is_exact",
    "kernel_plan",
    "kernel_recipe",
    "launch",
    "mad_code_bound",
    "mad_codes_bounded",
    "mad_cvt_for_descales",
    "mad_m_safe",
    "k32_key_order",
    "k_descale_per_tile",
    "q_descale_per_program",
    "prepare_vt",
    "resolve_config",
    "vt_key_order_for",
    "quantize_for_kernel",
]

LOG2E = 1.4426950408889634
LOG2_448 = math.log2(448.0)
SUPPORTED_QK_DIMS = (64, 128, 192, 256)
SUPPORTED_V_DIMS = (64, 128, 256)
SUPPORTED_HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (192, 128))
_FP8 = torch.float8_e4m3fn
LAST_LAUNCH: dict = {}  # "kernel": the compiled kernel of the last launch (n_regs, n_spills for ablations)
HD128_CAUSAL_MAXNREG = 168  # register cap for hd128 causal: three programs per SM (measured: docs/KERNEL.md)
P_PERM_DEFAULT = 1  # P's columns and V's keys in k32_key_order (see prepare_vt)


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
    """The recipe as this kernel computes it (:func:`zyfa.recipes.triton_kernel_recipe`): FA3's head-dim tiles
    (``head_dim_tiles``: 224 keys at hd128, 160 at hd64 and hd192) are no Triton block size, so the kernel keeps
    the recipe's ``block_m`` x ``block_n``; and it visits KV tiles from key 0 on (``kv_order`` forward). An
    emulation meant to match the kernel must do the same. Fields as the recipe's; named as the recipe where
    nothing differs (the spec ``triton:NAME`` gives the same recipe)."""
    r = get_recipe(spec)
    kr = triton_kernel_recipe(r)
    return r if kr is r else kr.replace(name=r.name)


def recipe_from_spec(spec: Recipe | str) -> Recipe:
    """A recipe spec -> Recipe: :func:`zyfa.recipes.get_recipe`, the one grammar (kept as a name for scripts)."""
    return get_recipe(spec)


# ---------------------------------------------------------------------------------------------- configs

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
    one fp32 min (3) otherwise (the same bits as 3 either way). 3 where the recipe leaves no margin. The packed
    u16x2 clamp (5) has fewer instructions but was no faster than 3 on the H200 (docs/KERNEL.md).
    0 for exp2 recipes (unused)."""
    if not plan.exp_mad:
        return 0
    if mad_t == 1 and mad_codes_bounded(plan):
        return 4
    return 6 if mad_m_safe(plan) > 0 else 3


def default_config(d_qk: int, d_v: int, causal: bool, plan: KernelPlan) -> dict:
    """Tile sizes and launch options, each set by a measurement on the H200 (docs/KERNEL.md, "The launch defaults",
    has every one beside the command that measured it).

    MAD_T: 0 (one fused FFMA per score) for MAD recipes whose row maxima are off the rounding boundary
    (:func:`fused_mad_is_exact`: the zyfa family), else 1 (t exactly as the emulator).
    MAD_CVT: :func:`default_mad_cvt` (the FFMA's saturation is the clamp at 0: fewer FMNMX per score).
    PIPELINE_QK: 0 (the hand-pipelined loop is serialised by Triton 3.6 on sm_90).
    P_PERM: 1 (P's columns and V's keys reordered within each 32-key step: no shuffles before the P·V wgmma).
    PV_MODE 2 instead of the plan's 4 at d 256 (the same per-tile flush, through Triton's partial accumulator: fewer
    spills). maxnreg 168 (three programs per SM) for hd128 causal and for the exp2 recipes at d 64 non-causal; at
    d 64 causal, for every recipe, three pipeline stages and maxnreg 128 (four programs per SM); at d 64 non-causal
    for the MAD recipes three stages in 128-row programs of two warpgroups without the cap (slower causal, at d 128
    and at MLA, so only there).
    DV_SPLIT 2 at d 256 (O's columns in two halves, one P·V dot each: fewer spills, the same output bit for bit);
    slower at d_v 128, so 1 there. VT_EARLY 1 at d 256 for the Hopper-accumulator recipes (Vᵀ's tile loaded beside
    K's, the same bits; slower below d 256). EXP2_SUM 1 for exp2 recipes with the rounded row sum (P's codes from a
    conversion of their own, the sum decoded from them; 0 re-rounds p in fp32: the same bits, more instructions;
    the sum read back from P's FP8 tensor was compiled wrong).
    """
    # 64-row tiles, one warpgroup, two programs per SM (their softmax and matmuls interleave) beat 128-row tiles on
    # two warpgroups for d <= 192; d = 256 needs 128 rows.
    mad_t = 0 if fused_mad_is_exact(plan) else 1
    cfg = {"BLOCK_M": 64, "num_warps": 4, "num_stages": 2, "TMA": True, "WS": False,
           "MAD_CVT": default_mad_cvt(plan, mad_t), "MAD_T": mad_t, "PIPELINE_QK": 0, "P_PERM": P_PERM_DEFAULT}
    if d_v >= 256 or d_qk >= 256:
        cfg.update(BLOCK_M=128, num_warps=8, num_stages=3)
        if plan.pv_mode == 4:
            cfg["PV_MODE"] = 2  # per-tile flush through Triton's partial accumulator: fewer spills at hd256
        if plan.pv_mode != 3:
            # P·V as two dots over O's column halves: the per-tile product needs half the registers (spills
            # far fewer LDL/STL), bit-identical output (docs/KERNEL.md)
            cfg["DV_SPLIT"] = 2
        if plan.rowsum_rounded == 2:
            cfg["num_stages"] = 2  # the ones tile of the tensor-core row sum: 3 stages need 236.5 KB > 227 KB
        if not plan.qk_k32:
            # Vᵀ's tile loaded beside K's (one mbarrier per stage, no CTA barrier inside the softmax): faster at
            # hd256, not at d <= 192 (docs/KERNEL.md); the fp32-accumulation recipes are refused it (resolve_config)
            cfg["VT_EARLY"] = 1
    elif d_qk <= 64 and not plan.qk_k32:
        if causal:
            # four programs per SM (54 KB of shared memory each, at most 128 registers): faster than three for
            # zyfa-hopper and fa3 flushed per tile (docs/KERNEL.md)
            cfg.update(num_stages=3, maxnreg=128)
        elif plan.exp_mad:  # measured with zyfa-hopper; the exp2 recipes keep the older form
            # K/V three tiles deep and two warpgroups sharing K/V (faster non-causal, slower causal)
            cfg.update(num_stages=3, BLOCK_M=128, num_warps=8)
        else:
            cfg["maxnreg"] = 168  # no spills at d 64: three programs per SM
    elif d_qk == 128 and d_v == 128 and causal and not plan.qk_k32:
        cfg["maxnreg"] = HD128_CAUSAL_MAXNREG  # small spills, but three programs per SM
    if not plan.exp_mad and plan.rowsum_rounded == 1:
        cfg["EXP2_SUM"] = 1  # exp2 P's rounded sum from codes of their own (docs/KERNEL.md)
    if plan.block_m is not None:
        cfg["BLOCK_M"] = plan.block_m
        cfg["num_warps"] = 8 if plan.block_m >= 128 else 4
    return cfg


# ---------------------------------------------------------------------------------------------- validation

def descale_to_bh(d, name: str, b: int, h: int, h_kv: int, device) -> torch.Tensor:
    """A descale (float, one-element tensor, (b, h) / (b, h, 1, 1), or for q (b, h_kv)) -> (b, h) fp32."""
    if isinstance(d, bool):
        raise TypeError(f"{name} must be a float or a tensor, got bool")
    if isinstance(d, (int, float)):
        if not math.isfinite(d) or d <= 0:
            raise ValueError(f"{name} must be a positive finite number, got {d}")
        return torch.full((b, h), float(d), dtype=torch.float32, device=device)
    if not isinstance(d, torch.Tensor):
        raise TypeError(f"{name} must be a float or a torch.Tensor, got {type(d).__name__}")
    if not d.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got {d.dtype}")
    if d.device != torch.device(device) and not (d.device.type == torch.device(device).type == "cuda"):
        raise ValueError(f"{name} is on {d.device}, the inputs on {device}")
    x = d.detach().to(device=device, dtype=torch.float32)
    if x.numel() == 1:
        x = x.reshape(1, 1).expand(b, h)
    else:
        shape = tuple(x.shape)
        if len(shape) == 4 and shape[2:] == (1, 1):
            x = x.reshape(shape[0], shape[1])
        if x.dim() != 2 or x.shape[0] != b or x.shape[1] not in (h, h_kv):
            raise ValueError(f"{name} must be one scalar or of shape ({b}, {h}) or ({b}, {h}, 1, 1), "
                             f"got {shape}")
        if x.shape[1] != h:  # q descale per (batch, kv head): its GQA group shares one (FA3's shape)
            x = x.repeat_interleave(h // h_kv, dim=1)
    x = x.contiguous()
    if not bool(torch.all(torch.isfinite(x) & (x > 0))):
        raise ValueError(f"{name} must be positive and finite")
    return x


def _per_row_descale(d, name: str, b: int, heads: int, seq: int, device):
    """A per-row (Q) or per-key (K) descale (b, heads, seq) or (b, heads, seq, 1) -> (b, heads, seq) fp32, or None
    when ``d`` has another form (handled by :func:`descale_to_bh`)."""
    if not isinstance(d, torch.Tensor) or isinstance(d, bool) or not d.dtype.is_floating_point:
        return None
    shape = tuple(d.shape)
    if not (len(shape) == 3 or (len(shape) == 4 and shape[3] == 1 and shape[2] > 1)):
        return None
    if shape[:3] != (b, heads, seq):
        raise ValueError(f"{name} per {'query row' if name == 'q_descale' else 'key'} must be of shape "
                         f"({b}, {heads}, {seq}) or ({b}, {heads}, {seq}, 1), got {shape}")
    return _checked_descale(d, name, device, (b, heads, seq))


def _checked_descale(d: torch.Tensor, name: str, device, shape: tuple[int, ...]) -> torch.Tensor:
    """``d`` as a contiguous fp32 tensor of ``shape`` on ``device``; ValueError (one line) for another device
    or a value that is not positive and finite."""
    if d.device != torch.device(device) and not (d.device.type == torch.device(device).type == "cuda"):
        raise ValueError(f"{name} is on {d.device}, the inputs on {device}")
    x = d.detach().to(device=device, dtype=torch.float32).reshape(shape).contiguous()
    if not bool(torch.all(torch.isfinite(x) & (x > 0))):
        raise ValueError(f"{name} must be positive and finite")
    return x


def k_descale_per_tile(kd: torch.Tensor, block_n: int, name: str = "k_descale") -> torch.Tensor:
    """Per-key K (or V) descales (b, h_kv, s_k) -> one per KV tile of ``block_n`` keys (b, h_kv,
    ceil(s_k / block_n)), what the kernel reads with per-block K (V) descales. ValueError when a tile holds more
    than one value (a descale block that is not a multiple of the kernel's ``block_n``)."""
    s_k = kd.shape[2]
    tiles = kd[:, :, ::block_n].contiguous()
    if not torch.equal(tiles.repeat_interleave(block_n, dim=2)[:, :, :s_k], kd):
        raise ValueError(f"{name} varies within a KV tile of {block_n} keys: the kernel takes one descale per "
                         f"tile (per-block descales need scale_block_kv a multiple of block_n={block_n})")
    return tiles


def q_descale_per_program(qd: torch.Tensor, block_m: int) -> torch.Tensor | None:
    """Per-row Q descales (b, h, s_q) -> one per program of ``block_m`` rows (b, h, ceil(s_q / block_m)) when every
    program's rows share one value (Q blocks a multiple of the kernel's BLOCK_M), else None (the kernel then reads
    one value per row)."""
    s_q = qd.shape[2]
    progs = qd[:, :, ::block_m].contiguous()
    return progs if torch.equal(progs.repeat_interleave(block_m, dim=2)[:, :, :s_q], qd) else None


def _v_descale(d, plan: KernelPlan, b: int, h_kv: int, s_k: int, d_v: int, block_n: int, device) -> torch.Tensor:
    """V's descale in the form the recipe's ``v_scale`` needs: (b, h_kv); per channel (b, h_kv, d_v) from
    (b, h_kv, d_v) or (b, h_kv, 1, d_v); per KV tile (b, h_kv, ceil(s_k / block_n)) from per-key (b, h_kv, s_k) or
    (b, h_kv, s_k, 1). A float or one-element tensor is one value everywhere."""
    one = d is None or isinstance(d, (int, float)) or (isinstance(d, torch.Tensor) and d.numel() == 1)
    if plan.vd_mode == 0 or one:
        vd = descale_to_bh(1.0 if d is None else d, "v_descale", b, h_kv, h_kv, device)
        if plan.vd_mode == 1:
            return vd[:, :, None].expand(b, h_kv, d_v).contiguous()
        if plan.vd_mode == 2:
            return vd[:, :, None].expand(b, h_kv, -(-s_k // block_n)).contiguous()
        return vd
    if plan.vd_mode == 2:
        vd = _per_row_descale(d, "v_descale", b, h_kv, s_k, device)
        if vd is None:
            raise ValueError(f"v_descale for v_scale='block' must be one value or per key: ({b}, {h_kv}, {s_k}) or "
                             f"({b}, {h_kv}, {s_k}, 1), got {tuple(getattr(d, 'shape', ()))}")
        return k_descale_per_tile(vd, block_n, "v_descale")
    shape = tuple(getattr(d, "shape", ()))
    if not isinstance(d, torch.Tensor) or not d.dtype.is_floating_point or shape not in (
            (b, h_kv, d_v), (b, h_kv, 1, d_v)):
        raise ValueError(f"v_descale for v_scale='channel' must be one value or per channel: ({b}, {h_kv}, {d_v}) or "
                         f"({b}, {h_kv}, 1, {d_v}), got {shape if shape else type(d).__name__}")
    return _checked_descale(d, "v_descale", device, (b, h_kv, d_v))


def validate_inputs(q, k, v, causal, sm_scale, window):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(x.shape)}")
    b, h, s_q, d_qk = q.shape
    _, h_kv, s_k, _ = k.shape
    d_v = v.shape[3]
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"batch mismatch: q {b}, k {k.shape[0]}, v {v.shape[0]}")
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(f"k and v must share batch, heads and seq: k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[3] != d_qk:
        raise ValueError(f"q and k head dims differ: {d_qk} vs {k.shape[3]}")
    if h_kv < 1 or h % h_kv:
        raise ValueError(f"q heads ({h}) must be a multiple of kv heads ({h_kv})")
    if s_q < 1 or s_k < 1 or b < 1:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if d_qk not in SUPPORTED_QK_DIMS or d_v not in SUPPORTED_V_DIMS:
        raise ValueError(f"unsupported head dims (d_qk={d_qk}, d_v={d_v}): the kernel takes d_qk in "
                         f"{SUPPORTED_QK_DIMS} and d_v in {SUPPORTED_V_DIMS} (tested: {SUPPORTED_HEAD_DIMS})")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides {x.stride()}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    if sm_scale is not None and (not isinstance(sm_scale, (int, float)) or isinstance(sm_scale, bool)
                                 or not math.isfinite(sm_scale) or sm_scale <= 0):
        raise ValueError(f"sm_scale must be a positive finite number or None, got {sm_scale!r}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    return b, h, h_kv, s_q, s_k, d_qk, d_v


def check_fp8(q, k, v, descales):
    bad = [n for n, x in (("q", q), ("k", k), ("v", v)) if x.dtype != _FP8]
    if bad:
        dtypes = ", ".join(f"{n}={x.dtype}" for n, x in (("q", q), ("k", k), ("v", v)))
        hint = ("; descales were given, so quantize the inputs to float8_e4m3fn first" if any(
            d is not None for d in descales) else "")
        raise TypeError(f"attention_fp8 takes torch.float8_e4m3fn q, k, v with descales (got {dtypes}){hint}; "
                        "for float inputs use attention_fp8_quantized(q, k, v, recipe=...), which quantizes "
                        "them as the recipe says")


def check_device(q):
    if q.device.type != "cuda":
        raise ValueError(f"attention_fp8 runs on a CUDA GPU (Hopper, sm_90); the inputs are on {q.device}. "
                         "For CPU results use zyfa.emulator.emulate")
    major, minor = torch.cuda.get_device_capability(q.device)
    if major != 9:
        raise ValueError(f"attention_fp8 needs a Hopper GPU (compute capability 9.x) for FP8 wgmma; "
                         f"{torch.cuda.get_device_name(q.device)} is {major}.{minor}")


# ---------------------------------------------------------------------------------------------- launch

def _interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def k32_key_order(n: int, device=None) -> torch.Tensor:
    """The key order the kernel's P operand uses when P_PERM=1: position 32s+16h+4t+2a+b holds key
    32s+16h+8a+2t+b (n a multiple of 32). A permutation within each 32-key wgmma step."""
    k = torch.arange(n, device=device)
    s, h, t, a, b = k // 32, (k // 16) % 2, (k // 4) % 4, (k // 2) % 2, k % 2
    return 32 * s + 16 * h + 8 * a + 2 * t + b


def vt_key_order_for(config: dict | None) -> bool:
    """Whether a launch with these overrides expects Vt in :func:`k32_key_order` (its P_PERM)."""
    return bool((config or {}).get("P_PERM", P_PERM_DEFAULT))


VT_COPY_BLOCK = 64  # keys per program of the Triton transpose (a multiple of 32)


def prepare_vt(v: torch.Tensor, permute_k32: bool = True, copy: str = "auto") -> torch.Tensor:
    """V (b, h_kv, s_k, d_v) -> Vt (b, h_kv, d_v, s_k_pad) contiguous, zero-padded.

    Hopper's FP8 wgmma reads both operands K-major; for P·V the K dim is the sequence, so V is transposed
    once here (TMA also needs 16-byte row strides, hence the padding to 16 keys). With ``permute_k32`` (what
    the Triton kernel's default P_PERM=1 expects) the keys are also reordered within each 32-key block by
    :func:`k32_key_order` (padding to 32), so P needs no register shuffle before its wgmma. The result records
    which order it holds; :func:`launch` refuses a mismatch with its P_PERM.

    copy: "triton" (one Triton copy kernel that moves the bytes at close to memory speed),
    "torch" (a permute and a contiguous copy, any device and dtype), "auto" (Triton for a CUDA tensor of a
    1-byte dtype, FP8, whose head dim is a power of two >= 16, else torch). Both give the same bytes.
    """
    if copy not in ("auto", "torch", "triton"):
        raise ValueError(f"copy must be 'auto', 'torch' or 'triton', got {copy!r}")
    b, h_kv, s_k, d_v = v.shape
    mult = 32 if permute_k32 else 16
    s_pad = -(-s_k // mult) * mult
    fits = d_v >= 16 and d_v & (d_v - 1) == 0 and v.element_size() == 1
    if copy == "triton" and not (fits and (v.is_cuda or _interpreting())):
        raise ValueError(f"copy='triton' needs a CUDA tensor of a 1-byte dtype with a power-of-two head dim >= 16 "
                         f"(got {v.dtype} on {v.device}, d_v={d_v})")
    if copy == "triton" or copy == "auto" and v.is_cuda and fits:
        from zyfa.kernels import _triton_vt

        v = v.contiguous()
        vt = torch.empty((b, h_kv, d_v, s_pad), dtype=v.dtype, device=v.device)
        n = b * h_kv
        if n and s_pad:
            grid = (-(-s_pad // VT_COPY_BLOCK), n)
            _triton_vt.vt_transpose[grid](v.view(torch.uint8), vt.view(torch.uint8), s_k, s_pad, DV=d_v,
                                          BLOCK_S=VT_COPY_BLOCK, PERM=bool(permute_k32))
        vt.zyfa_k32_permuted = bool(permute_k32)
        return vt
    if permute_k32:
        if s_pad != s_k:
            vp = torch.zeros((b, h_kv, s_pad, d_v), dtype=v.dtype, device=v.device)
            vp[:, :, :s_k].copy_(v)
            v = vp
        # key 32s+16h+8a+2t+b goes to position 32s+16h+4t+2a+b (k32_key_order), transposed in the same copy
        vt = v.reshape(b, h_kv, s_pad // 32, 2, 2, 4, 2, d_v).permute(0, 1, 7, 2, 3, 5, 4, 6)
        vt = vt.reshape(b, h_kv, d_v, s_pad)
    elif s_pad == s_k:
        vt = v.transpose(-1, -2).contiguous()
    else:
        vt = torch.zeros((b, h_kv, d_v, s_pad), dtype=v.dtype, device=v.device)
        vt[..., :s_k].copy_(v.transpose(-1, -2))
    vt.zyfa_k32_permuted = bool(permute_k32)
    return vt


def resolve_config(d_qk: int, d_v: int, causal: bool, plan: KernelPlan, config: dict | None = None):
    """:func:`default_config` with the caller's overrides, checked; returns (config, MAD_CVT, MAD bias).

    The bias is the plan's (magic-number form) or, for the cvt conversions, +0.5 back (cvt.rzi truncates).
    """
    cfg = default_config(d_qk, d_v, causal, plan)
    if config:
        if "MAD_T" in config and "MAD_CVT" not in config:
            cfg["MAD_CVT"] = default_mad_cvt(plan, config["MAD_T"])
        cfg.update(config)
    if plan.block_m is not None and cfg["BLOCK_M"] != plan.block_m:
        raise ValueError(f"recipe {plan.recipe!r} fixes BLOCK_M={plan.block_m} (per-tile P exponent)")
    if cfg.get("PIPELINE_QK") and cfg.get("PV_MODE") == 2 and "PV_MODE" not in (config or {}):
        cfg["PV_MODE"] = plan.pv_mode  # the hand-pipelined loop with PV_MODE 2 at d 256 needs 262 KB of shared memory
    if cfg.get("PV_MODE", plan.pv_mode) == 3 and "DV_SPLIT" not in (config or {}):
        cfg["DV_SPLIT"] = 1  # a PV_MODE 3 override keeps its second accumulator: no column halves
    vt_early = cfg.get("VT_EARLY", 0)
    if vt_early not in (0, 1):
        raise ValueError(f"VT_EARLY={vt_early!r}: expected 0 (Vᵀ loaded after the softmax) or 1 (beside K)")
    if vt_early and (cfg.get("QK_K32", plan.qk_k32) or cfg.get("PV_MODE", plan.pv_mode) == 1):
        raise ValueError(f"VT_EARLY=1 is not supported with the fp32 accumulation of recipe {plan.recipe!r} (QK_K32 / "
                         "PV_MODE 1): Triton 3.6 compiled it to wrong output for zyfa-exp2 at d 256 on the H200")
    if cfg.get("EXP2_SUM", 0) not in (0, 1):
        raise ValueError(f"EXP2_SUM={cfg['EXP2_SUM']!r}: expected 0 (the rounded sum of exp2 P from p rounded again in "
                         "fp32) or 1 (from the codes of a conversion of their own)")
    dv_split = cfg.get("DV_SPLIT", 1)
    if dv_split not in (1, 2):
        raise ValueError(f"DV_SPLIT={dv_split!r}: expected 1 (one P·V dot) or 2 (O's columns in two halves)")
    if dv_split == 2 and cfg.get("PV_MODE", plan.pv_mode) == 3:
        raise ValueError("DV_SPLIT=2 cannot be combined with PV_MODE 3 (the accumulator flushed every N tiles keeps "
                         "its own second accumulator)")
    if dv_split == 2 and d_v < 64:
        raise ValueError(f"DV_SPLIT=2 needs d_v >= 64 (halves of at least 32 columns), got d_v={d_v}")
    mad_cvt = cfg["MAD_CVT"]
    if mad_cvt not in (0, 1, 2, 3, 4, 5, 6):
        raise ValueError(f"MAD_CVT={mad_cvt!r}: expected 0 (magic add), 1 (cvt.rni/rzi), 3/4/5/6 (fma.rn.sat, "
                         "with an fp32 clamp at 126 / none / a packed u16x2 clamp / none where a per-program "
                         "bound allows)")
    if mad_cvt == 6 and not (plan.exp_mad and mad_m_safe(plan) > 0):
        raise ValueError(f"MAD_CVT=6 needs a MAD recipe whose codes stay below 126.375 in exact arithmetic (recipe "
                         f"{plan.recipe!r}: x <= {mad_code_bound(plan):.3f}): use MAD_CVT=3 or 5")
    if mad_cvt == 4 and not (cfg["MAD_T"] == 1 and mad_codes_bounded(plan)):
        raise ValueError(f"MAD_CVT=4 leaves out the clamp at code 126, which is safe only with MAD_T=1 and a "
                         f"recipe whose codes stay below 126.5 (recipe {plan.recipe!r}: x <= "
                         f"{mad_code_bound(plan):.3f}, MAD_T={cfg['MAD_T']}): use MAD_CVT="
                         + ("6 (no clamp where the program's bound allows), 3 or 5" if mad_m_safe(plan) > 0
                            else "3 or 5"))
    if cfg.get("DEBUG", 0) and mad_cvt >= 3:
        raise ValueError("DEBUG routes exist only for MAD_CVT 0-2")
    mad_bias = plan.mad_bias
    if plan.exp_mad and plan.mad_rounding == "trunc" and mad_cvt in (1, 2):
        mad_bias += 0.5  # cvt.rzi truncates by itself
    if plan.exp_mad and plan.mad_rounding == "trunc" and mad_cvt == 1:
        mad_cvt = 2
    if plan.exp_mad and plan.mad_rounding == "nearest" and mad_cvt == 2:
        raise ValueError("MAD_CVT=2 (cvt.rzi) truncates; the recipe asks for nearest rounding")
    return cfg, mad_cvt, mad_bias


_ONES: dict = {}


def _ones_tile(device, block_n: int) -> torch.Tensor:
    """(16, block_n) e4m3fn ones, one per device: the B operand of the tensor-core row sum (rowsum='rounded_mma')."""
    key = (str(device), block_n)
    if key not in _ONES:
        _ONES[key] = torch.ones((16, block_n), device=device).to(torch.float8_e4m3fn)
    return _ONES[key]


def launch(q8, k8, vt, qd, kd, vd, *, plan: KernelPlan, seq_k: int, causal: bool, sm_scale: float,
           window: int | None, config: dict | None = None, out=None, lse=None):
    """Launch the kernel on prepared operands (no checks: :func:`attention_fp8` does them).

    q8 (b, h, s_q, d_qk), k8 (b, h_kv, s_k, d_qk) contiguous FP8; vt from :func:`prepare_vt`; fp32 contiguous
    descales: qd (b, h), per query row (b, h, s_q) or per program of BLOCK_M rows (b, h, ceil(s_q / BLOCK_M))
    (:func:`q_descale_per_program`); kd (b, h_kv) or per KV tile (b, h_kv, ceil(s_k / BLOCK_N))
    (:func:`k_descale_per_tile`); vd (b, h_kv), or per channel (b, h_kv, d_v) / per KV tile as kd, as the plan's
    ``vd_mode`` says. The 3-D forms switch on the kernel's QD_ROW / KD_TILE / VD_MODE (else the same binary as
    before they existed). Returns (out, lse).
    """
    b, h, s_q, d_qk = q8.shape
    h_kv = k8.shape[1]
    d_v, s_k_pad = vt.shape[2], vt.shape[3]
    cfg, mad_cvt, mad_bias = resolve_config(d_qk, d_v, causal, plan, config)
    if getattr(vt, "zyfa_k32_permuted", None) != bool(cfg["P_PERM"]):
        raise ValueError(f"vt must come from prepare_vt(v, permute_k32={bool(cfg['P_PERM'])}) for P_PERM="
                         f"{cfg['P_PERM']} (got a Vt with zyfa_k32_permuted="
                         f"{getattr(vt, 'zyfa_k32_permuted', None)})")
    import triton

    from zyfa.kernels import _triton_fp8 as K

    block_n = cfg.get("BLOCK_N", plan.block_n)
    kd_tile = kd.dim() == 3
    qd_row = 0
    if qd.dim() == 3:  # 1: per query row; 2: per program of BLOCK_M rows (q_descale_per_program)
        qd_row = 1 if qd.shape[2] == s_q else 2 if qd.shape[2] == triton.cdiv(s_q, cfg["BLOCK_M"]) else -1
        if qd_row < 0 or tuple(qd.shape[:2]) != (b, h):
            raise ValueError(f"q_descale must be ({b}, {h}), per row ({b}, {h}, {s_q}) or per program "
                             f"({b}, {h}, {triton.cdiv(s_q, cfg['BLOCK_M'])}), got {tuple(qd.shape)}")
    mad_cvt = mad_cvt_for_descales(mad_cvt, qd_row, kd_tile)
    if kd_tile and tuple(kd.shape) != (b, h_kv, triton.cdiv(seq_k, block_n)):
        raise ValueError(f"per-tile k_descale must be ({b}, {h_kv}, {triton.cdiv(seq_k, block_n)}) for "
                         f"BLOCK_N={block_n} (k_descale_per_tile), got {tuple(kd.shape)}")
    vd_shape = [(b, h_kv), (b, h_kv, d_v), (b, h_kv, triton.cdiv(seq_k, block_n))][plan.vd_mode]
    if tuple(vd.shape) != vd_shape:
        raise ValueError(f"v_descale must be {vd_shape} for recipe {plan.recipe!r} (v_scale: per head, per channel, "
                         f"per KV tile), got {tuple(vd.shape)}")
    if cfg["TMA"]:
        K.ensure_allocator()
    out_dtype = torch.float32 if plan.out_mode == 2 else torch.bfloat16
    if out is None:
        out = torch.empty((b, h, s_q, d_v), dtype=out_dtype, device=q8.device)
    if lse is None:
        lse = torch.empty((b, h, s_q), dtype=torch.float32, device=q8.device)
    grid = (triton.cdiv(s_q, cfg["BLOCK_M"]), b * h)
    LAST_LAUNCH["kernel"] = K.attn_fwd_fp8[grid](
        q8, k8, vt, out, lse, qd, kd, vd, _ones_tile(q8.device, block_n),
        s_q, seq_k, s_k_pad, h, h_kv, int(window or 0), float(sm_scale) * LOG2E, float(mad_bias),
        float(mad_m_safe(plan)),
        **launch_constexprs(plan, cfg, mad_cvt, d_qk, d_v, causal, window is not None, qd_row, kd_tile),
        **launch_options(cfg))
    return out, lse


def launch_constexprs(plan: KernelPlan, cfg: dict, mad_cvt: int, d_qk: int, d_v: int, causal: bool,
                      window: bool = False, qd_row: int = 0, kd_tile: bool = False) -> dict:
    """The kernel's constexpr arguments for a resolved config (:func:`resolve_config`) and MAD_CVT after
    :func:`mad_cvt_for_descales`: what :func:`launch` passes, so an offline compile (``scripts/inspect_sass.py``)
    builds the same binary."""
    d1, d2 = (128, 64) if d_qk == 192 else (d_qk, 0)
    return dict(
        CAUSAL=bool(causal or window), WINDOW=bool(window),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg.get("BLOCK_N", plan.block_n), D1=d1, D2=d2, DV=d_v,
        EXP_MAD=plan.exp_mad, MAD_CVT=mad_cvt, P_SCALE=plan.p_scale, E_FIXED=plan.e_fixed,
        TILE_GRAN=plan.tile_gran, E_CAP=plan.e_cap, ROWSUM_ROUNDED=plan.rowsum_rounded,
        QK_K32=cfg.get("QK_K32", plan.qk_k32), PV_MODE=cfg.get("PV_MODE", plan.pv_mode),
        FLUSH=max(plan.flush, 1), RCP=plan.rcp, OUT_MODE=plan.out_mode, TMA=cfg["TMA"], WS=cfg["WS"],
        DEBUG=cfg.get("DEBUG", 0), MAD_T=cfg["MAD_T"], PIPELINE_QK=cfg.get("PIPELINE_QK", 0),
        P_PERM=int(bool(cfg["P_PERM"])), QD_ROW=qd_row, KD_TILE=int(kd_tile),
        VD_MODE=plan.vd_mode, DV_SPLIT=cfg.get("DV_SPLIT", 1), VT_EARLY=cfg.get("VT_EARLY", 0),
        EXP2_SUM=cfg.get("EXP2_SUM", 0))


def launch_options(cfg: dict) -> dict:
    """Triton's launch options for a resolved config: warps, pipeline stages and the register cap if any."""
    return {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
            **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {})}


def attention_fp8(q, k, v, *, recipe: Recipe | str = "zyfa", causal: bool = False, sm_scale: float | None = None,
                  window: int | None = None, q_descale=None, k_descale=None, v_descale=None,
                  config: dict | None = None):
    """FP8 attention forward (prefill) on Hopper.

    Args:
        q: (b, h, s_q, d_qk) torch.float8_e4m3fn; k: (b, h_kv, s_k, d_qk); v: (b, h_kv, s_k, d_v), h % h_kv == 0
            (GQA/MQA: query head i uses kv head i // (h // h_kv)). Last dim contiguous; other strides are
            copied to contiguous. (d_qk, d_v) in (64, 64), (128, 128), (256, 256), (192, 128) (MLA).
        recipe: a :class:`zyfa.recipes.Recipe` or its name; see the module docstring for what is honoured.
        causal: bottom-right aligned when s_q != s_k. window: HF sliding window (query at position p sees
            keys p - window < j <= p; implies the causal bound).
        sm_scale: default 1/sqrt(d_qk).
        q_descale: float, one-element tensor, (b, h) or (b, h_kv) (per kv-head group), or per query row
            (b, h, s_q) / (b, h, s_q, 1) (per-block or per-token Q descales, expanded to rows); k_descale: float,
            one-element tensor, (b, h_kv), or per key (b, h_kv, s_k) / (b, h_kv, s_k, 1), which must hold one
            value per KV tile of the recipe's ``block_n`` keys (per-block K descales); v_descale: float,
            one-element tensor or (b, h_kv); for ``v_scale='channel'`` per channel (b, h_kv, d_v) /
            (b, h_kv, 1, d_v), for ``v_scale='block'`` per key like k_descale. Default 1.0. Must be positive.
        config: launch overrides for tuning and ablations: BLOCK_M, num_warps, num_stages, maxnreg, TMA (device
            tensor descriptors, else pointer loads), WS (Triton's warp_specialize: no effect on sm_90 in Triton
            3.6), MAD_CVT (0 magic-number add after two fp32 clamps, 1 cvt.rni/rzi, 3/4/5/6 fma.rn.sat of x/128
            then the magic add, with an fp32 clamp at 126 / none / a packed one / none where the program's
            bound allows: :func:`default_mad_cvt`),
            MAD_T (1 exact t as the emulator; 0 one fused FFMA, faster, the default where
            :func:`fused_mad_is_exact`; see docs/KERNEL.md),
            PIPELINE_QK (1: S of the next KV tile computed before this tile's softmax, FA3's intra-warpgroup
            overlap written by hand; Triton 3.6 serialises it on sm_90), maxnreg None/0 = no cap,
            QK_K32 / PV_MODE (accumulation code, see the kernel), DV_SPLIT (2: P·V as two dots over O's column
            halves, the same arithmetic per element with half the registers for the per-tile product), VT_EARLY
            (1: Vᵀ's tile loaded at the top of each iteration beside K's, the same bits; no effect with
            PIPELINE_QK; refused with the fp32-accumulation recipes, whose compile it broke), EXP2_SUM (the rounded
            row sum of exp2 P: 1 from P's codes converted apart from its FP8 tensor, the default; 0 p rounded again
            in fp32; the same bits).
    Returns:
        (out, lse): out (b, h, s_q, d_v) bf16 (fp32 when the recipe's out_format is fp32), lse (b, h, s_q)
        fp32 natural log of the scores of the K it was given (for a K smoothed by the caller, without the
        q·mean(k) term; :func:`attention_fp8_quantized` adds it back); a row that sees no key gets out 0 and
        lse -inf.
    """
    b, h, h_kv, s_q, s_k, d_qk, d_v = validate_inputs(q, k, v, causal, sm_scale, window)
    check_fp8(q, k, v, (q_descale, k_descale, v_descale))
    dev = q.device
    qd = _per_row_descale(q_descale, "q_descale", b, h, s_q, dev)
    if qd is None:
        qd = descale_to_bh(1.0 if q_descale is None else q_descale, "q_descale", b, h, h_kv, dev)
    kd = _per_row_descale(k_descale, "k_descale", b, h_kv, s_k, dev)
    if kd is None:
        kd = descale_to_bh(1.0 if k_descale is None else k_descale, "k_descale", b, h_kv, h_kv, dev)
    plan = kernel_plan(recipe)
    block_n = (config or {}).get("BLOCK_N", plan.block_n)
    vd = _v_descale(v_descale, plan, b, h_kv, s_k, d_v, block_n, dev)
    if kd.dim() == 3:
        kd = k_descale_per_tile(kd, block_n)
    if qd.dim() == 3:  # one scalar per program where the Q blocks allow it (no per-row vector in the loop)
        qd_prog = q_descale_per_program(qd, resolve_config(d_qk, d_v, causal, plan, config)[0]["BLOCK_M"])
        qd = qd if qd_prog is None else qd_prog
    check_device(q)
    sm = 1.0 / math.sqrt(d_qk) if sm_scale is None else float(sm_scale)
    vt = prepare_vt(v, permute_k32=vt_key_order_for(config))
    return launch(q.contiguous(), k.contiguous(), vt, qd, kd, vd, plan=plan, seq_k=s_k, causal=causal,
                  sm_scale=sm, window=window, config=config)


def quantize_for_kernel(q, k, v, recipe: Recipe | str = "zyfa"):
    """Quantize float q, k, v as ``recipe`` says (the emulator's own quantizer, so both see the same FP8 values).

    Returns (q8, k8, v8, q_descale, k_descale, v_descale (b, h_kv)); FP8 tensors are float8_e4m3fn on the inputs'
    device. q_descale is (b, h), or (b, h, s_q) per query row for ``q_scale='block'``; k_descale (b, h_kv), or
    (b, h_kv, s_k) per key for ``k_scale='block'`` (:func:`k_descale_per_tile` gives the kernel's per-tile form).
    A recipe's ``qk_rotation`` and ``k_smoothing`` are applied here, by the emulator's quantizer.
    """
    return _quantize(q, k, v, recipe)[:6]


def _quantize(q, k, v, recipe):
    """:func:`quantize_for_kernel` plus the emulator's :class:`~zyfa.emulator.QuantizedInputs` (for K's mean)."""
    from zyfa.emulator import quantize_inputs

    r = get_recipe(recipe)
    kernel_plan(r)  # refuse unsupported recipes before doing any work
    qi = quantize_inputs(q, k, v, r)
    b, h = q.shape[:2]
    h_kv = k.shape[1]

    def descale(d, heads):
        d = d.float()
        if d.shape[3] > 1:  # per channel (V)
            return d.reshape(b, heads, d.shape[3]).contiguous()
        if d.shape[2] > 1:  # per token (block granularity, expanded by the quantizer)
            return d.reshape(b, heads, d.shape[2]).contiguous()
        return d.reshape(d.shape[0], d.shape[1]).expand(b, heads).contiguous()

    q8 = qi.q_values.to(_FP8)
    k8 = qi.k_values.to(_FP8)
    v8 = qi.v_values.to(_FP8)
    return q8, k8, v8, descale(qi.q_descale, h), descale(qi.k_descale, h_kv), descale(qi.v_descale, h_kv), qi


def attention_fp8_quantized(q, k, v, *, recipe: Recipe | str = "zyfa", causal: bool = False,
                            sm_scale: float | None = None, window: int | None = None, config: dict | None = None):
    """Quantize float (bf16/fp16/fp32) q, k, v per ``recipe`` and run :func:`attention_fp8`.

    The recipe's rotation and K smoothing happen in the quantizer (as in the emulator). With ``k_smoothing`` the
    kernel attends over K minus its per-channel mean: the output is unchanged (softmax is invariant to the per-row
    constant q·mean(k)), and the LSE returned is corrected by sm_scale·q_deq·mean(k), as the emulator's is, so it
    is the LSE of the unsmoothed (dequantized) scores.
    """
    validate_inputs(q, k, v, causal, sm_scale, window)
    recipe = get_recipe(recipe)
    kernel_plan(recipe)
    check_device(q)
    q8, k8, v8, qd, kd, vd, qi = _quantize(q, k, v, recipe)
    out, lse = attention_fp8(q8, k8, v8, recipe=recipe, causal=causal, sm_scale=sm_scale, window=window,
                             q_descale=qd, k_descale=kd, v_descale=vd, config=config)
    if recipe.k_smoothing:
        sm = 1.0 / math.sqrt(q.shape[3]) if sm_scale is None else float(sm_scale)
        q_deq = qi.q_values * qi.q_descale
        k_mean = qi.k_mean.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        lse = lse + sm * (q_deq @ k_mean.transpose(-1, -2)).squeeze(-1)
    return out, lse
