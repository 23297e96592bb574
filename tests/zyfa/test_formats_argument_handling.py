"""zyfa.formats on the inputs the exact-cast tests leave out: other input dtypes of the MAD (technique 1), the
closed form's default arguments, and the one-line messages that name a bad input.

Expected values are worked out by hand in the comments (fp32 and fp16 grids, the MAD formula
n = R(8t + 56 + offset), value 2**(n//8 - 7) * (1 + (n%8)/8)), not taken from the code under test.
"""

from __future__ import annotations

import pytest
import torch

from zyfa.formats import (
    E4M3FN,
    E4M3FNUZ,
    E5M2,
    decode_fp8,
    e4m3fn_bits_from_log2,
    e4m3fn_mad_closed_form,
    encode_fp8,
    get_format,
    round_mantissa,
    round_to_bf16,
    round_to_fp8,
)


def test_mad_of_float64_log2_rounds_t_to_fp32_first():
    # t = 0.5625 + 2**-30: fp32's ulp at 0.5625 is 2**-24, so t becomes 0.5625 and 8t + 56 = 60.5 exactly, a
    # tie that "nearest" sends to the even 60. Computed in float64 instead, 8t + 56 = 60.5 + 2**-27 -> 61.
    t = torch.tensor([0.5625 + 2.0**-30], dtype=torch.float64)
    assert e4m3fn_bits_from_log2(t).tolist() == [60]
    assert e4m3fn_mad_closed_form(t).tolist() == [1.5]  # n = 60: 2**0 * (1 + 4/8)


def test_mad_of_float16_log2_is_computed_in_fp32():
    # t = 0.5625 + 2**-10 = 2**-1 * (1 + 2**-3 + 2**-9) is exact in fp16 (10 mantissa bits). In fp32,
    # 8t + 56 = 60.5078125 is exact and rounds to 61; in fp16 arithmetic (ulp 2**-5 between 32 and 64) it
    # would become the tie 60.5, which rounds to the even 60.
    t = torch.tensor([0.5625 + 2.0**-10], dtype=torch.float16)
    assert float(t.item()) == 0.5625 + 2.0**-10
    assert e4m3fn_bits_from_log2(t).tolist() == [61]


def test_mad_closed_form_defaults_are_offset_0_and_nearest():
    # 8t + 56 for t = 0, 0.5, -6.5, 0.59375: 56, 60, 4, 60.75
    t = torch.tensor([0.0, 0.5, -6.5, 0.59375], dtype=torch.float32)
    # n = 56 -> 1.0; 60 -> 1.5; 4 -> subnormal 4 * 2**-9; R(60.75) = 61 -> 1.625 (trunc would give 60 -> 1.5)
    assert e4m3fn_mad_closed_form(t).tolist() == [1.0, 1.5, 2.0**-7, 1.625]
    assert decode_fp8(e4m3fn_bits_from_log2(t), E4M3FN).tolist() == [1.0, 1.5, 2.0**-7, 1.625]


def test_bad_inputs_give_one_line_naming_the_problem():
    ints = torch.arange(4)
    for cast in (lambda x: encode_fp8(x, E4M3FN), lambda x: round_to_fp8(x, E4M3FN)):
        with pytest.raises(ValueError, match=r"^FP8 cast: expected a floating-point tensor, got torch\.int64$"):
            cast(ints)
    with pytest.raises(
        ValueError, match=r"^t must be a floating-point tensor of log2 probabilities, got torch\.int64$"
    ):
        e4m3fn_bits_from_log2(ints)
    with pytest.raises(ValueError, match=r"^rounding must be 'nearest' or 'trunc', got 'floor'$"):
        e4m3fn_mad_closed_form(torch.zeros(1), rounding="floor")
    with pytest.raises(ValueError, match=r"^decode_fp8: expected uint8 codes, got torch\.int16$"):
        decode_fp8(torch.zeros(2, dtype=torch.int16), E4M3FN)


def test_encode_saturates_by_default():
    # e4m3fn: 1000 and inf are past max 448: the default (saturating) gives +-max, code 0x7E | sign;
    # saturate=False gives the NaN code 0x7F with the sign.
    x = torch.tensor([1000.0, -1000.0, float("inf")])
    assert encode_fp8(x, E4M3FN).tolist() == [0x7E, 0xFE, 0x7E]
    assert encode_fp8(x, E4M3FN, saturate=False).tolist() == [0x7F, 0xFF, 0x7F]
    assert round_to_fp8(x, E4M3FN).tolist() == [448.0, -448.0, 448.0]


def test_format_lookup_messages_name_the_input_and_the_choices():
    with pytest.raises(
        ValueError,
        match=r"^unknown FP8 format 'e3m4'; known: 'e4m3fn', 'e4m3fnuz', 'e5m2' \(with or without 'float8_'\)$",
    ):
        get_format("e3m4")
    with pytest.raises(
        ValueError,
        match=r"^no FP8 format for dtype torch\.float16; known: float8_e4m3fn, float8_e4m3fnuz, float8_e5m2$",
    ):
        get_format(torch.float16)
    # names are matched after strip and lower-casing, with or without the prefix
    assert get_format("  Float8_E4M3FNUZ ") is E4M3FNUZ
    assert get_format("E5M2") is E5M2


def test_fp8_input_message_says_to_decode_first():
    with pytest.raises(
        ValueError,
        match=r"^FP8 cast: input is already torch\.float8_e5m2; decode it \(decode_fp8 or \.float\(\)\) first$",
    ):
        encode_fp8(torch.zeros(2, dtype=torch.float8_e5m2), E4M3FN)


def test_round_mantissa_defaults_and_messages():
    # 1 + 2**-8 + 2**-9 (bits 8 and 9 below the point): 7 kept bits truncate to 1.0; RNE rounds up to 1 + 2**-7
    x = torch.tensor([1.0 + 2.0**-8 + 2.0**-9], dtype=torch.float32)
    assert round_mantissa(x, 7).tolist() == [1.0]  # default mode: truncation
    assert round_to_bf16(x).tolist() == [1.0 + 2.0**-7]  # default mode: round to nearest even
    with pytest.raises(ValueError, match=r"^round_mantissa: mantissa_bits must be in 0\.\.23, got 24$"):
        round_mantissa(x, 24)
    with pytest.raises(ValueError, match=r"^round_mantissa: mantissa_bits must be in 0\.\.23, got -1$"):
        round_mantissa(x, -1)
    with pytest.raises(ValueError, match=r"^round_mantissa: mode must be 'trunc' or 'rne', got 'nearest'$"):
        round_mantissa(x, 7, "nearest")
    with pytest.raises(ValueError, match=r"^round_mantissa: expected a floating-point tensor, got torch\.int32$"):
        round_mantissa(torch.ones(2, dtype=torch.int32), 7)


def test_round_mantissa_keeps_zero_bits_too():
    # 0 explicit bits: powers of two. 1.75 truncates to 1 and rounds to 2; 1.25 rounds to 1; -3.5 truncates to -2
    x = torch.tensor([1.75, 1.25, -3.5, 0.375], dtype=torch.float32)
    assert round_mantissa(x, 0, "trunc").tolist() == [1.0, 1.0, -2.0, 0.25]
    assert round_mantissa(x, 0, "rne").tolist() == [2.0, 1.0, -4.0, 0.5]
