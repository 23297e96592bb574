"""PyTorch's ``scaled_dot_product_attention`` as a peer: BF16 on one named backend (cuDNN, flash) or fp32 on any,
with the bottom-right causal and sliding-window masks of the FP64 oracle.

Exposed: ``BACKENDS``, ``check_bf16()``, ``sdpa_forward(...)``, ``prepare(q, k, v, ...)`` (the peer API's
"prepare once, call many").
"""

from __future__ import annotations

import torch

from zyfa.peers.common import Prepared, cuda_check, expand_kv

__all__ = ["BACKENDS", "check_bf16", "prepare", "sdpa_forward"]

BACKENDS = ("cudnn", "flash")


def check_bf16() -> tuple[bool, str]:
    return cuda_check(min_major=8)


def sdpa_forward(q, k, v, *, causal: bool, sm_scale: float, window: int | None = None,
                 dtype: torch.dtype = torch.float32, backend: str | None = None) -> torch.Tensor:
    """SDPA on q (b, h, s_q, d), k/v (b, h_kv, s_k, d) cast to ``dtype``, K/V heads repeated for GQA. ``backend``:
    None (PyTorch's choice) or one of :data:`BACKENDS`. A window, or a causal mask with s_q != s_k, is passed as an
    explicit bottom-right mask (HF convention: the window includes the causal bound), as the FP64 oracle."""
    import torch.nn.functional as F

    h = q.shape[1]
    q = q.to(dtype)
    k = expand_kv(k.to(dtype), h)
    v = expand_kv(v.to(dtype), h)
    s_q, s_k = q.shape[2], k.shape[2]
    mask = None
    if window is not None or (causal and s_q != s_k):
        i = torch.arange(s_q, device=q.device).view(-1, 1) + (s_k - s_q)
        j = torch.arange(s_k, device=q.device).view(1, -1)
        mask = j <= i
        if window is not None:
            mask = mask & (j > i - window)
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(causal) and mask is None,
                                              scale=float(sm_scale))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    with sdpa_kernel([be]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(causal) and mask is None,
                                              scale=float(sm_scale))


def prepare(q, k, v, *, causal: bool, sm_scale: float, backend: str | None = None, window: int | None = None,
            dtype: torch.dtype = torch.bfloat16) -> Prepared:
    """SDPA on one backend as a prepared peer: ``call()`` runs :func:`sdpa_forward` on the given tensors (the cast to
    ``dtype`` and GQA's repeat are part of each call, as a caller of SDPA pays them); ``output()`` is the last
    call's output, in ``dtype``."""
    last: list[torch.Tensor] = []

    def call() -> torch.Tensor:
        out = sdpa_forward(q, k, v, causal=causal, sm_scale=sm_scale, window=window, dtype=dtype, backend=backend)
        last[:] = [out]
        return out

    def output() -> torch.Tensor:
        if not last:
            raise RuntimeError("sdpa: output() before the first call()")
        return last[0]

    return Prepared(call=call, output=output, details={"sdpa_backend": backend or "any",
                                                       "sdpa_dtype": str(dtype).removeprefix("torch.")})
