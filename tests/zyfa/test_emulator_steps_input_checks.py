"""validate_qkv (through emulate): each bad input gets one error naming the operand and the sizes it saw.

Expected messages are written out here in full (the operand's name, its shape or batch size), so a check that
names the wrong operand, drops a size, or lets a mismatch through when only one of two conditions fails, fails.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from reference.attention import attention_fp64
from zyfa.emulator import emulate, validate_qkv


def _qkv(b=1, h=2, h_kv=2, s_q=8, s_k=8, d=64, d_v=64):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(b, h, s_q, d, generator=g),
        torch.randn(b, h_kv, s_k, d, generator=g),
        torch.randn(b, h_kv, s_k, d_v, generator=g),
    )


def _raises(exc, message, q, k, v, **kw):
    with pytest.raises(exc, match="^" + re.escape(message) + "$"):
        emulate(q, k, v, "zyfa", **kw)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_non_tensor_operand_is_named_with_its_type(which):
    args = list(_qkv())
    args[which] = args[which].tolist()
    _raises(TypeError, f"{'qkv'[which]} must be a torch.Tensor, got list", *args)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_operand_that_is_not_4d_is_named_with_its_shape(which):
    args = list(_qkv())
    args[which] = args[which][0]
    shape = tuple(args[which].shape)
    _raises(ValueError, f"{'qkv'[which]} must be 4-D (batch, heads, seq, head_dim), got shape {shape}", *args)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_integer_operand_is_named_with_its_dtype(which):
    args = list(_qkv())
    args[which] = args[which].to(torch.int32)
    _raises(TypeError, f"{'qkv'[which]} must be a floating-point tensor, got torch.int32", *args)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_empty_operand_is_named_with_its_shape(which):
    args = list(_qkv())
    x = args[which]
    args[which] = x[:, :, :0] if which == 0 else x[..., :0]  # q: no queries; k or v: no channels
    shape = tuple(args[which].shape)
    _raises(
        ValueError,
        f"{'qkv'[which]} has an empty dimension: shape {shape} (batch, heads, seq and head_dim must be >= 1)",
        *args,
    )


@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_operand_is_named(which, bad):
    args = [x.clone() for x in _qkv()]
    args[which][0, 1, 3, 5] = bad
    _raises(ValueError, f"{'qkv'[which]} contains NaN or Inf", *args)


def test_operands_on_two_devices_are_refused_naming_each_device():
    q, k, v = _qkv()
    _raises(ValueError, "q, k, v must be on one device, got cpu, meta, cpu", q, k.to("meta"), v)


def test_batch_mismatch_of_k_alone_or_v_alone_names_all_three_batches():
    q, k, v = _qkv()  # batch 1, 2 heads: a message quoting a head count for a batch is wrong
    _raises(ValueError, "batch mismatch: q 1, k 3, v 1", q, k.expand(3, -1, -1, -1), v)
    _raises(ValueError, "batch mismatch: q 1, k 1, v 3", q, k, v.expand(3, -1, -1, -1))


def test_k_and_v_differing_in_heads_alone_or_seq_alone_are_refused_with_both_shapes():
    q, k, v = _qkv(h=4, h_kv=2, s_k=16)
    _raises(ValueError, "k and v must share heads and seq: k (1, 2, 16, 64), v (1, 2, 12, 64)", q, k, v[:, :, :12])
    _raises(ValueError, "k and v must share heads and seq: k (1, 2, 16, 64), v (1, 1, 16, 64)", q, k, v[:, :1])


def test_query_heads_not_a_multiple_of_kv_heads_names_both_counts():
    q, k, v = _qkv(h=3, h_kv=2, s_k=16)  # seq 16 != 2 kv heads: the message must quote the heads
    _raises(ValueError, "q heads (3) must be a multiple of kv heads (2)", q, k, v)


def test_window_of_one_key_is_accepted_and_each_query_sees_only_its_own_key():
    """window=1 is the smallest valid window (HF: query p sees p - 1 < j <= p): the output is V's row itself."""
    q, k, v = _qkv(s_q=8, s_k=8)
    validate_qkv(q, k, v, window=1)
    emu = emulate(q, k, v, "fp32", causal=True, window=1)
    ref, _ = attention_fp64(q, k, v, causal=True, window=1)
    assert torch.equal(ref, v.double())
    assert torch.equal(emu.out, v)
    with pytest.raises(ValueError, match=re.escape("window must be an int >= 1 or None, got 0")):
        validate_qkv(q, k, v, window=0)
