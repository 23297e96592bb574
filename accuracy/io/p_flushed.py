"""Whether the emulator's ``p_flushed_frac`` is a fraction, checked on a tiny input (the study and the impact
runs normalise or mark their rows by it)."""

from __future__ import annotations

import torch

from zyfa.emulator import emulate


def flush_count_factor() -> float:
    """1.0 if the emulator's ``p_flushed_frac`` is a fraction; b*h if it counts the denominator once per tile.

    Checked on a tiny input: the same head twice must flush the same fraction as once.
    """
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 64, 64, generator=gen) * 4 for _ in range(3))
    one = emulate(q, k, v, "aiter").stats.get("p_flushed_frac", 0.0)
    two = emulate(q.repeat(1, 2, 1, 1), k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), "aiter").stats.get(
        "p_flushed_frac", 0.0)
    return 1.0 if one == 0 or abs(two / one - 1.0) < 1e-6 else two / one
