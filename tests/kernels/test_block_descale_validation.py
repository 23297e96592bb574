"""CPU tests of the FP8 wrapper's per-block / per-token descales, K smoothing and rotation recipes (issue 14):
which recipes the kernel takes, which descale shapes the wrapper accepts (it reaches the device check, the last
one) and which it refuses with one clear line. No GPU or Triton needed."""

from __future__ import annotations

import pytest
import torch

from zyfa.emulator import quantize_inputs
from zyfa.kernels.attention_fp8 import (
    attention_fp8,
    attention_fp8_quantized,
    k_descale_per_tile,
    kernel_plan,
    q_descale_per_program,
    quantize_for_kernel,
    recipe_from_spec,
)

FP8 = torch.float8_e4m3fn
B, H, H_KV, S_Q, S_K, D = 2, 4, 2, 200, 300, 64


def fp8_inputs():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, S_Q, D, generator=g).to(FP8)
    k = torch.randn(B, H_KV, S_K, D, generator=g).to(FP8)
    v = torch.randn(B, H_KV, S_K, D, generator=g).to(FP8)
    return q, k, v


def accepted(**kw):
    """The wrapper validated everything and stopped only at the device (CPU tensors)."""
    q, k, v = fp8_inputs()
    with pytest.raises(ValueError, match="CUDA GPU"):
        attention_fp8(q, k, v, **kw)


@pytest.mark.parametrize("spec", [
    "zyfa:q_scale=block,k_scale=block",
    "zyfa:q_scale=block,scale_block_q=1",  # per-token Q
    "zyfa:k_scale=block,scale_block_kv=256",  # two KV tiles per K block
    "zyfa:block_n=64,k_scale=block,scale_block_kv=64",
    "zyfa:k_smoothing=true",
    "zyfa:qk_rotation=hadamard",
    "zyfa-hopper:q_scale=block,k_scale=block,k_smoothing=true,qk_rotation=random_hadamard",
    "zyfa:v_scale=channel",  # per-channel V, applied to the output's columns
    "zyfa:v_scale=block,v_descale=tile",  # per-block V, applied to each tile's P.V
    "ck-blockscale",
])
def test_remedy_recipes_map_onto_the_kernel(spec):
    assert kernel_plan(spec).block_n == recipe_from_spec(spec).block_n


@pytest.mark.parametrize("spec,field", [
    ("zyfa:k_scale=block,scale_block_kv=64", "scale_block_kv"),  # half a 128-key tile
    ("zyfa:k_scale=block,scale_block_kv=1", "scale_block_kv"),  # per-token K: one descale per key
    ("zyfa:k_scale=block,scale_block_kv=200", "scale_block_kv"),
    ("zyfa:v_scale=none", "v_scale"),
    ("zyfa:v_scale=channel,v_descale=tile", "v_descale"),
])
def test_unsupported_granularities_are_named(spec, field):
    with pytest.raises(ValueError, match=f"does not support {field}="):
        kernel_plan(spec)
    q, k, v = fp8_inputs()
    with pytest.raises(ValueError, match=field):
        attention_fp8_quantized(q.float(), k.float(), v.float(), recipe=spec)


def test_per_row_and_per_key_descale_shapes_are_accepted():
    qd_rows = torch.rand(B, H, S_Q) + 0.5
    kd_tiles = (torch.rand(B, H_KV, 3) + 0.5).repeat_interleave(128, dim=2)[:, :, :S_K]  # constant per 128 keys
    accepted(q_descale=qd_rows, k_descale=kd_tiles)
    accepted(q_descale=qd_rows[..., None], k_descale=kd_tiles[..., None])
    accepted(q_descale=qd_rows, k_descale=torch.ones(B, H_KV))  # per-row Q with a per-head K
    accepted(q_descale=torch.ones(B, H_KV), k_descale=kd_tiles)  # FA3's (b, h_kv) Q with per-tile K
    # constant per 128 keys is constant per 64 too: a BLOCK_N=64 launch takes it
    q, k, v = fp8_inputs()
    with pytest.raises(ValueError, match="CUDA GPU"):
        attention_fp8(q, k, v, recipe="zyfa:block_n=64", k_descale=kd_tiles)


@pytest.mark.parametrize("kw,match", [
    ({"q_descale": torch.ones(B, H, S_Q + 1)}, r"q_descale per query row must be of shape \(2, 4, 200\)"),
    ({"q_descale": torch.ones(B, H_KV, S_Q)}, r"q_descale per query row must be of shape"),
    ({"q_descale": torch.ones(B, H, S_Q, 2)}, "q_descale must be one scalar"),
    ({"k_descale": torch.ones(B, H, S_K)}, r"k_descale per key must be of shape \(2, 2, 300\)"),
    ({"k_descale": torch.ones(B, H_KV, S_Q)}, "k_descale per key must be of shape"),
    ({"q_descale": -torch.ones(B, H, S_Q)}, "q_descale must be positive and finite"),
    ({"k_descale": torch.full((B, H_KV, S_K), float("nan"))}, "k_descale must be positive and finite"),
    ({"k_descale": torch.rand(B, H_KV, S_K) + 0.5}, "k_descale varies within a KV tile of 128 keys"),
    ({"v_descale": torch.ones(B, H_KV, S_K)}, "v_descale must be one scalar"),
])
def test_bad_per_row_descales_are_refused(kw, match):
    q, k, v = fp8_inputs()
    with pytest.raises(ValueError, match=match):
        attention_fp8(q, k, v, **kw)


def test_v_descale_forms_follow_the_recipes_v_scale():
    chan = "zyfa:v_scale=channel"
    block = "zyfa:v_scale=block,v_descale=tile"
    per_channel = torch.rand(B, H_KV, D) + 0.5
    per_key = (torch.rand(B, H_KV, 3) + 0.5).repeat_interleave(128, dim=2)[:, :, :S_K]
    accepted(recipe=chan, v_descale=per_channel)
    accepted(recipe=chan, v_descale=per_channel[:, :, None])
    accepted(recipe=chan, v_descale=0.5)
    accepted(recipe=block, v_descale=per_key)
    accepted(recipe=block, v_descale=per_key[..., None])
    accepted(recipe=block, v_descale=torch.tensor(0.5))
    q, k, v = fp8_inputs()
    for recipe, vd, match in [
        (chan, per_key, r"v_descale for v_scale='channel' must be one value or per channel: \(2, 2, 64\)"),
        (chan, torch.ones(B, H_KV), "v_descale for v_scale='channel'"),
        (chan, -per_channel, "v_descale must be positive and finite"),
        (block, per_channel, r"v_descale per key must be of shape \(2, 2, 300\)"),
        (block, torch.rand(B, H_KV, S_K) + 0.5, "v_descale varies within a KV tile of 128 keys"),
        ("zyfa", per_channel, "v_descale must be one scalar"),
    ]:
        with pytest.raises(ValueError, match=match):
            attention_fp8(q, k, v, recipe=recipe, v_descale=vd)


def test_k_descales_of_64_key_blocks_refused_for_128_key_tiles():
    kd = (torch.rand(B, H_KV, 5) + 0.5).repeat_interleave(64, dim=2)[:, :, :S_K]
    accepted(recipe="zyfa:block_n=64", k_descale=kd)
    q, k, v = fp8_inputs()
    with pytest.raises(ValueError, match="block_n=128"):
        attention_fp8(q, k, v, recipe="zyfa", k_descale=kd)


def test_q_descale_per_program_only_where_each_program_shares_one_value():
    blocks = torch.tensor([[[1.0, 2.0]]])
    qd = blocks.repeat_interleave(128, dim=2)[:, :, :200]  # 128-row Q blocks, the last one short
    assert torch.equal(q_descale_per_program(qd, 64), blocks.repeat_interleave(2, dim=2)[:, :, :4])
    assert torch.equal(q_descale_per_program(qd, 128), blocks)
    per_token = torch.rand(1, 1, 200) + 0.5
    assert q_descale_per_program(per_token, 64) is None  # finer than a program: the kernel reads one per row
    assert q_descale_per_program(blocks.repeat_interleave(32, dim=2), 64) is None


def test_k_descale_per_tile_takes_one_value_per_tile_including_the_short_last_one():
    blocks = torch.tensor([[[1.0, 2.0, 3.0]]])
    kd = blocks.repeat_interleave(128, dim=2)[:, :, :300]  # last tile 44 keys
    assert torch.equal(k_descale_per_tile(kd, 128), blocks)
    assert torch.equal(k_descale_per_tile(kd, 64), blocks.repeat_interleave(2, dim=2)[:, :, :5])
    bad = kd.clone()
    bad[0, 0, 299] = 4.0  # only the short last tile differs
    with pytest.raises(ValueError, match="varies within a KV tile"):
        k_descale_per_tile(bad, 128)


@pytest.mark.parametrize("spec", ["zyfa:q_scale=block,k_scale=block", "zyfa:q_scale=block,scale_block_q=64,"
                                  "k_scale=block,scale_block_kv=256,k_smoothing=true,qk_rotation=hadamard"])
def test_quantizer_gives_the_emulators_per_block_descales(spec):
    """quantize_for_kernel: per-row Q and per-key K descales equal to the emulator quantizer's, its FP8 values
    the same, and K's per-tile form holds each 128-key tile's block descale."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, S_Q, D, generator=g)
    k = torch.randn(B, H_KV, S_K, D, generator=g) + 2.0
    v = torch.randn(B, H_KV, S_K, D, generator=g)
    r = recipe_from_spec(spec)
    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, r)
    qi = quantize_inputs(q, k, v, r)
    assert qd.shape == (B, H, S_Q) and kd.shape == (B, H_KV, S_K) and vd.shape == (B, H_KV)
    assert torch.equal(v8.float(), qi.v_values)
    assert torch.equal(qd, qi.q_descale[..., 0]) and torch.equal(kd, qi.k_descale[..., 0])
    assert torch.equal(q8.float(), qi.q_values) and torch.equal(k8.float(), qi.k_values)
    # blocks really differ (else the test could not tell per-block from per-head)
    assert qd.unique().numel() > B * H and kd.unique().numel() > B * H_KV
    tiles = k_descale_per_tile(kd, 128)
    block = r.scale_block_kv
    assert torch.equal(tiles, kd[:, :, ::128])
    assert torch.equal(tiles.repeat_interleave(128, dim=2)[:, :, :S_K], kd)
    assert torch.equal(kd[:, :, ::block].repeat_interleave(block, dim=2)[:, :, :S_K], kd)
    if r.k_smoothing:  # smoothing: K's channel mean (2 per channel, norm 16 here, rotated or not) removed first
        assert qi.k_mean.norm(dim=-1).min() > 10.0


@pytest.mark.parametrize("spec,shape", [("zyfa:v_scale=channel", (B, H_KV, D)),
                                        ("zyfa:v_scale=block,v_descale=tile", (B, H_KV, S_K))])
def test_quantizer_gives_per_channel_and_per_key_v_descales(spec, shape):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, n, s, D, generator=g) for n, s in ((H, S_Q), (H_KV, S_K), (H_KV, S_K)))
    r = recipe_from_spec(spec)
    vd = quantize_for_kernel(q, k, v, r)[5]
    qi = quantize_inputs(q, k, v, r)
    assert vd.shape == shape and torch.equal(vd, qi.v_descale.reshape(shape))
    assert vd.unique().numel() > B * H_KV


def test_bench_markdown_has_a_rotation_column():
    from zyfa.bench.table import to_markdown

    meta = {"device": "H200", "command": "zyfa bench", "date": "d", "git_commit": "c", "versions": {},
            "inputs_note": "Gaussian"}
    base = {"input": "gaussian", "h": 16, "h_kv": 16, "d_qk": 128, "d_v": 128, "s": 32768, "causal": False,
            "impl": "triton-fp8", "tflops": 700.0, "ms": 3.0, "v_transpose_ms": 0.05}
    rows = [dict(base, recipe="zyfa"),
            dict(base, recipe="zyfa:qk_rotation=hadamard", rotation_ms=0.125, rotation_matmul_ms=0.0625)]
    md = to_markdown(meta, rows, ours="zyfa")
    lines = [ln for ln in md.splitlines() if ln.startswith("| gaussian")]
    assert lines[0].endswith("| - |") and lines[1].endswith("| 0.125 / 0.062 |")
    assert all(ln.count("|") == 17 for ln in lines)  # 16 columns
    assert "rotation ms (FWHT / matmul)" in md


def test_descale_value_checks_are_answered_together(monkeypatch):
    """attention_fp8 answers the descales' value checks together (zyfa.checks: one host sync, three otherwise, in
    every layer of every decode step); the first descale that is not positive and finite is named, as before."""
    from zyfa import checks
    from zyfa.kernels.validation import descale_to_bh

    with pytest.raises(ValueError, match="^k_descale must be positive and finite$"):  # outside a scope: at once
        descale_to_bh(torch.zeros(B, H_KV), "k_descale", B, H_KV, H_KV, "cpu")
    asked = []
    real = torch.Tensor.__bool__
    with pytest.raises(ValueError, match="^k_descale must be positive and finite$"), checks.deferred():
        monkeypatch.setattr(torch.Tensor, "__bool__", lambda t: asked.append(1) or real(t))
        good = descale_to_bh(torch.ones(B, H), "q_descale", B, H, H_KV, "cpu")
        bad = descale_to_bh(torch.full((B, H_KV), float("inf")), "k_descale", B, H_KV, H_KV, "cpu")
        assert good.shape == (B, H) and bad.shape == (B, H_KV) and asked == [], "nothing read back inside"
        monkeypatch.undo()  # the answer comes when the scope ends
    q, k, v = fp8_inputs()
    with pytest.raises(ValueError, match="^q_descale must be positive and finite$"):  # both bad: the first named
        attention_fp8(q, k, v, q_descale=torch.full((B, H), float("nan")), k_descale=-torch.ones(B, H_KV))
