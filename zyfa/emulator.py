"""Tiled emulator of FP8 attention kernels: one code path, every recipe, CPU or CUDA tensors.

It follows a kernel's tile structure: an online softmax over KV tiles of ``recipe.block_n`` columns, the
running row max, the per-tile (or per-row-per-tile) P scales, the row-sum source, where each descale is
applied, the accumulator model and the output rounding (:mod:`zyfa.recipes` names each choice and its
source). FP8×FP8 products are exact in fp32, so the matmuls run as fp32 matmuls on the FP8 values; only the
order of fp32 sums differs from hardware, far below FP8 error (docs/DESIGN.md, 'Numerics that must be exact').
The GPU's own arithmetic comes from a platform (:mod:`zyfa.platforms`, default the recipe's ``platform``): on
one whose matrix unit truncates FP8 sums (``h200``) both Q·K and P·V go through its accumulator model.

Exposed: :func:`emulate`, :func:`quantize_inputs`, :func:`quantization_key` (with :data:`QUANT_FIELDS`),
:class:`Emulation`, :class:`QuantizedInputs`.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import torch

from zyfa import checks
from zyfa.emulator_tile import (
    Tiling,
    min_exp,
    online_max,
    p_exponent,
    p_fp8,
    pv_update,
    qk_tile,
    row_blocks_seeing,
    tile_row_sum,
    zero_if_neginf,
)
from zyfa.formats import get_format, round_to_bf16, round_to_fp8, round_to_fp8_fast
from zyfa.platforms import Platform, get_platform
from zyfa.quant import finite_screen, nonfinite_error, quantize
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import Recipe
from zyfa.rotation import rotate_qk

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2
# (d_qk, d_v) pairs the modelled kernels run (MHA 64/128/256, MLA 192/128 and absorbed 576/512); others are
# emulated with a warning (the arithmetic does not depend on d, but no kernel was read for them).
KERNEL_HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (192, 128), (576, 512))


class UnsupportedHeadDimWarning(UserWarning):
    """Head dims no modelled kernel runs: the emulation is of a hypothetical kernel."""


@dataclass
class QuantizedInputs:
    """Q/K/V as the kernel sees them: element values (FP8/INT8/bf16 values held in fp32) and descales.

    ``*_values * *_descale`` (broadcast) are the dequantized inputs. ``k_mean`` is the per-channel K mean that
    SageAttention's smoothing removed (zeros otherwise): the kernel attends over ``k - k_mean``.
    """

    q_values: torch.Tensor
    k_values: torch.Tensor
    v_values: torch.Tensor
    q_descale: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    k_mean: torch.Tensor

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) in float32 as the kernel saw them (K smoothing undone: softmax-invariant)."""
        return (self.q_values * self.q_descale, self.k_values * self.k_descale + self.k_mean,
                self.v_values * self.v_descale)


@dataclass
class Emulation:
    """Result of :func:`emulate`.

    Attributes:
        out: (b, h, s_q, d_v) float32 holding the recipe's output values (bf16/fp8 values where it rounds).
        lse: (b, h, s_q) float32 natural-log log-sum-exp (-inf for fully masked rows).
        q_deq, k_deq, v_deq: float32 dequantized inputs, for the FP64 reference of what the kernel saw.
        p_flushed: 0-d float64 tensor on the emulation's device: the fraction of unmasked probabilities rounded to
            0 (None: not counted). Left there until read, so an emulation in every layer of a decode step does not
            wait on the GPU for it.
        stats: counters as numbers, e.g. ``p_flushed_frac`` (reading it is a host sync on a GPU).
        platform: name of the platform whose arithmetic was emulated (:mod:`zyfa.platforms`).
    """

    out: torch.Tensor
    lse: torch.Tensor
    q_deq: torch.Tensor
    k_deq: torch.Tensor
    v_deq: torch.Tensor
    p_flushed: torch.Tensor | None = None
    platform: str = ""

    @property
    def stats(self) -> dict:
        return {"p_flushed_frac": 0.0 if self.p_flushed is None else float(self.p_flushed)}


# ---------------------------------------------------------------------------------------------- validation

def validate_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int | None = None,
                 sm_scale: float | None = None) -> None:
    """Clear errors for shapes, dtypes, the mask, the scale and non-finite values (shared by the emulator and
    the kernels): ValueError (TypeError for non-tensors) naming the first problem."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(x.shape)}")
        if not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    b, h, _, d_qk = q.shape
    for name, x in (("q", q), ("k", k), ("v", v)):
        if 0 in x.shape:
            raise ValueError(f"{name} has an empty dimension: shape {tuple(x.shape)} (batch, heads, seq and "
                             "head_dim must be >= 1)")
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"batch mismatch: q {b}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must share heads and seq: k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[3] != d_qk:
        raise ValueError(f"q and k head dims differ: {d_qk} vs {k.shape[3]}")
    if h % k.shape[1]:
        raise ValueError(f"q heads ({h}) must be a multiple of kv heads ({k.shape[1]})")
    if window is not None and not (isinstance(window, numbers.Integral) and not isinstance(window, bool)
                                   and window >= 1):
        raise ValueError(f"window must be an int >= 1 or None, got {window!r}")
    if sm_scale is not None:
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
            raise ValueError(f"sm_scale must be a number, got {sm_scale!r}")
        if not (math.isfinite(float(sm_scale)) and float(sm_scale) > 0):
            raise ValueError(f"sm_scale must be finite and > 0, got {sm_scale!r}")
    # one screen (zyfa.quant.finite_screen; a host sync unless zyfa.checks defers it); a failed one finds the operand
    checks.check(finite_screen([q, k, v]), lambda: next(
        (ValueError(f"{name} contains NaN or Inf") for name, x in (("q", q), ("k", k), ("v", v))
         if not bool(torch.isfinite(x).all())), None))


# ---------------------------------------------------------------------------------------------- quantization

def _descale(amax: torch.Tensor, top: float) -> torch.Tensor:
    """amax / top, or 1 where that is 0 (an all-zero group, or one so small that amax / top underflows in fp32:
    a zero descale would turn its codes into NaN), as zyfa.quant.quantize does."""
    # A tensor divisor, not a Python float: on CUDA, PyTorch divides by a CPU scalar as a multiply by its
    # reciprocal, which is not the IEEE quotient (1 ulp off for some amax), so GPU and CPU descales would differ.
    d = amax / torch.full((), top, dtype=amax.dtype, device=amax.device)  # filled there: no host copy
    return torch.where(d > 0, d, torch.ones_like(d))


def _quantize_int8(x: torch.Tensor, granularity: str, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 (SageAttention's Q/K): descale = amax/127, values RNE, clamped to ±127."""
    b, h, s, d = x.shape
    if granularity == "block":
        nb = -(-s // block)
        pad = torch.nn.functional.pad(x, (0, 0, 0, nb * block - s))
        amax = pad.abs().reshape(b, h, nb, block * d).amax(-1, keepdim=True)
        descale = _descale(amax, 127.0)
        descale = descale.repeat_interleave(block, dim=2)[:, :, :s]
    elif granularity == "head":
        amax = x.abs().amax(dim=(2, 3), keepdim=True)
        descale = _descale(amax, 127.0)
    elif granularity == "tensor":
        amax = x.abs().amax().reshape(1, 1, 1, 1)
        descale = _descale(amax, 127.0)
    else:
        raise ValueError(f"int8 quantization does not support granularity {granularity!r}")
    return torch.round(x / descale).clamp(-127, 127), descale


def _scaled_by_quantize(fmt: str, granularity: str) -> bool:
    """Whether :func:`_quantize_operand` sends an operand of this format and granularity through
    :func:`zyfa.quant.quantize` (which refuses NaN/Inf)."""
    return fmt not in ("fp32", "bf16", "int8") and granularity not in ("none", "channel")


def _quantize_operand(x: torch.Tensor, fmt: str, granularity: str, block: int, heads_kv: int,
                      checked: bool = False):
    """One operand -> (values, descale broadcastable to x). ``checked``: x is known finite (the NaN/Inf count
    of :func:`zyfa.quant.quantize`, a host sync, is skipped)."""
    x = x.float()
    if fmt == "fp32":
        return x, torch.ones((1, 1, 1, 1), dtype=x.dtype, device=x.device)
    if fmt == "bf16":
        return round_to_bf16(x), torch.ones((1, 1, 1, 1), dtype=x.dtype, device=x.device)
    b, h, s, d = x.shape
    if granularity == "head_kv":
        # Q grouped by its kv head (FA3's q_descale is (batch, num_heads_k)); heads are group-contiguous.
        grouped = x.reshape(b, heads_kv, (h // heads_kv) * s, d)
        values, descale = _quantize_operand(grouped, fmt, "head", block, heads_kv, checked)
        return values.reshape(b, h, s, d), descale.repeat_interleave(h // heads_kv, dim=1)
    if fmt == "int8":
        return _quantize_int8(x, granularity, block)
    if granularity == "none":
        return round_to_fp8_fast(x, fmt), torch.ones((1, 1, 1, 1), dtype=x.dtype, device=x.device)
    if granularity == "channel":
        amax = x.abs().amax(dim=2, keepdim=True)
        descale = _descale(amax, get_format(fmt).max_normal)
        return round_to_fp8_fast(x / descale, fmt), descale
    values, descale = quantize(x, fmt, granularity, block_size=block, check_finite=not checked)
    if granularity == "block":
        descale = descale.repeat_interleave(block, dim=2)[:, :, :s]
    return values, descale


# The recipe fields quantize_inputs reads: recipes equal on them see the same dequantized inputs and so share one FP64
# reference on those (accuracy.operator.runner, accuracy.cliffs.sweep; tests/zyfa/test_quantization_key.py checks it
# against the code)
QUANT_FIELDS = ("qk_rotation", "rotation_seed", "k_smoothing", "q_format", "q_scale", "scale_block_q", "k_format",
                "k_scale", "scale_block_kv", "v_format", "v_scale")


def quantization_key(recipe: Recipe) -> tuple:
    """``recipe``'s values of :data:`QUANT_FIELDS` (the seed only where Q and K are rotated): the key of a shared
    FP64 reference on its dequantized inputs."""
    return tuple(None if f == "rotation_seed" and recipe.qk_rotation == "none" else getattr(recipe, f)
                 for f in QUANT_FIELDS)


def quantize_inputs(q, k, v, recipe: Recipe | str, *, screened: bool = False) -> QuantizedInputs:
    """Quantize Q/K/V as ``recipe`` says (rotation of Q and K, K smoothing, formats, descale granularity).

    ``screened``: the caller has put q, k and v through :func:`validate_qkv`'s NaN/Inf screen already, in float32
    terms (:func:`emulate`, for 16- and 32-bit inputs), so the operands are not screened a second time."""
    recipe = get_recipe(recipe)
    heads_kv = k.shape[1]
    if recipe.qk_rotation != "none":  # before quantization; Q·Kᵀ is unchanged in exact arithmetic
        q, k = rotate_qk(q, k, recipe.qk_rotation, seed=recipe.rotation_seed)
    k = k.float()
    k_mean = torch.zeros((1, 1, 1, 1), dtype=torch.float32, device=k.device)
    if recipe.k_smoothing:
        k_mean = k.mean(dim=2, keepdim=True)
        k = k - k_mean
    ops = ((q, recipe.q_format, recipe.q_scale, recipe.scale_block_q), (k, recipe.k_format, recipe.k_scale,
           recipe.scale_block_kv), (v, recipe.v_format, recipe.v_scale, recipe.scale_block_kv))
    # One screen for the operands quantize would each count NaN/Inf in (three host syncs per call otherwise, in
    # every layer of every decode step; zyfa.checks may defer it further), and quantize skips its count. A failed
    # screen counts as quantize would have, in the same order, and raises its error (or nothing: a float32 sum that
    # overflowed). Screened in float32, as _quantize_operand passes them: a float64 beyond float32's range is Inf.
    scaled = [x for x, fmt, gran, _ in ops if _scaled_by_quantize(fmt, gran)]
    checked = bool(scaled) and len({x.device for x in scaled}) == 1
    if checked and not screened:
        checks.check(finite_screen(scaled), lambda: next(
            (e for e in (nonfinite_error(x.float()) for x in scaled) if e is not None), None))
    # only an operand screened here skips quantize's count
    (qv, qd), (kv_, kd), (vv, vd) = (
        _quantize_operand(x, fmt, gran, block, heads_kv, checked and _scaled_by_quantize(fmt, gran))
        for x, fmt, gran, block in ops)
    return QuantizedInputs(qv, kv_, vv, qd, kd, vd, k_mean)


# ---------------------------------------------------------------------------------------------- emulate

def emulate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, recipe: Recipe | str, *, causal: bool = False,
            sm_scale: float | None = None, window: int | None = None, q_chunk: int | None = None,
            trace: list | None = None, platform: str | Platform | None = None) -> Emulation:
    """Emulate one FP8 attention forward kernel, tile by tile.

    Args:
        q: (b, h, s_q, d_qk) float tensor (any float dtype; the original, unquantized values).
        k: (b, h_kv, s_k, d_qk); v: (b, h_kv, s_k, d_v). h % h_kv == 0 (GQA/MQA).
        recipe: a :class:`Recipe` or its name.
        causal: bottom-right aligned causal mask; window: HF sliding window (query at p sees p-window < j <= p).
        sm_scale: softmax scale, default 1/sqrt(d_qk).
        q_chunk: query rows processed at once (rounded to a multiple of block_m); default 2048 on CPU, on a
            GPU as many as keep a (chunk, block_n) tile of all heads near 2^24 elements (fewer launches).
        trace: if a list, one dict per (query chunk, KV tile) is appended with the tile's ``t`` (log2
            probabilities), ``p8`` (rounded, scaled P), ``e`` (P exponent per row), ``row_sum`` (what was added
            to l), ``allowed`` (mask) and ``rows``/``cols``: for tests and diagnostics; costs memory.
        platform: the GPU whose arithmetic is emulated (a name of :data:`zyfa.platforms.PLATFORMS` or a
            :class:`~zyfa.platforms.Platform`); default the recipe's ``platform``. On a platform that truncates
            FP8 sums (``h200``), Q·K (FP8 Q and K) and P·V (FP8 P) go through its accumulator model: kept in the
            unit (``accumulator="matrix_unit"``: Q·K over the head dim, P·V flushed every
            ``accum_flush_tiles`` tiles) or flushed into fp32 every k step (``accumulator="fp32"``).
    Returns:
        :class:`Emulation` with the output, the LSE, the dequantized inputs and stats.
    """
    recipe = get_recipe(recipe)
    plat = get_platform(recipe.platform if platform is None else platform)
    validate_qkv(q, k, v, window=window, sm_scale=sm_scale)
    b, h, s_q, d_qk = q.shape
    h_kv, s_k, d_v = k.shape[1], k.shape[2], v.shape[3]
    if (d_qk, d_v) not in KERNEL_HEAD_DIMS:
        warnings.warn(f"head dims {d_qk}/{d_v} (qk/v) match no kernel this emulator models (they run "
                      f"{', '.join(f'{a}/{b_}' for a, b_ in KERNEL_HEAD_DIMS)}): emulated as the same tiling "
                      "would compute them", UnsupportedHeadDimWarning, stacklevel=2)
    group = h // h_kv
    sm_scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else float(sm_scale)
    dev = q.device

    # validate_qkv screened q, k, v; a float64 input beyond float32's range passes it (finite in float64) and is
    # left to quantize_inputs' own screen, which refuses it as quantize does
    qi = quantize_inputs(q, k, v, recipe, screened=torch.float64 not in (q.dtype, k.dtype, v.dtype))
    q_deq, k_deq, v_deq = qi.dequantized()

    # Expand K/V (and their descales) to the query heads; heads are group-contiguous (HF repeat_kv).
    def per_q_head(x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(group, dim=1) if x.shape[1] == h_kv and group > 1 else x

    k8, v8 = per_q_head(qi.k_values), per_q_head(qi.v_values)
    kd = per_q_head(qi.k_descale).expand(b, h, s_k, 1) if qi.k_descale.shape[2] > 1 else per_q_head(qi.k_descale)
    vd = per_q_head(qi.v_descale)
    k8t = k8.transpose(-1, -2)
    kdt = kd.transpose(-1, -2)  # (b|1, h|1, 1, s_k|1)

    p_fmt = get_format(recipe.p_format) if recipe.p_is_fp8 else None
    fmax = p_fmt.max_normal if p_fmt is not None else 1.0
    log2_fmax = math.log2(fmax)
    folded = recipe.log2e_folded
    # c = sm_scale·log2(e) folded on the host (CK MakeKargs); Triton-AMD keeps natural-log units.
    score_scale = torch.full((), sm_scale * LOG2E if folded else sm_scale, dtype=torch.float32, device=dev)
    to_log2 = (lambda d: d) if folded else (lambda d: d * LOG2E)

    block_m, block_n = recipe.tiles(d_qk)
    # The platform's accumulation: kept bits of Q·K and of P·V (Platform.accum_bits; None: fp32), and whether the
    # kernel keeps its sums in the matrix unit (matrix_unit) or flushes every k step into fp32 (fp32).
    in_unit = recipe.accumulator == "matrix_unit"
    qk_truncates, pv_truncates = recipe.truncated_gemms(plat)
    qk_bits = plat.accum_bits if qk_truncates else None
    pv_bits_any = plat.accum_bits if pv_truncates else None
    # The exponent a subnormal operand counts at in that accumulator: its format's smallest normal one (Q·K: Q's
    # and K's formats; P·V: P's and V's; the rounded_mma row sum's ones vector has exponent 0, any bound fits).
    qk_min = (min_exp(recipe.q_format), min_exp(recipe.k_format)) if qk_bits is not None else None
    pv_min = (min_exp(recipe.p_format), min_exp(recipe.v_format)) if pv_bits_any is not None else None
    ones_min = None if pv_min is None else (pv_min[0], 0)
    tiling = Tiling(recipe=recipe, dev=dev, fmax=fmax, log2_fmax=log2_fmax, score_scale=score_scale,
                     to_log2=to_log2, block_m=block_m, block_n=block_n, k_step=plat.k_step, in_unit=in_unit,
                     qk_bits=qk_bits, qk_min=qk_min, pv_bits=pv_bits_any, pv_min=pv_min, ones_min=ones_min,
                     two_level=in_unit and pv_bits_any is not None,
                     tile_factor_needed=recipe.p_scale == "tile_amax" or recipe.v_descale == "tile")
    if q_chunk is None:
        q_chunk = 2048 if dev.type == "cpu" else max(2048, (1 << 24) // (b * h * block_n))
    q_chunk = max(block_m, (q_chunk // block_m) * block_m)
    s_q_pad = -(-s_q // block_m) * block_m
    q8 = torch.nn.functional.pad(qi.q_values, (0, 0, 0, s_q_pad - s_q))
    qd = qi.q_descale
    if qd.shape[2] > 1:
        qd = torch.nn.functional.pad(qd, (0, 0, 0, s_q_pad - s_q), value=1.0)
    k_pos = torch.arange(s_k, device=dev)

    out = torch.empty((b, h, s_q_pad, d_v), dtype=torch.float32, device=dev)
    lse = torch.empty((b, h, s_q_pad), dtype=torch.float32, device=dev)
    flushed = torch.zeros((), dtype=torch.float64, device=dev)
    counted = torch.zeros((), dtype=torch.float64, device=dev)

    for r0 in range(0, s_q_pad, q_chunk):
        r1 = min(r0 + q_chunk, s_q_pad)
        rows = r1 - r0
        q_pos = torch.arange(r0, r1, device=dev) + (s_k - s_q)
        row_valid = (torch.arange(r0, r1, device=dev) < s_q)[:, None]
        # KV tiles any row of this chunk can see (fully masked tiles are exact no-ops: skipped, like hardware).
        # positions on the host (q_pos[i] = r0 + i + s_k - s_q), not read back from the device
        last_pos = min(r1, s_q) - 1 + (s_k - s_q)  # r0 < s_q always (s_q_pad < s_q + block_m)
        hi = min(s_k, last_pos + 1) if causal or window is not None else s_k
        lo = 0 if window is None else max(0, r0 + (s_k - s_q) - window + 1)
        t_first, t_last = lo // block_n, (-(-hi // block_n) if hi > lo else lo // block_n)

        qc = q8[:, :, r0:r1]
        qdc = qd[:, :, r0:r1] if qd.shape[2] > 1 else qd
        m = torch.full((b, h, rows, 1), -math.inf, dtype=torch.float32, device=dev)
        l = torch.zeros((b, h, rows, 1), dtype=torch.float32, device=dev)
        e_run = torch.zeros((b, h, rows, 1), dtype=torch.float32, device=dev)
        acc = torch.zeros((b, h, rows, d_v), dtype=torch.float32, device=dev)  # fp32 (second-level) acc
        acc_tc = None  # Hopper tensor-core accumulator (registers), when it is modelled (zeros: empty)
        if tiling.two_level:
            acc_tc = torch.zeros_like(acc)
        starts = range(t_first * block_n, t_last * block_n, block_n)
        for c0 in (reversed(starts) if recipe.kv_order == "reverse" else starts):
            c1 = min(c0 + block_n, s_k)
            kp = k_pos[c0:c1]
            allowed = row_valid & torch.ones((1, c1 - c0), dtype=torch.bool, device=dev)
            if causal or window is not None:  # a window implies the causal bound (reference/attention.py)
                allowed = allowed & (kp[None, :] <= q_pos[:, None])
            if window is not None:
                allowed = allowed & (kp[None, :] > q_pos[:, None] - window)
            # Row blocks (one kernel program each) that see none of this tile skip it, as the kernels do: only
            # the contiguous run of blocks that see it is computed (an exact no-op for the others, except that
            # the Hopper accumulator model would otherwise truncate their accumulator once more).
            a, z = 0, rows
            if causal or window is not None:
                seen = row_blocks_seeing(r0, rows, block_m, s_q, s_k, c0, c1, window)
                if seen is None:
                    continue
                a, z = seen
            allowed = allowed[a:z]
            st = _RowSlice(a, z, m=m, l=l, e_run=e_run, acc=acc, acc_tc=acc_tc)
            m, l, e_run, acc, acc_tc = st.m, st.l, st.e_run, st.acc, st.acc_tc
            x = qk_tile(tiling, qc[:, :, a:z], k8t[..., c0:c1], qdc[:, :, a:z] if qdc.shape[2] > 1 else qdc,
                         kdt[..., c0:c1] if kdt.shape[-1] > 1 else kdt, allowed)
            m, alpha, t = online_max(tiling, m, x)
            e_new, e_run, alpha = p_exponent(tiling, t, e_run, alpha)
            p8, p_sum_src, unscale = p_fp8(tiling, t, e_new, e_run)
            row_sum = tile_row_sum(tiling, p8, p_sum_src)
            l = alpha * l + row_sum
            if trace is not None:
                trace.append({"rows": (r0 + a, r0 + z), "cols": (c0, c1), "t": t, "p8": p8, "e": e_run.clone(),
                              "row_sum": row_sum, "allowed": allowed})

            if p_fmt is not None:
                flushed += ((p8 == 0) & allowed).sum()
                counted += allowed.sum() * (b * h)  # allowed is (rows, cols), p8 is (b, h, rows, cols)

            acc, acc_tc = pv_update(tiling, p8, v8[..., c0:c1, :], vd, acc, acc_tc, alpha, unscale, c0)
            m, l, e_run, acc, acc_tc = st.store(m=m, l=l, e_run=e_run, acc=acc, acc_tc=acc_tc)

        if acc_tc is not None:
            acc = acc + acc_tc
        # Normalize: O = acc / l (or · fp32(1/l)); rows that see no key (fully masked) give 0 and lse -inf. A
        # row that sees keys but whose l is not a positive number (scores overflowed to ±inf, or NaN) gives
        # NaN: an overflow is a finding, never shown as a masked row.
        sees = (q_pos >= 0) if (causal or window is not None) else torch.ones_like(q_pos, dtype=torch.bool)
        sees = (sees & row_valid[:, 0] & (s_k > 0))[:, None]
        ok = (l > 0) & torch.isfinite(l)
        bad = sees & ~ok
        safe_l = torch.where(ok, l, torch.ones_like(l))
        o = acc / safe_l if recipe.reciprocal == "div" else acc * (1.0 / safe_l)
        o = torch.where(ok, o, torch.where(bad, torch.full_like(o, math.nan), torch.zeros_like(o)))
        if recipe.v_descale == "end":
            end = vd if recipe.p_scale != "fmax" else vd * (1.0 / fmax)
            o = o * end
        elif recipe.p_scale == "fmax":
            o = o * (1.0 / fmax)
        out[:, :, r0:r1] = o
        log2_l = torch.log2(l) - e_run
        masked_lse = torch.where(bad, torch.full_like(l, math.nan), torch.full_like(l, -math.inf))
        lse[:, :, r0:r1] = torch.where(
            ok, (zero_if_neginf(m) * (1.0 if folded else LOG2E) + log2_l) * LN2, masked_lse
        ).squeeze(-1)

    out, lse = out[:, :, :s_q], lse[:, :, :s_q]
    if recipe.k_smoothing:
        # The kernel's scores lack q·mean(k) (softmax-invariant); its LSE is corrected by that term.
        lse = lse + sm_scale * (q_deq @ per_q_head(qi.k_mean).transpose(-1, -2)).squeeze(-1)
    out = _round_out(out, recipe)
    # left on the device until read (no probabilities counted: none flushed either, so 0 / 1)
    return Emulation(out=out, lse=lse, q_deq=q_deq, k_deq=k_deq, v_deq=v_deq, p_flushed=flushed / counted.clamp(min=1),
                     platform=plat.name)



class _RowSlice:
    """Rows ``a:z`` of the per-row running state (views), and ``store`` to write the tile's new state back."""

    def __init__(self, a: int, z: int, **full: torch.Tensor | None):
        self.a, self.z, self.full = a, z, full
        self.whole = a == 0 and all(t is None or t.shape[2] == z for t in full.values())
        for name, t in full.items():
            setattr(self, name, t if t is None or self.whole else t[:, :, a:z])

    def store(self, **new: torch.Tensor | None) -> tuple:
        if self.whole:
            return tuple(new.values())
        for name, t in new.items():
            if t is not None:
                self.full[name][:, :, self.a:self.z] = t
        return tuple(self.full[name] for name in new)


def _round_out(o: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    if recipe.out_format == "fp32":
        return o
    if recipe.out_format == "bf16_rne":
        return round_to_bf16(o, "rne")
    if recipe.out_format == "bf16_trunc":
        return round_to_bf16(o, "trunc")
    # e4m3fn output (cuDNN FP8 on Hopper): scaled by the output amax, rounded, descaled.
    amax = o.abs().amax()
    scale = torch.where(amax > 0, get_format("e4m3fn").max_normal / amax, torch.ones_like(amax))
    return round_to_fp8(o * scale, "e4m3fn") / scale
