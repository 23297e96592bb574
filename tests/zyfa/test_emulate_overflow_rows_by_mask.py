"""Which rows count as 'seeing a key' when the scores overflow, for every mask and query/key count.

emulate() gives NaN for a row that sees keys but whose row sum is not a positive number (overflowed scores),
and zeros with lse -inf only for a row that sees no key (emulate's comments; tests/zyfa/
test_emulator_overflow_and_checks.py covers the plain square case). The rows that see keys are decided here from
the FP64 oracle (reference/attention.py): its lse is finite exactly there.
"""

from __future__ import annotations

import pytest
import torch

from reference.attention import attention_fp64
from zyfa.emulator import emulate


def _overflowing(s_q: int, s_k: int, seed: int = 0):
    """q row i equals k row (i mod s_k) scaled up: its score with that key overflows fp32 (|k|^2·1e38)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 1, s_k, 64, generator=g) * 1e19
    q = k[:, :, torch.arange(s_q) % s_k].clone()
    v = torch.randn(1, 1, s_k, 64, generator=g)
    return q, k, v


CASES = [  # (s_q, s_k, mask)
    (32, 32, {"causal": True}),  # row 0 sees key 0 only
    (32, 32, {"causal": True, "window": 4}),
    (40, 8, {}),  # more queries than keys, no mask: every row sees every key
    (40, 8, {"causal": True}),  # the first 32 rows see no key
    (40, 8, {"window": 3}),  # a window alone is causal too
    (16, 1, {}),  # a single key
    (16, 1, {"causal": True}),
]


@pytest.mark.parametrize("name", ["zyfa", "ck", "fa3"])
@pytest.mark.parametrize("s_q,s_k,mask", CASES)
def test_overflowed_rows_are_nan_and_unseeing_rows_are_masked(name, s_q, s_k, mask):
    q, k, v = _overflowing(s_q, s_k)
    ref_out, ref_lse = attention_fp64(q, k, v, **mask)
    sees = torch.isfinite(ref_lse)[0, 0]  # the oracle (float64) has no overflow here
    assert torch.isfinite(ref_out).all() and sees.any()
    em = emulate(q, k, v, name, **mask)
    out, lse = em.out[0, 0], em.lse[0, 0]
    assert torch.isnan(out[sees]).all(-1).all(), "a row that sees keys came back as a number or a masked row"
    assert torch.isnan(lse[sees]).all()
    assert (out[~sees] == 0).all() and torch.isneginf(lse[~sees]).all()


@pytest.mark.parametrize("mask", [{"causal": True}, {"window": 3}, {"causal": True, "window": 3}])
def test_rows_that_see_no_key_stay_zero_without_overflow(mask):
    """40 queries, 8 keys, bottom-right aligned: the first 32 rows see no key under any of these masks."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(1, 2, 40, 64, generator=g),
        torch.randn(1, 2, 8, 64, generator=g),
        torch.randn(1, 2, 8, 64, generator=g),
    )
    em = emulate(q, k, v, "zyfa", **mask)
    _, ref_lse = attention_fp64(q, k, v, **mask)
    masked = torch.isneginf(ref_lse)
    assert int(masked[0, 0].sum()) == 32
    assert torch.equal(torch.isneginf(em.lse), masked)
    assert (em.out[masked] == 0).all() and torch.isfinite(em.out).all()
