"""zyfa.quant: the default arguments, empty and tiny inputs, and the exact one-line messages for bad inputs.

Expected descales and values are worked by hand: descale = amax / max_normal in fp32 (1 where that is 0),
x_q = x / descale rounded to the format.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zyfa.formats import E4M3FN, E5M2
from zyfa.quant import dequantize, expand_block_descale, quantize


def test_default_granularity_is_one_scale_for_the_tensor():
    x = torch.zeros(2, 2, 3, 4)
    x[0, 0, 0, 0] = 896.0  # amax 896: descale 2 for e4m3fn (max 448)
    x[1, 1, 2, 3] = -3.0
    x_q, descale = quantize(x, E4M3FN)
    assert descale.shape == (1, 1, 1, 1) and descale.item() == 2.0
    assert x_q[0, 0, 0, 0].item() == 448.0 and x_q[1, 1, 2, 3].item() == -1.5


def test_default_block_size_is_128_tokens_in_quantize_and_dequantize():
    # 130 tokens: blocks [0, 128) and [128, 130); amax 448 * 4 in the first, 448 / 2 in the second
    x = torch.zeros(1, 1, 130, 2)
    x[0, 0, 127, 0] = 1792.0
    x[0, 0, 128, 1] = 224.0
    x_q, descale = quantize(x, E4M3FN, "block")
    assert descale.flatten().tolist() == [4.0, 0.5]
    assert x_q[0, 0, 127, 0].item() == 448.0 and x_q[0, 0, 128, 1].item() == 448.0
    back = dequantize(x_q, descale)  # default block_size 128 expands the two block scales
    assert torch.equal(back, x)


def test_empty_inputs_get_unit_descales():
    for shape, granularity, dshape in (
        ((1, 2, 0, 4), "tensor", (1, 1, 1, 1)),
        ((1, 2, 0, 4), "head", (1, 2, 1, 1)),
        ((1, 2, 3, 0), "head", (1, 2, 1, 1)),
    ):
        x_q, descale = quantize(torch.zeros(shape), E5M2, granularity)
        assert x_q.shape == shape and descale.shape == dshape
        assert torch.equal(descale, torch.ones(dshape))


def test_amax_so_small_that_the_descale_underflows_gets_one():
    # amax 2**-149 (the smallest fp32 subnormal) / 448 rounds to 0 in fp32: the descale falls back to 1, and
    # x / 1 = 2**-149 then rounds to 0 in e4m3fn (min subnormal 2**-9).
    x = torch.zeros(1, 1, 2, 2)
    x[0, 0, 0, 0] = 2.0**-149
    x_q, descale = quantize(x, E4M3FN, "tensor")
    assert descale.item() == 1.0
    assert torch.equal(x_q, torch.zeros_like(x))


@pytest.mark.parametrize("block_size", [True, 2.5, -1, 0])
def test_bad_block_sizes_are_named(block_size):
    with pytest.raises(ValueError, match=rf"^block_size must be a positive integer, got {block_size!r}$"):
        quantize(torch.ones(1, 1, 4, 4), E4M3FN, "block", block_size=block_size)


def test_integral_float_block_size_is_accepted():
    x = torch.arange(1.0, 9.0).reshape(1, 1, 4, 2)
    q1, d1 = quantize(x, E4M3FN, "block", block_size=2.0)
    q2, d2 = quantize(x, E4M3FN, "block", block_size=2)
    assert torch.equal(q1, q2) and torch.equal(d1, d2)
    # tokens (0, 1) hold 1..4 and tokens (2, 3) hold 5..8: block amax 4 and 8, descale amax / 448 in fp32
    assert torch.equal(d2.flatten(), torch.tensor([4.0, 8.0], dtype=torch.float32) / 448.0)


def test_each_entry_point_names_itself_in_the_shape_message():
    three_d = torch.ones(1, 4, 2)
    four_d = torch.ones(1, 1, 4, 2)
    with pytest.raises(
        ValueError, match=r"^quantize: expected a 4-D tensor \(batch, heads, seq, head_dim\), got shape \(1, 4, 2\)$"
    ):
        quantize(three_d, E4M3FN)
    with pytest.raises(ValueError, match=r"^dequantize: expected a 4-D tensor .*got shape \(1, 4, 2\)$"):
        dequantize(three_d, torch.ones(1, 1, 1, 1))
    with pytest.raises(ValueError, match=r"^dequantize: expected a 4-D tensor .*got shape \(1, 1\)$"):
        dequantize(four_d, torch.ones(1, 1))
    with pytest.raises(ValueError, match=r"^expand_block_descale: expected a 4-D tensor .*got shape \(2,\)$"):
        expand_block_descale(torch.ones(2), 4, 2)
    with pytest.raises(ValueError, match=r"^quantize: expected a torch\.Tensor, got list$"):
        quantize([[1.0]], E4M3FN)
    with pytest.raises(
        ValueError, match=r"^quantize: x must be float16, bfloat16, float32 or float64, got torch\.int64$"
    ):
        quantize(torch.ones(1, 1, 2, 2, dtype=torch.int64), E4M3FN)
    with pytest.raises(
        ValueError,
        match=r"^quantize: unknown granularity 'row'; expected one of \('tensor', 'head', 'block'\)$",
    ):
        quantize(four_d, E4M3FN, "row")
    with pytest.raises(ValueError, match=r"^quantize: x holds 1 NaN/Inf value\(s\); FP8 scaling needs a finite amax$"):
        quantize(torch.tensor([[[[1.0, float("nan")]]]]), E4M3FN)
    with pytest.raises(
        ValueError,
        match=r"^expand_block_descale: descale shape \(1, 1, 3, 1\) does not match seq_len=4, block_size=2 "
        r"\(expected \(b, h, 2, 1\)\)$",
    ):
        expand_block_descale(torch.ones(1, 1, 3, 1), 4, 2)
    with pytest.raises(ValueError, match=r"expected \(b, h, 2, 1\)\)$"):
        expand_block_descale(torch.ones(1, 1, 2, 2), 4, 2)  # the trailing dim must be 1


def test_block_size_one_is_one_scale_per_token():
    x = torch.tensor([[1.0, -2.0], [0.0, 0.0], [7.0, 3.5]]).reshape(1, 1, 3, 2)
    x_q, descale = quantize(x, E4M3FN, "block", block_size=1)
    # token amax 2, 0 (unit descale), 7: descale amax / 448 in fp32
    assert torch.equal(descale.flatten(), torch.tensor([2.0 / 448, 1.0, 7.0 / 448], dtype=torch.float32))
    assert x_q[0, 0, 0].tolist() == [224.0, -448.0] and x_q[0, 0, 2].tolist() == [448.0, 224.0]
    assert torch.equal(dequantize(x_q, descale, block_size=1), x)


def test_dequantize_returns_float32_whatever_the_input_dtypes():
    x_q = torch.tensor([448.0, -0.5, 3.0, 0.0]).reshape(1, 1, 2, 2)
    descale = torch.tensor([0.25]).reshape(1, 1, 1, 1)
    expected = torch.tensor([112.0, -0.125, 0.75, 0.0]).reshape(1, 1, 2, 2)  # x_q * 0.25, exact
    for xq, d in (
        (x_q.double(), descale),
        (x_q, descale.double()),
        (x_q.to(torch.float8_e4m3fn), descale),
        (x_q.half(), descale.half()),
    ):
        out = dequantize(xq, d)
        assert out.dtype == torch.float32, (xq.dtype, d.dtype)
        assert torch.equal(out, expected)


def test_float32_inputs_are_scaled_in_fp32_and_float64_inputs_in_float64():
    # amax 890.96887 gives descale 890.96887 / 448 = 1.9887698 in fp32. x = 9.4466562 over that descale is
    # 4.749999910... exactly, which fp32 rounds to the e4m3fn tie 4.75 (-> 5.0, the even side); in float64
    # it stays below the tie (-> 4.5). Hand check with numpy float32 / Python float arithmetic:
    amax, x = 890.9688720703125, 9.446656227111816
    d = np.float32(np.float32(amax) / np.float32(448.0))
    assert d == np.float32(1.988769769668579)
    assert np.float32(np.float32(x) / d) == 4.75 and x / float(d) < 4.75 - 2**-30
    values = torch.tensor([amax, x]).reshape(1, 1, 1, 2)
    q32, d32 = quantize(values, E4M3FN)
    q64, d64 = quantize(values.double(), E4M3FN)
    assert d32.item() == float(d) and d64.item() == float(d)
    assert q32.flatten().tolist() == [448.0, 5.0]
    assert q64.flatten().tolist() == [448.0, 4.5]


def test_float64_amax_is_rounded_to_fp32_before_the_division():
    # The descale is amax / max_normal in fp32 arithmetic: fp32(fp32(amax) / 448). For this float64 amax that
    # differs by one fp32 ulp from dividing in float64 and rounding once (numpy float32 arithmetic by hand).
    amax = 950.5132326296093
    expected = np.float32(np.float32(amax) / np.float32(448.0))
    assert expected != np.float32(amax / 448.0)
    _, descale = quantize(torch.tensor([amax, 1.0], dtype=torch.float64).reshape(1, 1, 1, 2), E4M3FN)
    assert descale.dtype == torch.float32 and descale.item() == float(expected)
