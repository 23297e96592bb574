"""The FP64 oracle: exact attention in float64, the reference every accuracy metric compares against.

Every input is upcast to float64 (exact from bf16, fp16, fp32 or FP8) and the softmax is computed in
float64 from the full row: scores, row max subtracted, exp, sum, then out = (P @ V) / l. There is no
online rescaling and no rounding to a lower precision anywhere, so the only error is float64 rounding
(about 1e-15 relative), far below any FP8 or BF16 error it is used to measure.

Memory stays bounded at long sequences: the work is chunked over query rows and looped over batches and
KV heads, so at most one (group heads, chunk_size, keys) block of scores exists at a time; with a causal
or sliding-window mask the keys no query of a chunk can see are skipped. 32K tokens run on CPU or GPU.

Exposed functions:
    attention_fp64(q, k, v, *, causal, sm_scale, window, chunk_size, device) -> (out, lse)
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["attention_fp64"]


def attention_fp64(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    window: int | None = None,
    chunk_size: int = 1024,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax attention in float64 (forward), with its natural-log log-sum-exp.

    Query head i uses KV head i // (h_q // h_kv) (HF ``repeat_kv``), so MHA, GQA and MQA need no expanded
    K/V. Query i sits at key position p = i + s_k - s_q (bottom-right alignment); ``causal`` keeps keys
    j <= p and ``window`` keeps keys p - window < j <= p (HF sliding-window convention, which includes
    the causal bound). A query row that sees no key gets out 0 and lse -inf.

    Args:
        q: (b, h_q, s_q, d_qk), any floating dtype.
        k: (b, h_kv, s_k, d_qk), h_q % h_kv == 0.
        v: (b, h_kv, s_k, d_v); d_v may differ from d_qk (MLA: 192/128, absorbed MLA: 576/512).
        causal: mask keys after the query's position.
        sm_scale: scale applied to Q·Kᵀ; default 1/sqrt(d_qk).
        window: sliding-window length in keys (>= 1), or None for no window.
        chunk_size: query rows per block of scores.
        device: where to compute; None uses q's device.

    Returns:
        out: (b, h_q, s_q, d_v) float64; lse: (b, h_q, s_q) float64 natural log; both on the compute device.
    """
    _check_inputs(q, k, v, sm_scale=sm_scale, window=window, chunk_size=chunk_size)
    b, h_q, s_q, d_qk = q.shape
    _, h_kv, s_k, d_v = v.shape
    group = h_q // h_kv
    dev = torch.device(device) if device is not None else q.device
    scale = 1.0 / math.sqrt(d_qk) if sm_scale is None else float(sm_scale)
    offset = s_k - s_q  # key position of query row 0 (bottom-right alignment)
    masked = causal or window is not None

    out = torch.zeros(b, h_q, s_q, d_v, dtype=torch.float64, device=dev)
    lse = torch.full((b, h_q, s_q), -math.inf, dtype=torch.float64, device=dev)
    for bi in range(b):
        for g in range(h_kv):
            heads = slice(g * group, (g + 1) * group)
            q_g = q[bi, heads].to(device=dev, dtype=torch.float64)  # (group, s_q, d_qk)
            k_g = k[bi, g].to(device=dev, dtype=torch.float64)  # (s_k, d_qk)
            v_g = v[bi, g].to(device=dev, dtype=torch.float64)  # (s_k, d_v)
            for r0 in range(0, s_q, chunk_size):
                r1 = min(r0 + chunk_size, s_q)
                lo, hi = 0, s_k
                if masked:  # keys outside [lo, hi) are masked for every row of this chunk
                    hi = min(s_k, r1 + offset)  # last row's position + 1
                    if window is not None:
                        lo = max(0, r0 + offset - window + 1)
                if lo >= hi:
                    continue  # every row of the chunk is fully masked: out 0, lse -inf already
                scores = torch.matmul(q_g[:, r0:r1], k_g[lo:hi].T).mul_(scale)  # (group, rows, keys)
                if masked:
                    _mask_edges_(scores, r0 + offset, lo, window)
                m = scores.amax(dim=-1, keepdim=True)
                m = torch.where(torch.isfinite(m), m, 0.0)  # fully masked rows: exp(-inf - 0) = 0, no NaN
                p = scores.sub_(m).exp_()  # in place: P reuses the scores' memory
                l = p.sum(dim=-1, keepdim=True)
                pv = torch.matmul(p, v_g[lo:hi])
                out[bi, heads, r0:r1] = torch.where(l > 0, pv / l, 0.0)
                lse[bi, heads, r0:r1] = (m + torch.log(l)).squeeze(-1)  # log(0) = -inf for empty rows
    return out, lse


def _mask_edges_(scores: torch.Tensor, pos0: int, lo: int, window: int | None) -> None:
    """Set to -inf the scores of keys a row may not see; rows sit at positions pos0, pos0 + 1, ...

    Columns are keys lo, lo + 1, ...  Only the two edge bands can hold masked keys (keys after the first
    row's position, keys at or before the last row's position - window), so only they get a mask: its cost
    is (rows x chunk), not (rows x keys).
    """
    rows, keys = scores.shape[-2:]
    pos = torch.arange(pos0, pos0 + rows, device=scores.device)[:, None]
    a = max(0, pos0 + 1 - lo)  # column of the first key after row 0's position
    if a < keys:
        key = torch.arange(lo + a, lo + keys, device=scores.device)[None, :]
        scores[..., a:].masked_fill_(key > pos, -math.inf)
    if window is not None:
        z = min(keys, pos0 + rows - window - lo)  # columns before z are outside the last row's window
        if z > 0:
            key = torch.arange(lo, lo + z, device=scores.device)[None, :]
            scores[..., :z].masked_fill_(key <= pos - window, -math.inf)


def _check_inputs(q, k, v, *, sm_scale, window, chunk_size) -> None:
    """Raise ValueError (TypeError for non-tensors) naming the first problem with the inputs."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (batch, heads, seq, head_dim), got {x.dim()}-D shape {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise ValueError(f"{name} must have a floating dtype, got {x.dtype}")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads, got k {k.shape[1]}, v {v.shape[1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same seq length, got k {k.shape[2]}, v {v.shape[2]}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must have the same head_dim, got q {q.shape[3]}, k {k.shape[3]}")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]}) for MHA/GQA/MQA")
    if q.shape[3] < 1 or v.shape[3] < 1:
        raise ValueError(f"head dims must be >= 1, got d_qk {q.shape[3]}, d_v {v.shape[3]}")
    if window is not None and not (_is_int(window) and window >= 1):
        raise ValueError(f"window must be an int >= 1 or None, got {window!r}")
    if not (_is_int(chunk_size) and chunk_size >= 1):
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    if sm_scale is not None and not math.isfinite(float(sm_scale)):
        raise ValueError(f"sm_scale must be finite, got {sm_scale!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.element_size() == 1:  # torch has no isfinite for FP8 dtypes; float32 holds them exactly
            x = x.float()
        if x.numel() and not bool(torch.isfinite(x).all()):
            n_nan = int(torch.isnan(x).sum())
            n_inf = int(torch.isinf(x).sum())
            raise ValueError(f"{name} contains non-finite values ({n_nan} NaN, {n_inf} Inf)")


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)
