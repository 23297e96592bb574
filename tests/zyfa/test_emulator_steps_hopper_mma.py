"""The Hopper FP8 accumulator model (zyfa.emulator._mma) against a scalar integer implementation of its rule.

The rule, as docs/PLATFORMS.md documents it (fitted bit for bit on the H200): at each k = 32 step the 32 exact
products, each at the sum of its operands' exponents (-6 for a subnormal e4m3fn operand), and the incoming
accumulator are aligned to the largest exponent among them, truncated toward zero to ``hopper_bits`` bits below it,
and summed exactly; the sum is truncated toward zero to ``hopper_bits`` bits below its own leading bit.
``_hopper_reference`` below does that one output at a time in Python integers (``math.frexp`` for the exponent,
``math.trunc`` for the truncation), so it shares no code with the tensor implementation; on FP8 operands every value
involved is exact, so the two must agree bit for bit. Without ``hopper_bits`` the result is the plain
``acc + a @ b``.
"""

from __future__ import annotations

import math

import pytest
import torch

from zyfa.emulator_tile import mma

STEP = 32


def _operand_exponent(x: float) -> int:
    """An e4m3fn operand's exponent as the unit sees it: floor(log2|x|), -6 (the smallest normal's) if subnormal."""
    return max(math.frexp(x)[1] - 1, -6)


def _hopper_reference(a, b, acc, bits: int) -> torch.Tensor:
    """acc + a @ b for 2-D float tensors, one output at a time, exactly as the documented rule says."""
    m, k = a.shape
    n = b.shape[1]
    out = torch.empty(m, n, dtype=torch.float64)
    for i in range(m):
        for j in range(n):
            c = None if acc is None else float(acc[i, j])
            for k0 in range(0, k, STEP):
                pairs = [(float(a[i, kk]), float(b[kk, j])) for kk in range(k0, min(k, k0 + STEP))]
                terms = [x * y for x, y in pairs]
                exponents = [_operand_exponent(x) + _operand_exponent(y) for x, y in pairs if x * y != 0]
                if c is not None and c != 0:
                    exponents.append(math.frexp(c)[1] - 1)
                if not exponents:
                    c = 0.0
                    continue
                exponent = max(exponents)
                quantum = math.ldexp(1.0, exponent - bits)
                units = sum(math.trunc(t / quantum) for t in terms)
                if c is not None:
                    units += math.trunc(c / quantum)
                total = math.ldexp(float(units), exponent - bits)
                # the sum kept to ``bits`` bits below its leading bit, toward zero (only a carry changes it)
                lead = max(math.frexp(total)[1] - 1, exponent) if total else exponent
                c = math.ldexp(float(math.trunc(math.ldexp(total, bits - lead))), lead - bits)
            out[i, j] = c
    return out


def _e4m3(shape, seed, lo=-9, hi=8):
    """Random e4m3fn values of both signs, magnitudes 2^lo .. 2^hi (exact in fp32, products exact too)."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.empty(shape).uniform_(lo, hi, generator=g))
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    return (mag * sign).to(torch.float8_e4m3fn).float()


@pytest.mark.parametrize("bits", [13, 8, 3])
@pytest.mark.parametrize("k", [32, 96, 70])
def test_signed_fp8_operands_match_the_rule_bit_for_bit(bits, k):
    a, b = _e4m3((5, k), 1), _e4m3((k, 4), 2)
    got = mma(a, b, None, bits)
    assert got.dtype == torch.float32 and got.shape == (5, 4)
    assert torch.equal(got.double(), _hopper_reference(a, b, None, bits))


@pytest.mark.parametrize("bits", [13, 5])
def test_incoming_accumulator_is_aligned_and_truncated_too(bits):
    a, b = _e4m3((6, 64), 3), _e4m3((64, 3), 4)
    g = torch.Generator().manual_seed(5)
    acc = torch.randn(6, 3, generator=g) * 2.0 ** torch.randint(-4, 12, (6, 3), generator=g)
    got = mma(a, b, acc, bits)
    assert torch.equal(got.double(), _hopper_reference(a, b, acc, bits))
    assert not torch.equal(got, mma(a, b, None, bits))


def test_products_all_below_one_keep_bits_below_their_own_largest_term():
    """P·V with P and V below 1: the alignment follows the step's largest term (here < 2^-2), not 1."""
    a, b = _e4m3((4, 64), 6, lo=-9, hi=-1), _e4m3((64, 5), 7, lo=-9, hi=-1)
    acc = _e4m3((4, 5), 8, lo=-9, hi=-3)
    for bits, c in ((6, None), (6, acc), (13, acc)):
        assert torch.equal(mma(a, b, c, bits).double(), _hopper_reference(a, b, c, bits))


def test_operands_of_different_batch_ranks_broadcast_like_matmul():
    """a (m, k) against b (2, 3, k, n): every (2, 3) batch gets the rule's result, as a @ b would broadcast."""
    a, b = _e4m3((3, 64), 9), _e4m3((2, 3, 64, 4), 10)
    got = mma(a, b, None, 13)
    assert got.shape == (2, 3, 3, 4)
    for i in range(2):
        for j in range(3):
            assert torch.equal(got[i, j].double(), _hopper_reference(a, b[i, j], None, 13))
    both = mma(_e4m3((2, 3, 3, 64), 11), b, None, 13)
    assert both.shape == (2, 3, 3, 4)


def test_true_fp32_accumulation_adds_the_incoming_accumulator():
    """hopper_bits None: acc + a @ b (small integers: every sum exact)."""
    g = torch.Generator().manual_seed(12)
    a = torch.randint(-8, 9, (2, 3, 5, 40), generator=g).float()
    b = torch.randint(-8, 9, (2, 3, 40, 4), generator=g).float()
    acc = torch.randint(-100, 101, (2, 3, 5, 4), generator=g).float()
    want = acc.double() + a.double() @ b.double()
    assert torch.equal(mma(a, b, acc, None).double(), want)
    assert torch.equal(mma(a, b, None, None).double(), a.double() @ b.double())


def test_result_follows_the_operands_device():
    a, b = torch.empty(2, 3, 4, 64, device="meta"), torch.empty(2, 3, 64, 5, device="meta")
    assert mma(a, b, None, 13).device.type == "meta"
    assert mma(a, b, torch.empty(2, 3, 4, 5, device="meta"), 13).device.type == "meta"


def test_result_is_float32_under_a_float64_default_dtype():
    a, b = _e4m3((4, 64), 13), _e4m3((64, 3), 14)
    want = mma(a, b, None, 13)
    torch.set_default_dtype(torch.float64)
    try:
        got = mma(a, b, None, 13)
    finally:
        torch.set_default_dtype(torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, want)
