"""The pieces of one KV tile (zyfa.emulator_tile): the matrix unit's accumulator model and the small arithmetic steps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from zyfa.reference.attention import attention_fp64

from zyfa.emulator import emulate
from zyfa.emulator_tile import exp2_bittrick, mma
from zyfa.recipe_spec import get_recipe

# ----------------------------------------------------------------------------------------------------------- hopper mma

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


# --------------------------------------------------------------------------------------------------------- small pieces
# Small steps of the emulator: the Schraudolph exp2 bits, the FP8 output of an all-zero result, and the row-block
# bookkeeping with one query row per block.
#
# Expected values: the Schraudolph word computed here in numpy fp32 from its documented formula; zeros for
# attention over an all-zero V; the FP64 oracle (reference/attention.py) for the one-row blocks, where the fp32
# recipe's only rounding is fp32 arithmetic (and a one-key window returns V's own row, exactly).

BIAS = 127 * 2**23 - 486411  # CK unified attention / AITER hd256 (UA_FA4_EXP2_APPROX)


def _schraudolph(t: np.ndarray) -> np.ndarray:
    """The fp32 word u32(2^23·t + 127·2^23 − 486411), computed in fp32 as the kernel does; negatives -> 0."""
    y = t.astype(np.float32) * np.float32(2**23) + np.float32(BIAS)
    word = np.clip(np.trunc(np.where(np.isfinite(y), y, np.float32(0))), 0, None).astype(np.uint32)
    return word.view(np.float32)


@pytest.mark.filterwarnings("ignore:head dims")
def test_schraudolph_exp2_is_the_documented_fp32_word():
    # where 2^23·t + bias (in fp32) is exactly 0: the word 0, i.e. P = 0; and the fp32 neighbours on both sides
    zero_at = np.float32(-float(np.float32(BIAS)) / 2**23)
    edge = np.array(
        [zero_at, np.nextafter(zero_at, np.float32(0)), np.nextafter(zero_at, np.float32(-200))], dtype=np.float32
    )
    t = np.concatenate([np.linspace(-140.0, 0.0, 20_001, dtype=np.float32), edge, [-np.inf]]).astype(np.float32)
    got = exp2_bittrick(torch.from_numpy(t)).numpy()
    want = _schraudolph(t)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert got[-4] == 0.0 and got[-3] > 0 and got[-2] == 0.0 and got[-1] == 0.0
    p = got[t > -120]
    assert np.all(np.abs(p / np.exp2(t[t > -120].astype(np.float64)) - 1) < 0.07)  # an approximation of 2^t


@pytest.mark.filterwarnings("ignore:head dims")
def test_fp8_output_of_an_all_zero_result_is_zero_not_nan():
    """out_format='e4m3fn' scales by the output amax: an all-zero output (all-zero V) keeps scale 1 and stays 0."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 40, 64, generator=g), torch.randn(1, 2, 40, 64, generator=g)
    v = torch.zeros(1, 2, 40, 64)
    for name in ("cudnn-fp8", "ck"):
        r = get_recipe(name).replace(name=f"{name}-fp8out", out_format="e4m3fn")
        emu = emulate(q, k, v, r, causal=True)
        assert torch.equal(emu.out, torch.zeros_like(emu.out)), name
        assert torch.isfinite(emu.lse).all()


@pytest.mark.filterwarnings("ignore:head dims")
@pytest.mark.parametrize("mask", [dict(causal=True), dict(causal=True, window=1), dict(causal=True, window=3)])
@pytest.mark.parametrize("d_v", [1, 64])
def test_one_query_row_per_block_matches_the_oracle(mask, d_v):
    """block_m=1, block_n=1: every (row, key) pair is its own tile, so the runs of row blocks that see a tile
    start at row 0, row 1 or later and end before the last row; the fp32 recipe must still be the oracle's
    attention to fp32 precision (with window=1, V's own row exactly)."""
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 2, 6, 64, generator=g), torch.randn(1, 2, 6, 64, generator=g)
    v = torch.randn(1, 2, 6, d_v, generator=g)
    r = get_recipe("fp32").replace(name="fp32-1x1", block_m=1, block_n=1)
    emu = emulate(q, k, v, r, **mask)
    ref, lse_ref = attention_fp64(q, k, v, **mask)
    assert ((emu.out.double() - ref).abs() <= 1e-6 * ref.abs().amax(-1, keepdim=True)).all()
    assert (emu.lse.double() - lse_ref).abs().max() < 1e-5
    if mask.get("window") == 1:
        assert torch.equal(emu.out, v)
