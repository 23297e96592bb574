"""bootstrap_ci against a separate numpy implementation of both of its intervals, on the same random stream.

The docstring fixes the method: scipy's BCa interval from ``n`` resamples drawn by ``np.random.default_rng(seed)``,
and where BCa is degenerate or scipy is unavailable, the percentile interval of ``n`` resamples drawn with the same
seed. Both are written out below from their textbook definitions (Efron & Tibshirani 14.3 and 15.4; the normal
quantiles from the standard library), so a change of the number of resamples, the seed, the confidence level, the
method or the quantile points shows as a different interval, not only as a different width.
"""

from __future__ import annotations

import math
import sys
from statistics import NormalDist

import numpy as np
import pytest
from zyfa.accuracy.scoring.metrics import CI, bootstrap_ci

_N = NormalDist()


def _resample_indices(size: int, n: int, seed: int) -> np.ndarray:
    """n resamples of ``size`` indices with replacement: one integers() draw of shape (n, size)."""
    return np.random.default_rng(seed).integers(0, size, size=(n, size))


def _bca(x, stat, n, seed, alpha) -> tuple[float, float, float]:
    x = np.asarray(x, dtype=np.float64)
    m = x.size
    boot = np.array([stat(x[i]) for i in _resample_indices(m, n, seed)])
    theta = float(stat(x))
    z0 = _N.inv_cdf((np.sum(boot < theta) + np.sum(boot <= theta)) / (2 * n))  # bias correction
    jack = np.array([stat(np.delete(x, j)) for j in range(m)])
    u = (m - 1) * (jack.mean() - jack)
    a = (u**3).sum() / m**3 / 6 / ((u**2).sum() / m**2) ** 1.5  # acceleration
    z = _N.inv_cdf(alpha / 2)
    lo = _N.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
    hi = _N.cdf(z0 + (z0 - z) / (1 - a * (z0 - z)))
    low, high = np.quantile(boot, [lo, hi])
    return theta, float(low), float(high)


def _percentile(x, stat, n, seed, alpha) -> tuple[float, float, float]:
    x = np.asarray(x, dtype=np.float64)
    boot = np.array([stat(x[i]) for i in _resample_indices(x.size, n, seed)])
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return float(stat(x)), float(low), float(high)


def _sample(size=23, seed=5):
    return np.random.default_rng(seed).lognormal(size=size)


@pytest.mark.parametrize("stat", [np.mean, np.median])
@pytest.mark.parametrize("n,seed,alpha", [(200, 0, 0.05), (201, 1, 0.1), (50, 7, 0.3)])
def test_bca_interval_matches_the_textbook_definition(stat, n, seed, alpha):
    x = _sample()
    ci = bootstrap_ci(x, stat=stat, n=n, seed=seed, alpha=alpha)
    assert isinstance(ci, CI)
    assert ci == pytest.approx(_bca(x, stat, n, seed, alpha), rel=1e-12)


def test_default_arguments_are_mean_1000_resamples_seed_0_and_95_percent():
    x = _sample(size=15, seed=8)
    assert bootstrap_ci(x) == pytest.approx(_bca(x, np.mean, 1000, 0, 0.05), rel=1e-12)


def test_bca_with_a_statistic_that_takes_no_axis():
    x = _sample(size=17, seed=2)

    def p75(v):
        return float(np.percentile(v, 75))

    ci = bootstrap_ci(x, stat=p75, n=120, seed=4, alpha=0.1)
    assert ci == pytest.approx(_bca(x, p75, 120, 4, 0.1), rel=1e-12)


def test_values_are_flattened_to_one_sample():
    x = _sample(size=12, seed=3)
    assert bootstrap_ci(x.reshape(3, 4), n=99, seed=2) == bootstrap_ci(list(x), n=99, seed=2)
    assert bootstrap_ci(x.reshape(3, 4), n=99, seed=2) == pytest.approx(_bca(x, np.mean, 99, 2, 0.05), rel=1e-12)


def test_integer_values_are_measured_in_float64():
    ci = bootstrap_ci([1, 2, 2, 3, 7, 8, 9, 9, 10, 12], n=150, seed=1)
    assert ci.estimate == 6.3
    assert ci == pytest.approx(_bca([1, 2, 2, 3, 7, 8, 9, 9, 10, 12], np.mean, 150, 1, 0.05), rel=1e-12)


def test_the_seed_fixes_the_resamples():
    x = _sample()
    assert bootstrap_ci(x, n=100, seed=9) == bootstrap_ci(x, n=100, seed=9)
    assert bootstrap_ci(x, n=100, seed=9) != bootstrap_ci(x, n=100, seed=10)


@pytest.mark.parametrize("stat", [np.mean, np.median])
@pytest.mark.parametrize("n,seed,alpha", [(300, 0, 0.05), (301, 4, 0.2), (1, 2, 0.1)])
def test_without_scipy_the_percentile_interval_of_the_same_resamples(monkeypatch, stat, n, seed, alpha):
    """An install without scipy: ``from scipy import stats`` fails, and the percentile interval is used."""
    monkeypatch.setitem(sys.modules, "scipy", None)
    with pytest.raises(ImportError):
        from scipy import stats  # noqa: F401
    x = _sample(size=19, seed=6)
    assert bootstrap_ci(x, stat=stat, n=n, seed=seed, alpha=alpha) == pytest.approx(
        _percentile(x, stat, n, seed, alpha), rel=1e-13)


def test_without_scipy_default_arguments():
    x = _sample(size=9, seed=1)
    expected = _percentile(x, np.mean, 1000, 0, 0.05)
    saved = sys.modules.get("scipy")
    sys.modules["scipy"] = None
    try:
        ci = bootstrap_ci(x)
    finally:
        sys.modules["scipy"] = saved
    assert ci == pytest.approx(expected, rel=1e-13)


def test_degenerate_bca_falls_back_to_the_percentile_interval():
    """The maximum of a sample whose maximum appears twice: every leave-one-out maximum is the same, so BCa's
    acceleration is 0/0 and its interval NaN; the percentile interval of the same resamples is returned."""
    x = np.array([2.804, 4.233, 1.34, 8.277, 2.769, 5.118, 4.535, 4.852, 12.5, 2.035, 5.412, 3.297, 12.5, 9.807,
                  7.504, 5.381, 4.031, 9.486, 4.092, 7.535, 9.617, 7.884, 3.118, 5.496, 9.505, 3.032, 0.276, 1.442])
    for n, seed, alpha in ((400, 0, 0.1), (401, 3, 0.2), (250, 2, 0.05)):
        expected = _percentile(x, np.max, n, seed, alpha)
        assert expected[1] < 12.5  # a nonzero-width interval, so its quantile points matter
        assert bootstrap_ci(x, stat=np.max, n=n, seed=seed, alpha=alpha) == pytest.approx(expected, rel=1e-13)


def test_one_value_or_constant_values_give_a_zero_width_interval():
    assert bootstrap_ci([4.25]) == (4.25, 4.25, 4.25)
    assert bootstrap_ci(np.full(7, -1.5), n=10) == (-1.5, -1.5, -1.5)
    assert bootstrap_ci([2.0, 2.0], stat=np.median, n=1) == (2.0, 2.0, 2.0)
    # the estimate is the statistic, not a value of the sample
    assert bootstrap_ci([3.0, 3.0, 3.0], stat=np.sum) == (9.0, 9.0, 9.0)
    assert bootstrap_ci([5.0], stat=lambda v: 2 * float(v[0])) == (10.0, 10.0, 10.0)


def test_any_nan_gives_a_nan_interval():
    for values in ([math.nan], [1.0, 2.0, math.nan], [math.nan, math.nan]):
        ci = bootstrap_ci(values)
        assert all(math.isnan(v) for v in ci), values


def test_two_distinct_values_give_the_bca_interval_not_a_zero_width_one():
    ci = bootstrap_ci([1.0, 3.0], n=50, seed=0)
    assert ci.estimate == 2.0
    assert ci == pytest.approx(_bca([1.0, 3.0], np.mean, 50, 0, 0.05), rel=1e-12)
    assert ci.low < ci.high


def test_float32_values_are_measured_in_float64():
    """A float32 sample (e.g. metrics kept as float32) is upcast first: its mean is the float64 mean of the values,
    which differs from numpy's float32 mean in the 8th digit for this sample."""
    x = np.random.default_rng(0).lognormal(size=101).astype(np.float32)
    x64 = x.astype(np.float64)
    assert float(np.mean(x)) != float(np.mean(x64))
    ci = bootstrap_ci(x, n=60, seed=1)
    assert ci.estimate == float(np.mean(x64))
    assert ci == pytest.approx(_bca(x64, np.mean, 60, 1, 0.05), rel=1e-12)


def test_without_scipy_a_float32_statistic_is_interpolated_in_float64(monkeypatch):
    """The percentile interval interpolates between resample statistics in float64, whatever dtype the
    statistic returns (float32 here: interpolating in float32 would round the bounds to float32)."""
    monkeypatch.setitem(sys.modules, "scipy", None)
    x = _sample(size=19, seed=6)

    def mean32(v):
        return np.float32(np.mean(v))

    expected = _percentile(x, lambda v: np.float64(mean32(v)), 300, 0, 0.05)
    ci = bootstrap_ci(x, stat=mean32, n=300, seed=0, alpha=0.05)
    assert ci.low == pytest.approx(expected[1], rel=1e-14) and ci.high == pytest.approx(expected[2], rel=1e-14)
    assert ci.low != float(np.float32(ci.low)) or ci.high != float(np.float32(ci.high))


def test_an_infinite_value_gives_an_infinite_not_a_nan_upper_bound():
    sqnr_db = [30.5, 29.8, 31.2, 30.0, 28.9, math.inf]  # one layer exact
    ci = bootstrap_ci(sqnr_db, stat=np.median, n=200, seed=0, alpha=0.1)
    assert ci.estimate == 30.25
    assert ci.high == math.inf
