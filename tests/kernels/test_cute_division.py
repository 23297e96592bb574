"""The CuTe kernel's EPILOGUE 1 division (its default) (``zyfa/kernels/_cute_ptx.py``: ``rcp_rn`` once per row, then
``div_by_rcp`` per element: q = a·rb, e = fma(-q, b, a), q + e·rb) gives div.rn.f32's bits, in exact arithmetic
(CPU, no DSL): each step rounded to binary32 from the exact rational, against the correctly rounded quotient. On the
ranges of the kernel's acc / l and on quotients next to a rounding midpoint, the hard cases. The GPU form test
(tests/kernels/test_cute_kernel_gpu.py, the default against EPILOGUE 0) checks the same on the hardware's bits."""

from __future__ import annotations

import math
import random
import re
import struct
from fractions import Fraction
from pathlib import Path

PTX = Path(__file__).resolve().parents[2] / "zyfa" / "kernels" / "_cute_ptx.py"
TWO = Fraction(2)


def round_f32(x: Fraction) -> float:
    """x rounded to the nearest binary32, ties to even (subnormals included, inf past the largest finite)."""
    if x == 0:
        return 0.0
    sign = -1.0 if x < 0 else 1.0
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    if TWO ** e > x:
        e -= 1
    e = max(e, -126)
    scaled = x / TWO ** (e - 23)
    m, rem = divmod(scaled.numerator, scaled.denominator)
    if 2 * rem > scaled.denominator or (2 * rem == scaled.denominator and m % 2):
        m += 1
    v = Fraction(m) * TWO ** (e - 23)
    if v >= TWO ** 128 - TWO ** 103:
        return sign * math.inf
    return sign * float(v)


def f32_next(x: float, k: int) -> float:
    """The binary32 k steps above x (x > 0)."""
    return struct.unpack("<f", struct.pack("<I", struct.unpack("<I", struct.pack("<f", x))[0] + k))[0]


def div_by_rcp(a: float, b: float) -> float:
    """The asm sequence of _cute_ptx.div_by_rcp after rcp_rn, each instruction rounded once."""
    rb = Fraction(round_f32(1 / Fraction(b)))                   # rcp.rn.f32
    q = Fraction(round_f32(Fraction(a) * rb))                  # mul.rn.f32 q, a, rb
    e = Fraction(round_f32(-q * Fraction(b) + Fraction(a)))    # neg.f32 e, q; fma.rn.f32 e, e, b, a
    return round_f32(e * rb + q)                               # fma.rn.f32 out, e, rb, q


def div_rn(a: float, b: float) -> float:
    return round_f32(Fraction(a) / Fraction(b))


def test_the_modelled_sequence_is_the_kernels():
    src = PTX.read_text()
    assert '"rcp.rn.f32 $0, $1;"' in src
    assert re.search(r"mul\.rn\.f32 q, \$1, \$3; neg\.f32 e, q; fma\.rn\.f32 e, e, \$2, \$1; \"\s*"
                     r"\"fma\.rn\.f32 \$0, e, \$3, q;", src)


def _f32(m: float, k: int) -> float:
    return round_f32(Fraction(math.ldexp(m, k)))


def test_equals_div_rn_on_the_kernels_ranges():
    """a: acc (V's FP8 values times P's, summed: magnitudes 2^-45..2^34, either sign, or 0); b: the row sum l
    (2^-2..2^26; the significands 1.11…1 and 1.1 among them, where a reciprocal rounds worst)."""
    rng = random.Random(0)
    hard_b = [_f32(1 - 2 ** -24, k) for k in range(-1, 26)] + [_f32(1.5, k) for k in range(-2, 25)]
    for i in range(20000):
        a = _f32(rng.random() + 0.5, rng.randint(-45, 34)) * rng.choice((1, -1))
        b = _f32(rng.random() + 0.5, rng.randint(-1, 27)) if i % 4 else rng.choice(hard_b)
        assert div_by_rcp(a, b) == div_rn(a, b), (a, b)
    for b in hard_b:
        assert div_by_rcp(0.0, b) == 0.0 and div_by_rcp(b, b) == 1.0


def test_equals_div_rn_next_to_rounding_midpoints():
    """a chosen so that a / b lies within an ulp of a midpoint between two binary32 (and a's two neighbours)."""
    rng = random.Random(1)
    for _ in range(4000):
        b = _f32(rng.random() + 0.5, rng.randint(-1, 27))
        q = _f32(rng.random() + 0.5, rng.randint(-40, 30))
        half_ulp = Fraction(math.ldexp(1, math.frexp(q)[1] - 25))
        a = round_f32((Fraction(q) + half_ulp) * Fraction(b))
        for x in (a, f32_next(a, 1), f32_next(a, -1)):
            assert div_by_rcp(x, b) == div_rn(x, b), (x, b)
