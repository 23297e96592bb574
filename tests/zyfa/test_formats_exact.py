"""Exact tests of zyfa.formats: every code, every tie, random fp32, corner tables, against torch's casts.

Comparisons are bit for bit (atol = rtol = 0, through ``.view(torch.uint8)``); NaN codes are compared as
bytes too, since ours follow torch's (e4m3fn/e5m2 keep the sign, fnuz has the one code 0x80).

Recent torch's float32 -> float8_e4m3fn cast *saturates*: finite overflow and +-inf give +-448 (pytorch
PR #178817, April 2026, in the 2.13 used here); older torch gave NaN. So the torch oracle for our
non-saturating e4m3fn mode is torch's cast with the overflow rule (|x| > 464, or inf -> NaN) applied on top,
a no-op on an older torch. The oracle for our saturating mode is torch's cast of ``clamp(x, -max, max)``
(NaN stays NaN).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zyfa.formats import (
    E4M3FN,
    E4M3FNUZ,
    E5M2,
    FORMATS,
    FP8Format,
    decode_fp8,
    e4m3fn_bits_from_log2,
    e4m3fn_mad_closed_form,
    encode_fp8,
    get_format,
    round_mantissa,
    round_to_bf16,
    round_to_fp8,
)

ALL = list(FORMATS.values())
IDS = [f.short_name for f in ALL]
NAN, INF = math.nan, math.inf


# ----------------------------------------------------------------------------------------------------------
# helpers


def assert_same_bytes(ours: torch.Tensor, ref: torch.Tensor, inputs: torch.Tensor | None = None) -> None:
    """Bit-for-bit equality; on failure list the count and the first five mismatches."""
    __tracebackhide__ = True
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, (ours.shape, ours.dtype, ref.shape, ref.dtype)
    n = ours.element_size()
    a = ours.contiguous().view(torch.uint8).reshape(-1, n)
    b = ref.contiguous().view(torch.uint8).reshape(-1, n)
    bad = (a != b).any(dim=1).nonzero().flatten()
    if bad.numel():
        lines = []
        for i in bad[:5].tolist():
            x = "" if inputs is None else f"x={inputs.flatten()[i].item()!r} ({inputs.flatten()[i].item():.9g}): "
            lines.append(f"  [{i}] {x}ours={ours.flatten()[i].item()!r} ref={ref.flatten()[i].item()!r}")
        raise AssertionError(f"{bad.numel()} of {a.shape[0]} differ:\n" + "\n".join(lines))


def assert_same_values(ours: torch.Tensor, ref: torch.Tensor, inputs: torch.Tensor | None = None) -> None:
    """float32 bit equality, except that any NaN matches any NaN (NaN payloads and signs are not values)."""
    __tracebackhide__ = True
    assert torch.equal(ours.isnan(), ref.isnan()), "NaN positions differ"
    canon = torch.tensor(NAN)
    assert_same_bytes(torch.where(ours.isnan(), canon, ours), torch.where(ref.isnan(), canon, ref), inputs)


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def boundary(fmt: FP8Format) -> float:
    """max_normal plus half an ulp of the top binade: the first magnitude that may overflow."""
    return fmt.max_normal + 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)


def torch_codes(x: torch.Tensor, fmt: FP8Format, saturate: bool) -> torch.Tensor:
    """The oracle: torch's own cast, made saturating or not as described in the module docstring."""
    x = x.float()
    if saturate:
        return x.clamp(-fmt.max_normal, fmt.max_normal).to(fmt.torch_dtype).view(torch.uint8)
    codes = x.to(fmt.torch_dtype).view(torch.uint8)
    if fmt is E4M3FN:
        a = x.abs()
        # RNE overflow: past the tie 464, or exactly on it only if the even side were 480 (it is 448: no)
        over = (a > boundary(fmt)) | torch.isinf(x)
        codes = torch.where(over, (0x7F | (torch.signbit(x).to(torch.uint8) << 7)).to(torch.uint8), codes)
    return codes


def finite_values(fmt: FP8Format) -> torch.Tensor:
    """All distinct finite non-negative values of the format, ascending (float32)."""
    v = decode_fp8(torch.arange(256, dtype=torch.uint8), fmt)
    v = v[torch.isfinite(v) & (v >= 0)]
    return torch.unique(v)


def tie_inputs(fmt: FP8Format) -> torch.Tensor:
    """Every midpoint between adjacent codes (and above max), +-1 fp32 ulp, and the codes, both signs."""
    v = finite_values(fmt)
    top = torch.tensor([boundary(fmt), 2 * fmt.max_normal])
    mids = torch.cat([(v[1:] + v[:-1]) / 2, top])  # exact in fp32: few significant bits
    pts = torch.cat([v, mids])
    pts = torch.cat([pts, torch.nextafter(pts, f32(INF)), torch.nextafter(pts, f32(0.0))])
    return torch.cat([pts, -pts])


def random_fp32(n: int, lo_exp: int, hi_exp: int, seed: int) -> torch.Tensor:
    """Random signs, exponents uniform in [lo_exp, hi_exp], all 23 mantissa bits random."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(lo_exp, hi_exp + 1, (n,), generator=g, dtype=torch.int32)
    mant = torch.randint(0, 1 << 23, (n,), generator=g, dtype=torch.int32)
    sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.int32) << 31
    return (sign | ((e + 127) << 23) | mant).view(torch.float32)


def python_round(v: float, fmt: FP8Format, saturate: bool) -> float:
    """Scalar reference in Python floats (exact: frexp/ldexp, and round() is half-to-even)."""
    if math.isnan(v):
        return NAN
    over = fmt.max_normal if saturate else (INF if fmt.has_inf else NAN)
    if math.isinf(v):
        return math.copysign(over, v)
    a = abs(v)
    e = max(math.frexp(a)[1] - 1, fmt.emin) if a else fmt.emin
    r = math.ldexp(round(math.ldexp(a, fmt.mantissa_bits - e)), e - fmt.mantissa_bits)
    if r > fmt.max_normal:
        r = over
    if r == 0 and not fmt.has_negative_zero:
        return 0.0
    return math.copysign(r, v)


def check_cast(x: torch.Tensor, fmt: FP8Format) -> None:
    """Our encode against the torch oracle in both modes, and round_to_fp8 against decode(encode)."""
    __tracebackhide__ = True
    for saturate in (True, False):
        codes = encode_fp8(x, fmt, saturate=saturate)
        assert_same_bytes(codes, torch_codes(x, fmt, saturate), x)
        assert_same_values(round_to_fp8(x, fmt, saturate=saturate), decode_fp8(codes, fmt), x)


# ----------------------------------------------------------------------------------------------------------
# the format table


def test_format_table():
    assert (E4M3FN.max_normal, E4M3FN.min_normal, E4M3FN.min_subnormal) == (448.0, 2.0**-6, 2.0**-9)
    assert (E4M3FNUZ.max_normal, E4M3FNUZ.bias, E4M3FNUZ.min_subnormal) == (240.0, 8, 2.0**-10)
    assert (E5M2.max_normal, E5M2.min_normal, E5M2.min_subnormal) == (57344.0, 2.0**-14, 2.0**-16)
    for fmt in ALL:
        v = finite_values(fmt)
        assert v[-1].item() == fmt.max_normal
        assert v[1].item() == fmt.min_subnormal
        assert decode_fp8(torch.tensor([fmt.max_code], dtype=torch.uint8), fmt).item() == fmt.max_normal
        assert torch.finfo(fmt.torch_dtype).max == fmt.max_normal
        assert torch.finfo(fmt.torch_dtype).tiny == fmt.min_normal


@pytest.mark.parametrize(
    "name, fmt",
    [("e4m3fn", E4M3FN), ("float8_e4m3fn", E4M3FN), ("E5M2", E5M2), ("e4m3fnuz", E4M3FNUZ),
     (torch.float8_e5m2, E5M2), (E4M3FNUZ, E4M3FNUZ)],
)  # fmt: skip
def test_get_format(name, fmt):
    assert get_format(name) is fmt


def test_get_format_unknown():
    with pytest.raises(ValueError, match="unknown FP8 format 'e3m4'"):
        get_format("e3m4")


# ----------------------------------------------------------------------------------------------------------
# every code


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_decode_every_code(fmt):
    codes = torch.arange(256, dtype=torch.uint8)
    ours = decode_fp8(codes, fmt)
    ref = codes.view(fmt.torch_dtype).float()
    assert_same_values(ours, ref, codes)
    # zeros: +0 at 0x00; -0 at 0x80 except fnuz, where 0x80 is the only NaN
    assert_same_bytes(ours[:1], f32([0.0]))
    if fmt.has_negative_zero:
        assert_same_bytes(ours[0x80:0x81], f32([-0.0]))
    assert int(ours.isnan().sum()) == {E4M3FN: 2, E4M3FNUZ: 1, E5M2: 6}[fmt]
    assert int(ours.isinf().sum()) == (2 if fmt.has_inf else 0)
    # a torch float8 tensor is read as its bytes
    assert_same_values(decode_fp8(codes.view(fmt.torch_dtype), fmt), ours)


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_encode_decode_every_code(fmt):
    codes = torch.arange(256, dtype=torch.uint8)
    values = decode_fp8(codes, fmt)
    keep = ~values.isnan()
    assert_same_bytes(encode_fp8(values[keep], fmt, saturate=False), codes[keep], values[keep])
    finite = torch.isfinite(values)
    assert_same_bytes(encode_fp8(values[finite], fmt, saturate=True), codes[finite], values[finite])
    # NaN codes encode to the format's NaN (sign kept where the format has signed NaNs)
    assert encode_fp8(values[~keep], fmt).view(fmt.torch_dtype).float().isnan().all()


# ----------------------------------------------------------------------------------------------------------
# casts against torch


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_cast_ties_and_neighbours(fmt):
    check_cast(tie_inputs(fmt), fmt)


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_cast_random_fp32(fmt):
    x = random_fp32(60_000, -12, 17, seed=1234)
    check_cast(x, fmt)


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_cast_subnormals_and_tiny(fmt):
    # a fine fp32 grid over [-2 min_normal, 2 min_normal] plus random values far below min_subnormal
    grid = torch.linspace(-2 * fmt.min_normal, 2 * fmt.min_normal, 8_001, dtype=torch.float32)
    tiny = random_fp32(5_000, -149 + 23, fmt.emin - fmt.mantissa_bits - 1, seed=7)
    denormal_fp32 = (torch.arange(-1000, 1000, dtype=torch.int32) * 4099).view(torch.float32)
    check_cast(torch.cat([grid, tiny, denormal_fp32]), fmt)


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_cast_specials_and_huge(fmt):
    big = random_fp32(5_000, fmt.emax, 127, seed=3)
    specials = f32([NAN, -NAN, INF, -INF, 0.0, -0.0, 3.0e38, -3.0e38, 1e-45, -1e-45])
    check_cast(torch.cat([big, specials]), fmt)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=64))
def test_cast_hypothesis_fp32(values):
    x = f32(values)
    for fmt in ALL:
        check_cast(x, fmt)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(width=64, allow_nan=False, min_value=-7e4, max_value=7e4), min_size=1, max_size=32))
def test_cast_hypothesis_fp64_single_rounding(values):
    """float64 inputs are rounded once, straight to FP8 (torch goes through fp32: two roundings)."""
    x = torch.tensor(values, dtype=torch.float64)
    for fmt in ALL:
        for saturate in (True, False):
            ref = torch.tensor([python_round(v, fmt, saturate) for v in values], dtype=torch.float32)
            assert_same_values(round_to_fp8(x, fmt, saturate=saturate), ref, x)
            assert_same_values(decode_fp8(encode_fp8(x, fmt, saturate=saturate), fmt), ref, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cast_16bit_inputs_upcast_exactly(dtype):
    x = random_fp32(20_000, -16, 15, seed=11).to(dtype)
    for fmt in ALL:
        for saturate in (True, False):
            assert_same_bytes(encode_fp8(x, fmt, saturate=saturate), torch_codes(x.float(), fmt, saturate))


# hand-worked corner tables: (input, saturating result, non-saturating result)
CORNERS = {
    E4M3FN: [
        (448.0, 448.0, 448.0),
        (464.0, 448.0, 448.0),  # tie between 448 (mantissa 110) and 480: even side is 448
        (464.00003, 448.0, NAN),  # one fp32 ulp above the tie
        (465.0, 448.0, NAN),
        (480.0, 448.0, NAN),
        (-1e6, -448.0, NAN),
        (INF, 448.0, NAN),
        (-INF, -448.0, NAN),
        (NAN, NAN, NAN),
        (-0.0, -0.0, -0.0),
        (-(2.0**-11), -0.0, -0.0),  # underflow keeps the sign
        (2.0**-9, 2.0**-9, 2.0**-9),  # min subnormal
        (2.0**-10, 0.0, 0.0),  # tie between 0 and 2^-9: even is 0
        (3 * 2.0**-10, 2.0**-8, 2.0**-8),  # tie between 1 and 2 (x 2^-9): even is 2
        (15 * 2.0**-10, 2.0**-6, 2.0**-6),  # tie between max subnormal 7 * 2^-9 and min normal 8 * 2^-9
        (1.0625, 1.0, 1.0),  # tie between 1 and 1.125
        (1.1875, 1.25, 1.25),  # tie between 1.125 and 1.25
        (248.0, 256.0, 256.0),  # tie between 240 and 256 (exponent carry)
    ],
    E4M3FNUZ: [
        (240.0, 240.0, 240.0),
        (247.99998, 240.0, 240.0),
        (248.0, 240.0, NAN),  # tie between 240 (mantissa 111) and 256: even side overflows
        (-300.0, -240.0, NAN),
        (INF, 240.0, NAN),
        (-INF, -240.0, NAN),
        (NAN, NAN, NAN),
        (-0.0, 0.0, 0.0),  # no -0
        (-(2.0**-12), 0.0, 0.0),  # negative underflow is +0, never the NaN code 0x80
        (2.0**-10, 2.0**-10, 2.0**-10),
        (2.0**-11, 0.0, 0.0),
        (3 * 2.0**-11, 2.0**-9, 2.0**-9),
    ],
    E5M2: [
        (57344.0, 57344.0, 57344.0),
        (61439.996, 57344.0, 57344.0),
        (61440.0, 57344.0, INF),  # tie between 57344 (mantissa 11) and 65536: even side overflows
        (-1e5, -57344.0, -INF),
        (INF, 57344.0, INF),
        (-INF, -57344.0, -INF),
        (NAN, NAN, NAN),
        (-0.0, -0.0, -0.0),
        (2.0**-16, 2.0**-16, 2.0**-16),
        (2.0**-17, 0.0, 0.0),
        (3 * 2.0**-17, 2.0**-15, 2.0**-15),
        (1.125, 1.0, 1.0),
        (1.375, 1.5, 1.5),
        (-1e-30, -0.0, -0.0),
    ],
}


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_cast_corner_table(fmt):
    x = f32([c[0] for c in CORNERS[fmt]])
    for saturate, col in ((True, 1), (False, 2)):
        want = f32([c[col] for c in CORNERS[fmt]])
        assert_same_values(round_to_fp8(x, fmt, saturate=saturate), want, x)
        assert_same_values(decode_fp8(encode_fp8(x, fmt, saturate=saturate), fmt), want, x)
        assert_same_values(torch.tensor([python_round(v, fmt, saturate) for v in x.tolist()]), want, x)
    check_cast(x, fmt)


def test_cast_fp64_double_rounding_cases():
    # each value sits within 1e-9 of a tie; rounding to fp32 first lands on the tie and rounds the other way
    cases = [
        (E4M3FN, 464.0 + 1e-9, False, NAN),
        (E4M3FN, 1.0625 + 1e-12, True, 1.125),
        (E4M3FNUZ, 248.0 - 1e-9, False, 240.0),
        (E5M2, 61440.0 - 1e-9, False, 57344.0),
    ]
    for fmt, v, saturate, want in cases:
        x = torch.tensor([v], dtype=torch.float64)
        assert_same_values(round_to_fp8(x, fmt, saturate=saturate), f32([want]), x)
        via_fp32 = round_to_fp8(x.float(), fmt, saturate=saturate)
        assert not torch.equal(via_fp32.nan_to_num(7.0), f32([want]).nan_to_num(7.0))


def test_round_to_fp8_returns_float32_on_input_device_and_shape():
    x = torch.randn(2, 3, 5, dtype=torch.bfloat16)
    for fmt in ALL:
        y = round_to_fp8(x, fmt)
        assert y.dtype == torch.float32 and y.shape == x.shape and y.device == x.device
        c = encode_fp8(x, fmt)
        assert c.dtype == torch.uint8 and c.shape == x.shape


def test_cast_rejects_integer_and_fp8_inputs():
    with pytest.raises(ValueError, match="floating-point"):
        encode_fp8(torch.arange(4), E4M3FN)
    with pytest.raises(ValueError, match="already"):
        round_to_fp8(torch.zeros(4, dtype=torch.float8_e4m3fn), E4M3FN)


# ----------------------------------------------------------------------------------------------------------
# bf16 and reduced mantissas


def test_bf16_rne_matches_torch():
    x = torch.cat([random_fp32(100_000, -149, 127, seed=5), tie_inputs(E5M2),
                   torch.randint(-(2**31), 2**31 - 1, (50_000,), dtype=torch.int64).to(torch.int32).view(torch.float32),
                   f32([NAN, INF, -INF, 0.0, -0.0, 3.3895314e38, -3.3895314e38, 1e-45])])  # fmt: skip
    ref = x.to(torch.bfloat16).float()
    assert_same_values(round_to_bf16(x, "rne"), ref, x)
    assert_same_values(round_to_bf16(x.to(torch.float64), "rne"), ref, x)


def test_bf16_trunc_is_bit_mask():
    bits = torch.randint(-(2**31), 2**31 - 1, (100_000,), dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    ref = (bits & -65536).view(torch.float32)
    out = round_to_bf16(x, "trunc")
    assert_same_values(out, torch.where(x.isnan(), NAN, ref), x)
    # toward zero: never larger in magnitude
    fin = torch.isfinite(x)
    assert (out[fin].abs() <= x[fin].abs()).all()


def test_round_mantissa_matches_frexp_oracle():
    x = random_fp32(50_000, -120, 120, seed=9)
    m, e = torch.frexp(x.double())
    for n in (1, 3, 7, 10, 13, 14, 22):
        scale = torch.exp2(torch.tensor(float(n + 1), dtype=torch.float64))
        rne = torch.ldexp(torch.round(m * scale), e - n - 1).float()
        trunc = torch.ldexp(torch.trunc(m * scale), e - n - 1).float()
        assert_same_bytes(round_mantissa(x, n, "rne"), rne, x)
        assert_same_bytes(round_mantissa(x, n, "trunc"), trunc, x)


def test_round_mantissa_10_bits_is_fp16_in_its_normal_range():
    x = random_fp32(100_000, -14, 14, seed=2)
    assert_same_bytes(round_mantissa(x, 10, "rne"), x.half().float(), x)


def test_round_mantissa_edges():
    x = f32([1.0 + 2.0**-14, 1.0 + 3 * 2.0**-14, NAN, INF, -INF, -0.0, 3.4028235e38])
    out = round_mantissa(x, 13, "rne")
    assert_same_values(out, f32([1.0, 1.0 + 2.0**-12, NAN, INF, -INF, -0.0, INF]), x)
    assert_same_bytes(round_mantissa(x, 23, "rne"), x)
    # a NaN whose payload sits only in dropped bits (naive masking would make it inf) stays NaN, quietened,
    # sign and kept payload bits intact, so the result is still a value with n mantissa bits
    # 0x7F800001, 0xFF800001 (-NaN), 0x7FA00000
    nans = torch.tensor([0x7F800001, -0x007FFFFF, 0x7FA00000], dtype=torch.int32).view(torch.float32)
    for mode in ("trunc", "rne"):
        got = round_mantissa(nans, 7, mode).view(torch.int32)
        assert got.tolist() == [0x7FC00000, -0x00400000, 0x7FE00000], mode
    with pytest.raises(ValueError, match="0..23"):
        round_mantissa(x, 24)
    with pytest.raises(ValueError, match="mode"):
        round_mantissa(x, 13, "nearest")


# ----------------------------------------------------------------------------------------------------------
# ZYFA technique 1: the multiply-add + integer path

ROUNDINGS = ("nearest", "trunc")


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("offset", [0.0, -0.5, 0.5, 0.3, -1.0, 2.0])
def test_mad_bits_match_closed_form(rounding, offset):
    dense = torch.linspace(-20.0, 10.0, 300_001, dtype=torch.float32)
    ties = (torch.arange(-200, 200, dtype=torch.float32) + 0.5) / 8 - 7  # 8t + 56 = k + 1/2 exactly
    t = torch.cat([dense, ties, f32([-INF, INF, -1e30, 1e30])])
    bits = e4m3fn_bits_from_log2(t, offset=offset, rounding=rounding)
    assert bits.dtype == torch.uint8 and int(bits.max()) <= 0x7E
    # the expected integer by hand, in numpy fp32 (not the helper under test): clamp(R(8t + 56 + offset), 0, 126)
    with np.errstate(invalid="ignore"):
        y = t.numpy() * np.float32(8) + np.float32(56.0 + offset)
    y = np.clip(np.where(np.isnan(y), 0, y), 0, 126)
    want = (np.rint(y) if rounding == "nearest" else np.trunc(y)).astype(np.uint8)
    assert np.array_equal(bits.numpy(), want)
    # and the closed form is that code's value: 2^(E-7)(1 + M/8), subnormal M 2^-9, with E = n // 8, M = n % 8
    n = want.astype(np.float64)
    value = np.where(n >= 8, 2.0 ** (n // 8 - 7) * (1 + (n % 8) / 8), (n % 8) * 2.0**-9)
    assert np.array_equal(e4m3fn_mad_closed_form(t, offset, rounding).double().numpy(), value)
    assert_same_bytes(decode_fp8(bits, E4M3FN), e4m3fn_mad_closed_form(t, offset, rounding), t)
    # monotone in t
    assert (bits[1:300_001].to(torch.int32) >= bits[:300_000].to(torch.int32)).all()


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_mad_exact_at_integers_and_piecewise_linear_between(rounding):
    # multiples of 1/8: 8t + 56 is an exact integer, so both roundings agree
    t = torch.arange(-6 * 8, 8 * 8 + 7, dtype=torch.float32) / 8  # [-6, 8.75]
    values = decode_fp8(e4m3fn_bits_from_log2(t, rounding=rounding), E4M3FN)
    fl = torch.floor(t)
    assert_same_bytes(values, torch.exp2(fl) * (1 + (t - fl)), t)  # Schraudolph: 2^floor(t) (1 + frac t)
    ints = torch.arange(-6, 9, dtype=torch.float32)
    assert_same_bytes(decode_fp8(e4m3fn_bits_from_log2(ints, rounding=rounding), E4M3FN), torch.exp2(ints))
    # [-7, -6) maps onto the subnormal codes: a linear ramp (t + 7) 2^-6 from 0, not 2^t
    ramp = torch.arange(-7 * 8, -6 * 8, dtype=torch.float32) / 8
    got = decode_fp8(e4m3fn_bits_from_log2(ramp, rounding=rounding), E4M3FN)
    assert_same_bytes(got, (ramp + 7) * 2.0**-6, ramp)
    # so 2^-7 and below, and masked entries, give +0
    low = f32([-7.0, -8.0, -9.0, -100.0, -INF])
    assert_same_bytes(e4m3fn_bits_from_log2(low, rounding=rounding), torch.zeros(5, dtype=torch.uint8))


def test_mad_rounding_details():
    # ties go to even in "nearest": 8t + 56 = 10.5 -> 10, 11.5 -> 12
    t = (f32([10.5, 11.5, 0.5, 125.5]) - 56) / 8
    assert e4m3fn_bits_from_log2(t).tolist() == [10, 12, 0, 126]
    assert e4m3fn_bits_from_log2(t, rounding="trunc").tolist() == [10, 11, 0, 125]
    # truncation toward zero of a negative y = -0.5 is 0 (then the clamp): code 0
    assert e4m3fn_bits_from_log2(f32([-7.0625]), rounding="trunc").tolist() == [0]
    # the clamp at 0x7E = 448: from t = 8.75 (trunc) or 8.6875 (nearest); never the NaN code 0x7F
    edge = f32([8.6875, 8.6874995, 8.75, 8.749999, 9.0, 100.0, INF])
    assert e4m3fn_bits_from_log2(edge).tolist() == [126, 125, 126, 126, 126, 126, 126]
    assert e4m3fn_bits_from_log2(edge, rounding="trunc").tolist() == [125, 125, 126, 125, 126, 126, 126]
    # offset shifts in code units
    assert e4m3fn_bits_from_log2(f32([0.0]), offset=-1.0).tolist() == [55]
    assert e4m3fn_bits_from_log2(f32([0.0]), offset=0.49).tolist() == [56]
    # NaN t gives code 0 (as PTX cvt does); bad arguments raise
    assert e4m3fn_bits_from_log2(f32([NAN])).tolist() == [0]
    with pytest.raises(ValueError, match="rounding"):
        e4m3fn_bits_from_log2(f32([0.0]), rounding="floor")


# ----------------------------------------------------------------------------------------------------------
# CUDA gives the same bytes


@pytest.mark.gpu
def test_cuda_matches_cpu():
    x = torch.cat([random_fp32(100_000, -20, 18, seed=4), tie_inputs(E4M3FN), tie_inputs(E5M2),
                   f32([NAN, INF, -INF, 0.0, -0.0])])  # fmt: skip
    xc = x.cuda()
    for fmt in ALL:
        for saturate in (True, False):
            assert_same_bytes(encode_fp8(xc, fmt, saturate=saturate).cpu(), encode_fp8(x, fmt, saturate=saturate))
            assert_same_values(round_to_fp8(xc, fmt, saturate=saturate).cpu(), round_to_fp8(x, fmt, saturate=saturate))
        codes = torch.arange(256, dtype=torch.uint8)
        assert_same_values(decode_fp8(codes.cuda(), fmt).cpu(), decode_fp8(codes, fmt))
    for mode in ("rne", "trunc"):
        assert_same_values(round_to_bf16(xc, mode).cpu(), round_to_bf16(x, mode))
    t = torch.linspace(-20, 10, 10_001)
    assert_same_bytes(e4m3fn_bits_from_log2(t.cuda()).cpu(), e4m3fn_bits_from_log2(t))
