"""Small steps of the emulator: the Schraudolph exp2 bits, the FP8 output of an all-zero result, and the row-block
bookkeeping with one query row per block.

Expected values: the Schraudolph word computed here in numpy fp32 from its documented formula; zeros for
attention over an all-zero V; the FP64 oracle (reference/attention.py) for the one-row blocks, where the fp32
recipe's only rounding is fp32 arithmetic (and a one-key window returns V's own row, exactly).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reference.attention import attention_fp64
from zyfa.emulator import emulate
from zyfa.emulator_tile import exp2_bittrick
from zyfa.recipes import get_recipe

pytestmark = pytest.mark.filterwarnings("ignore:head dims")

BIAS = 127 * 2**23 - 486411  # CK unified attention / AITER hd256 (UA_FA4_EXP2_APPROX)


def _schraudolph(t: np.ndarray) -> np.ndarray:
    """The fp32 word u32(2^23·t + 127·2^23 − 486411), computed in fp32 as the kernel does; negatives -> 0."""
    y = t.astype(np.float32) * np.float32(2**23) + np.float32(BIAS)
    word = np.clip(np.trunc(np.where(np.isfinite(y), y, np.float32(0))), 0, None).astype(np.uint32)
    return word.view(np.float32)


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
