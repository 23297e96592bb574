"""compute_metrics against hand-computed values, its edge cases and validation; bootstrap_ci."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from zyfa.accuracy.scoring.metrics import ERROR_METRICS, bootstrap_ci, compute_metrics


def _t(rows):
    """(1, 1, rows, d) float64 tensor."""
    return torch.tensor(rows, dtype=torch.float64)[None, None]


def test_hand_computed_values():
    ref = _t([[3.0, 4.0], [6.0, 8.0]])  # row norms 5 and 10, ||r||^2 = 125
    out = _t([[3.0, 4.0], [6.0, 9.0]])  # one error of 1 in row 1
    m = compute_metrics(out, ref)
    assert m["rel_l2"] == pytest.approx(1 / math.sqrt(125), rel=1e-15)
    assert m["rmse"] == pytest.approx(0.5, rel=1e-15)
    assert m["max_abs_err"] == 1.0
    assert m["cosine"] == pytest.approx(133 / math.sqrt(142 * 125), rel=1e-15)
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(125), rel=1e-15)
    # per-row relative errors 0 and 0.1; numpy's linear-interpolated quantiles
    assert m["row_rel_err_p50"] == pytest.approx(0.05, rel=1e-14)
    assert m["row_rel_err_p99"] == pytest.approx(0.099, rel=1e-14)
    assert m["row_rel_err_max"] == pytest.approx(0.1, rel=1e-15)
    assert m["has_nan"] is False and m["nonfinite_frac"] == 0.0
    assert m["n_rows"] == 2 and m["n_zero_ref_rows"] == 0
    assert "lse_rmse" not in m


def test_lse_errors_and_masked_rows():
    out = _t([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    lse_ref = torch.tensor([[[1.5, -math.inf, 2.0]]], dtype=torch.float64)
    lse = torch.tensor([[[1.0, -math.inf, 2.25]]], dtype=torch.float32)
    m = compute_metrics(out, out, lse=lse, lse_ref=lse_ref)
    assert m["lse_max_abs_err"] == pytest.approx(0.5)
    assert m["lse_rmse"] == pytest.approx(math.sqrt((0.25 + 0.0625) / 2))
    # the fully masked row has a zero reference: skipped by the row quantiles, counted, its error reported
    assert m["n_zero_ref_rows"] == 1 and m["zero_ref_rows_max_abs_err"] == 0.0
    with pytest.raises(ValueError, match="fully masked"):
        compute_metrics(out, out, lse=torch.tensor([[[1.0, 0.0, 2.0]]]), lse_ref=lse_ref)
    with pytest.raises(ValueError, match="both"):
        compute_metrics(out, out, lse=lse)


def test_zero_reference_rows_use_absolute_error():
    ref = _t([[0.0, 0.0], [3.0, 4.0]])
    out = _t([[0.0, 0.5], [3.0, 4.0]])
    m = compute_metrics(out, ref)
    assert m["row_rel_err_max"] == 0.0  # only row 1 counts, and it is exact
    assert m["zero_ref_rows_max_abs_err"] == 0.5
    assert m["max_abs_err"] == 0.5


def test_identical_tensors():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 17, 8, generator=gen, dtype=torch.float64)
    m = compute_metrics(x.float(), x.float().double(), lse=x[..., 0], lse_ref=x[..., 0])
    assert m["rel_l2"] == 0.0 and m["rmse"] == 0.0 and m["max_abs_err"] == 0.0
    assert m["sqnr_db"] == math.inf
    assert m["cosine"] == pytest.approx(1.0, abs=1e-15)
    assert m["row_rel_err_max"] == 0.0 and m["lse_max_abs_err"] == 0.0


def test_low_precision_and_numpy_inputs_are_upcast():
    gen = torch.Generator().manual_seed(1)
    ref = torch.randn(1, 2, 33, 16, generator=gen, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    m = compute_metrics(out, ref)
    expected = float(torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref))
    assert m["rel_l2"] == pytest.approx(expected, rel=1e-12)
    assert 1e-3 < m["rel_l2"] < 4e-3  # bf16 keeps 8 significant bits
    m_np = compute_metrics(out.float().numpy(), ref.numpy())
    assert m_np["rel_l2"] == pytest.approx(m["rel_l2"], rel=1e-12)


def test_nan_in_output_is_a_finding_not_a_crash():
    ref = _t([[1.0, 2.0], [3.0, 4.0]])
    out = _t([[1.0, math.nan], [3.0, 4.0]])
    m = compute_metrics(out, ref, lse=torch.tensor([[[0.0, 1.0]]]), lse_ref=torch.tensor([[[0.0, 1.0]]]))
    assert m["has_nan"] is True
    assert m["nonfinite_frac"] == 0.25
    for name in ERROR_METRICS:
        if not name.startswith("lse_"):
            assert math.isnan(m[name]), name
    m_inf = compute_metrics(_t([[1.0, math.inf], [3.0, 4.0]]), ref)
    assert m_inf["has_nan"] is True and math.isnan(m_inf["rel_l2"])
    m_lse = compute_metrics(ref, ref, lse=torch.tensor([[[math.nan, 1.0]]]), lse_ref=torch.tensor([[[0.0, 1.0]]]))
    assert m_lse["has_nan"] is True and math.isnan(m_lse["lse_rmse"]) and m_lse["rel_l2"] == 0.0


def test_validation():
    ref = _t([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(ValueError, match="shape mismatch"):
        compute_metrics(ref[..., :1], ref)
    with pytest.raises(ValueError, match="out_ref contains non-finite"):
        compute_metrics(ref, _t([[1.0, math.nan], [3.0, 4.0]]))
    with pytest.raises(ValueError, match="lse_ref"):
        compute_metrics(ref, ref, lse=torch.zeros(1, 1, 2), lse_ref=torch.tensor([[[math.nan, 0.0]]]))
    with pytest.raises(TypeError):
        compute_metrics([[1.0]], ref)


def test_bootstrap_ci_mean():
    rng = np.random.default_rng(123)
    x = rng.normal(5.0, 1.0, size=200)
    ci = bootstrap_ci(x, n=500, seed=0)
    assert ci.estimate == pytest.approx(x.mean())
    assert ci.low < ci.estimate < ci.high
    # the 95% interval of a mean of 200 N(0,1) draws is about ±0.14 wide
    assert 0.2 < ci.high - ci.low < 0.4
    assert bootstrap_ci(x, n=500, seed=0) == ci
    assert bootstrap_ci(x, n=500, seed=1) != ci


def test_bootstrap_ci_degenerate_and_fallback(monkeypatch):
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0)
    assert bootstrap_ci([3.5]) == (3.5, 3.5, 3.5)
    assert all(math.isnan(v) for v in bootstrap_ci([1.0, math.nan, 2.0]))
    with pytest.raises(ValueError):
        bootstrap_ci([])
    x = np.arange(50, dtype=float)
    scipy_ci = bootstrap_ci(x, stat=np.median, n=400, seed=0)

    import scipy.stats

    def broken(*a, **k):
        raise RuntimeError("no scipy bootstrap here")

    monkeypatch.setattr(scipy.stats, "bootstrap", broken)
    fallback = bootstrap_ci(x, stat=np.median, n=400, seed=0)
    assert fallback.estimate == scipy_ci.estimate == 24.5
    assert fallback.low < 24.5 < fallback.high
    assert fallback.low == pytest.approx(scipy_ci.low, abs=4) and fallback.high == pytest.approx(scipy_ci.high, abs=4)

