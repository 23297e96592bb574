"""The Hopper FP8 accumulator model inside emulate() counts a subnormal operand at its own format's smallest normal
exponent (e4m3fn -6, e4m3fnuz -7, e5m2 -14), in Q·K and in P·V, against the rule written out in float64.

The rule (docs/PLATFORMS.md, fitted on the H200 with e4m3fn, e5m2 and mixed operands; e4m3fnuz by analogy): every k = 32
step, each product counts at the sum of its operands' exponents, a subnormal operand at its format's smallest
normal exponent. The float64 reference is tests/zyfa/hopper_rule.py, which takes that exponent to be e4m3fn's -6
for both operands. The rule is unchanged when an operand is scaled by 2^s and its smallest normal exponent moves
by s (every exponent, quantum and term moves by s; float64 keeps it all exact), so an operand of smallest normal
exponent ``emin`` is fed to it scaled by 2^(-6 - emin) and the result scaled back: the reference for that format.

The inputs are built so that the per-format exponent decides the result: every V (or Q) value of the cases below
is a subnormal of its format, so counting it at -6 instead moves the step's largest exponent and truncates more.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.zyfa.hopper_rule import hopper_mma
from zyfa.emulator import emulate
from zyfa.formats import get_format
from zyfa.recipe_spec import get_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

RULE_MIN_EXP = -6  # the smallest normal exponent hopper_rule.hopper_mma counts a subnormal operand at (e4m3fn)


def _rule(a: np.ndarray, b: np.ndarray, emin_a: int, emin_b: int, bits: int = 13) -> np.ndarray:
    """a @ b on the accumulator rule with a's subnormals at ``emin_a`` and b's at ``emin_b`` (see the module doc)."""
    sa, sb = RULE_MIN_EXP - emin_a, RULE_MIN_EXP - emin_b
    return hopper_mma(np.ldexp(a, sa), np.ldexp(b, sb), None, bits) / 2.0 ** (sa + sb)


def _stepwise_rule(a: np.ndarray, b: np.ndarray, emin_a: int, emin_b: int) -> np.ndarray:
    """The same with every k = 32 step started from zero and the steps added in fp32 (accumulator='fp32')."""
    out = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k0 in range(0, a.shape[1], 32):
        out = out + _rule(a[:, k0:k0 + 32], b[k0:k0 + 32], emin_a, emin_b).astype(np.float32)
    return out.astype(np.float64)


def _codes_to_values(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    return codes.to(torch.uint8).view(get_format(fmt).torch_dtype).float()


def _subnormals(shape, fmt: str, g) -> torch.Tensor:
    """Positive subnormals of ``fmt`` (codes 1 .. 2^mantissa_bits - 1), each equally likely."""
    top = 1 << get_format(fmt).mantissa_bits
    return _codes_to_values(torch.randint(1, top, shape, generator=g), fmt)


def _recipe(**fields):
    """zyfa-hopper (the Hopper FP8 accumulator in Q·K and P·V, P in e4m3fn) with FA3's P arithmetic (fp32 exp2,
    P scaled by a fixed 2^8, the row sum from the unrounded scaled P), no input scaling (the FP8 values given are
    the operands) and an fp32 output."""
    return get_recipe("zyfa-hopper").replace(
        exp_method="exp2", p_scale="pow2", p_scale_log2=8, rowsum="fp32", out_format="fp32", reciprocal="div",
        q_scale="none", k_scale="none", v_scale="none", block_m=4, block_n=32, **fields)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float((np.abs(a - b) / np.abs(b)).max())


@pytest.mark.parametrize("accumulator", ["matrix_unit", "fp32"])
@pytest.mark.parametrize("v_format", ["e5m2", "e4m3fnuz"])
def test_pv_counts_subnormal_v_at_its_formats_smallest_normal_exponent(v_format, accumulator):
    """One tile of 32 keys: P (e4m3fn, from the trace) times a V whose columns are all subnormals of ``v_format``
    (positive: no cancellation). The output is the rule's P·V with V's subnormals at that format's exponent,
    over the fp32 row sum of P·2^8; with them counted at -6 (e4m3fn's) it is measurably another."""
    r = _recipe(name=f"hopper-v-{v_format}-{accumulator}", v_format=v_format, accumulator=accumulator)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 4, 64, generator=g) * 0.5
    k = torch.randn(1, 1, 32, 64, generator=g) * 0.5
    v = _subnormals((1, 1, 32, 64), v_format, g)
    trace: list = []
    emu = emulate(q, k, v, r, sm_scale=1.0, trace=trace)
    assert len(trace) == 1 and torch.equal(emu.v_deq, v)  # V reached the unit as given: subnormal codes
    p8 = trace[0]["p8"][0, 0].double().numpy()
    l = np.exp2(trace[0]["t"][0, 0].double().numpy() + 8).sum(-1, keepdims=True)
    v8 = v[0, 0].double().numpy()
    mma = _rule if accumulator == "matrix_unit" else _stepwise_rule
    emin_p, emin_v = get_format("e4m3fn").emin, get_format(v_format).emin
    want = mma(p8, v8, emin_p, emin_v) / l
    got = emu.out[0, 0].double().numpy()
    assert _rel(got, want) < 2e-6
    assert _rel(mma(p8, v8, emin_p, RULE_MIN_EXP) / l, want) > 1e-4  # the format's exponent decides it


@pytest.mark.parametrize("accumulator", ["matrix_unit", "fp32"])
@pytest.mark.parametrize(("q_format", "k_format"), [("e5m2", "e5m2"), ("e4m3fnuz", "e5m2"), ("e5m2", "e4m3fn")])
def test_qk_counts_subnormal_q_at_its_formats_smallest_normal_exponent(q_format, k_format, accumulator):
    """One key, so P = 1 and the LSE is the score itself: Q all subnormals of ``q_format`` (signed), K large
    normals of ``k_format`` (signed), d = 64 (two k steps). The LSE is the rule's Q·K with Q's subnormals at its
    format's exponent; with them counted at -6 it is measurably another."""
    r = _recipe(name=f"hopper-qk-{q_format}-{k_format}-{accumulator}", q_format=q_format, k_format=k_format,
                accumulator=accumulator)
    g = torch.Generator().manual_seed(2)
    sign = torch.where(torch.rand(1, 1, 4, 64, generator=g) < 0.5, -1.0, 1.0)
    q = _subnormals((1, 1, 4, 64), q_format, g) * sign
    kf = get_format(k_format)
    # K: signed normals in the top 12 binades of its format (e5m2 up to 2^15, e4m3fn up to 2^8): products spread
    # over more than the 13 kept bits, so the step's largest exponent decides which bits are cut
    k_mag = torch.exp2(torch.empty(1, 1, 1, 64).uniform_(kf.emax - 11, kf.emax, generator=g))
    k_sign = torch.where(torch.rand(1, 1, 1, 64, generator=g) < 0.5, -1.0, 1.0)
    k = (k_mag * k_sign).to(kf.torch_dtype).float()
    v = torch.ones(1, 1, 1, 64)
    emu = emulate(q, k, v, r, sm_scale=1.0)
    assert torch.equal(emu.q_deq, q) and torch.equal(emu.k_deq, k)
    q64, kt64 = q[0, 0].double().numpy(), k[0, 0].double().numpy().T
    mma = _rule if accumulator == "matrix_unit" else _stepwise_rule
    emin_q, emin_k = get_format(q_format).emin, kf.emin
    want = mma(q64, kt64, emin_q, emin_k)[:, 0]
    got = emu.lse[0, 0].double().numpy()
    assert _rel(got, want) < 2e-6  # the LSE's own fp32 rounding
    if emin_q != RULE_MIN_EXP:  # e5m2 and e4m3fnuz Q: counting them at -6 gives other scores
        assert _rel(mma(q64, kt64, RULE_MIN_EXP, emin_k)[:, 0], want) > 1e-4
