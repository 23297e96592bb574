"""The FP64 oracle's input checks word for word, its smallest head dims, and its sliding window when there are more
queries than keys.

Messages are compared whole, on shapes whose sizes all differ, so a message that reads the wrong dimension or
names the wrong tensor fails. Head dims of 1 are legal and computed against a softmax written out in Python
floats. The window is checked against a dense float64 softmax with an explicit mask built from each query's
position (bottom-right alignment), for s_q > s_k, s_q == s_k and s_q < s_k and every chunk size.
"""

from __future__ import annotations

import math

import pytest
import torch
from zyfa.reference import attention_fp64


def _raises(exc, message, *args, **kwargs):
    with pytest.raises(exc) as info:
        attention_fp64(*args, **kwargs)
    assert str(info.value) == message


def _ok(b=1, h=2, s=5, d=3):
    return torch.zeros(b, h, s, d)


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_type_rank_and_dtype_messages_name_the_tensor(name):
    def with_bad(bad):
        qkv = {"q": _ok(), "k": _ok(), "v": _ok()}
        qkv[name] = bad
        return qkv["q"], qkv["k"], qkv["v"]

    _raises(TypeError, f"{name} must be a torch.Tensor, got list", *with_bad([[0.0]]))
    _raises(
        ValueError,
        f"{name} must be 4-D (batch, heads, seq, head_dim), got 3-D shape (2, 5, 3)",
        *with_bad(torch.zeros(2, 5, 3)),
    )
    _raises(ValueError, f"{name} must have a floating dtype, got torch.int32", *with_bad(_ok().to(torch.int32)))


def test_shape_messages_read_the_right_dimension():
    # batch 1, 3, 5 for q, k, v; k and v have 2 heads, so a message reading k's heads says 2, not 3
    _raises(
        ValueError,
        "batch sizes differ: q 1, k 3, v 5",
        torch.zeros(1, 4, 6, 3),
        torch.zeros(3, 2, 7, 3),
        torch.zeros(5, 2, 7, 3),
    )
    # 4 query heads over 3 KV heads; the sequence lengths (6, 7) and head dim (3) differ from both
    _raises(
        ValueError,
        "query heads (4) must be a multiple of kv heads (3) for MHA/GQA/MQA",
        torch.zeros(1, 4, 6, 3),
        torch.zeros(1, 3, 7, 3),
        torch.zeros(1, 3, 7, 3),
    )


@pytest.mark.parametrize("d_qk, d_v", [(0, 6), (5, 0), (0, 0)])
def test_empty_head_dims_are_refused_with_both_sizes(d_qk, d_v):
    _raises(
        ValueError,
        f"head dims must be >= 1, got d_qk {d_qk}, d_v {d_v}",
        torch.zeros(1, 2, 4, d_qk),
        torch.zeros(1, 2, 7, d_qk),
        torch.zeros(1, 2, 7, d_v),
    )


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn], ids=["fp32", "fp8"])
def test_non_finite_message_counts_nan_and_inf_separately(name, dtype):
    qkv = {"q": _ok(), "k": _ok(), "v": _ok()}
    x = qkv[name]
    x[0, 0, 0, 0] = math.nan
    x[0, 1, 2, 1] = math.nan
    if dtype == torch.float8_e4m3fn:  # e4m3fn has no inf: only NaNs, counted as such
        expected = f"{name} contains non-finite values (2 NaN, 0 Inf)"
    else:
        x[0, 0, 3, 2] = math.inf
        x[0, 1, 4, 0] = -math.inf
        x[0, 1, 0, 2] = math.inf
        expected = f"{name} contains non-finite values (2 NaN, 3 Inf)"
    qkv[name] = x.to(dtype)
    _raises(ValueError, expected, qkv["q"], qkv["k"], qkv["v"])


def _softmax_by_hand(q, k, v, scale):
    """out[i] = sum_j exp(s_ij - max_j s_ij) v_j / sum_j exp(s_ij - max_j s_ij), in Python floats."""
    out = []
    for qi in q:
        s = [scale * sum(a * b for a, b in zip(qi, kj, strict=True)) for kj in k]
        w = [math.exp(x - max(s)) for x in s]
        out.append([sum(wj * vj[c] for wj, vj in zip(w, v, strict=True)) / sum(w) for c in range(len(v[0]))])
    return out


@pytest.mark.parametrize("d_qk, d_v", [(1, 1), (1, 3), (3, 1)])
def test_head_dim_one_is_computed(d_qk, d_v):
    g = torch.Generator().manual_seed(10 * d_qk + d_v)
    q = torch.randn(1, 1, 3, d_qk, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 4, d_qk, generator=g, dtype=torch.float64)
    v = torch.randn(1, 1, 4, d_v, generator=g, dtype=torch.float64)
    out, _ = attention_fp64(q, k, v)
    expected = _softmax_by_hand(q[0, 0].tolist(), k[0, 0].tolist(), v[0, 0].tolist(), 1 / math.sqrt(d_qk))
    torch.testing.assert_close(out[0, 0], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-14)


def _dense_masked(q, k, v, *, window, scale):
    """Full float64 score matrix, keys j allowed for query i iff p - window < j <= p with p = i + s_k - s_q."""
    s_q, s_k = q.shape[2], k.shape[2]
    p = torch.arange(s_q)[:, None] + (s_k - s_q)
    j = torch.arange(s_k)[None, :]
    allowed = (j <= p) & (j > p - window)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, dim=-1)  # -inf for a row with no key
    w = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    return w @ v, lse


@pytest.mark.parametrize("s_q, s_k, window", [(9, 4, 2), (12, 5, 3), (7, 7, 2), (4, 9, 3)])
def test_window_matches_a_dense_mask_when_queries_outnumber_keys(s_q, s_k, window):
    g = torch.Generator().manual_seed(s_q * 100 + s_k * 10 + window)
    q = torch.randn(1, 2, s_q, 4, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, s_k, 4, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, s_k, 3, generator=g, dtype=torch.float64)
    out_ref, lse_ref = _dense_masked(q, k, v, window=window, scale=0.5)
    sees_a_key = torch.isfinite(lse_ref)
    assert bool(sees_a_key.any()) and (s_q <= s_k or not bool(sees_a_key.all())), "both kinds of row present"
    for chunk in [*range(1, s_q + 1), 1024]:
        out, lse = attention_fp64(q, k, v, causal=True, window=window, sm_scale=0.5, chunk_size=chunk)
        msg = f"chunk_size={chunk}"
        torch.testing.assert_close(out, out_ref, rtol=0, atol=1e-13, msg=msg)
        torch.testing.assert_close(lse, lse_ref, rtol=0, atol=1e-13, msg=msg)
