"""Which operand formats send Q·K and P·V through a platform's truncating accumulator in emulate(), and K's
per-kv-head descale.

emulate()'s docstring: on a platform that truncates FP8 sums (h200), Q·K with FP8 Q *and* K, and P·V with an FP8
P, go through its accumulator model; a platform (zyfa.platforms.Platform, which emulate() takes as is) says per
gemm whether BF16 operands truncate too (``bf16_qk``, ``bf16_pv``; the h200's are fp32). Every case is one k step
whose exact sum is 1 + 3·2^-14: the truncating accumulator keeps 13 bits below the largest product's exponent (0),
so it gives 1 + 2^-13 (docs/PLATFORMS.md); fp32 keeps 1 + 3·2^-14.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from zyfa.emulator import emulate, quantize_inputs
from zyfa.platforms import get_platform
from zyfa.recipes import get_recipe

pytestmark = pytest.mark.usefixtures("one_thread")

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
