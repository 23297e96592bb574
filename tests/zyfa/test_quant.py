"""zyfa.quant: scale shapes and values per granularity, the half-ulp round-trip bound, and input checks."""

from __future__ import annotations

import math

import pytest
import torch

from zyfa.formats import E4M3FN, E4M3FNUZ, E5M2, FORMATS, round_to_fp8
from zyfa.quant import dequantize, expand_block_descale, quantize

ALL = list(FORMATS.values())
IDS = [f.short_name for f in ALL]
GRANULARITIES = ("tensor", "head", "block")


def make_x(b=2, h=3, s=300, d=16, seed=0, dtype=torch.float32):
    """Gaussian values with a different range per (batch, head) and per 128-token block, plus outliers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, s, d, generator=g)
    x = x * torch.exp2(torch.arange(b * h, dtype=torch.float32).reshape(b, h, 1, 1) - 2)
    x = x * torch.exp2(torch.arange(s, dtype=torch.float32) // 128).reshape(1, 1, s, 1)
    x[0, 0, min(5, s - 1), min(3, d - 1)] = 40.0
    return x.to(dtype)


def per_token(descale: torch.Tensor, s: int, granularity: str, block_size: int) -> torch.Tensor:
    return expand_block_descale(descale, s, block_size) if granularity == "block" else descale


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_round_trip_within_half_ulp(fmt, granularity):
    x = make_x()
    x_q, descale = quantize(x, fmt, granularity, block_size=128)
    assert x_q.dtype == torch.float32 and descale.dtype == torch.float32 and x_q.shape == x.shape
    assert torch.equal(round_to_fp8(x_q, fmt), x_q)  # representable values
    scale = per_token(descale, x.shape[2], granularity, 128)
    scaled = x / scale
    # RNE: relative error <= 2^-(M+1) in the normal range, absolute <= min_subnormal / 2 below it
    half_ulp = torch.maximum(scaled.abs() * 2.0 ** -(fmt.mantissa_bits + 1), torch.tensor(fmt.min_subnormal / 2))
    assert ((scaled - x_q).abs() <= half_ulp).all()
    # the same bound after dequantization, up to the fp32 rounding of the division and multiplication
    err = (dequantize(x_q, descale, block_size=128) - x).abs()
    assert (err <= half_ulp * scale * (1 + 2.0**-20) + x.abs() * 2.0**-22).all()


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_each_group_amax_lands_on_max_normal(fmt, granularity):
    x = make_x(s=256)
    x_q, descale = quantize(x, fmt, granularity, block_size=128)
    groups = {"tensor": (1, 1, 1, -1), "head": (2, 3, 1, -1), "block": (2, 3, 2, -1)}[granularity]
    group_max = x_q.abs().reshape(groups).amax(-1)
    assert (group_max == fmt.max_normal).all()
    amax = x.abs().reshape(groups).amax(-1, keepdim=True)
    assert torch.equal(descale.reshape(amax.shape), amax / fmt.max_normal)


def test_descale_shapes_and_values_per_granularity():
    x = make_x(b=2, h=3, s=300, d=16)
    _, d_tensor = quantize(x, E4M3FN, "tensor")
    _, d_head = quantize(x, E4M3FN, "head")
    _, d_block = quantize(x, E4M3FN, "block", block_size=128)
    assert d_tensor.shape == (1, 1, 1, 1)
    assert d_head.shape == (2, 3, 1, 1)
    assert d_block.shape == (2, 3, 3, 1)  # ceil(300 / 128); the last block holds 44 tokens
    assert d_tensor.item() == x.abs().max().item() / 448
    # per head: each (batch, head) has its own range, so six different descales
    assert torch.unique(d_head).numel() == 6
    assert torch.equal(d_head, x.abs().amax(dim=(2, 3), keepdim=True) / 448)
    # per block: the blocks grow by 2x, so the descales differ per block too (the outlier sits in block 0)
    want = torch.stack([x[:, :, i : i + 128].abs().amax(dim=(2, 3)) for i in (0, 128, 256)], dim=2)[..., None]
    assert torch.equal(d_block, want / 448)
    assert torch.unique(d_block).numel() == 18


def test_expand_block_descale():
    descale = torch.arange(1.0, 7.0).reshape(1, 2, 3, 1)
    out = expand_block_descale(descale, 300, 128)
    assert out.shape == (1, 2, 300, 1)
    assert out[0, 1, :, 0].tolist() == [4.0] * 128 + [5.0] * 128 + [6.0] * 44
    with pytest.raises(ValueError, match=r"expected \(b, h, 2, 1\)"):
        expand_block_descale(descale, 256, 128)


def test_block_size_not_dividing_seq_and_one_token():
    for s, bs in ((1, 128), (129, 128), (7, 3)):
        x = make_x(b=1, h=2, s=s, d=8)
        x_q, descale = quantize(x, E5M2, "block", block_size=bs)
        assert descale.shape == (1, 2, math.ceil(s / bs), 1)
        assert dequantize(x_q, descale, block_size=bs).shape == x.shape


def test_zero_input_gets_unit_descale():
    x = torch.zeros(1, 2, 4, 8)
    x[0, 1] = 1.0
    for g in GRANULARITIES:
        x_q, descale = quantize(x, E4M3FN, g, block_size=2)
        assert torch.equal(x_q, x * 448)  # all-zero groups quantize to 0, the rest to 448
        assert (descale > 0).all()
        assert torch.equal(dequantize(x_q, descale, block_size=2), x)
    _, d_head = quantize(x, E4M3FN, "head")
    assert torch.equal(d_head.flatten(), torch.tensor([1.0, 1 / 448]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_float_dtypes(dtype):
    x = make_x(b=1, h=2, s=130, d=8).to(dtype)
    x_q, descale = quantize(x, E4M3FNUZ, "head")
    assert x_q.dtype == torch.float32 and descale.dtype == torch.float32
    if dtype != torch.float64:  # 16-bit values are exact in fp32: same result as from fp32
        ref_q, ref_d = quantize(x.float(), E4M3FNUZ, "head")
        assert torch.equal(x_q, ref_q) and torch.equal(descale, ref_d)


def test_format_by_name():
    x = make_x(b=1, h=1, s=8, d=8)
    assert all(torch.equal(a, b) for a, b in zip(quantize(x, "e4m3fn"), quantize(x, E4M3FN), strict=True))


@pytest.mark.parametrize(
    "x, kwargs, match",
    [
        (torch.randn(3, 4, 8), {}, r"4-D tensor \(batch, heads, seq, head_dim\), got shape \(3, 4, 8\)"),
        (torch.randn(1, 1, 2, 3, 4), {}, "4-D"),
        (torch.ones(1, 1, 4, 4, dtype=torch.int32), {}, "torch.int32"),
        (torch.ones(1, 1, 4, 4).to(torch.float8_e4m3fn), {}, "float8_e4m3fn"),
        (torch.tensor([[[[1.0, math.nan]]]]), {}, "1 NaN/Inf"),
        (torch.tensor([[[[math.inf, -math.inf]]]]), {}, "2 NaN/Inf"),
        (torch.ones(1, 1, 4, 4), {"granularity": "row"}, "unknown granularity 'row'"),
        (torch.ones(1, 1, 4, 4), {"fmt": "e3m4"}, "unknown FP8 format 'e3m4'"),
        (torch.ones(1, 1, 4, 4), {"granularity": "block", "block_size": 0}, "block_size"),
        ("not a tensor", {}, "torch.Tensor"),
    ],
)
def test_bad_inputs_raise(x, kwargs, match):
    kwargs = {"fmt": E4M3FN, "granularity": "tensor", **kwargs}
    with pytest.raises(ValueError, match=match):
        quantize(x, kwargs.pop("fmt"), kwargs.pop("granularity"), **kwargs)
