"""The built-in implementations: our Triton kernel and the real peer kernels of :mod:`zyfa.peers`, as
:class:`~zyfa.accuracy.implementations.base.Implementation` objects (looked up by name in
:mod:`zyfa.accuracy.implementations.registry`).

Built-ins (:func:`zyfa.accuracy.implementations.registry.builtin_names`):

- ``triton:<recipe>``: our Triton FP8 kernel (:mod:`zyfa.kernels.attention_fp8`), one per recipe it honours.
- ``cute:<recipe>``: our CuTe DSL FP8 kernel (:mod:`zyfa.kernels.attention_cute`, nvidia-cutlass-dsl, imported only
  where it runs), for the specs :func:`zyfa.kernels.cute_plan.cute_plan` takes (the ``zyfa-hopper`` numerics); no
  sliding window, head dims :data:`zyfa.kernels.cute_plan.CUTE_HEAD_DIMS` (others are unsupported rows). Paired,
  as ``triton:``, with the recipe as our kernels compute it (forward KV order, no head-dim tiles).
- ``cudnn-fp8``: cuDNN's FP8 SDPA through nvidia-cudnn-frontend's graph API (``sdpa_fp8``). On Hopper it
  writes FP8 output, so ``scale_o`` must be chosen: ``cudnn-fp8`` takes 448 / amax(O) from a first pass,
  ``cudnn-fp8:oracle-scale`` from the FP64 oracle's output amax. The choice is in the row (``scale_o_choice``).
- ``sdpa-bf16:cudnn``, ``sdpa-bf16:flash``: PyTorch SDPA in BF16 on one backend, paired with ``bf16``.
- ``sdpa-fp32``: PyTorch SDPA in fp32 on any device and backend, paired with ``fp32``: the FP32 baseline of the
  long-context tasks (a window or a causal mask with s_q != s_k is passed as an explicit bottom-right mask).
- ``flash-attn-triton-amd``: AMD's Triton FP8 forward from the ``flash-attn`` package
  (``flash_attn.flash_attn_triton_amd.fwd_prefill``), installed as a package; the adapter sets its launch
  config (the AMD-only ``waves_per_eu`` hint left out) and imports its forward alone. docs/real_kernels.md says
  which numerics the released package has and why it is paired with ``triton-amd:p_scale=tile_amax``.
- ``flashinfer-fa3``: FA3's FP8 forward as FlashInfer (``flashinfer-python``) builds it for sm_90
  (``single_prefill_with_kv_cache`` with ``backend="fa3"``), paired with ``fa3`` with P scaled by 448, Q per
  query head, FlashInfer's tiles and KV tiles visited last to first (:data:`FLASHINFER_FA3_RECIPE`).
  FlashInfer compiles the kernel with nvcc on first use, or loads it from its AOT folder;
  ``scripts/build_flashinfer_fa3.py`` does that build where the GPU machine cannot.

Exposed:
    PEER_TABLE: {name: () -> Implementation}       the peers' names and how to make each
    KERNEL_TABLE: {namespace: (spec) -> Implementation}   our kernels (triton, cute) and how to make each
    builtin_implementation(key) -> Implementation   a registry key (a peer's name, ``triton:SPEC``, ``cute:SPEC``) made
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from zyfa.accuracy.implementations.base import Implementation, ImplementationError, ImplResult, input_sm_scale
from zyfa.accuracy.implementations.names import KERNEL_PLANS, builtin_names, kernel_namespace
from zyfa.accuracy.inputs.attention_input import AttentionInput

from zyfa.kernels.cute_plan import CUTE_HEAD_DIMS
from zyfa.peers import cudnn_fp8, flash_attn_amd, flashinfer_fa3
from zyfa.peers.common import all_checks as _all
from zyfa.peers.common import cuda_check as _cuda
from zyfa.peers.common import package_check as _package
from zyfa.peers.flashinfer_fa3 import FLASHINFER_FA3_DIMS, packed_head_dims
from zyfa.peers.registry import PEERS
from zyfa.peers.sdpa import sdpa_forward

__all__ = ["KERNEL_TABLE", "PEER_TABLE", "builtin_implementation"]


# ---------------------------------------------------------------------------------------------- input limits

def _effective_window(x: AttentionInput) -> int | None:
    """The window, or None where it cannot bind (causal, s_q == s_k, window >= s_k: it equals the causal mask)."""
    if x.window is None:
        return None
    if x.causal and x.q.shape[2] == x.k.shape[2] and x.window >= x.k.shape[2]:
        return None
    return x.window


def _no_window_limits(*, same_dims: bool = False, equal_seq_causal: bool = True, dims=None):
    def limits(x: AttentionInput) -> str | None:
        if _effective_window(x) is not None:
            return f"sliding window ({x.window} keys) not supported"
        if (x.causal or x.window is not None) and equal_seq_causal and x.q.shape[2] != x.k.shape[2]:
            return "causal with s_q != s_k not supported (top-left vs bottom-right alignment)"
        d_qk, d_v = x.q.shape[-1], x.v.shape[-1]
        if same_dims and d_qk != d_v:
            return f"d_qk {d_qk} != d_v {d_v} not supported"
        if dims is not None and (d_qk, d_v) not in dims:
            return f"head dims {d_qk}/{d_v} not supported (takes {', '.join(f'{a}/{b}' for a, b in dims)})"
        return None

    return limits


# ---------------------------------------------------------------------------------------------- triton:<recipe>

def _triton_impl(recipe: str) -> Implementation:
    # lazy: the Triton kernel (triton), imported only where it runs
    from zyfa.kernels.attention_fp8 import SUPPORTED_HEAD_DIMS

    def fn(x: AttentionInput, context: dict) -> ImplResult:
        # lazy: the Triton kernel (triton), imported only where it runs
        from zyfa.kernels.attention_fp8 import attention_fp8_quantized

        out, lse = attention_fp8_quantized(x.q, x.k, x.v, recipe=recipe, causal=bool(x.causal),
                                           sm_scale=x.sm_scale, window=x.window)
        return ImplResult(out, lse)

    def limits(x: AttentionInput) -> str | None:
        dims = (x.q.shape[-1], x.v.shape[-1])
        if dims not in SUPPORTED_HEAD_DIMS:
            return f"head dims {dims[0]}/{dims[1]} not supported by the Triton kernel"
        return None

    return Implementation(
        name=f"triton:{recipe}", fn=fn, recipe=recipe, quantizes="recipe", device="CUDA, Hopper (sm_90)",
        package="triton", check=_all(lambda: _cuda(exact_major=9), lambda: _package("triton", "triton")),
        limits=limits, description=f"our Triton FP8 kernel under recipe {recipe}", emulation="triton-kernel")


# ---------------------------------------------------------------------------------------------- cute:<recipe>

# the CuTe kernel: no sliding window, its head dims; causal with s_q != s_k aligns bottom-right as ours
_CUTE_SHAPES = _no_window_limits(equal_seq_causal=False, dims=CUTE_HEAD_DIMS)


def _cute_impl(recipe: str) -> Implementation:
    def fn(x: AttentionInput, context: dict) -> ImplResult:
        # lazy: the CuTe DSL kernel (nvidia-cutlass-dsl), imported only where it runs
        from zyfa.kernels.attention_cute import attention_cute_quantized

        out, lse = attention_cute_quantized(x.q, x.k, x.v, recipe=recipe, causal=bool(x.causal), sm_scale=x.sm_scale)
        return ImplResult(out, lse)

    # the same kernel version of the recipe as triton:'s (emulation "triton-kernel"): cute_plan takes only forward KV
    # order and 128-key tiles, and the kernel never reads head_dim_tiles
    return Implementation(
        name=f"cute:{recipe}", fn=fn, recipe=recipe, quantizes="recipe", device="CUDA, Hopper (sm_90)",
        package="nvidia-cutlass-dsl",
        check=_all(lambda: _cuda(exact_major=9), lambda: _package("cutlass", "nvidia-cutlass-dsl")),
        limits=_CUTE_SHAPES, description=f"our CuTe DSL FP8 kernel (ping-pong) under recipe {recipe}",
        emulation="triton-kernel")


# ---------------------------------------------------------------------------------------------- peers

def _peer_impl(name: str, fn: Callable[[AttentionInput, dict], ImplResult], limits, description: str,
               **kw) -> Implementation:
    """A peer of zyfa.peers' table (:data:`zyfa.peers.registry.PEERS`): its name, recipe, device, package and check
    from there."""
    peer = PEERS[name]
    return Implementation(name=peer.name, fn=fn, recipe=peer.recipe, device=peer.device, package=peer.package,
                          check=peer.check, limits=limits, description=description, **kw)


def _run_prepared(prepare: Callable[..., Any], x: AttentionInput, **kw) -> ImplResult:
    """One forward of a peer through its "prepare once, call many" entry (zyfa.peers): prepared, called once."""
    prepared = prepare(x.q, x.k, x.v, causal=bool(x.causal), sm_scale=input_sm_scale(x), **kw)
    prepared.call()
    if x.q.is_cuda:
        torch.cuda.synchronize(x.q.device)
    return ImplResult(prepared.output(), prepared.lse() if prepared.lse else None, dict(prepared.details))


def _cudnn_fp8_run(x: AttentionInput, context: dict, scale_o_choice: str) -> ImplResult:
    amax = None
    if scale_o_choice == "oracle":
        amax = context.get("oracle_out_amax")
        if amax is None:
            raise ImplementationError("cudnn-fp8:oracle-scale needs the oracle's output amax (runner context)")
    return _run_prepared(cudnn_fp8.prepare, x, out_amax=amax)


def _cudnn_impl(name: str, scale_o_choice: str) -> Implementation:
    return _peer_impl(
        name, lambda x, c: _cudnn_fp8_run(x, c, scale_o_choice), _no_window_limits(same_dims=False),
        f"cuDNN FP8 SDPA (graph sdpa_fp8), FP8 output, scale_o from the {scale_o_choice} amax", quantizes="recipe",
        scale_o="oracle" if scale_o_choice == "oracle" else None)


def _sdpa_impl(backend: str) -> Implementation:
    def fn(x: AttentionInput, context: dict) -> ImplResult:
        out = sdpa_forward(x.q, x.k, x.v, causal=bool(x.causal), sm_scale=input_sm_scale(x), dtype=torch.bfloat16,
                           backend=backend)
        return ImplResult(out, None, {"sdpa_backend": backend})

    return _peer_impl(f"sdpa-bf16:{backend}", fn, _no_window_limits(),
                      f"PyTorch scaled_dot_product_attention in BF16, {backend} backend", quantizes="none")


def _sdpa_fp32_impl() -> Implementation:
    def fn(x: AttentionInput, context: dict) -> ImplResult:
        out = sdpa_forward(x.q, x.k, x.v, causal=bool(x.causal), sm_scale=input_sm_scale(x),
                           window=_effective_window(x), dtype=torch.float32)
        return ImplResult(out, None, {"sdpa_dtype": "float32"})

    return _peer_impl("sdpa-fp32", fn, None,
                      "PyTorch scaled_dot_product_attention in fp32 (any backend; the FP32 baseline)", quantizes="none")


def _flash_attn_amd_impl() -> Implementation:
    return _peer_impl(
        "flash-attn-triton-amd", lambda x, c: _run_prepared(flash_attn_amd.prepare, x),
        _no_window_limits(same_dims=True, equal_seq_causal=False),
        "AMD's Triton FP8 forward from flash-attn (flash_attn_triton_amd), run on Hopper", quantizes="recipe")


_FLASHINFER_SHAPES = _no_window_limits(equal_seq_causal=False, dims=FLASHINFER_FA3_DIMS)


def _flashinfer_limits(x: AttentionInput) -> str | None:
    """Its kernel's shapes, and on a packed install (scripts/build_flashinfer_fa3.py) the head dims packed."""
    why = _FLASHINFER_SHAPES(x)
    if why is None:
        packed = packed_head_dims()
        if packed is not None and x.q.shape[-1] not in packed:
            why = (f"head dim {x.q.shape[-1]} is not in this FlashInfer FA3 pack (built for "
                   f"{', '.join(map(str, packed))}; scripts/build_flashinfer_fa3.py --head-dims adds it)")
    return why


def _flashinfer_fa3_impl() -> Implementation:
    return _peer_impl(
        "flashinfer-fa3", lambda x, c: _run_prepared(flashinfer_fa3.prepare, x), _flashinfer_limits,
        "FA3's FP8 forward as FlashInfer builds it for sm_90 (single_prefill_with_kv_cache, backend fa3)",
        quantizes="recipe")


# ---------------------------------------------------------------------------------------------- the table

# the peers by name and how to make each; our kernels' names (triton:SPEC, cute:SPEC) are read by the names table
PEER_TABLE: dict[str, Callable[[], Implementation]] = {
    "cudnn-fp8": lambda: _cudnn_impl("cudnn-fp8", "first-pass"),
    "cudnn-fp8:oracle-scale": lambda: _cudnn_impl("cudnn-fp8:oracle-scale", "oracle"),
    "sdpa-bf16:cudnn": lambda: _sdpa_impl("cudnn"),
    "sdpa-bf16:flash": lambda: _sdpa_impl("flash"),
    "sdpa-fp32": _sdpa_fp32_impl,
    "flash-attn-triton-amd": _flash_attn_amd_impl,
    "flashinfer-fa3": _flashinfer_fa3_impl,
}
if set(PEER_TABLE) != {n for n in builtin_names() if kernel_namespace(n) is None}:  # pragma: no cover
    raise ImportError("implementations.builtins: the peers differ from accuracy.implementations.names' table")
# our kernels by namespace (accuracy.implementations.names.KERNEL_PLANS): how to make one under a recipe spec
KERNEL_TABLE: dict[str, Callable[[str], Implementation]] = {"triton": _triton_impl, "cute": _cute_impl}
if set(KERNEL_TABLE) != set(KERNEL_PLANS):  # pragma: no cover - a kernel added to one table and not the other
    raise ImportError("implementations.builtins: our kernels differ from accuracy.implementations.names.KERNEL_PLANS")


def builtin_implementation(key: str) -> Implementation:
    """The built-in a registry key names (:func:`zyfa.accuracy.implementations.names.builtin_key`): a peer, or our
    Triton or CuTe kernel under the recipe spec after ``triton:`` or ``cute:``."""
    if key in PEER_TABLE:
        return PEER_TABLE[key]()
    namespace = kernel_namespace(key)
    return KERNEL_TABLE[namespace](key[len(namespace) + 1:])
