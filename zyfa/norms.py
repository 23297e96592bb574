"""The relative L2 error: the one definition every command, report, script and test helper calls.

``rel_l2(out, ref) = ||out - ref||_F / ||ref||_F``: the Frobenius norm over the whole tensor, in float64, each norm
computed as ``sqrt(sum(x * x))`` (the form :func:`zyfa.accuracy.scoring.metrics.compute_metrics` has always used, so
the study's rows keep their values to the last bit).

Edge cases (one behaviour everywhere):
    - the reference is zero: 0.0 when the output is zero too (exact), else ``inf`` (any error is infinitely
      large against nothing); never a division by zero, never a made-up floor;
    - the output holds NaN or Inf: ``nan`` (the error is undefined; ``compute_metrics`` reports every error
      metric of such an output as nan and flags it ``has_nan``);
    - the reference holds NaN or Inf: ValueError (a reference must be finite).

It lives in ``zyfa/`` (the lowest package that needs it: ``zyfa/bench/`` may not import ``accuracy``).

Exposed functions:
    rel_l2(out, ref) -> float                       the error of two tensors of one shape
    rel_l2_per(out, ref, dim) -> list[float]        one error per index of ``dim`` (e.g. per query head)
    rel_l2_terms(out, ref) -> tensor                (squared error norm, squared reference norm) on the device,
                                                    for a caller that reads several values back at once
    rel_l2_from_terms(err_sq, ref_sq) -> float      the error from those two numbers (the zero-reference rule)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the tensors bring torch: importing this module stays light (zyfa/bench/ imports it)
    import torch

__all__ = ["rel_l2", "rel_l2_from_terms", "rel_l2_per", "rel_l2_terms"]


def rel_l2_from_terms(err_sq: float, ref_sq: float) -> float:
    """``sqrt(err_sq) / sqrt(ref_sq)`` with this module's rules: 0.0 or inf at a zero reference, nan for a
    non-finite error. Raises ValueError for a non-finite reference."""
    if not math.isfinite(ref_sq):
        raise ValueError(f"the reference's squared norm is {ref_sq}: the reference must be finite")
    if not math.isfinite(err_sq):
        return math.nan
    if ref_sq == 0.0:
        return 0.0 if err_sq == 0.0 else math.inf
    return math.sqrt(err_sq) / math.sqrt(ref_sq)


def _pair(out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"shape mismatch: out {tuple(out.shape)} vs ref {tuple(ref.shape)}")
    o = out.detach().double()
    return o, ref.detach().double().to(o.device)


def rel_l2_terms(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """A float64 tensor ``[sum((out - ref)^2), sum(ref^2)]`` on ``out``'s device (not read back); give its two
    values to :func:`rel_l2_from_terms`. Raises ValueError when the shapes differ."""
    o, r = _pair(out, ref)
    d = o - r
    terms = o.new_zeros(2)
    terms[0], terms[1] = (d * d).sum(), (r * r).sum()
    return terms


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref||_F / ||ref||_F`` in float64 (on ``out``'s device; ``ref`` is moved there); see the module
    docstring for a zero reference and non-finite values.

    Raises:
        ValueError: the shapes differ, or the reference is not finite.
    """
    err_sq, ref_sq = rel_l2_terms(out, ref).tolist()
    return rel_l2_from_terms(err_sq, ref_sq)


def rel_l2_per(out: torch.Tensor, ref: torch.Tensor, dim: int) -> list[float]:
    """One :func:`rel_l2` per index of dimension ``dim`` (the other dimensions summed), e.g. ``dim=1`` of a
    (batch, heads, seq, head_dim) output: the error of each head."""
    o, r = _pair(out, ref)
    d = o - r
    others = tuple(i for i in range(o.dim()) if i != dim % o.dim())
    err_sq = (d * d).sum(dim=others).tolist()
    ref_sq = (r * r).sum(dim=others).tolist()
    return [rel_l2_from_terms(e, s) for e, s in zip(err_sq, ref_sq, strict=True)]
