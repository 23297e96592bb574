"""An example kernel plug-in: plain PyTorch attention on per-tensor FP8 (e4m3fn) quantized Q, K, V.

It follows the plug-in contract in docs/CONTRACTS.md, so it runs through the toolkit unchanged::

    zyfa accuracy --inputs gaussian --seq 1024 --kernel examples/fp8_torch_attention.py:attention
    zyfa accuracy --inputs gaussian --seq 1024 --kernel examples.fp8_torch_attention:attention \\
        --kernel-recipe zyfa

What it does: each of Q, K, V is scaled by 448 / amax (one scale per tensor), cast to ``torch.float8_e4m3fn``
(PyTorch's round-to-nearest-even cast), and dequantized; then softmax(Q Kᵀ · sm_scale) V in fp32 with the
mask the arguments describe. It uses nothing from this project: a kernel of your own replaces the body.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def _fake_quant(x: torch.Tensor) -> torch.Tensor:
    """Per-tensor FP8 e4m3fn quantize-dequantize, in fp32."""
    x = x.float()
    amax = x.abs().max()
    scale = FP8_MAX / amax if amax > 0 else torch.ones((), device=x.device)
    return (x * scale).to(torch.float8_e4m3fn).float() / scale


def attention(q, k, v, *, causal: bool, sm_scale: float, window: int | None):
    """q (b, h, s_q, d_qk), k (b, h_kv, s_k, d_qk), v (b, h_kv, s_k, d_v) -> (out (b, h, s_q, d_v), lse (b, h, s_q))."""
    h, h_kv = q.shape[1], k.shape[1]
    q8, k8, v8 = _fake_quant(q), _fake_quant(k), _fake_quant(v)
    if h != h_kv:  # GQA: each group of h // h_kv query heads shares one K/V head
        k8 = k8.repeat_interleave(h // h_kv, dim=1)
        v8 = v8.repeat_interleave(h // h_kv, dim=1)
    s = torch.matmul(q8, k8.transpose(-1, -2)) * sm_scale
    s_q, s_k = q.shape[2], k.shape[2]
    if causal or window is not None:
        i = torch.arange(s_q, device=q.device).unsqueeze(1) + (s_k - s_q)  # bottom-right aligned
        j = torch.arange(s_k, device=q.device).unsqueeze(0)
        keep = j <= i
        if window is not None:
            keep = keep & (j > i - window)
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1).clamp(min=torch.finfo(torch.float32).min))
    p = torch.nan_to_num(p, nan=0.0)  # a row that sees no key: output 0
    return torch.matmul(p, v8), lse
