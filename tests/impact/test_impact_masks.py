"""Masks the emulator cannot express are refused with a clear error; the ones it can are accepted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from zyfa.accuracy.impact.model import RecipeAttention, UnsupportedMaskError

S, D = 48, 16


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, S, D, generator=g), torch.randn(1, 1, S, D, generator=g),
            torch.randn(1, 1, S, D, generator=g))


MOD = SimpleNamespace(layer_idx=0, is_causal=True, scaling=0.25, training=False)


def _causal(window=None, b=1):
    i = torch.arange(S).view(-1, 1)
    j = torch.arange(S).view(1, -1)
    m = j <= i
    if window:
        m &= j > i - window
    return m.expand(b, 1, S, S)


def test_causal_and_window_masks_accepted_and_equal_to_no_mask():
    q, k, v = _qkv()
    fn = RecipeAttention("fp32")
    none, _ = fn(MOD, q, k, v, None, scaling=0.25)
    masked, _ = fn(MOD, q, k, v, _causal(), scaling=0.25)
    assert torch.equal(none, masked)
    additive = torch.zeros(1, 1, S, S).masked_fill(~_causal(), torch.finfo(torch.float32).min)
    assert torch.equal(fn(MOD, q, k, v, additive, scaling=0.25)[0], none)
    win, _ = fn(MOD, q, k, v, _causal(window=8), scaling=0.25, sliding_window=8)
    assert not torch.equal(win, none)


def test_padding_mask_refused():
    q, k, v = _qkv()
    mask = _causal().clone()
    mask[..., :5] = False  # left padding
    with pytest.raises(UnsupportedMaskError, match="padding"):
        RecipeAttention("aiter")(MOD, q, k, v, mask, scaling=0.25)


def test_window_mask_without_window_argument_refused():
    q, k, v = _qkv()
    with pytest.raises(UnsupportedMaskError, match="not the plain causal"):
        RecipeAttention("fp32")(MOD, q, k, v, _causal(window=8), scaling=0.25)


def test_bias_mask_refused():
    q, k, v = _qkv()
    bias = torch.zeros(1, 1, S, S).masked_fill(~_causal(), float("-inf"))
    bias[..., 3] -= 0.5  # ALiBi-like finite bias
    bias = torch.where(_causal(), bias.clamp(max=0).nan_to_num(neginf=-1e9), bias)
    with pytest.raises(UnsupportedMaskError):
        RecipeAttention("fp32")(MOD, q, k, v, bias, scaling=0.25)


def test_bad_shape_noncausal_softcap_refused():
    q, k, v = _qkv()
    fn = RecipeAttention("fp32")
    with pytest.raises(UnsupportedMaskError, match="shape"):
        fn(MOD, q, k, v, torch.ones(S, S, dtype=torch.bool), scaling=0.25)
    with pytest.raises(UnsupportedMaskError, match="non-causal"):
        fn(SimpleNamespace(layer_idx=0, is_causal=False, scaling=0.25, training=False), q, k, v, None, scaling=0.25)
    with pytest.raises(UnsupportedMaskError, match="softcap"):
        fn(MOD, q, k, v, None, scaling=0.25, softcap=50.0)


def test_padded_batch_in_a_real_model_refused(smollm2, ids):
    from zyfa.accuracy.impact.model import final_hidden  # noqa: F401  (the same import path the runner uses)
    from zyfa.capture.hook import swap_attention

    short = ids[:, :16]
    attn = torch.ones_like(short)
    attn[0, :3] = 0
    with swap_attention(smollm2.model, RecipeAttention("fp32")), torch.no_grad(), \
            pytest.raises(UnsupportedMaskError):
        smollm2.model(input_ids=short, attention_mask=attn, use_cache=False)
