"""Gaussian specs (determinism, outliers, validation) and capture inputs (layers, heads, tokens, GQA)."""

from __future__ import annotations

import math

import pytest
import torch
from zyfa.accuracy.inputs.attention_input import (
    AttentionInput,
    GaussianSpec,
    capture_inputs,
    content_hash,
    make_gaussian,
)


def test_gaussian_is_deterministic_by_seed():
    spec = GaussianSpec(seq=300, head_dim=64, heads_q=4, heads_kv=2, seed=3)
    a, b = make_gaussian(spec), make_gaussian(spec)
    for x, y in ((a.q, b.q), (a.k, b.k), (a.v, b.v)):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    assert a.meta["content_hash"] == b.meta["content_hash"] == content_hash(b.q, b.k, b.v)
    assert len(a.meta["content_hash"]) == 16
    c = make_gaussian(GaussianSpec(seq=300, head_dim=64, heads_q=4, heads_kv=2, seed=4))
    assert c.meta["content_hash"] != a.meta["content_hash"]
    assert a.q.dtype == torch.bfloat16
    assert a.shape == {"batch": 1, "heads_q": 4, "heads_kv": 2, "seq_q": 300, "seq_k": 300, "head_dim": 64,
                       "head_dim_v": 64}
    assert a.meta["spec"]["seed"] == 3 and a.meta["source"] == "gaussian"
    assert a.name == "gaussian-b1-h4x2-s300-d64-seed3"


def test_std_and_dtype():
    x = make_gaussian(GaussianSpec(seq=2048, head_dim=64, heads_q=2, heads_kv=2, std=2.5, dtype="fp32"))
    assert x.q.dtype == torch.float32
    assert float(x.q.std()) == pytest.approx(2.5, rel=0.01)
    assert float(x.v.mean()) == pytest.approx(0.0, abs=0.02)


def test_outliers_fraction_and_shared_bulk():
    frac, n = 0.01, 4 * 2048 * 64
    kw = dict(seq=2048, head_dim=64, heads_q=4, heads_kv=4, dtype="fp32", seed=5)
    plain = make_gaussian(GaussianSpec(**kw))
    spiky = make_gaussian(GaussianSpec(**kw, outlier_frac=frac, outlier_scale=10.0))
    for t in ("q", "k"):
        hit = getattr(spiky, t) != getattr(plain, t)  # same bulk draws: only outlier entries differ
        count = int(hit.sum())
        assert count == spiky.meta["outlier_counts"][t]
        assert abs(count - frac * n) < 5 * math.sqrt(frac * (1 - frac) * n)  # binomial, 5 sigma
        extra = (getattr(spiky, t) - getattr(plain, t))[hit]
        assert float(extra.std()) == pytest.approx(10.0, rel=0.1)
    assert torch.equal(spiky.v, plain.v)  # V untouched by default (outlier_tensors="qk")
    qkv = make_gaussian(GaussianSpec(**kw, outlier_frac=frac, outlier_tensors="qkv"))
    assert torch.equal(qkv.q, spiky.q) and not torch.equal(qkv.v, plain.v)
    assert "out0.01x10qk" in spiky.name


@pytest.mark.parametrize("d_qk,d_v", [(64, None), (128, None), (256, None), (192, 128), (576, 512)])
def test_supported_head_dims(d_qk, d_v):
    x = make_gaussian(GaussianSpec(seq=8, head_dim=d_qk, head_dim_v=d_v, heads_q=2, heads_kv=1))
    assert x.q.shape == (1, 2, 8, d_qk) and x.k.shape == (1, 1, 8, d_qk)
    assert x.v.shape == (1, 1, 8, d_v or d_qk)


@pytest.mark.parametrize("kwargs,match", [
    (dict(head_dim=0), "head_dim must be an int >= 1, got 0"),
    (dict(head_dim=128, head_dim_v=0), "head_dim_v must be an int >= 1, got 0"),
    (dict(seq_q=0), "seq_q must be an int >= 1 or None"),
    (dict(heads_q=4, heads_kv=3), "multiple of heads_kv"),
    (dict(seq=0), "seq must be >= 1"),
    (dict(window=0), "window"),
    (dict(outlier_frac=1.5), "outlier_frac"),
    (dict(std=0.0), "std"),
    (dict(dtype="fp16"), "dtype"),
    (dict(outlier_tensors="qx"), "outlier_tensors"),
    (dict(seq=16.0), "seq must be an int"),
])
def test_spec_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GaussianSpec(**kwargs)


def test_attention_input_validation():
    q = torch.zeros(1, 4, 8, 64)
    with pytest.raises(ValueError, match="multiple"):
        AttentionInput("x", q, torch.zeros(1, 3, 8, 64), torch.zeros(1, 3, 8, 64))
    with pytest.raises(ValueError, match="4-D"):
        AttentionInput("x", q[0], q, q)


def test_capture_inputs_layers_heads_tokens(tiny_capture):
    path = tiny_capture()
    all_layers = capture_inputs(path)
    assert [x.meta["layer"] for x in all_layers] == [0, 1, 2]
    assert all_layers[0].q.shape == (1, 6, 96, 64) and all_layers[0].k.shape == (1, 2, 96, 64)  # GQA 6:2
    assert all_layers[0].q.dtype == torch.bfloat16 and all_layers[0].causal
    assert all_layers[1].window == 32 and all_layers[0].window is None
    assert all_layers[0].sm_scale == pytest.approx(64**-0.5)
    meta = all_layers[0].meta
    assert meta["source"] == "capture" and meta["model"] == "test/TinyModel" and len(meta["file_sha256"]) == 64

    sel = capture_inputs(path, layers=[1], heads=[3, 4, 5], max_tokens=40)
    assert len(sel) == 1
    x = sel[0]
    # query heads 3..5 form KV group 1: GQA 3:1 kept, K/V are that group's head
    assert x.q.shape == (1, 3, 40, 64) and x.k.shape == (1, 1, 40, 64)
    assert torch.equal(x.q, all_layers[1].q[:, 3:6, :40])
    assert torch.equal(x.k, all_layers[1].k[:, 1:2, :40])
    assert x.meta["q_heads"] == [3, 4, 5] and x.meta["kv_heads"] == [1]
    assert x.name == "TinyModel-L1-sliding-h3.4.5-s40"
    assert x.meta["content_hash"] == content_hash(x.q, x.k, x.v, causal=True, window=32)
    assert x.meta["content_hash"] != all_layers[1].meta["content_hash"]


def test_capture_inputs_errors(tmp_path, tiny_capture):
    with pytest.raises(FileNotFoundError, match="missing.h5"):
        capture_inputs(tmp_path / "missing.h5")
    path = tiny_capture(layers=(0,))
    with pytest.raises(ValueError, match="max_tokens"):
        capture_inputs(path, max_tokens=0)
    with pytest.raises(ValueError, match=r"layers \[5\]"):
        capture_inputs(path, layers=[5])
    with pytest.raises(ValueError, match="no query heads"):
        capture_inputs(path, heads=[9])
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="HDF5"):
        capture_inputs(bad)


def test_the_mask_is_part_of_the_input_identity():
    """Result rows are joined on (name, content hash): the same tensors under another mask are another problem."""
    import hashlib

    kw = dict(seq=64, head_dim=64, heads_q=2, heads_kv=1, seed=9)
    full, causal = make_gaussian(GaussianSpec(**kw)), make_gaussian(GaussianSpec(**kw, causal=True))
    windowed = make_gaussian(GaussianSpec(**kw, causal=True, window=16))
    assert torch.equal(full.q, causal.q) and torch.equal(causal.k, windowed.k)  # same tensors
    hashes = {x.meta["content_hash"] for x in (full, causal, windowed)}
    assert len(hashes) == 3
    assert content_hash(full.q, full.k, full.v, window=16) not in hashes  # a window alone differs too
    # unmasked inputs keep the tensor-only hash: sha256 of each tensor's dtype, shape and bytes
    h = hashlib.sha256()
    for t in (full.q, full.k, full.v):
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    assert full.meta["content_hash"] == h.hexdigest()[:16]
    assert causal.meta["content_hash"] == content_hash(causal.q, causal.k, causal.v, causal=True)
