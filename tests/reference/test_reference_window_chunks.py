"""The FP64 oracle's sliding window at chunk edges: every chunk size from 1 to the sequence length gives the same
result as a row-by-row float64 softmax written out here (explicit key range per row, no chunking, no edge bands).
"""

from __future__ import annotations

import math

import pytest
import torch
from zyfa.reference import attention_fp64


def rowwise(q, k, v, *, window, sm_scale):
    """out[i] = softmax over keys j in (p - window, p] of q_i . k_j * scale, p = i + s_k - s_q; float64."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    s_q, s_k = q.shape[2], k.shape[2]
    out = torch.zeros(*q.shape[:3], v.shape[3], dtype=torch.float64)
    for i in range(s_q):
        p = i + s_k - s_q
        lo, hi = max(0, p - window + 1), p + 1
        if lo >= hi:
            continue
        s = (q[:, :, i : i + 1] @ k[:, :, lo:hi].transpose(-1, -2)) * sm_scale  # (b, h, 1, keys)
        w = torch.exp(s - s.amax(dim=-1, keepdim=True))
        out[:, :, i : i + 1] = (w @ v[:, :, lo:hi]) / w.sum(dim=-1, keepdim=True)
    return out


@pytest.mark.parametrize("s_q, s_k, window", [(8, 8, 3), (8, 8, 1), (6, 9, 4), (9, 9, 8)])
def test_every_chunk_size_masks_the_window_like_the_row_by_row_softmax(s_q, s_k, window):
    g = torch.Generator().manual_seed(s_q * 100 + s_k * 10 + window)
    q = torch.randn(1, 2, s_q, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, s_k, 8, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, s_k, 8, generator=g, dtype=torch.float64)
    expected = rowwise(q, k, v, window=window, sm_scale=1 / math.sqrt(8))
    for chunk in range(1, s_q + 1):
        out, _ = attention_fp64(q, k, v, causal=True, window=window, chunk_size=chunk)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-13, msg=f"chunk_size={chunk}")
