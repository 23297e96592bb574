"""Error metrics of an attention output against its FP64 reference, and bootstrap confidence intervals.

Every metric is computed in float64 from the output under test (``out``: any floating dtype, e.g. the
emulator's float32 values already rounded to the recipe's output format) and the reference (``out_ref``:
the FP64 oracle). A "row" is one query row: the last dimension (the value head dim) of a
(batch, heads, seq, d_v) tensor. Names carry their units; relative errors are plain ratios.

Exposed functions:
    compute_metrics(out, out_ref, *, lse=None, lse_ref=None) -> dict[str, float]
    bootstrap_ci(values, stat=np.mean, n=1000, seed=0, alpha=0.05) -> CI(estimate, low, high)

Metrics (``compute_metrics``):
    rel_l2              ||o - r||_F / ||r||_F (Frobenius over the whole tensor): :func:`zyfa.norms.rel_l2`'s
                        definition (0.0 when both are zero, inf when only the reference is)
    rmse                sqrt(mean((o - r)^2))
    max_abs_err         max |o - r|
    cosine              <o, r> / (||o|| ||r||), 1.0 when both are zero
    row_rel_err_p50/p99/max
                        quantiles of ||o_i - r_i|| / ||r_i|| over query rows i whose reference norm is
                        nonzero (rows with a zero reference, e.g. fully masked ones, are skipped here; their
                        absolute error is in ``zero_ref_rows_max_abs_err``)
    sqnr_db             10 log10(||r||^2 / ||o - r||^2); inf when the output is exact
    lse_max_abs_err, lse_rmse
                        error of the natural-log log-sum-exp over rows where the reference is finite; rows
                        with lse -inf (fully masked) must be -inf in both, else ValueError
    has_nan, nonfinite_frac
                        flags of the output under test: a recipe that produces NaN/Inf is a finding, not a
                        crash, so its error metrics are reported as nan and ``has_nan`` is True
    n_zero_out_rows     query rows whose output is all zeros while the reference row is not: what a fully
                        masked row looks like, so a kernel that loses rows (e.g. to an overflow shown as a
                        masked row) is visible even without an LSE to compare
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
from zyfa.accuracy.scoring.metric_names import ERROR_METRICS

from zyfa.norms import rel_l2_from_terms

__all__ = ["ERROR_METRICS", "CI", "bootstrap_ci", "compute_metrics"]


def _as_float64(x, name: str) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}")
    if x.is_complex():
        raise ValueError(f"{name} must be real, got {x.dtype}")
    return x.detach().to(torch.float64)


def compute_metrics(out, out_ref, *, lse=None, lse_ref=None) -> dict[str, float]:
    """Error of ``out`` against ``out_ref``, in float64.

    Args:
        out: (..., d_v) output under test (torch tensor or numpy array, any real dtype).
        out_ref: same shape, the reference (normally float64 from ``reference.attention_fp64``).
        lse: (...) natural-log log-sum-exp under test, or None.
        lse_ref: same shape as ``lse``, the reference's; give both or neither.

    Returns:
        A flat dict: the float metrics named in :data:`ERROR_METRICS` (the two ``lse_*`` only when LSEs are
        given), ``has_nan`` (bool), ``nonfinite_frac``, ``n_rows``, ``n_zero_ref_rows``, ``n_zero_out_rows``
        and ``zero_ref_rows_max_abs_err``.

    Raises:
        ValueError: shapes differ, the reference holds NaN/Inf, only one LSE is given, or the -inf rows of
            the two LSEs disagree.
    """
    o = _as_float64(out, "out")
    r = _as_float64(out_ref, "out_ref")
    if o.shape != r.shape:
        raise ValueError(f"shape mismatch: out {tuple(o.shape)} vs out_ref {tuple(r.shape)}")
    if o.dim() < 1 or o.numel() == 0:
        raise ValueError(f"outputs must be non-empty with a head dim, got shape {tuple(o.shape)}")
    if not bool(torch.isfinite(r).all()):
        raise ValueError(
            f"out_ref contains non-finite values ({int(torch.isnan(r).sum())} NaN, "
            f"{int(torch.isinf(r).sum())} Inf): the reference must be finite"
        )
    if (lse is None) != (lse_ref is None):
        raise ValueError("give both lse and lse_ref, or neither")

    finite = torch.isfinite(o)
    n_nonfinite = int((~finite).sum())
    res: dict[str, float] = {}
    res["has_nan"] = n_nonfinite > 0
    res["nonfinite_frac"] = n_nonfinite / o.numel()
    res.update(_output_metrics(o, r) if n_nonfinite == 0 else _nan_output_metrics(o, r))
    ref_rows_zero = (r == 0).all(dim=-1)
    res["n_zero_out_rows"] = int(((o == 0).all(dim=-1) & ~ref_rows_zero).sum())
    if lse is not None:
        lse_metrics = _lse_metrics(_as_float64(lse, "lse"), _as_float64(lse_ref, "lse_ref"))
        if any(math.isnan(v) for v in lse_metrics.values()):
            res["has_nan"] = True
        res.update(lse_metrics)
    return res


def _output_metrics(o: torch.Tensor, r: torch.Tensor) -> dict[str, float]:
    d = o - r
    err_sq = float(torch.sum(d * d))
    ref_sq = float(torch.sum(r * r))
    out_sq = float(torch.sum(o * o))
    res = {
        "rel_l2": rel_l2_from_terms(err_sq, ref_sq),
        "rmse": math.sqrt(err_sq / d.numel()),
        "max_abs_err": float(d.abs().max()),
    }
    if out_sq == 0.0 and ref_sq == 0.0:
        res["cosine"] = 1.0
    elif out_sq == 0.0 or ref_sq == 0.0:
        res["cosine"] = 0.0
    else:
        res["cosine"] = float(torch.sum(o * r)) / math.sqrt(out_sq * ref_sq)

    # per query row: ||o_i - r_i|| / ||r_i||, rows with a zero reference norm skipped
    rows_err = torch.linalg.vector_norm(d, dim=-1).reshape(-1)
    rows_ref = torch.linalg.vector_norm(r, dim=-1).reshape(-1)
    zero = rows_ref == 0
    rel = (rows_err[~zero] / rows_ref[~zero]).cpu().numpy()
    if rel.size:
        p50, p99 = np.quantile(rel, [0.5, 0.99])
        res.update(row_rel_err_p50=float(p50), row_rel_err_p99=float(p99), row_rel_err_max=float(rel.max()))
    else:
        res.update(row_rel_err_p50=math.nan, row_rel_err_p99=math.nan, row_rel_err_max=math.nan)
    if err_sq == 0.0:
        res["sqnr_db"] = math.inf
    elif ref_sq == 0.0:
        res["sqnr_db"] = -math.inf
    else:
        res["sqnr_db"] = 10.0 * math.log10(ref_sq / err_sq)
    res["n_rows"] = int(rows_ref.numel())
    res["n_zero_ref_rows"] = int(zero.sum())
    # max |o - r| over the rows whose reference is all zeros (fully masked rows: the output should be 0)
    zero_rows = d.reshape(-1, d.shape[-1])[zero]
    res["zero_ref_rows_max_abs_err"] = float(zero_rows.abs().max()) if zero_rows.numel() else 0.0
    return res


def _nan_output_metrics(o: torch.Tensor, r: torch.Tensor) -> dict[str, float]:
    rows_ref = torch.linalg.vector_norm(r, dim=-1).reshape(-1)
    res = {name: math.nan for name in ERROR_METRICS if not name.startswith("lse_")}
    res["n_rows"] = int(rows_ref.numel())
    res["n_zero_ref_rows"] = int((rows_ref == 0).sum())
    res["zero_ref_rows_max_abs_err"] = math.nan
    return res


def _lse_metrics(lse: torch.Tensor, lse_ref: torch.Tensor) -> dict[str, float]:
    if lse.shape != lse_ref.shape:
        raise ValueError(f"shape mismatch: lse {tuple(lse.shape)} vs lse_ref {tuple(lse_ref.shape)}")
    if bool(torch.isnan(lse_ref).any()) or bool((lse_ref == math.inf).any()):
        raise ValueError("lse_ref contains NaN or +Inf: the reference must be finite or -inf (masked rows)")
    if bool(torch.isnan(lse).any()) or bool((lse == math.inf).any()):
        return {"lse_max_abs_err": math.nan, "lse_rmse": math.nan}
    masked_ref = lse_ref == -math.inf
    masked = lse == -math.inf
    if not torch.equal(masked, masked_ref):
        n = int((masked != masked_ref).sum())
        raise ValueError(
            f"lse and lse_ref disagree on which rows are fully masked (-inf) in {n} rows: "
            f"{int(masked.sum())} vs {int(masked_ref.sum())} -inf rows"
        )
    keep = ~masked_ref
    if not bool(keep.any()):
        return {"lse_max_abs_err": 0.0, "lse_rmse": 0.0}
    d = lse[keep] - lse_ref[keep]
    return {"lse_max_abs_err": float(d.abs().max()), "lse_rmse": math.sqrt(float(torch.mean(d * d)))}


class CI(NamedTuple):
    """A statistic and its bootstrap confidence interval."""

    estimate: float
    low: float
    high: float


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    stat: Callable = np.mean,
    n: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> CI:
    """Bootstrap (1 - alpha) confidence interval of ``stat`` over ``values`` (e.g. one metric per layer).

    Uses ``scipy.stats.bootstrap`` (BCa); where BCa is degenerate (constant data, tiny samples) or scipy
    fails (a NaN bound), falls back to the percentile interval of ``n`` resamples drawn with the same seed. One
    value gives a zero-width interval; any NaN gives a NaN interval (a NaN-producing recipe stays visible); an
    infinite value (the +inf SQNR of an exact layer) may give an infinite bound.

    Args:
        values: 1-D sample.
        stat: statistic; a numpy reduction taking ``axis`` (np.mean, np.median) is vectorized by scipy.
        n: bootstrap resamples.
        seed: seed of the resampling generator.
        alpha: 1 - confidence level.
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if np.isnan(x).any():
        return CI(math.nan, math.nan, math.nan)
    estimate = float(stat(x))
    if x.size == 1 or np.all(x == x[0]):
        return CI(estimate, estimate, estimate)
    low = high = math.nan
    try:
        from scipy import stats  # lazy: scipy is optional here (the percentile interval below without it)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = stats.bootstrap(
                (x,), stat, n_resamples=n, confidence_level=1.0 - alpha, method="BCa",
                rng=np.random.default_rng(seed),
            )
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    except Exception:  # scipy missing, too old (no rng=), or BCa failing: percentile fallback below
        pass
    if math.isnan(low) or math.isnan(high):  # an infinite bound is an answer (a sample holding +inf), not a failure
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, x.size, size=(n, x.size))
        boot = np.array([stat(x[i]) for i in idx], dtype=np.float64)
        low, high = (float(v) for v in np.quantile(boot, [alpha / 2, 1.0 - alpha / 2]))
    return CI(estimate, low, high)
