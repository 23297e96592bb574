"""The platform's truncating accumulator inside emulate() (the H200's FP8 wgmma): its paths through Q·K, P·V and the row
sum, the exponent a subnormal operand counts at, and accumulation by operand format.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from tests.zyfa.hopper_rule import hopper_mma
from zyfa.emulator import emulate, quantize_inputs
from zyfa.emulator_tile import min_exp
from zyfa.platforms import H200, get_platform
from zyfa.recipe_spec import get_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------------------------- hopper accumulator paths

def _inputs(s_k: int, seed: int):
    """4 queries, s_k keys, d 64. Key 0 holds every row's largest score by far (so after tile 0 the running max
    never moves and every rescale is 1). V: positive integers 1..15 (e4m3fn-exact) with one 448 (descale 1)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 4, 64, generator=g) * 0.3
    k = torch.randn(1, 1, s_k, 64, generator=g) * 0.3
    q[..., 0] = 2.0
    k[..., 0] = torch.rand(s_k, generator=g) * 1.5 - 1.0
    k[0, 0, 0, 0] = 3.0
    v = torch.randint(1, 16, (1, 1, s_k, 64), generator=g).float()
    v[0, 0, s_k // 2, 0] = 448.0
    return q, k, v


def _fixed_p_scale_hopper(**fields):
    """zyfa-hopper (Hopper FP8 accumulator, P in e4m3fn) with FA3's P arithmetic: fp32 exp2, a fixed P scale
    2^8, the row sum from the unrounded scaled P; per-tensor descales; fp32 output."""
    return get_recipe("zyfa-hopper").replace(
        exp_method="exp2", p_scale="pow2", p_scale_log2=8, rowsum="fp32", out_format="fp32", **fields
    )


def _rel_paths(a: np.ndarray, b: np.ndarray) -> float:
    return float((np.abs(a - b) / np.abs(b)).max())


def test_per_tile_pv_product_is_truncated_by_the_accumulator_model():
    """v_descale='tile' puts each tile's P·V through the matrix unit on its own: with the Hopper accumulator at
    3 bits that one k = 32 step truncates; the output is that truncated product (times V's descale 1) over the
    fp32 row sum of P·2^8, not the exact product."""
    r = _fixed_p_scale_hopper(
        name="hopper-vtile-3bits",
        v_descale="tile",
        reciprocal="div",
        block_m=4,
        block_n=32,
    )
    q, k, v = _inputs(32, seed=1)
    trace: list = []
    emu = emulate(q, k, v, r, sm_scale=1.0, trace=trace, platform=dataclasses.replace(H200, accum_bits=3))
    assert len(trace) == 1 and emu.v_deq.abs().max().item() == 448.0
    p8 = trace[0]["p8"][0, 0].double().numpy()
    t = trace[0]["t"][0, 0].double().numpy()
    v8 = v[0, 0].double().numpy()
    l = np.exp2(t + 8).sum(-1, keepdims=True)  # fp32 row sum of P scaled by 2^8
    want = hopper_mma(p8, v8, None, 3) / l
    got = emu.out[0, 0].double().numpy()
    assert _rel_paths(got, want) < 2e-6
    assert _rel_paths(p8 @ v8 / l, want) > 1e-2  # the exact product is far from it: the case discriminates


@pytest.mark.parametrize("flush", [2, 3])
def test_flush_every_n_tiles_follows_the_tile_index_from_key_0(flush):
    """accum_flush_tiles=N: after KV tiles N-1, 2N-1, ... (counted from key 0) the tensor-core accumulator is
    added into the fp32 one and restarts from zero; what is left is added at the end. 7 tiles of 32 keys, an
    8-bit accumulator, P·2^8 with rescales of exactly 1 after tile 0: the output is that schedule's sum over the
    fp32 row sum, and another schedule (flushing after tiles 1, 4 or never) gives a different one."""
    r = _fixed_p_scale_hopper(
        name=f"hopper-flush{flush}",
        accum_flush_tiles=flush,
        reciprocal="div",
        block_m=4,
        block_n=32,
    )
    q, k, v = _inputs(7 * 32, seed=2)
    trace: list = []
    emu = emulate(q, k, v, r, sm_scale=1.0, trace=trace, platform=dataclasses.replace(H200, accum_bits=8))
    assert len(trace) == 7 and emu.v_deq.abs().max().item() == 448.0
    ts = [tr["t"][0, 0].double().numpy() for tr in trace]
    assert (ts[0][:, 0] == 0).all() and all((t < 0).all() for t in ts[1:])  # the running max stays at key 0
    p8s = [tr["p8"][0, 0].double().numpy() for tr in trace]
    v8 = v[0, 0].double().numpy()
    l = sum(np.exp2(t + 8).sum(-1, keepdims=True) for t in ts)

    def schedule(flush_after) -> np.ndarray:
        acc, c = np.zeros((4, 64)), None
        for i, p8 in enumerate(p8s):
            c = hopper_mma(p8, v8[32 * i : 32 * (i + 1)], c, 8)
            if flush_after(i):
                acc, c = acc + c, None
        return (acc if c is None else acc + c) / l

    want = schedule(lambda i: (i + 1) % flush == 0)
    got = emu.out[0, 0].double().numpy()
    assert _rel_paths(got, want) < 2e-6
    for other in (lambda i: (i - 1) % 3 == 0, lambda i: False):
        assert _rel_paths(schedule(other), want) > 1e-4
    assert math.isfinite(float(emu.lse.max()))


# ------------------------------------------------------------------------------------------------ operand min exponents
# Where the smallest normal exponent of each operand format enters emulate()'s Hopper accumulator (h200).
#
# The rule (docs/PLATFORMS.md; tests/zyfa/hopper_rule.py writes it out in float64 with e4m3fn's -6 for a subnormal
# operand): every k = 32 step, each product counts at the sum of its operands' exponents, a subnormal operand at its
# format's smallest normal exponent. As in tests/zyfa/test_hopper_min_exp_per_format.py, an operand whose format
# has smallest normal exponent ``emin`` is fed to that rule scaled by 2^(-6 - emin) and the result scaled back
# (every exponent, quantum and term moves by the same power of two; float64 keeps it exact).
#
# Covered here: the exponents themselves (FP8 from the formats' tables, bf16 and fp32 from the IEEE layout: 8
# exponent bits, bias 127, so 1 - 127 = -126); a bf16 or fp32 V of subnormals behind an FP8 P in P·V; the
# ``rounded_mma`` row sum (P·ones in the unit, ones at exponent 0) with subnormal e5m2 P; that row sum kept as one
# chain over the tile in the unit (``accumulator="matrix_unit"``); the per-tile P·V of ``v_descale="tile"``.

RULE_MIN_EXP = -6  # what hopper_rule.hopper_mma counts a subnormal operand at


def _rule(a: np.ndarray, b: np.ndarray, emin_a: int, emin_b: int, bits: int = 13) -> np.ndarray:
    """a @ b (one chain over all of k) on the rule, a's subnormals at ``emin_a`` and b's at ``emin_b``."""
    sa, sb = RULE_MIN_EXP - emin_a, RULE_MIN_EXP - emin_b
    return hopper_mma(np.ldexp(a, sa), np.ldexp(b, sb), None, bits) / 2.0 ** (sa + sb)


def _stepwise_rule(a: np.ndarray, b: np.ndarray, emin_a: int, emin_b: int, bits: int = 13) -> np.ndarray:
    """Each k = 32 step from zero on the rule, the steps added in fp32 (a kernel keeping a true fp32 sum)."""
    out = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k0 in range(0, a.shape[1], 32):
        out = out + _rule(a[:, k0:k0 + 32], b[k0:k0 + 32], emin_a, emin_b, bits).astype(np.float32)
    return out.astype(np.float64)


def _recipe(**fields):
    """zyfa-hopper (h200, the accumulator model in Q·K and P·V) with FA3's P arithmetic (fp32 exp2, P scaled by
    2^8, the row sum from the unrounded scaled P), no input scaling (the values given are the operands), fp32
    output."""
    base = dict(exp_method="exp2", p_scale="pow2", p_scale_log2=8, rowsum="fp32", out_format="fp32",
                reciprocal="div", q_scale="none", k_scale="none", v_scale="none", block_m=4, block_n=32)
    return get_recipe("zyfa-hopper").replace(**{**base, **fields})


def _rel_min_exp(a: np.ndarray, b: np.ndarray) -> float:
    return float((np.abs(a - b) / np.abs(b)).max())


def test_smallest_normal_exponent_of_each_operand_format():
    """e4m3fn -6, e4m3fnuz -7 (bias 8), e5m2 -14 (bias 15); bf16 and fp32 -126 (8 exponent bits, bias 127);
    a format with no such exponent (INT8) is one clear error naming it."""
    want = {"e4m3fn": -6, "e4m3fnuz": -7, "e5m2": -14, "bf16": -126, "fp32": -126}
    assert {f: min_exp(f) for f in want} == want
    assert 2.0 ** want["fp32"] == torch.finfo(torch.float32).tiny  # the smallest normal, independently
    with pytest.raises(ValueError, match="no accumulator operand exponent for format 'int8'"):
        min_exp("int8")


def _positive_v(fmt: str, g: torch.Generator) -> torch.Tensor:
    """(1, 1, 32, 64) positive subnormals exactly representable in ``fmt``: bf16 m·2^-133 (m in 1..127, every bf16
    subnormal), fp32 m·2^-134 (m in 1..255: 8 significant bits, so P·V products stay exact)."""
    if fmt == "bf16":
        return torch.randint(1, 128, (1, 1, 32, 64), generator=g).float() * 2.0 ** -133
    return torch.randint(1, 256, (1, 1, 32, 64), generator=g).float() * 2.0 ** -134


def _one_tile_pv(q, k, v, r):
    """Emulate one KV tile with its trace: P's FP8 values, the fp32 row sum of P·2^8 (float64), V and the result."""
    trace: list = []
    emu = emulate(q, k, v, r, sm_scale=1.0, trace=trace)
    assert len(trace) == 1 and torch.equal(emu.v_deq, v)
    p8 = trace[0]["p8"][0, 0].double().numpy()
    l = np.exp2(trace[0]["t"][0, 0].double().numpy() + 8).sum(-1, keepdims=True)
    return p8, l, v[0, 0].double().numpy(), emu


@pytest.mark.parametrize("v_format", ["bf16", "fp32"])
def test_pv_counts_a_subnormal_bf16_or_fp32_v_at_minus_126(v_format):
    """An e4m3fn P times a V of bf16 (or fp32) subnormals goes through the h200 accumulator (P is FP8): V's
    subnormals count at -126, not e4m3fn's -6 and not one binade off (-124, -127). The output is the rule's P·V over
    the fp32 row sum of P·2^8 (it is itself subnormal: compared to 2^-148 plus 1e-6 relative)."""
    r = _recipe(name=f"hopper-v-{v_format}", v_format=v_format)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 4, 64, generator=g) * 0.5
    k = torch.randn(1, 1, 32, 64, generator=g) * 0.5
    v = _positive_v(v_format, g)
    p8, l, v8, emu = _one_tile_pv(q, k, v, r)
    want = _rule(p8, v8, -6, -126) / l
    got = emu.out[0, 0].double().numpy()
    assert (np.abs(got - want) <= 2.0 ** -148 + 1e-6 * np.abs(want)).all()
    for other in (-6, -124, -127):  # V's subnormals at another exponent give other outputs
        assert _rel_min_exp(_rule(p8, v8, -6, other) / l, want) > 1e-4


def _q_k_for_log2_probabilities(t: torch.Tensor):
    """fp32 Q and K (no rounding: exact scores) of one block of 4 query rows whose log2 probabilities (sm_scale 1,
    log2(e) folded into the scores) are ``t`` + the row max: Q = e_0, K's first coordinate t·ln 2."""
    q = torch.zeros(1, 1, 4, 64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, t.numel(), 64)
    k[0, 0, :, 0] = t / np.log2(np.e)
    return q, k


@pytest.mark.parametrize("accumulator", ["matrix_unit", "fp32"])
def test_rounded_mma_row_sum_counts_subnormal_e5m2_p_at_minus_14(accumulator):
    """rowsum='rounded_mma': the row sum is P·ones on the unit. In a second tile whose probabilities are all
    2^-24..2^-22 of the row max (P·2^8: e5m2 subnormals, multiples of 2^-16) and an 8-bit accumulator, P counts at
    e5m2's -14 (ones at 0): the largest exponent is -14, the quantum 2^-22, the sum exact. Counted at -6 (e4m3fn's,
    or V's format here) the quantum is 2^-14 and every subnormal P is cut to 0. The traced row sum is the rule's."""
    r = _recipe(name=f"hopper-rowsum-e5m2-{accumulator}", p_format="e5m2", rowsum="rounded_mma",
                accumulator=accumulator, q_format="fp32", k_format="fp32")
    g = torch.Generator().manual_seed(4)
    # tile 1: the row max (t in (-1, 0]); tile 2: t in (-23.9, -22.1)
    t = torch.cat([-torch.rand(32, generator=g), torch.empty(32).uniform_(-23.9, -22.1, generator=g)])
    q, k = _q_k_for_log2_probabilities(t)
    v = torch.randn(1, 1, 64, 64, generator=g)
    trace: list = []
    emulate(q, k, v, r, sm_scale=1.0, trace=trace, platform=dataclasses.replace(H200, accum_bits=8))
    assert [tr["cols"] for tr in trace] == [(0, 32), (32, 64)]
    p8 = trace[1]["p8"][0, 0].double().numpy()
    assert ((p8 > 0) & (p8 < 2.0 ** -14)).mean() > 0.9  # e5m2 subnormals
    ones = np.ones((32, 1))
    want = _rule(p8, ones, -14, 0, bits=8)
    assert np.array_equal(trace[1]["row_sum"][0, 0].double().numpy(), want)
    assert (want > 0).all() and np.array_equal(want, p8.sum(-1, keepdims=True))  # exact here
    assert (_rule(p8, ones, -6, 0, bits=8) < want).all()  # at -6 the subnormal P would be cut to 0


def test_rounded_mma_row_sum_is_one_chain_over_the_tile_in_the_unit():
    """accumulator='matrix_unit': P·ones over a 64-key tile is one chain of two k steps in the unit, so the first
    step's sum (probabilities 2^-14..2^-10 of the max, P·2^8 with bits down to 2^-9) is truncated against the second
    step's largest exponent (P = 2^8 at the max): the rule's chain, not two steps added in fp32."""
    r = _recipe(name="hopper-rowsum-chain", rowsum="rounded_mma", accumulator="matrix_unit", block_n=64,
                q_format="fp32", k_format="fp32")
    g = torch.Generator().manual_seed(5)
    # first k step: t in (-14, -10); second: the row max (t in (-1, 0])
    t = torch.cat([torch.empty(32).uniform_(-14.0, -10.0, generator=g), -torch.rand(32, generator=g)])
    q, k = _q_k_for_log2_probabilities(t)
    v = torch.randn(1, 1, 64, 64, generator=g)
    trace: list = []
    emulate(q, k, v, r, sm_scale=1.0, trace=trace)
    assert len(trace) == 1 and trace[0]["cols"] == (0, 64)
    p8 = trace[0]["p8"][0, 0].double().numpy()
    ones = np.ones((64, 1))
    want = _rule(p8, ones, -6, 0)
    assert np.array_equal(trace[0]["row_sum"][0, 0].double().numpy(), want)
    assert not np.array_equal(_stepwise_rule(p8, ones, -6, 0), want)  # flushing each step would differ


@pytest.mark.parametrize("accumulator", ["matrix_unit", "fp32"])
def test_per_tile_pv_of_v_descale_tile_counts_subnormal_e5m2_v_at_minus_14(accumulator):
    """v_descale='tile' (P·V of each tile computed apart, then scaled and added in fp32): a 64-key tile of e5m2
    subnormal V goes through the accumulator with V at e5m2's -14; in the unit (matrix_unit) as one chain over the
    tile's two k steps, with accumulator='fp32' each step flushed into fp32. The output is that P·V over the fp32
    row sum of P·2^8; V at -6, or the other accumulation, gives another."""
    r = _recipe(name=f"hopper-vtile-{accumulator}", v_format="e5m2", v_descale="tile", accumulator=accumulator,
                block_n=64)
    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, 1, 4, 64, generator=g)
    k = torch.randn(1, 1, 64, 64, generator=g)
    codes = torch.randint(1, 4, (1, 1, 64, 64), generator=g)  # e5m2 subnormal codes: 1..3 · 2^-16
    v = codes.float() * 2.0 ** -16
    p8, l, v8, emu = _one_tile_pv(q, k, v, r)
    mma, other = (_rule, _stepwise_rule) if accumulator == "matrix_unit" else (_stepwise_rule, _rule)
    want = mma(p8, v8, -6, -14) / l
    got = emu.out[0, 0].double().numpy()
    assert _rel_min_exp(got, want) < 2e-6
    assert _rel_min_exp(mma(p8, v8, -6, -6) / l, want) > 1e-4
    if accumulator == "matrix_unit":
        assert _rel_min_exp(other(p8, v8, -6, -14) / l, want) > 1e-5


# -------------------------------------------------------------------------------------- accumulation by operand formats
# Which operand formats send Q·K and P·V through a platform's truncating accumulator in emulate(), and K's
# per-kv-head descale.
#
# emulate()'s docstring: on a platform that truncates FP8 sums (h200), Q·K with FP8 Q *and* K, and P·V with an FP8
# P, go through its accumulator model; a platform (zyfa.platforms.Platform, which emulate() takes as is) says per
# gemm whether BF16 operands truncate too (``bf16_qk``, ``bf16_pv``; the h200's are fp32). Every case is one k step
# whose exact sum is 1 + 3·2^-14: the truncating accumulator keeps 13 bits below the largest product's exponent (0),
# so it gives 1 + 2^-13 (docs/PLATFORMS.md); fp32 keeps 1 + 3·2^-14.

EXACT = 1 + 3 * 2.0 ** -14  # the exact (and fp32) sum of the cases below
TRUNCATED = 1 + 2.0 ** -13  # the same sum 13 bits below 2^0, truncated toward zero


def _score_inputs():
    """One key: Q row = (1, 1, 0, ...), K = (1, 3·2^-14, 0, ...), both exact in e4m3fn/bf16 respectively (1 and a
    2-bit significand), so the score is 1 + 3·2^-14; V = 1. With one key the LSE is the score itself."""
    q = torch.zeros(1, 1, 4, 64)
    q[..., :2] = 1.0
    k = torch.zeros(1, 1, 1, 64)
    k[..., 0], k[..., 1] = 1.0, 3 * 2.0 ** -14
    return q, k, torch.ones(1, 1, 1, 64)


def _fp32_out(recipe: str, **fields):
    return get_recipe(recipe).replace(out_format="fp32", **fields)


def test_fp8_q_with_bf16_k_on_h200_sums_q_k_in_fp32():
    """e4m3fn Q with bf16 K is not an FP8 Q·K: on the h200 its sum is fp32's (the LSE is 1 + 3·2^-14), not the
    FP8 accumulator's 1 + 2^-13."""
    r = _fp32_out("zyfa-hopper", name="fp8q-bf16k", k_format="bf16", q_scale="none", k_scale="none",
                  v_scale="none")
    q, k, v = _score_inputs()
    emu = emulate(q, k, v, r, sm_scale=1.0)
    assert torch.equal(emu.q_deq, q) and torch.equal(emu.k_deq, k)
    assert (emu.lse - EXACT).abs().max().item() < 1e-6  # the LSE's own fp32 roundings: a few ulps of 1


def test_bf16_q_k_truncate_only_where_the_platform_truncates_bf16_q_k():
    """bf16 Q and K: fp32 sums on the h200 (bf16_qk='fp32'); on a platform whose BF16 Q·K truncates like its FP8
    one, the score (the LSE) is 1 + 2^-13."""
    r = _fp32_out("bf16")
    trunc = dataclasses.replace(get_platform("h200"), name="h200-bf16-qk-truncating", bf16_qk="align_truncate")
    q, k, v = _score_inputs()
    assert (emulate(q, k, v, r, sm_scale=1.0).lse - EXACT).abs().max().item() < 1e-6
    emu = emulate(q, k, v, r, sm_scale=1.0, platform=trunc)
    assert emu.platform == "h200-bf16-qk-truncating"
    assert (emu.lse - TRUNCATED).abs().max().item() < 1e-6


def test_bf16_p_v_truncate_only_where_the_platform_truncates_bf16_p_v():
    """bf16 P and V: Q = 0 makes both keys' probabilities exactly 1 (l = 2), V's first column (1, 3·2^-14): the
    output's first column is (1 + 3·2^-14)/2 on the h200 (bf16_pv='fp32') and (1 + 2^-13)/2 on a platform whose
    BF16 P·V truncates; the other columns are 0."""
    r = _fp32_out("bf16")
    trunc = dataclasses.replace(get_platform("h200"), name="h200-bf16-pv-truncating", bf16_pv="align_truncate")
    q = torch.zeros(1, 1, 4, 64)
    k = torch.zeros(1, 1, 2, 64)
    v = torch.zeros(1, 1, 2, 64)
    v[0, 0, :, 0] = torch.tensor([1.0, 3 * 2.0 ** -14])
    for plat, col0 in ((None, EXACT / 2), (trunc, TRUNCATED / 2)):
        out = emulate(q, k, v, r, sm_scale=1.0, platform=plat).out
        want = torch.zeros_like(out)
        want[..., 0] = col0
        assert torch.equal(out, want), plat


def test_k_scale_head_kv_gives_one_descale_per_kv_head():
    """k_scale='head_kv' on K (grouped by its own kv heads: one group per head): K's descale is amax/448 per
    (batch, kv head), computed here in float64 (the fp32 quotient is the float64 one rounded once), and its values
    are K / descale rounded to e4m3fn (torch's own cast)."""
    r = get_recipe("zyfa").replace(name="k-head-kv", k_scale="head_kv")
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, 8, 64, generator=g)
    k = torch.randn(2, 2, 8, 64, generator=g) * torch.tensor([1.0, 30.0]).view(1, 2, 1, 1)
    v = torch.randn(2, 2, 8, 64, generator=g)
    qi = quantize_inputs(q, k, v, r)
    want = (k.double().abs().amax(dim=(2, 3), keepdim=True) / 448.0).float()
    assert qi.k_descale.shape == (2, 2, 1, 1) and torch.equal(qi.k_descale, want)
    assert torch.equal(qi.k_values, (k / want).to(torch.float8_e4m3fn).float())
