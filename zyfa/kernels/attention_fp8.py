"""FP8 (e4m3fn) attention forward on Hopper through Triton: the wrapper and the launch.

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

The roles live in their own modules, re-exported here (the public names of ``__all__``):
:mod:`zyfa.kernels.kernel_plan` (a recipe as the kernel's switches, the recipe fields honoured, the MAD bounds),
:mod:`zyfa.kernels.tuning` (launch defaults and overrides), :mod:`zyfa.kernels.validation` (input and descale
checks, all before Triton is imported, so bad input gets a clear error on any machine); the kernel itself is
:mod:`zyfa.kernels._triton_fp8`. docs/KERNEL.md says what the kernel does and why.
"""

from __future__ import annotations

import math
import os

import torch

from zyfa import checks
from zyfa.kernels.kernel_plan import (
    LOG2_448,
    LOG2E,
    MAD_FUSED_DRIFT,
    MAD_FUSED_DRIFT0,
    KernelPlan,
    default_mad_cvt,
    fused_mad_is_exact,
    kernel_plan,
    kernel_recipe,
    mad_code_bound,
    mad_codes_bounded,
    mad_cvt_for_descales,
    mad_m_safe,
    recipe_from_spec,
)
from zyfa.kernels.tuning import (
    HD128_CAUSAL_MAXNREG,
    P_PERM_DEFAULT,
    default_config,
    launch_constexprs,
    launch_options,
    resolve_config,
    vt_key_order_for,
)
from zyfa.kernels.validation import (
    SUPPORTED_HEAD_DIMS,
    SUPPORTED_QK_DIMS,
    SUPPORTED_V_DIMS,
    check_device,
    check_fp8,
    descale_to_bh,
    k_descale_per_tile,
    per_row_descale,
    q_descale_per_program,
    v_descale_for,
    validate_inputs,
)
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import Recipe

__all__ = [
    "HD128_CAUSAL_MAXNREG",
    "KernelPlan",
    "LAST_LAUNCH",
    "LOG2E",
    "LOG2_448",
    "MAD_FUSED_DRIFT",
    "MAD_FUSED_DRIFT0",
    "P_PERM_DEFAULT",
    "SUPPORTED_HEAD_DIMS",
    "SUPPORTED_QK_DIMS",
    "SUPPORTED_V_DIMS",
    "attention_fp8",
    "attention_fp8_quantized",
    "check_device",
    "check_fp8",
    "default_config",
    "default_mad_cvt",
    "descale_to_bh",
    "fused_mad_is_exact",
    "k32_key_order",
    "k_descale_per_tile",
    "kernel_plan",
    "kernel_recipe",
    "launch",
    "launch_constexprs",
    "launch_options",
    "mad_code_bound",
    "mad_codes_bounded",
    "mad_cvt_for_descales",
    "mad_m_safe",
    "per_row_descale",
    "prepare_vt",
    "q_descale_per_program",
    "quantize_for_kernel",
    "recipe_from_spec",
    "resolve_config",
    "v_descale_for",
    "validate_inputs",
    "vt_key_order_for",
]

_FP8 = torch.float8_e4m3fn
LAST_LAUNCH: dict = {}  # "kernel": the compiled kernel of the last launch (n_regs, n_spills for ablations)


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
            tensor descriptors, else pointer loads), MAD_CVT (0 magic-number add after two fp32 clamps, 3/4/6
            fma.rn.sat of x/128 then the magic add, with an fp32 clamp at 126 / none / none where the program's
            bound allows: :func:`default_mad_cvt`),
            MAD_T (1 exact t as the emulator; 0 one fused FFMA, faster, the default where
            :func:`fused_mad_is_exact`; see docs/KERNEL.md), maxnreg None/0 = no cap,
            QK_K32 / PV_MODE (accumulation code, see the kernel), DV_SPLIT (2: P·V as two dots over O's column
            halves, the same arithmetic per element with half the registers for the per-tile product), VT_EARLY
            (1: Vᵀ's tile loaded at the top of each iteration beside K's, the same bits; refused with the
            fp32-accumulation recipes, whose compile it broke). Keys of switches removed after they lost their
            A/B (PIPELINE_QK, WS, EXP2_SUM; MAD_CVT 1, 2, 5: docs/KERNEL.md) are refused.
    Returns:
        (out, lse): out (b, h, s_q, d_v) bf16 (fp32 when the recipe's out_format is fp32), lse (b, h, s_q)
        fp32 natural log of the scores of the K it was given (for a K smoothed by the caller, without the
        q·mean(k) term; :func:`attention_fp8_quantized` adds it back); a row that sees no key gets out 0 and
        lse -inf.
    """
    b, h, h_kv, s_q, s_k, d_qk, d_v = validate_inputs(q, k, v, causal, sm_scale, window)
    check_fp8(q, k, v, (q_descale, k_descale, v_descale))
    dev = q.device
    with checks.deferred():  # the descales' value checks answered together (one host sync, or the caller's)
        qd = per_row_descale(q_descale, "q_descale", b, h, s_q, dev)
        if qd is None:
            qd = descale_to_bh(1.0 if q_descale is None else q_descale, "q_descale", b, h, h_kv, dev)
        kd = per_row_descale(k_descale, "k_descale", b, h_kv, s_k, dev)
        if kd is None:
            kd = descale_to_bh(1.0 if k_descale is None else k_descale, "k_descale", b, h_kv, h_kv, dev)
        plan = kernel_plan(recipe)
        block_n = (config or {}).get("BLOCK_N", plan.block_n)
        vd = v_descale_for(v_descale, plan, b, h_kv, s_k, d_v, block_n, dev)
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
