"""The platform is the source of the emulator's k step: editing ``Platform.k_step`` changes the emulation."""

from __future__ import annotations

import dataclasses

import torch

from zyfa.emulator import emulate
from zyfa.platforms import H200


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
