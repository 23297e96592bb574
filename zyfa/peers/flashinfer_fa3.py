"""FA3's FP8 forward as FlashInfer (``flashinfer-python``) builds it for sm_90: one call of its single-sequence
prefill, and the recipe quantizer's values laid out as it takes them.

Exposed: ``FLASHINFER_FA3_RECIPE``, ``FLASHINFER_VERSIONS``, ``FLASHINFER_FA3_DIMS``, ``PACK_MANIFEST``, ``check()``,
``packed_head_dims()``, ``flashinfer_fa3_forward(...)``, ``flashinfer_fa3_inputs(...)``, ``head_dims_refusal(q, k, v)``,
``prepare(q, k, v, ...)``
(the peer API's "prepare once, call many": the recipe's quantizer and FlashInfer's layout made once, then one launch
per sequence per call).
"""

from __future__ import annotations

import functools
import math

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

__all__ = ["FLASHINFER_FA3_DIMS", "FLASHINFER_FA3_RECIPE", "FLASHINFER_VERSIONS", "PACK_MANIFEST", "check",
           "flashinfer_fa3_forward", "flashinfer_fa3_inputs", "head_dims_refusal", "packed_head_dims", "prepare"]

# What FlashInfer 0.7.4's FA3-derived FP8 prefill on sm_90 computes (its hopper/quantization mainloop and
# hopper/variants.cuh StandardFP8Attention, docs/real_kernels.md): FA3's numerics (exp2 of the scaled score minus
# the scaled row max, fp32 row sum of the unscaled P, the FP8 wgmma accumulator of P·V never flushed, O times
# v_scale / (448 · l) at the end, bf16 out), except that P is multiplied by 448 (the e4m3 maximum) before its
# cast where FA3 adds 8 to the exponent (×2^8), Q is scaled per query head (FA3 per KV head), and the tiles
# differ. Its mainloop visits KV tiles from the last to the first (kv_order=reverse), as FA3's does: on the H200
# the forward-order emulation missed it by 6-22% in error on four of the real layers, the reverse one matched.
# FlashInfer's single-prefill FP8 tiles (CTA_Q x CTA_KV by head dim, prefill_sm90.cuh), not FA3's; reverse KV order.
FLASHINFER_FA3_RECIPE = ("fa3:p_scale=fmax,q_scale=head,head_dim_tiles=64:192x128|128:128x192|256:128x128,"
                         "kv_order=reverse")
FLASHINFER_VERSIONS = ("0.7.4",)  # released versions whose FP8 prefill was read (prefix match)
FLASHINFER_FA3_DIMS = ((64, 64), (128, 128), (256, 256))  # its FP8 sm_90 prefill's head dims (prefill_sm90.cuh)


# written beside the flashinfer package by scripts/build_flashinfer_fa3.py: the head dims whose modules it built
PACK_MANIFEST = "flashinfer-fa3-pack.json"


@functools.cache
def packed_head_dims() -> tuple[int, ...] | None:
    """The head dims a FlashInfer FA3 pack holds (its manifest beside the ``flashinfer`` package), or None where
    FlashInfer is installed whole (it builds any head dim on first use). Another head dim on a packed install
    would start FlashInfer's JIT build, which the pack cannot do: the implementation refuses it instead. Read once
    per process (the implementation's limits ask on every call, a model's layers many times a pass)."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.find_spec("flashinfer")
    if spec is None or not spec.origin:
        return None
    manifest = Path(spec.origin).resolve().parent.parent / PACK_MANIFEST
    if not manifest.is_file():
        return None
    try:
        return tuple(sorted(int(d) for d in json.loads(manifest.read_text())["modules"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


check = all_checks(
    lambda: cuda_check(exact_major=9), lambda: package_check("flashinfer", "flashinfer-python"),
    lambda: read_release("flashinfer-python", FLASHINFER_VERSIONS, "the FP8 prefill's"))


def flashinfer_fa3_forward(q8, k8, v8, scale_q, scale_k, scale_v, *, causal: bool, sm_scale: float):
    """One call of FlashInfer's FA3 FP8 prefill (``single_prefill_with_kv_cache``, ``backend="fa3"``): one
    sequence in its NHD layout, q8 (s_q, h, d), k8/v8 (s_k, h_kv, d) e4m3fn; the dequantization scales fp32 (h,)
    for Q and (h_kv,) for K and V. Causal masks align bottom-right, as ours. Returns (out bf16 (s_q, h, d), lse
    natural log (s_q, h)); FlashInfer's own LSE is in base 2. Used by the adapter and ``zyfa bench``."""
    import flashinfer

    out, lse2 = flashinfer.single_prefill_with_kv_cache(
        q8, k8, v8, scale_q=scale_q, scale_k=scale_k, scale_v=scale_v, o_dtype=torch.bfloat16, causal=bool(causal),
        sm_scale=float(sm_scale), backend="fa3", return_lse=True)
    return out, lse2 * math.log(2.0)


def flashinfer_fa3_inputs(qi, h: int, h_kv: int):
    """The recipe quantizer's FP8 values and descales, per batch element in FlashInfer's layout: a list of
    (q8 (s_q, h, d), k8 (s_k, h_kv, d), v8, scale_q (h,), scale_k (h_kv,), scale_v (h_kv,))."""
    b = qi.q_values.shape[0]
    qd, kd, vd = per_head_descales(qi, b, h, h_kv)
    fp8 = [t.to(torch.float8_e4m3fn) for t in (qi.q_values, qi.k_values, qi.v_values)]
    return [tuple(t[i].transpose(0, 1).contiguous() for t in fp8) + (qd[i], kd[i], vd[i]) for i in range(b)]


def head_dims_refusal(q, k, v) -> str | None:
    """Why its FP8 prefill cannot take these tensors' head dims (:data:`FLASHINFER_FA3_DIMS`), or None."""
    if (q.shape[-1], v.shape[-1]) in FLASHINFER_FA3_DIMS:
        return None
    return (f"FlashInfer's FP8 prefill takes d_qk = d_v in {', '.join(str(d) for d, _ in FLASHINFER_FA3_DIMS)}, "
            f"not {q.shape[-1]}/{v.shape[-1]}")


def prepare(q, k, v, *, causal: bool, sm_scale: float) -> Prepared:
    """FA3's FP8 forward from FlashInfer prepared once: the FP8 values and descales of :data:`FLASHINFER_FA3_RECIPE`'s
    quantizer in FlashInfer's NHD layout (made here, outside any timing; it reads V as stored); ``call()`` launches
    once per sequence. ``output()`` and ``lse()``: the last call's, as (b, h, s_q, d_v) fp32 and (b, h, s_q).
    ValueError for head dims its FP8 prefill does not take (:data:`FLASHINFER_FA3_DIMS`)."""
    why = head_dims_refusal(q, k, v)
    if why:
        raise ValueError(why)
    per_seq = flashinfer_fa3_inputs(quantize_inputs(q, k, v, FLASHINFER_FA3_RECIPE), q.shape[1], k.shape[1])
    last: list[list[tuple[torch.Tensor, torch.Tensor]]] = []

    def call() -> list[torch.Tensor]:
        res = [flashinfer_fa3_forward(*t, causal=causal, sm_scale=sm_scale) for t in per_seq]
        last[:] = [res]
        return [o for o, _ in res]

    def latest(i: int) -> torch.Tensor:
        if not last:
            raise RuntimeError("flashinfer-fa3: output() before the first call()")
        return torch.stack([r[i].transpose(0, 1).float() for r in last[0]])

    return Prepared(call=call, output=lambda: latest(0), lse=lambda: latest(1),
                    details={"flashinfer": dist_version("flashinfer-python"), "backend": "fa3"})
