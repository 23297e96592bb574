"""Rotation of Q and K along the head dimension before quantization ("incoherent processing").

Multiplying Q and K by the same orthogonal matrix M (d x d) leaves every score unchanged in exact arithmetic,
(Q M)(K M)ᵀ = Q M Mᵀ Kᵀ = Q Kᵀ, while it spreads a large value in one channel over all d channels. The
quantization grid of an FP8 tensor with one scale is set by its largest value, so spreading outlier channels
shrinks the error of every other value. FlashAttention-3 (Shah et al., arXiv 2407.08608, section on FP8 "incoherent
processing") uses M = H·D: a normalised Walsh–Hadamard matrix H and a random ±1 diagonal D, applied by the caller
before its kernel, with O(d log d) work per row.

Kinds (``KINDS``):
    ``none``: no rotation.
    ``hadamard``: M = H_d / sqrt(d), the Sylvester Hadamard matrix, normalised (symmetric and orthogonal).
    ``random_hadamard``: M = D · H_d / sqrt(d), D = diag(±1) drawn from ``seed`` (the same D for Q and K, for
        every batch and head).

Only power-of-two head dims have a Sylvester Hadamard matrix; other head dims (MLA's 192, say) are refused with a
ValueError naming the head dim, rather than handled blockwise, so that a rotated run always means a full-width
rotation. The FP64 reference of a rotated run is the unrotated exact attention: the rotation is part of what
the kernel does to its inputs, and its rounding is part of the error measured.

Exposed: ``KINDS``, ``hadamard_matrix(d)``, ``rotation_matrix(d, kind, seed)``, ``fwht(x)``,
``rotate_qk(q, k, kind, seed)``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# torch is imported inside the functions, not here: KINDS is read by zyfa.recipes, which the CLIs use to check
# their arguments before any heavy import (see zyfa/platforms.py).

KINDS = ("none", "hadamard", "random_hadamard")

__all__ = ["KINDS", "fwht", "hadamard_matrix", "rotate_qk", "rotation_matrix"]


def _check_dim(d: int) -> int:
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"head dim must be a positive int, got {d!r}")
    if d & (d - 1):
        raise ValueError(f"Hadamard rotation needs a power-of-two head dim, got {d} (MLA's 192 is not supported)")
    return d


def hadamard_matrix(d: int, *, dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """The normalised Sylvester Hadamard matrix H_d / sqrt(d) (d a power of two): symmetric, orthogonal; in
    ``dtype`` (default float64)."""
    import torch

    _check_dim(d)
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return (h / math.sqrt(d)).to(dtype=dtype or torch.float64, device=device)


def _signs(d: int, seed: int) -> torch.Tensor:
    import torch

    gen = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, 2, (d,), generator=gen, dtype=torch.int64).mul(2).sub(1).to(torch.float64)


def rotation_matrix(d: int, kind: str, *, seed: int = 0, dtype: torch.dtype | None = None,
                    device=None) -> torch.Tensor | None:
    """M for ``kind`` (None for ``none``), in ``dtype`` (default float64): x -> x @ M rotates the last dimension."""
    import torch

    if kind not in KINDS:
        raise ValueError(f"rotation kind {kind!r} is not one of {KINDS}")
    if kind == "none":
        return None
    h = hadamard_matrix(d)
    if kind == "random_hadamard":
        h = _signs(d, seed)[:, None] * h
    return h.to(dtype=dtype or torch.float64, device=device)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Normalised fast Walsh–Hadamard transform of the last dimension (x @ H_d / sqrt(d), O(d log d) per row),
    computed in x's dtype (float32 or float64 recommended)."""
    import torch

    d = _check_dim(x.shape[-1])
    lead = x.shape[:-1]
    y = x.reshape(-1, d).clone()
    h = 1
    while h < d:
        y = y.view(-1, d // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, d)
        h *= 2
    return (y / math.sqrt(d)).reshape(*lead, d)


def rotate_qk(q: torch.Tensor, k: torch.Tensor, kind: str, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and K rotated along the head dim by the same M (``kind``), in float32 (float64 inputs stay float64).

    q: (..., d), k: (..., d). Returns (q @ M, k @ M); ``none`` returns the inputs unchanged.
    """
    import torch

    if kind not in KINDS:
        raise ValueError(f"rotation kind {kind!r} is not one of {KINDS}")
    if kind == "none":
        return q, k
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"Q and K head dims differ: {q.shape[-1]} vs {k.shape[-1]}")
    d = _check_dim(q.shape[-1])
    out = []
    for x in (q, k):
        dt = torch.float64 if x.dtype == torch.float64 else torch.float32
        x = x.to(dt)
        if kind == "random_hadamard":
            x = x * _signs(d, seed).to(dtype=dt, device=x.device)
        out.append(fwht(x))
    return out[0], out[1]
