"""The pieces of one KV tile (zyfa.emulator_tile): the matrix unit's accumulator model and the small arithmetic steps.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from zyfa.reference.attention import attention_fp64

from zyfa.emulator import emulate
from zyfa.emulator_tile import Tiling, block_max, exp2_bittrick, gemm, mma, pv_update, qk_tile, tile_row_sum
from zyfa.platforms import stepwise_mma, truncating_mma
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


# ----------------------------------------------------------------------------------------------- tile steps' k step
# The tile steps take the matrix unit's k step from the platform (Tiling.k_step, from Platform.k_step), not the
# helpers' default of 32. Expected values: zyfa.platforms' own accumulator model called with that k step.


def _tiling(recipe, **fields) -> Tiling:
    """A Tiling for calling one tile step directly: the fields qk_tile and tile_row_sum read, set here; the rest
    are placeholders those steps do not read."""
    base = dict(recipe=recipe, dev=torch.device("cpu"), fmax=448.0, log2_fmax=math.log2(448.0),
                score_scale=torch.tensor(1.0), to_log2=None, block_m=4, block_n=8, k_step=64, in_unit=True,
                qk_bits=13, qk_min=(-6, -6), pv_bits=13, pv_min=(-6, -6), ones_min=(-6, 0), two_level=True,
                tile_factor_needed=False)
    base.update(fields)
    return Tiling(**base)


def test_mma_steps_k_by_the_k_step_it_is_given():
    a, b = _e4m3((5, 128), 20), _e4m3((128, 4), 19)
    got = mma(a, b, None, 13, k_step=64)
    assert torch.equal(got, truncating_mma(a, b, None, 13, 64, min_exp=(-6, -6)))
    assert not torch.equal(got, mma(a, b, None, 13, k_step=32))


@pytest.mark.parametrize("in_unit", [True, False])
def test_gemm_steps_k_by_the_k_step_it_is_given(in_unit):
    """k = 128 in steps of 64 (MI355X's MFMA k, here with a truncating accumulator): kept in the unit, or each step
    flushed into fp32; the result differs from steps of 32 on these operands."""
    a, b = _e4m3((5, 128), 21), _e4m3((128, 4), 22)
    got = gemm(a, b, None, 13, in_unit, min_exp=(-6, -6), k_step=64)
    want = (truncating_mma(a, b, None, 13, 64, min_exp=(-6, -6)) if in_unit
            else stepwise_mma(a, b, 13, 64, min_exp=(-6, -6)))
    assert torch.equal(got, want)
    assert not torch.equal(got, gemm(a, b, None, 13, in_unit, min_exp=(-6, -6), k_step=32))


def test_scores_of_a_tile_use_the_platforms_k_step():
    q, kt = _e4m3((1, 1, 4, 128), 23), _e4m3((1, 1, 128, 8), 24)
    tg = _tiling(get_recipe("zyfa-hopper"), k_step=64)
    allowed = torch.ones(4, 8, dtype=torch.bool)
    one = torch.ones(1, 1, 1, 1)
    got = qk_tile(tg, q, kt, one, one, allowed)
    assert torch.equal(got, truncating_mma(q, kt, None, 13, 64, min_exp=(-6, -6)))
    assert not torch.equal(got, qk_tile(dataclasses.replace(tg, k_step=32), q, kt, one, one, allowed))


def test_rounded_mma_row_sum_uses_the_platforms_k_step():
    """P8 · ones on the matrix unit: 128 keys in steps of 64."""
    p8 = _e4m3((1, 1, 4, 128), 25, lo=-9, hi=8).abs()
    recipe = get_recipe("zyfa-hopper").replace(name="zyfa-hopper-rowsum-mma", rowsum="rounded_mma")
    tg = _tiling(recipe, k_step=64)
    got = tile_row_sum(tg, p8, None)
    ones = torch.ones(128, 1)
    assert torch.equal(got, truncating_mma(p8, ones, None, 13, 64, min_exp=(-6, 0)))
    assert not torch.equal(got, tile_row_sum(dataclasses.replace(tg, k_step=32), p8, None))


def test_rounded_mma_row_sum_ones_are_float32_under_a_float64_default_dtype():
    """The ones vector is float32 whatever torch's default dtype (an fp32 matrix unit: P8 @ ones, which refuses
    mixed dtypes)."""
    p8 = _e4m3((1, 1, 4, 64), 26, lo=0, hi=4).abs()  # 1 to 16 in steps of 1/8 at most: every sum exact
    recipe = get_recipe("zyfa").replace(name="zyfa-rowsum-mma", rowsum="rounded_mma")
    tg = _tiling(recipe, pv_bits=None, ones_min=None, two_level=False)
    want = tile_row_sum(tg, p8, None)
    torch.set_default_dtype(torch.float64)
    try:
        got = tile_row_sum(tg, p8, None)
    finally:
        torch.set_default_dtype(torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(want, p8.sum(-1, keepdim=True))


def test_rounded_mma_row_sum_ones_are_on_the_tiles_device():
    """On the truncating unit the ones vector must be on P's device (the meta device here stands for CUDA)."""
    recipe = get_recipe("zyfa-hopper").replace(name="zyfa-hopper-rowsum-mma", rowsum="rounded_mma")
    tg = _tiling(recipe, dev=torch.device("meta"))
    got = tile_row_sum(tg, torch.empty(1, 1, 4, 64, device="meta"), None)
    assert got.device.type == "meta" and got.shape == (1, 1, 4, 1)


@pytest.mark.parametrize("branch", ["per_tile", "two_level", "chained"])
def test_pv_update_uses_the_platforms_k_step(branch):
    """O += P·V over 128 keys in steps of 64, in each of pv_update's three ways: per tile into fp32 (a tile factor
    needed), the two-level tensor-core accumulator (flushed every tile here), or chained into the fp32 accumulator
    with each k step flushed (``accumulator=fp32`` on a truncating unit)."""
    p8 = _e4m3((1, 1, 4, 128), 27, lo=-6, hi=0).abs()
    v = _e4m3((1, 1, 128, 3), 28)
    acc = _e4m3((1, 1, 4, 3), 29, lo=-2, hi=2)
    alpha = torch.ones(1, 1, 4, 1)
    recipe = get_recipe("zyfa-hopper")  # accum_flush_tiles=1, v_descale not per tile
    assert recipe.accum_flush_tiles == 1 and recipe.v_descale != "tile"
    tg = _tiling(recipe, in_unit=branch != "chained", two_level=branch == "two_level",
                 tile_factor_needed=branch == "per_tile")
    acc_tc = torch.zeros_like(acc) if branch == "two_level" else None
    got, got_tc = pv_update(tg, p8, v, torch.ones(1), acc, acc_tc, alpha, None, 0)
    if branch == "chained":
        want = acc + stepwise_mma(p8, v, 13, 64, min_exp=(-6, -6))
    else:
        want = acc + truncating_mma(p8, v, None, 13, 64, min_exp=(-6, -6))
    assert torch.equal(got, want)
    if branch == "two_level":
        assert torch.equal(got_tc, torch.zeros_like(acc))
    at32, _ = pv_update(dataclasses.replace(tg, k_step=32), p8, v, torch.ones(1), acc, acc_tc, alpha, None, 0)
    assert not torch.equal(got, at32)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_block_max_takes_any_number_of_leading_dimensions(lead):
    """x: (..., rows, 1): every block of block_m rows gets its own max, whatever the leading dimensions."""
    x = torch.arange(math.prod(lead) * 6, dtype=torch.float32).reshape(*lead, 6, 1).flip(-2)
    got = block_max(x, 2)
    assert got.shape == x.shape
    for r in range(6):  # x falls along the rows: each block's max is its first row (rows 0-1, 2-3, 4-5)
        assert torch.equal(got[..., r, 0], x[..., r - r % 2, 0])
