"""AMD's Triton FP8 forward (``flash_attn.flash_attn_triton_amd``, from the ``flash-attn`` package) run on Hopper:
its forward module imported alone, with the launch config Triton's CUDA launcher takes, and one call of it.

docs/real_kernels.md says what the released package computes and why it is paired with
:data:`FLASH_ATTN_AMD_RECIPE`.

Exposed: ``FLASH_ATTN_AMD_RECIPE``, ``FLASH_ATTN_AMD_VERSIONS``, ``FLASH_ATTN_AMD_CONFIG``, ``check()``,
``flash_attn_amd_module()``, ``flash_attn_amd_forward(...)``, ``head_dims_refusal(q, k, v)``,
``prepare(q, k, v, ...)`` (the peer API's "prepare once, call many": the recipe's quantizer, then the forward on a
fixed output buffer).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import torch

from zyfa.emulator import quantize_inputs
from zyfa.peers.common import (
    Prepared,
    all_checks,
    cuda_check,
    dist_version,
    package_check,
    per_head_descales,
    read_release,
)

__all__ = ["FLASH_ATTN_AMD_CONFIG", "FLASH_ATTN_AMD_RECIPE", "FLASH_ATTN_AMD_VERSIONS", "check",
           "flash_attn_amd_forward", "flash_attn_amd_module", "head_dims_refusal", "prepare"]

# What flash-attn 2.8.3's Triton-AMD FP8 forward does (docs/real_kernels.md): triton-amd's numerics with P
# scaled by 448/amax over each BLOCK_M x BLOCK_N tile (the released code; later sources cast P unscaled). Its
# FP8 tl.dots pass no max_num_imprecise_acc, so each dot's k chain stays in the matrix unit (Q·K over the head
# dim; each tile's P·V a fresh dot, then scaled and added to its fp32 accumulator): accumulator=matrix_unit with a
# flush every tile. On a platform whose matrix unit keeps fp32 sums (mi355x) the two fields change nothing; on
# the H200 they are what it computes (scripts/compare_pairings.py: ratio 1.0000 on every input, where the
# per-step fp32 flush left 1.86x on Qwen2.5-Coder's layer 0).
FLASH_ATTN_AMD_RECIPE = "triton-amd:p_scale=tile_amax,accumulator=matrix_unit,accum_flush_tiles=1"
FLASH_ATTN_AMD_VERSIONS = ("2.8.3",)  # released versions whose forward was read (prefix match)
FLASH_ATTN_AMD_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "PRE_LOAD_V": False, "num_stages": 1, "num_warps": 4}


check = all_checks(
    lambda: cuda_check(min_major=9), lambda: package_check("triton", "triton"),
    lambda: package_check("flash_attn", "flash-attn"), lambda: package_check("einops", "einops"),
    lambda: read_release("flash-attn", FLASH_ATTN_AMD_VERSIONS, "the FP8 forward's"))


_FA_FWD = "flash_attn.flash_attn_triton_amd.fwd_prefill"


def flash_attn_amd_module():
    """Import its forward module (and its utils) alone, and give it our launch config.

    The package ``__init__`` imports the CUDA extension ``flash_attn_2_cuda``, or with the Triton-AMD switch
    (``FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE``) the whole Triton interface with its backward kernels. Neither
    is needed for the forward, so unless the package is already imported, the package module is created from
    its spec without running its ``__init__`` while the forward module is imported, then removed again (a later
    ``import flash_attn`` runs the real ``__init__``).
    """
    if _FA_FWD in sys.modules:
        fwd = sys.modules[_FA_FWD]
    elif "flash_attn" in sys.modules:
        fwd = importlib.import_module(_FA_FWD)
    else:
        spec = importlib.util.find_spec("flash_attn")
        if spec is None:
            raise RuntimeError("flash-attn is not installed")
        sys.modules["flash_attn"] = importlib.util.module_from_spec(spec)  # __init__ not run
        try:
            fwd = importlib.import_module(_FA_FWD)
        finally:
            sys.modules.pop("flash_attn", None)
    import triton

    # its FP8 path is gated on the AMD architecture (utils.arch_supports_fp8: HIP and gfx942), outside its numerics
    utils = sys.modules[_FA_FWD.rsplit(".", 1)[0] + ".utils"]
    utils.arch_supports_fp8 = lambda: True
    cfg = dict(FLASH_ATTN_AMD_CONFIG)
    stages, warps = cfg.pop("num_stages"), cfg.pop("num_warps")
    # its default config carries the AMD-only launch hint waves_per_eu, which Triton's CUDA launcher rejects
    fwd.attn_fwd.configs = [triton.Config(cfg, num_stages=stages, num_warps=warps)]
    return fwd


def head_dims_refusal(q, k, v) -> str | None:
    """Why it cannot take these tensors' head sizes (it takes one for Q, K and V, reading V's rows with Q's), or
    None."""
    d_q, d_k, d_v = q.shape[-1], k.shape[-1], v.shape[-1]
    if d_q == d_k == d_v:
        return None
    return f"flash-attn's Triton-AMD FP8 forward takes one head size for Q, K and V, not {d_q}/{d_k}/{d_v}"


def flash_attn_amd_forward(q8, k8, v8, q_descale, k_descale, v_descale, *, causal: bool, sm_scale: float,
                           out: torch.Tensor | None = None):
    """One call of flash-attn's Triton-AMD FP8 forward: q8 (b, h, s_q, d), k8/v8 (b, h_kv, s_k, d) e4m3fn;
    descales (b, h) for Q (this release indexes Q's by query head) and (b, h_kv) for K and V.
    Returns (out fp32 (b, h, s_q, d), lse fp32 natural log (b, h, s_q)). Used by the adapter and ``zyfa bench``.

    ValueError where Q, K and V do not share one head size: the kernel takes its head size from Q and reads V's rows
    with it (``ACTUAL_BLOCK_DMODEL``), so MLA's 192/128 would read past V's rows into the next ones."""
    why = head_dims_refusal(q8, k8, v8)
    if why:
        raise ValueError(why)
    fwd = flash_attn_amd_module()
    b, h, s_q, _ = q8.shape
    s_k = k8.shape[2]
    if out is None:
        out = torch.zeros((b, h, s_q, v8.shape[3]), dtype=torch.float32, device=q8.device)
    lse, _ = fwd.attention_prefill_forward_triton_impl(
        q8, k8, v8, out, float(sm_scale), None, bool(causal), None, "bhsd", None, None, s_q, s_k, None, None, 0.0,
        None, None, False, True, q_descale, k_descale, v_descale, None)
    return out, lse


def prepare(q, k, v, *, causal: bool, sm_scale: float) -> Prepared:
    """flash-attn's Triton-AMD FP8 forward prepared once: the FP8 values and per-head descales of
    :data:`FLASH_ATTN_AMD_RECIPE`'s quantizer and one fp32 output buffer, made before any call; it reads V as stored
    (no transpose). ``output()`` is that buffer (fp32), ``lse()`` the last call's."""
    qi = quantize_inputs(q, k, v, FLASH_ATTN_AMD_RECIPE)
    q8, k8, v8 = (t.to(torch.float8_e4m3fn).contiguous() for t in (qi.q_values, qi.k_values, qi.v_values))
    qd, kd, vd = per_head_descales(qi, q.shape[0], q.shape[1], k.shape[1])
    o = torch.zeros((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), dtype=torch.float32, device=q.device)
    last: list[torch.Tensor] = []

    def call() -> torch.Tensor:
        out, lse = flash_attn_amd_forward(q8, k8, v8, qd, kd, vd, causal=causal, sm_scale=sm_scale, out=o)
        last[:] = [lse]
        return out

    def lse() -> torch.Tensor:
        if not last:
            raise RuntimeError("flash-attn-triton-amd: lse() before the first call()")
        return last[0]

    return Prepared(call=call, output=lambda: o, lse=lse, details={
        "flash_attn": dist_version("flash-attn"),
        "launch_config": ",".join(f"{k}={v}" for k, v in FLASH_ATTN_AMD_CONFIG.items())})
