"""compute_metrics on small tensors against expectations written out in numpy float64 (not by the code under test).

Every metric of the docstring of accuracy/scoring/metrics.py is recomputed here from its definition: Frobenius rel-L2,
RMSE, max error, cosine (and its zero-norm conventions), per-row relative errors with numpy's default (linear)
quantile written out by hand, SQNR in dB, the zero-reference and zero-output row counts, and the LSE errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from zyfa.accuracy.scoring.metrics import ERROR_METRICS, compute_metrics


def _linear_quantile(values, p):
    """numpy's default quantile ('linear', type 7), written out: the order statistic at p*(n-1), interpolated."""
    s = sorted(values)
    pos = p * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


def _expected(o: np.ndarray, r: np.ndarray) -> dict[str, float]:
    o, r = o.astype(np.float64), r.astype(np.float64)
    d = o - r
    err_sq, ref_sq, out_sq = (float((a * a).sum()) for a in (d, r, o))
    rows_err = np.sqrt((d * d).sum(axis=-1)).reshape(-1)
    rows_ref = np.sqrt((r * r).sum(axis=-1)).reshape(-1)
    rel = [e / n for e, n in zip(rows_err, rows_ref, strict=True) if n != 0]
    return {
        "rel_l2": math.sqrt(err_sq) / math.sqrt(ref_sq),
        "rmse": math.sqrt(err_sq / d.size),
        "max_abs_err": float(np.abs(d).max()),
        "cosine": float((o * r).sum()) / math.sqrt(out_sq * ref_sq),
        "row_rel_err_p50": _linear_quantile(rel, 0.5),
        "row_rel_err_p99": _linear_quantile(rel, 0.99),
        "row_rel_err_max": max(rel),
        "sqnr_db": 10.0 * math.log10(ref_sq / err_sq),
        "n_rows": int(rows_ref.size),
        "n_zero_ref_rows": int((rows_ref == 0).sum()),
    }


def _t(rows):
    """(1, 1, rows, d) float64 tensor."""
    return torch.tensor(rows, dtype=torch.float64)[None, None]


def test_every_metric_matches_numpy_on_a_4d_float32_output():
    """(batch 2, heads 3, rows 5, d 4): row reductions must run over the last dim only, quantiles over 30 rows."""
    rng = np.random.default_rng(11)
    ref = rng.normal(size=(2, 3, 5, 4))
    out = (ref + rng.normal(scale=0.05, size=ref.shape) * rng.uniform(0.1, 3.0, size=(2, 3, 5, 1))).astype(np.float32)
    m = compute_metrics(torch.from_numpy(out), torch.from_numpy(ref))
    exp = _expected(out, ref)
    for key in ("rel_l2", "rmse", "max_abs_err", "cosine", "row_rel_err_p50", "row_rel_err_p99",
                "row_rel_err_max", "sqnr_db"):
        assert m[key] == pytest.approx(exp[key], rel=1e-12), key
    assert m["n_rows"] == 30 and m["n_zero_ref_rows"] == 0 and m["n_zero_out_rows"] == 0
    assert m["zero_ref_rows_max_abs_err"] == 0.0
    assert m["has_nan"] is False and m["nonfinite_frac"] == 0.0
    # the three row quantiles are distinct here, so swapping p50/p99/max would show
    assert m["row_rel_err_p50"] < m["row_rel_err_p99"] < m["row_rel_err_max"]


def test_row_quantiles_interpolate_between_rows():
    """Five rows with relative errors 0, 0.1, 0.2, 0.3, 0.4 (ref rows of norm 5): p50 = 0.2, p99 = 0.396."""
    ref = _t([[3.0, 4.0]] * 5)
    out = _t([[3.0, 4.0 + 0.5 * i] for i in range(5)])
    m = compute_metrics(out, ref)
    assert m["row_rel_err_p50"] == pytest.approx(0.2, rel=1e-14)
    assert m["row_rel_err_p99"] == pytest.approx(0.3 + 0.96 * 0.1, rel=1e-14)
    assert m["row_rel_err_max"] == pytest.approx(0.4, rel=1e-14)
    assert m["rmse"] == pytest.approx(math.sqrt(0.25 * (0 + 1 + 4 + 9 + 16) / 10), rel=1e-15)
    assert m["max_abs_err"] == 2.0


def test_a_single_element_output():
    """One query row of head dim 1 is a valid (non-empty) output."""
    m = compute_metrics(torch.tensor([[2.0]]), torch.tensor([[4.0]], dtype=torch.float64))
    assert m["rel_l2"] == 0.5 and m["max_abs_err"] == 2.0 and m["n_rows"] == 1
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(4.0), rel=1e-15)


def test_a_one_dimensional_output_is_one_row():
    """(..., d_v) includes a bare (d_v,) vector: one query row."""
    m = compute_metrics(torch.tensor([1.0, 2.0, 2.0]), torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64))
    assert m["n_rows"] == 1
    assert m["rel_l2"] == pytest.approx(2.0 / math.sqrt(21), rel=1e-15)
    assert m["row_rel_err_p50"] == m["row_rel_err_p99"] == m["row_rel_err_max"] == pytest.approx(2 / math.sqrt(21))


@pytest.mark.parametrize("out,ref,cosine", [
    ([[0.0, 0.0]], [[0.0, 0.0]], 1.0),  # both zero: 1 by convention
    ([[0.0, 0.0]], [[1.0, 2.0]], 0.0),  # one side zero: 0
    ([[1.0, 2.0]], [[0.0, 0.0]], 0.0),
    ([[1.0, 0.0]], [[0.0, 1.0]], 0.0),  # unit norms on both sides, orthogonal: a real 0, not a convention
    ([[1.0, 0.0]], [[1.0, 1.0]], 1 / math.sqrt(2)),  # unit-norm output
    ([[1.0, 1.0]], [[0.0, 1.0]], 1 / math.sqrt(2)),  # unit-norm reference
    ([[2.0, 0.0]], [[-3.0, 0.0]], -1.0),
])
def test_cosine_definition_and_zero_norm_conventions(out, ref, cosine):
    assert compute_metrics(_t(out), _t(ref))["cosine"] == pytest.approx(cosine, abs=1e-15)


def test_zero_reference_conventions():
    """ref all zero: rel-L2 is 0 for an exact output and inf otherwise; SQNR +inf / -inf; no rows for quantiles."""
    zero = _t([[0.0, 0.0], [0.0, 0.0]])
    exact = compute_metrics(zero, zero)
    assert exact["rel_l2"] == 0.0 and exact["sqnr_db"] == math.inf and exact["cosine"] == 1.0
    wrong = compute_metrics(_t([[0.0, 0.0], [0.0, -0.25]]), zero)
    assert wrong["rel_l2"] == math.inf
    assert wrong["sqnr_db"] == -math.inf
    assert wrong["rmse"] == pytest.approx(0.125, rel=1e-15)
    for key in ("row_rel_err_p50", "row_rel_err_p99", "row_rel_err_max"):
        assert math.isnan(wrong[key]), key
    assert wrong["n_rows"] == 2 and wrong["n_zero_ref_rows"] == 2
    assert wrong["zero_ref_rows_max_abs_err"] == 0.25
    assert wrong["n_zero_out_rows"] == 0  # zero output rows only count where the reference row is not zero


def test_sqnr_and_rel_l2_of_a_unit_error():
    """||r||^2 = 1 with ||o - r||^2 = 2, then 1 (not only the 0 / nonzero cases): SQNR -3.01 dB, then 0 dB."""
    m = compute_metrics(_t([[0.0, 1.0]]), _t([[1.0, 0.0]]))
    assert m["sqnr_db"] == pytest.approx(-10 * math.log10(2), rel=1e-15)
    assert m["rel_l2"] == pytest.approx(math.sqrt(2), rel=1e-15)  # ||(-1, 1)|| / ||(1, 0)||
    m = compute_metrics(_t([[2.0, 0.0]]), _t([[1.0, 0.0]]))
    assert m["sqnr_db"] == 0.0 and m["rel_l2"] == 1.0 and m["rmse"] == pytest.approx(math.sqrt(0.5))


def test_zero_output_rows_are_counted_only_where_the_reference_is_not_zero():
    ref = _t([[1.0, 2.0], [0.0, 0.0], [3.0, 0.0], [0.0, 5.0]])
    out = _t([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 4.0]])
    m = compute_metrics(out, ref)
    assert m["n_zero_out_rows"] == 2  # rows 0 and 2; row 1 is zero on both sides, row 3 is not zero
    assert m["n_zero_ref_rows"] == 1 and m["n_rows"] == 4
    assert m["row_rel_err_max"] == 1.0
    assert m["row_rel_err_p50"] == pytest.approx(1.0)  # rows 0, 2, 3: 1, 1, 0.2 -> median 1
    assert m["row_rel_err_p99"] == pytest.approx(1.0)


def test_zero_reference_row_error_is_the_largest_absolute_entry_of_those_rows():
    ref = _t([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    out = _t([[0.0, -0.75, 0.5], [1.0, 9.0, 1.0], [0.25, 0.0, 0.0]])
    m = compute_metrics(out, ref)
    assert m["zero_ref_rows_max_abs_err"] == 0.75  # row 1's error of 8 is not a zero-reference row
    assert m["max_abs_err"] == 8.0
    assert m["n_zero_ref_rows"] == 2


def test_inputs_that_require_grad_are_measured_without_autograd():
    ref = torch.tensor([[3.0, 4.0], [1.0, 0.0]], dtype=torch.float64)
    out = (ref + torch.tensor([[0.0, 1.0], [0.0, 0.0]])).float().requires_grad_(True)
    m = compute_metrics(out, ref.clone().requires_grad_(True))
    assert m["rel_l2"] == pytest.approx(1 / math.sqrt(26), rel=1e-7)
    assert m["row_rel_err_max"] == pytest.approx(0.2, rel=1e-7)


def test_numpy_arrays_of_any_real_dtype_are_upcast_to_float64():
    ref = np.array([[1.0, 2.0, 3.0]], dtype=np.float64)
    out16 = np.array([[1.0, 2.0, 3.001953125]], dtype=np.float16)  # 3 + 2**-9: one float16 ulp above 3
    m = compute_metrics(out16, ref)
    assert m["max_abs_err"] == 2.0**-9
    assert m["rel_l2"] == pytest.approx(2.0**-9 / math.sqrt(14), rel=1e-15)
    m_int = compute_metrics(np.array([[1, 2, 4]], dtype=np.int32), ref)
    assert m_int["max_abs_err"] == 1.0


def test_nan_output_keeps_the_row_counts_and_reports_nan_errors():
    ref = _t([[1.0, 2.0], [0.0, 0.0], [3.0, 4.0]])
    out = _t([[1.0, 2.0], [0.0, 0.0], [math.inf, 4.0]])
    m = compute_metrics(out, ref)
    assert m["has_nan"] is True
    assert m["nonfinite_frac"] == pytest.approx(1 / 6, rel=1e-15)
    assert m["n_rows"] == 3 and m["n_zero_ref_rows"] == 1
    assert math.isnan(m["zero_ref_rows_max_abs_err"])
    assert set(m) == {name for name in ERROR_METRICS if not name.startswith("lse_")} | {
        "has_nan", "nonfinite_frac", "n_rows", "n_zero_ref_rows", "n_zero_out_rows", "zero_ref_rows_max_abs_err"}
    for name in ERROR_METRICS:
        if not name.startswith("lse_"):
            assert math.isnan(m[name]), name
    m2 = compute_metrics(_t([[math.nan, math.nan], [0.0, 0.0], [0.0, 0.0]]), ref)
    assert m2["nonfinite_frac"] == pytest.approx(2 / 6, rel=1e-15)
    assert m2["n_zero_out_rows"] == 1  # row 2 is all zeros against a nonzero reference row, NaN or not elsewhere


def test_finite_output_result_has_exactly_the_documented_keys():
    ref = _t([[1.0, 2.0]])
    m = compute_metrics(ref, ref)
    assert set(m) == {name for name in ERROR_METRICS if not name.startswith("lse_")} | {
        "has_nan", "nonfinite_frac", "n_rows", "n_zero_ref_rows", "n_zero_out_rows", "zero_ref_rows_max_abs_err"}
    m = compute_metrics(ref, ref, lse=torch.zeros(1, 1, 1), lse_ref=torch.zeros(1, 1, 1))
    assert {"lse_max_abs_err", "lse_rmse"} <= set(m)


# ---------------------------------------------------------------------------------------------------- LSE errors


def _lse(values, dtype=torch.float64):
    return torch.tensor(values, dtype=dtype)[None, None]


def test_lse_errors_over_the_unmasked_rows():
    out = _t([[1.0, 0.0]] * 4)
    lse_ref = _lse([0.5, -math.inf, 2.0, -1.0])
    lse = _lse([0.25, -math.inf, 2.5, -1.0])
    m = compute_metrics(out, out, lse=lse, lse_ref=lse_ref)
    assert m["lse_max_abs_err"] == 0.5
    assert m["lse_rmse"] == pytest.approx(math.sqrt((0.0625 + 0.25 + 0.0) / 3), rel=1e-15)
    assert m["has_nan"] is False


def test_lse_given_as_numpy_arrays():
    out = _t([[1.0, 0.0]] * 2)
    m = compute_metrics(out, out, lse=np.array([[[1.0, 3.0]]], dtype=np.float32),
                        lse_ref=np.array([[[1.0, 2.0]]]))
    assert m["lse_max_abs_err"] == 1.0 and m["lse_rmse"] == pytest.approx(math.sqrt(0.5))


def test_all_rows_masked_gives_zero_lse_error():
    out = _t([[0.0, 0.0]] * 2)
    m = compute_metrics(out, out, lse=_lse([-math.inf, -math.inf]), lse_ref=_lse([-math.inf, -math.inf]))
    assert m["lse_max_abs_err"] == 0.0 and m["lse_rmse"] == 0.0
    assert m["has_nan"] is False


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nonfinite_lse_under_test_is_a_finding(bad):
    """NaN or +Inf in the LSE under test: nan LSE errors and has_nan, even with a finite output."""
    out = _t([[1.0, 0.0]] * 3)
    m = compute_metrics(out, out, lse=_lse([0.0, bad, 1.0]), lse_ref=_lse([0.0, 2.0, 1.0]))
    assert math.isnan(m["lse_max_abs_err"]) and math.isnan(m["lse_rmse"])
    assert m["has_nan"] is True
    assert m["rel_l2"] == 0.0  # the output metrics are unaffected


def test_nan_lse_on_a_masked_row_is_a_finding_not_a_disagreement():
    """NaN where the reference row is fully masked (-inf): a NaN finding, checked before the masked-row match."""
    out = _t([[1.0, 0.0]] * 3)
    m = compute_metrics(out, out, lse=_lse([0.0, math.nan, 1.0]), lse_ref=_lse([0.0, -math.inf, 1.0]))
    assert math.isnan(m["lse_max_abs_err"]) and math.isnan(m["lse_rmse"]) and m["has_nan"] is True


def test_masked_rows_disagreement_names_the_counts():
    out = _t([[1.0, 0.0]] * 5)
    with pytest.raises(ValueError) as err:  # rows 1 and 2 disagree, rows 0, 3 and 4 agree
        compute_metrics(out, out, lse=_lse([-math.inf, -math.inf, -math.inf, 0.0, 1.0]),
                        lse_ref=_lse([-math.inf, 1.0, 2.0, 0.0, 1.0]))
    assert str(err.value) == (
        "lse and lse_ref disagree on which rows are fully masked (-inf) in 2 rows: 3 vs 1 -inf rows")


def test_lse_shape_mismatch_message():
    out = _t([[1.0, 0.0]] * 2)
    with pytest.raises(ValueError) as err:
        compute_metrics(out, out, lse=torch.zeros(1, 1, 2), lse_ref=torch.zeros(1, 2))
    assert str(err.value) == "shape mismatch: lse (1, 1, 2) vs lse_ref (1, 2)"


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_lse_ref_must_be_finite_or_minus_inf(bad):
    out = _t([[1.0, 0.0]] * 2)
    with pytest.raises(ValueError) as err:
        compute_metrics(out, out, lse=_lse([0.0, 0.0]), lse_ref=_lse([0.0, bad]))
    assert str(err.value) == "lse_ref contains NaN or +Inf: the reference must be finite or -inf (masked rows)"
