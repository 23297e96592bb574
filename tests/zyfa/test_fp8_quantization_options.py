"""The FP8 quantization options of a recipe, end to end (issue 14): per-token and per-block Q/K descales, K
smoothing and per-channel V descales on e4m3fn recipes, through ``quantize_inputs`` (which the kernel's quantizer
reuses) and through ``emulate``.

Each expectation comes from a separate small float64 implementation of that one step written here (numpy: an
e4m3fn round-to-nearest-even, the group amaxes, the per-channel mean), never from the code under test; the
tolerances come from e4m3fn's precision (3 mantissa bits: a normal value rounds within 2^-4 of itself relative, a
subnormal within 2^-10 of the descale).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from zyfa.reference.attention import attention_fp64

from zyfa.emulator import emulate, quantize_inputs
from zyfa.norms import rel_l2
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import QUANT_SCHEMES, RECIPES

E4M3_MAX = 448.0
HALF_ULP_REL = 2.0**-4  # e4m3fn normal numbers: 3 stored mantissa bits
SUBNORMAL_HALF_STEP = 2.0**-10  # e4m3fn subnormal spacing 2^-9, in units of the descale


def e4m3fn_rne(x: np.ndarray) -> np.ndarray:
    """Round float64 values to e4m3fn, nearest even, saturating at +-448 (independent of zyfa.formats)."""
    x = np.clip(np.asarray(x, dtype=np.float64), -E4M3_MAX, E4M3_MAX)
    mag = np.abs(x)
    exp = np.floor(np.log2(np.where(mag > 0, mag, 1.0)))
    exp = np.maximum(exp, -6.0)  # below 2^-6 the spacing stays 2^-9 (subnormals)
    quantum = 2.0 ** (exp - 3.0)
    return np.round(x / quantum) * quantum  # np.round: half to even


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def expected_fp8(x: np.ndarray, amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, descale) of x with one descale per group: amax broadcast to x's groups; fp32 descale as kernels
    take it (amax / 448 rounded to fp32), the quotient rounded to fp32, then e4m3fn."""
    descale = f32(amax / E4M3_MAX)
    descale = np.where(descale > 0, descale, 1.0)
    return e4m3fn_rne(f32(x / descale)), descale


def assert_within_fp8(deq: np.ndarray, x: np.ndarray, descale: np.ndarray) -> None:
    """Dequantized values within half an e4m3fn step of the originals."""
    bound = np.maximum(HALF_ULP_REL * np.abs(x), SUBNORMAL_HALF_STEP * descale) * (1 + 1e-6)
    assert (np.abs(deq - x) <= bound).all()


def _zyfa(**fields):
    return get_recipe("zyfa").replace(name="zyfa-test", **fields)


def _qkv(b=1, h=2, h_kv=1, s=10, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s, d, generator=g)
    k = torch.randn(b, h_kv, s, d, generator=g)
    v = torch.randn(b, h_kv, s, d, generator=g)
    return q, k, v


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def _rel(a, b) -> float:
    return rel_l2(torch.as_tensor(np.asarray(a, np.float64)), torch.as_tensor(np.asarray(b, np.float64)))


# ---------------------------------------------------------------------------------------------- quantize_inputs

def test_per_token_qk_descales_are_each_tokens_amax_over_448():
    q, k, v = _qkv()
    q = q * torch.logspace(-3, 3, 10).reshape(1, 1, 10, 1)  # tokens six decades apart
    qi = quantize_inputs(q, k, v, _zyfa(q_scale="block", k_scale="block", scale_block_q=1, scale_block_kv=1))
    for x, codes, descale in ((q, qi.q_values, qi.q_descale), (k, qi.k_values, qi.k_descale)):
        xn = _np(x)
        want_codes, want_descale = expected_fp8(xn, np.abs(xn).max(axis=3, keepdims=True))
        assert descale.shape == (*x.shape[:3], 1)
        np.testing.assert_array_equal(_np(descale), want_descale)
        np.testing.assert_array_equal(_np(codes), want_codes)
        assert_within_fp8(_np(codes) * want_descale, xn, want_descale)
    # V keeps zyfa's per-tensor descale
    assert qi.v_descale.numel() == 1 and qi.v_descale.item() == pytest.approx(v.abs().max().item() / E4M3_MAX)


def test_per_block_qk_descales_cover_blocks_of_tokens_with_a_short_last_block():
    q, k, v = _qkv(s=10)
    q[:, :, 4:8] *= 50.0  # the second block of 4 tokens is large
    qi = quantize_inputs(q, k, v, _zyfa(q_scale="block", k_scale="block", scale_block_q=4, scale_block_kv=3))
    for x, codes, descale, block in ((q, qi.q_values, qi.q_descale, 4), (k, qi.k_values, qi.k_descale, 3)):
        xn = _np(x)
        amax = np.zeros(xn.shape[:3] + (1,))
        for start in range(0, xn.shape[2], block):  # blocks 0..3, 4..7, 8..9 (short)
            amax[:, :, start:start + block] = np.abs(xn[:, :, start:start + block]).max(axis=(2, 3), keepdims=True)
        want_codes, want_descale = expected_fp8(xn, amax)
        np.testing.assert_array_equal(_np(descale.expand(*x.shape[:3], 1)), want_descale)
        np.testing.assert_array_equal(_np(codes), want_codes)
    # each block's largest magnitude lands on 448
    assert _np(qi.q_values[:, :, 4:8]).__abs__().max() == E4M3_MAX


def test_k_smoothing_on_fp8_subtracts_the_per_channel_mean_over_tokens_before_quantizing():
    q, k, v = _qkv(h=4, h_kv=2, s=12)
    k = k + torch.tensor([30.0, -5.0, 0.0, 2.0, 0.0, 0.0, 80.0, 1.0])  # channel offsets, as real K has
    qi = quantize_inputs(q, k, v, _zyfa(k_smoothing=True))
    kn = _np(k)
    mean = kn.mean(axis=2, keepdims=True)  # per (batch, kv head, channel), over the tokens
    np.testing.assert_allclose(_np(qi.k_mean), mean, rtol=1e-6, atol=1e-5)
    centred = kn - _np(qi.k_mean)
    want_codes, want_descale = expected_fp8(centred, np.abs(centred).max())
    np.testing.assert_allclose(_np(qi.k_descale), want_descale, rtol=2.0**-23)
    np.testing.assert_array_equal(_np(qi.k_values), want_codes)
    # the grid now follows the centred K: its descale is far below the uncentred K's
    assert qi.k_descale.item() < 0.1 * np.abs(kn).max() / E4M3_MAX
    # dequantized() undoes the smoothing: K within half an FP8 step (of the centred grid) of the original
    _, k_deq, _ = qi.dequantized()
    assert_within_fp8(_np(k_deq) - _np(qi.k_mean), centred, want_descale)
    np.testing.assert_allclose(_np(k_deq), kn, atol=HALF_ULP_REL * np.abs(centred).max() * 1.001)


def test_per_channel_v_descales_are_each_channels_amax_over_tokens():
    q, k, v = _qkv(h=2, h_kv=2, s=16)
    v = v * torch.tensor([1e3, 1.0, 1e-3, 1.0, 1.0, 5.0, 1e-2, 1.0])
    qi = quantize_inputs(q, k, v, _zyfa(v_scale="channel"))
    vn = _np(v)
    want_codes, want_descale = expected_fp8(vn, np.abs(vn).max(axis=2, keepdims=True))
    assert qi.v_descale.shape == (1, 2, 1, 8)
    np.testing.assert_array_equal(_np(qi.v_descale), want_descale)
    np.testing.assert_array_equal(_np(qi.v_values), want_codes)
    assert_within_fp8(_np(qi.v_values) * want_descale, vn, want_descale)


def test_named_remedies_quantize_as_their_fields_say():
    """Each named remedy's dequantized inputs equal the independent quantization of its fields."""
    q, k, v = _qkv(h=2, h_kv=1, s=256, d=16, seed=3)
    qn, kn, vn = _np(q), _np(k), _np(v)

    def blocks(x, size):
        amax = np.zeros(x.shape[:3] + (1,))
        for s0 in range(0, x.shape[2], size):
            amax[:, :, s0:s0 + size] = np.abs(x[:, :, s0:s0 + size]).max(axis=(2, 3), keepdims=True)
        return amax

    qi = quantize_inputs(q, k, v, "zyfa+block")
    deq = qi.dequantized()
    for got, x in zip(deq, (qn, kn, vn), strict=True):
        codes, descale = expected_fp8(x, blocks(x, 128))
        np.testing.assert_array_equal(_np(got), f32(codes * descale))

    qi = quantize_inputs(q, k, v, "zyfa+block+smooth")
    kc = kn - kn.mean(axis=2, keepdims=True)
    codes, descale = expected_fp8(kc, blocks(kc, 128))
    assert_within_fp8(_np(qi.k_values * qi.k_descale), kc, descale)
    codes, descale = expected_fp8(vn, np.abs(vn).max(axis=2, keepdims=True))
    np.testing.assert_array_equal(_np(qi.v_values * qi.v_descale), f32(codes * descale))

    qi = quantize_inputs(q, k, v, "zyfa+smooth")
    assert qi.k_descale.numel() == 1 and qi.k_mean.shape == (1, 1, 1, 16)


# ---------------------------------------------------------------------------------------------- emulate

def _emulated_vs_deq_reference(q, k, v, recipe, causal=False):
    em = emulate(q, k, v, recipe, causal=causal)
    ref, lse = attention_fp64(em.q_deq, em.k_deq, em.v_deq, causal=causal)
    return em, ref, lse


def test_emulate_applies_per_token_q_and_k_descales_to_the_scores():
    q, k, v = _qkv(h=2, h_kv=1, s=256, d=64, seed=1)
    q = q * torch.logspace(-2, 1, 256).reshape(1, 1, 256, 1)
    k = k * torch.logspace(1, -2, 256).reshape(1, 1, 256, 1)
    r = _zyfa(q_scale="block", k_scale="block", scale_block_q=1, scale_block_kv=1)
    em, ref, _ = _emulated_vs_deq_reference(q, k, v, r, causal=True)
    assert _rel(_np(em.out), ref.numpy()) < 2e-2  # P rounding only: the descales are applied where they belong
    # the dequantized inputs are the independent per-token quantization
    codes, descale = expected_fp8(_np(q), np.abs(_np(q)).max(axis=3, keepdims=True))
    np.testing.assert_array_equal(_np(em.q_deq), f32(codes * descale))


def test_emulate_applies_each_kv_tiles_own_v_block_descale():
    """V blocks 100x apart: a wrong tile's descale would be off by 100x in half the keys."""
    q, k, v = _qkv(h=1, h_kv=1, s=256, d=64, seed=2)
    v[:, :, 128:] *= 100.0
    k = k * 0.1  # diffuse attention: both halves matter
    em, ref, _ = _emulated_vs_deq_reference(q, k, v, "zyfa+block")
    # P rounding of diffuse rows only (a tile scaled by the other block's descale would be off by 100x: error ~1)
    assert _rel(_np(em.out), ref.numpy()) < 5e-2
    codes, descale = expected_fp8(_np(v), np.concatenate([np.full((1, 1, 128, 1), np.abs(_np(v)[:, :, :128]).max()),
                                                          np.full((1, 1, 128, 1), np.abs(_np(v)[:, :, 128:]).max())],
                                                         axis=2))
    np.testing.assert_array_equal(_np(em.v_deq), f32(codes * descale))


def test_emulate_with_per_channel_v_keeps_small_channels_accurate():
    q, k, v = _qkv(h=1, h_kv=1, s=256, d=64, seed=4)
    v = v * torch.where(torch.arange(64) < 4, 1e3, 1e-3)  # 4 huge channels, 60 tiny ones
    x64 = attention_fp64(q, k, v)[0].numpy()
    small = slice(4, 64)
    err = {}
    for name, fields in (("tensor", {}), ("channel", {"v_scale": "channel"})):
        em = emulate(q, k, v, _zyfa(**fields))
        err[name] = _rel(_np(em.out)[..., small], x64[..., small])
    # per tensor, the tiny channels' codes sit at or below e4m3fn's smallest subnormal (1e-3 / (1e3 / 448) ~ 2^-11)
    assert err["tensor"] > 0.5
    assert err["channel"] < 0.1  # Q/K's per-tensor quantization and P rounding remain (about 5e-2 here)


def test_emulate_with_k_smoothing_equals_attention_on_the_original_inputs_up_to_fp8():
    q, k, v = _qkv(h=2, h_kv=1, s=256, d=64, seed=5)
    k = k + 40.0 * (torch.arange(64) % 7 == 0)  # large channel offsets in K
    x64 = attention_fp64(q, k, v, causal=True)[0]
    # softmax invariance, independently: centring K leaves the FP64 output unchanged
    centred = k.double() - k.double().mean(dim=2, keepdim=True)
    np.testing.assert_allclose(attention_fp64(q.double(), centred, v.double(), causal=True)[0].numpy(), x64.numpy(),
                               rtol=0, atol=1e-12)
    plain = emulate(q, k, v, "zyfa", causal=True)
    smooth = emulate(q, k, v, "zyfa+smooth", causal=True)
    err_plain, err_smooth = _rel(_np(plain.out), x64.numpy()), _rel(_np(smooth.out), x64.numpy())
    assert err_smooth < 0.5 * err_plain
    # the LSE is the original problem's (the smoothing's q.mean(k) term added back)
    _, lse_deq = attention_fp64(smooth.q_deq, smooth.k_deq, smooth.v_deq, causal=True)
    # (within zyfa's own LSE error from its rounded row sums, about 2e-2 here; without the term it is off by q.mean(k))
    assert (smooth.lse.double() - lse_deq).abs().max().item() < 5e-2


@pytest.mark.parametrize("name", QUANT_SCHEMES)
def test_every_quantization_scheme_runs_and_its_error_is_fp8_sized(name):
    q, k, v = _qkv(h=2, h_kv=1, s=300, d=64, seed=6)
    em, ref, _ = _emulated_vs_deq_reference(q, k, v, name, causal=True)
    assert 1e-3 < _rel(_np(em.out), ref.numpy()) < 3e-2
    orig = attention_fp64(q, k, v, causal=True)[0].numpy()
    assert 3e-3 < _rel(_np(em.out), orig) < 0.2


def test_schemes_change_only_the_quantization_of_zyfa():
    zyfa = RECIPES["zyfa"]
    quant = ("q_scale", "k_scale", "v_scale", "scale_block_q", "scale_block_kv", "k_smoothing", "qk_rotation",
             "rotation_seed", "v_descale")
    for name in QUANT_SCHEMES[1:]:
        r = RECIPES[name]
        assert r.status in ("assumed", "modelled", "from source", "verified") and r.status_note
        assert "arXiv" in r.source
        other = {f: getattr(r, f) for f in r.__dataclass_fields__ if f not in (*quant, "name", "source", "tags",
                                                                                "status", "status_note")}
        assert other == {f: getattr(zyfa, f) for f in other}, name


def test_plus_names_parse_with_platforms_overrides_and_lists():
    from zyfa.kernels.attention_fp8 import recipe_from_spec
    from zyfa.recipe_spec import parse_recipes

    r = get_recipe("zyfa+block+hadamard@h200")
    assert r.platform == "h200" and r.qk_rotation == "random_hadamard" and r.q_scale == "block"
    o = recipe_from_spec("zyfa+block+smooth:scale_block_q=64")
    assert o.scale_block_q == 64 and o.k_smoothing and o.name == "zyfa+block+smooth:scale_block_q=64"
    assert [x.name for x in parse_recipes("zyfa+smooth, zyfa+hadamard")] == ["zyfa+smooth", "zyfa+hadamard"]
    with pytest.raises(ValueError, match="unknown recipe 'zyfa\\+nothing'"):
        get_recipe("zyfa+nothing")


def test_rotation_of_a_scheme_leaves_fp64_attention_unchanged():
    """The rotating scheme's dequantized Q, K are the rotated ones; un-quantized, the rotation is exact."""
    from zyfa.rotation import rotate_qk

    q, k, v = (t.double() for t in _qkv(h=2, h_kv=2, s=64, d=32, seed=7))
    qr, kr = rotate_qk(q, k, RECIPES["zyfa+hadamard"].qk_rotation, seed=RECIPES["zyfa+hadamard"].rotation_seed)
    a, b = attention_fp64(q, k, v, causal=True)[0], attention_fp64(qr, kr, v, causal=True)[0]
    assert (a - b).abs().max().item() < 1e-12
    assert not math.isclose(qr[0, 0, 0, 0].item(), q[0, 0, 0, 0].item())
