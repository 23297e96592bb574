"""The platform is the only source of the emulator's accumulator parameters: editing ``Platform.k_step`` or
``Platform.accum_bits`` changes the emulation, and no recipe can set them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from zyfa.emulator import emulate
from zyfa.platforms import H200, MI355X, Platform
from zyfa.recipe_spec import SpecError, get_recipe


def _qkv(seed=0, s=64, d=64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 1, s, d, generator=g) for _ in range(3)]


def test_the_h200s_k_step_decides_the_truncating_steps():
    q, k, v = _qkv()
    r = "fa3:head_dim_tiles=none,block_n=64"  # Hopper accumulator, never flushed, on the h200
    base = emulate(q, k, v, r).out
    same = emulate(q, k, v, r, platform=dataclasses.replace(H200, k_step=32)).out
    other = emulate(q, k, v, r, platform=dataclasses.replace(H200, k_step=16)).out
    assert H200.k_step == 32 and torch.equal(base, same)
    assert not torch.equal(base, other)  # aligned and truncated every 16 products instead of 32


def test_the_h200s_accum_bits_decide_the_truncation():
    q, k, v = _qkv(seed=1)
    r = "fa3:head_dim_tiles=none,block_n=64"
    base = emulate(q, k, v, r).out
    same = emulate(q, k, v, r, platform=dataclasses.replace(H200, accum_bits=13)).out
    coarse = emulate(q, k, v, r, platform=dataclasses.replace(H200, accum_bits=8)).out
    fine = emulate(q, k, v, r, platform=dataclasses.replace(H200, accum_bits=23)).out
    assert H200.accum_bits == 13 and torch.equal(base, same)
    assert not torch.equal(base, coarse) and not torch.equal(base, fine)


def test_accum_bits_matter_only_where_the_platform_truncates():
    q, k, v = _qkv(seed=2)
    base = emulate(q, k, v, "fa3@mi355x").out  # fp32 sums: no kept bits to read
    assert torch.equal(base, emulate(q, k, v, "fa3", platform=MI355X).out)


def test_a_recipe_cannot_set_the_accumulators_bits():
    with pytest.raises(SpecError, match="no field 'accum_mantissa_bits'"):
        get_recipe("fa3:accum_mantissa_bits=8")


@pytest.mark.parametrize("bits", [None, 0, 24, True, 13.0])
def test_a_truncating_platform_needs_its_bits(bits):
    with pytest.raises(ValueError, match=rf"platform 'h200': an align_truncate accumulator needs accum_bits an int in "
                                         rf"\[1, 23\], got {bits!r}"):
        Platform(**{**{f: getattr(H200, f) for f in H200.__dataclass_fields__}, "accum_bits": bits})
