"""AttentionInput and GaussianSpec reject bad input with one clear line naming the problem; limits are inclusive
where the docs say so (window 1, outlier_frac 0 and 1, outlier_scale 0, one head, one token)."""

from __future__ import annotations

import math

import pytest
import torch
from zyfa.accuracy.inputs.attention_input import AttentionInput, GaussianSpec


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as err:
        fn(*args, **kwargs)
    return str(err.value)


def _z(*shape):
    return torch.zeros(*shape)


# ------------------------------------------------------------------------------------------------ AttentionInput


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [_z(4, 8, 64), _z(1, 1, 4, 8, 64), [[0.0]]])
def test_attention_input_tensors_must_be_4d(which, bad):
    t = {"q": _z(1, 2, 8, 64), "k": _z(1, 2, 8, 64), "v": _z(1, 2, 8, 64), which: bad}
    assert _message(AttentionInput, "prob", t["q"], t["k"], t["v"]) == (
        f"input 'prob': {which} must be a 4-D tensor (batch, heads, seq, head_dim)")


@pytest.mark.parametrize("k_shape,v_shape", [
    ((1, 2, 8, 64), (2, 2, 8, 64)),  # batch
    ((1, 2, 8, 64), (1, 1, 8, 64)),  # heads
    ((1, 2, 8, 64), (1, 2, 9, 64)),  # keys
])
def test_k_and_v_must_agree_on_batch_heads_and_keys(k_shape, v_shape):
    assert _message(AttentionInput, "kv", _z(1, 2, 8, 64), _z(*k_shape), _z(*v_shape)) == (
        f"input 'kv': k {k_shape} and v {v_shape} differ")


@pytest.mark.parametrize("k_shape", [(2, 2, 8, 64), (1, 2, 8, 32)])
def test_q_and_k_must_agree_on_batch_and_head_dim(k_shape):
    v_shape = k_shape[:3] + (64,)
    assert _message(AttentionInput, "qk", _z(1, 2, 8, 64), _z(*k_shape), _z(*v_shape)) == (
        f"input 'qk': q (1, 2, 8, 64) and k {k_shape} differ")


@pytest.mark.parametrize("h_kv", [0, 3, 5])
def test_query_heads_must_be_a_multiple_of_kv_heads(h_kv):
    assert _message(AttentionInput, "gqa", _z(1, 4, 8, 64), _z(1, h_kv, 8, 64), _z(1, h_kv, 8, 64)) == (
        f"input 'gqa': 4 query heads not a multiple of {h_kv} kv heads")


@pytest.mark.parametrize("window", [0, -2, 2.0, True, "8"])
def test_attention_input_window_must_be_a_positive_int(window):
    assert _message(AttentionInput, "w", _z(1, 1, 8, 64), _z(1, 1, 8, 64), _z(1, 1, 8, 64), window=window) == (
        f"input 'w': window must be an int >= 1 or None, got {window!r}")


def test_attention_input_accepts_the_limits():
    """Different query/key lengths, d_v != d_qk, one KV head for all query heads (MQA), window 1, batch 2."""
    x = AttentionInput("ok", _z(2, 6, 5, 192), _z(2, 1, 9, 192), _z(2, 1, 9, 128), causal=True, window=1)
    assert x.shape == {"batch": 2, "heads_q": 6, "heads_kv": 1, "seq_q": 5, "seq_k": 9, "head_dim": 192,
                       "head_dim_v": 128}
    assert x.window == 1 and x.causal is True and x.sm_scale is None and x.meta == {}
    assert AttentionInput("gqa", _z(1, 4, 8, 64), _z(1, 2, 8, 64), _z(1, 2, 8, 64)).shape["heads_kv"] == 2


# -------------------------------------------------------------------------------------------------- GaussianSpec


@pytest.mark.parametrize("name", ["batch", "heads_q", "heads_kv", "seq", "seed"])
@pytest.mark.parametrize("bad", [2.0, True, "3", None])
def test_spec_counts_and_seed_must_be_ints(name, bad):
    assert _message(GaussianSpec, **{name: bad}) == f"{name} must be an int, got {bad!r}"


@pytest.mark.parametrize("name", ["batch", "heads_q", "heads_kv", "seq"])
@pytest.mark.parametrize("bad", [0, -1])
def test_spec_counts_must_be_at_least_one(name, bad):
    kwargs = {name: bad}
    if name == "heads_kv":
        kwargs["heads_q"] = 4
    assert _message(GaussianSpec, **kwargs) == f"{name} must be >= 1, got {bad}"


def test_spec_accepts_one_of_everything_and_a_negative_or_zero_seed():
    spec = GaussianSpec(batch=1, heads_q=1, heads_kv=1, seq=1, head_dim=64, seed=-5)
    assert spec.seed == -5 and spec.seq == 1
    assert GaussianSpec(seed=0).seed == 0


def test_spec_heads_multiple():
    assert _message(GaussianSpec, heads_q=6, heads_kv=4) == "heads_q (6) must be a multiple of heads_kv (4)"
    assert GaussianSpec(heads_q=6, heads_kv=3).heads_kv == 3


@pytest.mark.parametrize("head_dim,head_dim_v", [(80, None), (96, None), (112, None), (128, 64), (192, 192)])
def test_any_head_dim_the_emulator_computes_is_a_gaussian_input(head_dim, head_dim_v):
    """The kernels ship a few head dims; the emulator and the oracle compute any, so a Gaussian input may have any
    (80, 96 and 112 were refused before)."""
    spec = GaussianSpec(head_dim=head_dim, head_dim_v=head_dim_v, seq=4)
    assert (spec.head_dim, spec.d_v) == (head_dim, head_dim_v or head_dim)


@pytest.mark.parametrize("head_dim,head_dim_v,name", [(0, None, "head_dim"), (64, 0, "head_dim_v"),
                                                      (-8, None, "head_dim"), (64.0, None, "head_dim")])
def test_head_dims_below_one_are_refused(head_dim, head_dim_v, name):
    shown = head_dim if head_dim_v is None else head_dim_v
    assert _message(GaussianSpec, head_dim=head_dim, head_dim_v=head_dim_v) == (
        f"{name} must be an int >= 1, got {shown!r}")


@pytest.mark.parametrize("window", [0, -1, 4.0, False])
def test_spec_window_must_be_a_positive_int(window):
    assert _message(GaussianSpec, window=window) == f"window must be an int >= 1 or None, got {window!r}"


@pytest.mark.parametrize("std", [0.0, -1.0, math.inf, math.nan])
def test_std_must_be_finite_and_positive(std):
    assert _message(GaussianSpec, std=std) == f"std must be finite and > 0, got {std}"


@pytest.mark.parametrize("frac", [-0.001, 1.001, math.nan])
def test_outlier_frac_must_be_in_zero_one(frac):
    assert _message(GaussianSpec, outlier_frac=frac) == f"outlier_frac must be in [0, 1], got {frac}"


@pytest.mark.parametrize("scale", [-0.5, math.inf, math.nan])
def test_outlier_scale_must_be_finite_and_non_negative(scale):
    assert _message(GaussianSpec, outlier_scale=scale) == f"outlier_scale must be finite and >= 0, got {scale}"


@pytest.mark.parametrize("tensors", ["", "qa", "Q", "x", "X", "qX"])
def test_outlier_tensors_must_be_letters_of_qkv(tensors):
    assert _message(GaussianSpec, outlier_tensors=tensors) == (
        f"outlier_tensors must be letters of 'qkv', got {tensors!r}")


@pytest.mark.parametrize("dtype", ["fp16", "bfloat16", ""])
def test_dtype_must_be_bf16_or_fp32(dtype):
    assert _message(GaussianSpec, dtype=dtype) == f"dtype must be one of ['bf16', 'fp32'], got {dtype!r}"


def test_spec_accepts_the_inclusive_limits():
    for kwargs in (dict(window=1), dict(outlier_frac=0.0), dict(outlier_frac=1.0), dict(outlier_scale=0.0),
                   dict(std=1e-30), dict(outlier_tensors="v"), dict(outlier_tensors="qkv"), dict(dtype="fp32"),
                   dict(head_dim=256), dict(head_dim=192, head_dim_v=128), dict(head_dim=576, head_dim_v=512),
                   dict(head_dim=64, head_dim_v=64)):
        spec = GaussianSpec(**kwargs)
        for key, value in kwargs.items():
            assert getattr(spec, key) == value


def test_spec_name_spells_every_non_default_field():
    assert GaussianSpec().name == "gaussian-b1-h4x4-s4096-d128-seed0"
    spec = GaussianSpec(batch=2, heads_q=8, heads_kv=2, seq=33, head_dim=576, head_dim_v=512, causal=True,
                        window=16, std=0.5, outlier_frac=0.002, outlier_scale=20.0, outlier_tensors="k",
                        dtype="fp32", seed=7)
    assert spec.name == "gaussian-b2-h8x2-s33-d576-512-causal-w16-std0.5-out0.002x20k-fp32-seed7"
    assert spec.d_v == 512 and GaussianSpec(head_dim=64).d_v == 64
