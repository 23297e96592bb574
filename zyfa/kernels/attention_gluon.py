"""Gluon FP8 attention (sm_90a) with the ``zyfa-hopper`` numerics: the technique-2 (ping-pong) ablation.

:func:`attention_fp8_gluon` runs :mod:`zyfa.kernels._gluon_fp8` with one consumer warpgroup per program
(``pingpong=False``) or two consumer warpgroups in ping-pong with a TMA producer warp (``pingpong=True``). Both use
exactly the P handling the Triton kernel runs for ``zyfa-hopper`` (fused-MAD e4m3fn codes, per-row power-of-two P
exponent, rounded row sum, accumulator flushed into fp32 every KV tile), so the two schedules can be timed against
each other and against :func:`zyfa.kernels.attention_fp8.attention_fp8` with the same numerics.

Scope: head dim 128, non-causal, s_q and s_k multiples of 128, float8_e4m3fn q/k/v with descales (float,
one-element tensor, (b, h) / (b, h_kv) as :func:`~zyfa.kernels.attention_fp8.attention_fp8` takes them), GQA, bf16
output and fp32 LSE. Validation reuses attention_fp8's helpers and runs before Triton / Gluon is imported.
"""

from __future__ import annotations

import math

import torch

from zyfa.kernels.attention_fp8 import prepare_vt
from zyfa.kernels.kernel_plan import LOG2E, kernel_plan
from zyfa.kernels.validation import check_device, check_fp8, descale_to_bh, validate_inputs

__all__ = ["GLUON_RECIPE", "GLUON_TILE", "attention_fp8_gluon"]

GLUON_RECIPE = "zyfa-hopper"  # the numerics the Gluon kernel implements (its P handling and accumulator)
GLUON_TILE = 128  # s_q and s_k must be multiples of this (64-row warpgroups, 128-row ping-pong blocks, 128-key tiles)
LAST_LAUNCH: dict = {}


def _validate_gluon(q, k, v, causal, sm_scale):
    """attention_fp8's checks, then the Gluon kernel's narrower scope (hd128, non-causal, whole tiles)."""
    b, h, h_kv, s_q, s_k, d_qk, d_v = validate_inputs(q, k, v, causal, sm_scale, None)
    if causal:
        raise ValueError("attention_fp8_gluon is non-causal only (causal=True is not implemented in the Gluon "
                         "kernel); use attention_fp8(..., causal=True)")
    if (d_qk, d_v) != (128, 128):
        raise ValueError(f"attention_fp8_gluon supports head dim 128 only (d_qk = d_v = 128), got d_qk={d_qk}, "
                         f"d_v={d_v}; use attention_fp8 for other head dims")
    if s_q % GLUON_TILE or s_k % GLUON_TILE:
        raise ValueError(f"attention_fp8_gluon needs seq lengths that are multiples of {GLUON_TILE} (no masked "
                         f"tails), got s_q={s_q}, s_k={s_k}; use attention_fp8 for other lengths")
    return b, h, h_kv, s_q, s_k


def attention_fp8_gluon(q8, k8, v8, q_descale, k_descale, v_descale, *, pingpong: bool,
                        sm_scale: float | None = None, config: dict | None = None):
    """FP8 attention forward (non-causal, hd128) in Gluon with the ``zyfa-hopper`` numerics.

    Args:
        q8: (b, h, s_q, 128) torch.float8_e4m3fn; k8, v8: (b, h_kv, s_k, 128), h % h_kv == 0. Last dim
            contiguous (other strides are copied to contiguous); s_q, s_k multiples of 128.
        q_descale, k_descale, v_descale: float, one-element tensor, (b, h) / (b, h_kv) (see attention_fp8).
        pingpong: False: one consumer warpgroup per program (64 rows); True: two consumer warpgroups in ping-pong
            plus a 1-warp TMA producer (128 rows per program).
        sm_scale: default 1/sqrt(128).
        config: kernel overrides for ablations: pingpong STAGES (default 4), LAG (2: release K/V tile j-2 after
            the S wait, the softmax overlaps the warpgroup's own P·V; 1: wait for both first), REG_B, REG_LOAD;
            one-warpgroup UNROLL2 (0 default; 1 spills), ptx_options.
    Returns:
        (out, lse): out (b, h, s_q, 128) bf16, lse (b, h, s_q) fp32 natural log.
    """
    if not isinstance(pingpong, bool):
        raise TypeError(f"pingpong must be a bool, got {type(pingpong).__name__}")
    b, h, h_kv, s_q, s_k = _validate_gluon(q8, k8, v8, False, sm_scale)
    check_fp8(q8, k8, v8, (q_descale, k_descale, v_descale))
    dev = q8.device
    qd = descale_to_bh(1.0 if q_descale is None else q_descale, "q_descale", b, h, h_kv, dev)
    kd = descale_to_bh(1.0 if k_descale is None else k_descale, "k_descale", b, h_kv, h_kv, dev)
    vd = descale_to_bh(1.0 if v_descale is None else v_descale, "v_descale", b, h_kv, h_kv, dev)
    check_device(q8)
    plan = kernel_plan(GLUON_RECIPE)
    # the kernel hard-codes this plan's switches (see _gluon_fp8's docstring); a changed recipe must fail loudly
    assert (plan.exp_mad, plan.p_scale, plan.tile_gran, plan.rowsum_rounded, plan.pv_mode, plan.rcp,
            plan.out_mode, plan.mad_rounding) == (True, 3, False, True, 4, False, 0, "trunc"), plan
    sm = 1.0 / math.sqrt(128) if sm_scale is None else float(sm_scale)

    from zyfa.kernels import _gluon_fp8 as G
    from zyfa.kernels._triton_fp8 import ensure_allocator

    ensure_allocator()  # global scratch for the in-kernel TMA descriptors
    cfg = dict(config or {})
    fn, const, rows = G.kernel_and_constexprs(pingpong, s_k, cfg)
    q = q8.contiguous()
    k = k8.contiguous()
    vt = prepare_vt(v8, permute_k32=False)  # (b, h_kv, 128, s_k): s_k % 128 == 0, so no padding
    out = torch.empty((b, h, s_q, 128), dtype=torch.bfloat16, device=dev)
    lse = torch.empty((b, h, s_q), dtype=torch.float32, device=dev)
    extra = {"ptx_options": cfg["ptx_options"]} if cfg.get("ptx_options") else {}
    grid = (s_q // rows, b * h)
    LAST_LAUNCH["kernel"] = fn[grid](q, k, vt, out, lse, qd, kd, vd, s_q, s_k, h, h_kv, sm * LOG2E,
                                     float(plan.mad_bias), float(plan.e_cap), num_warps=4, **const, **extra)
    return out, lse
