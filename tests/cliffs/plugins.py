"""Plug-in kernels for the cliff-finder tests (docs/CONTRACTS.md's contract): exact float32 attention, and
versions of it with a planted fault at chosen lengths."""

from __future__ import annotations

import math

import torch


def exact(q, k, v, *, causal, sm_scale, window):
    """Float32 attention (GQA expanded, bottom-right causal): an error of about 1e-7 against FP64."""
    h, s_q, s_k = q.shape[1], q.shape[2], k.shape[2]
    g = h // k.shape[1]
    k, v = (t.float().repeat_interleave(g, dim=1) for t in (k, v))
    s = (q.float() @ k.transpose(-1, -2)) * sm_scale
    if causal:
        pos = torch.arange(s_q).unsqueeze(1) + (s_k - s_q)
        s = s.masked_fill(torch.arange(s_k).unsqueeze(0) > pos, -math.inf)
    return torch.softmax(s, dim=-1) @ v


def nan_at_16(q, k, v, *, causal, sm_scale, window):
    """NaN in the first query row of every head where the KV length is a multiple of 16."""
    out = exact(q, k, v, causal=causal, sm_scale=sm_scale, window=window)
    if k.shape[2] % 16 == 0:
        out[:, :, 0, :] = math.nan
    return out


def refuse_above_32(q, k, v, *, causal, sm_scale, window):
    """Raises for KV lengths above 32."""
    if k.shape[2] > 32:
        raise ValueError(f"KV length {k.shape[2]} above 32 not supported")
    return exact(q, k, v, causal=causal, sm_scale=sm_scale, window=window)


def cliff_at_24(q, k, v, *, causal, sm_scale, window):
    """An output 1.1x too large at KV length 24 (error 0.1 where its neighbours have 1e-7)."""
    out = exact(q, k, v, causal=causal, sm_scale=sm_scale, window=window)
    return out * 1.1 if k.shape[2] == 24 else out
