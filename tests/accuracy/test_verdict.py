"""accuracy.scoring.verdict on planted data: a true effect is found, a null carries its detectable effect, a clustered
design
is as wide as its clusters, McNemar and Holm on textbook tables, the ceiling case."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from zyfa.accuracy.scoring.verdict import (
    LABEL_CEILING,
    LABEL_EFFECT,
    cluster_bootstrap,
    holm,
    mcnemar_exact,
    mde,
    mean_interval,
    paired_interval,
    paired_verdict,
    spearman_with_p,
)


def test_true_effect_is_found():
    rng = np.random.default_rng(1)
    a = rng.normal(0.0, 1.0, 200)
    b = a + 0.5 + rng.normal(0.0, 0.3, 200)  # b is 0.5 higher per unit
    v = paired_verdict(a, b, threshold=0.1, metric="Δ log p", arms=("flushed", "never"))
    assert v.label == LABEL_EFFECT and v.kind == "effect" and v.direction == "better"
    assert v.lo < 0.5 < v.hi and v.lo > 0.1
    assert v.p < 1e-10
    assert v.n_units == v.n_clusters == 200
    s = v.sentence("smollm2 needle 4K")
    assert s.startswith("smollm2 needle 4K: Δ log p never vs flushed +0.4") and "n = 200" in s and "better" in s
    lower = paired_verdict(a, b, threshold=0.1, higher_is_better=False)
    assert lower.direction == "worse"


def test_null_states_its_detectable_effect():
    rng = np.random.default_rng(2)
    a = rng.normal(0.0, 1.0, 12)
    b = a + rng.normal(0.0, 1.0, 12)  # no true effect, few noisy units
    v = paired_verdict(a, b, threshold=0.05, metric="Δ log p")
    assert v.kind == "inconclusive"
    assert v.lo < 0 < v.hi
    # the detectable effect is (t[.975, 11] + t[.8, 11]) x SE, SE about sd / sqrt(12)
    d = b - a
    expected = (stats.t.ppf(0.975, 11) + stats.t.ppf(0.8, 11)) * d.std(ddof=1) / math.sqrt(12)
    assert v.detectable == pytest.approx(expected, rel=0.1)
    assert v.label == f"inconclusive (could detect only ≥ {v.detectable:.3g})"
    assert f"could detect only effects ≥ {v.detectable:.3g}" in v.sentence("x")
    assert v.half_width == pytest.approx((v.hi - v.lo) / 2)
    assert v.p == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue, abs=0.1)


def test_equivalence_when_the_interval_lies_inside_the_threshold():
    rng = np.random.default_rng(3)
    a = rng.normal(0.0, 1.0, 400)
    b = a + rng.normal(0.0, 0.05, 400)
    v = paired_verdict(a, b, threshold=0.05)
    assert v.kind == "equivalent" and v.label == "no effect larger than 0.05"
    assert v.lo >= -0.05 and v.hi <= 0.05
    assert "no effect larger than 0.05" in v.sentence("c")
    # the same data against a threshold below the interval's reach: not equivalent
    assert paired_verdict(a, b, threshold=0.001).kind == "inconclusive"


def test_clustered_design_is_as_wide_as_its_clusters():
    """3 facts x 30 depths: the fact decides the outcome, so the interval is that of 3 samples, not 90."""
    rng = np.random.default_rng(4)
    fact_effect = np.array([-0.4, 0.1, 0.6])
    facts = np.repeat(np.arange(3), 30)
    d = fact_effect[facts] + rng.normal(0.0, 0.05, 90)
    naive = cluster_bootstrap(d)
    clustered = cluster_bootstrap(d, facts)
    fact_means = np.array([d[facts == f].mean() for f in range(3)])
    three = cluster_bootstrap(fact_means)  # equal cluster sizes: the same resamples as 3 samples
    assert clustered == pytest.approx(three)
    assert (clustered[2] - clustered[1]) > 5 * (naive[2] - naive[1])
    v = paired_verdict(np.zeros(90), d, clusters=facts, threshold=0.1)
    assert v.n_units == 90 and v.n_clusters == 3
    assert v.kind == "inconclusive" and v.detectable > 0.5
    assert "n = 90 units in 3 independent clusters" in v.sentence("needle")
    assert paired_verdict(np.zeros(90), d, threshold=0.1).kind == "effect"  # the naive design would call it


def test_cluster_bootstrap_mean_matches_a_loop_and_unequal_clusters():
    x = np.array([1.0, 2.0, 3.0, 10.0, 11.0, 0.0])
    cl = ["a", "a", "a", "b", "b", "c"]
    est, lo, hi = cluster_bootstrap(x, cl, n_boot=2000, seed=7)
    est2, lo2, hi2 = cluster_bootstrap(x, cl, stat=np.mean, n_boot=2000, seed=7)
    assert est == pytest.approx(np.mean(x)) and (lo, hi) == pytest.approx((lo2, hi2))
    med = cluster_bootstrap(x, cl, stat="median", n_boot=500)
    assert med[0] == pytest.approx(2.5) and med[1] <= med[2]
    assert all(math.isnan(t) for t in cluster_bootstrap([1.0, 2.0], ["one", "one"])[1:])


@pytest.mark.parametrize("bad, match", [
    (dict(values=[]), "at least one value"),
    (dict(values=[1.0, math.nan]), "NaN"),
    (dict(values=[1.0, 2.0], clusters=[1]), "clusters has 1 entries for 2 values"),
    (dict(values=[1.0, 2.0], stat="mode"), "stat must be"),
])
def test_cluster_bootstrap_refuses_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        cluster_bootstrap(**bad)


def test_ratio_verdict_and_mappings():
    rng = np.random.default_rng(5)
    units = [f"L{i}/h{j}" for i in range(8) for j in range(12)]
    a = {u: float(rng.lognormal(0, 0.2)) for u in units}
    b = {u: a[u] * 0.3 * float(rng.lognormal(0, 0.05)) for u in units}
    v = paired_verdict(a, b, clusters=lambda u: u.split("/")[0], threshold=0.05, ratio=True, higher_is_better=False,
                       metric="error ratio")
    assert v.kind == "effect" and v.direction == "better" and v.n_clusters == 8 and v.n_units == 96
    assert v.lo < 0.3 < v.hi
    same = paired_verdict(a, dict(a), threshold=0.05, ratio=True)
    assert same.kind == "equivalent" and same.effect == pytest.approx(1.0)
    with pytest.raises(ValueError, match="only one arm"):
        paired_verdict(a, {units[0]: 1.0}, threshold=0.05)
    with pytest.raises(ValueError, match="positive values"):
        paired_verdict([1.0, 0.0], [1.0, 1.0], threshold=0.05, ratio=True)


def test_ceiling_cells_are_uninformative():
    v = paired_verdict([1, 1, 1, 1], [1, 1, 1, 1], clusters=[0, 0, 1, 1], threshold=0.05, metric="exact match")
    assert v.label == LABEL_CEILING and not v.informative
    assert "uninformative, every arm at the ceiling" in v.sentence("gemma3 passkey 8K")
    # one miss in either arm: informative again
    assert paired_verdict([1, 1, 1, 0], [1, 1, 1, 1], threshold=0.05).informative
    assert paired_verdict([0.0, 0.0], [0.0, 0.0], threshold=0.05).kind == "floor"
    # an explicit ceiling for a continuous metric
    assert paired_verdict([0.0, 0.0], [0.0, 0.0], threshold=0.05, ceiling=0.0).kind == "ceiling"


def test_bad_threshold_and_unpaired_input():
    with pytest.raises(ValueError, match="threshold"):
        paired_verdict([1.0], [1.0], threshold=0)
    with pytest.raises(ValueError, match="paired comparison"):
        paired_verdict([1.0, 2.0], [1.0], threshold=0.1)
    with pytest.raises(ValueError, match="units repeat"):
        paired_verdict([1.0, 2.0], [1.0, 2.0], units=["x", "x"], threshold=0.1)


def test_mcnemar_on_known_tables():
    # 10 discordant pairs all one way: p = 2 x 0.5^10
    a = [1] * 10 + [1] * 5 + [0] * 5
    b = [0] * 10 + [1] * 5 + [0] * 5
    assert mcnemar_exact(a, b) == (pytest.approx(2 / 1024), 0, 10)
    # 2 vs 8 discordant: p = 2 x (1 + 10 + 45) / 1024 = 0.109375
    a = [0, 0] + [1] * 8 + [1] * 20
    b = [1, 1] + [0] * 8 + [1] * 20
    p, n01, n10 = mcnemar_exact(a, b)
    assert (n01, n10) == (2, 8) and p == pytest.approx(0.109375)
    assert p == pytest.approx(stats.binomtest(2, 10, 0.5).pvalue)
    assert mcnemar_exact([1, 0], [1, 0]) == (1.0, 0, 0)
    assert mcnemar_exact([0] * 3 + [1] * 3, [1] * 3 + [0] * 3)[0] == pytest.approx(1.0)


def test_holm_textbook_example():
    # four tests: sorted 0.005, 0.01, 0.03, 0.04 x 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    out = holm([0.01, math.nan, 0.02])
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.02)


def test_spearman_with_p():
    x = np.arange(8.0)
    rho, p, n = spearman_with_p(x, x ** 2)
    assert rho == pytest.approx(1.0) and p < 1e-3 and n == 8
    rho, p, n = spearman_with_p([1, 2, 3, 4, 5, 6, 7, 8], [2, 1, 4, 3, 6, 5, 8, math.nan])
    assert n == 7 and 0 < p < 0.05
    # n = 8, rho about 0.6 is not significant at 5% (the study note: |rho| < 0.74)
    rho, p, n = spearman_with_p(x, [1, 0, 3, 2, 0, 7, 6, 5])
    assert n == 8 and p > 0.05
    assert math.isnan(spearman_with_p([1, 2], [1, 2])[0])


def test_mde_formula():
    assert mde(1.0, 1_000_000) == pytest.approx(1.959964 + 0.841621, rel=1e-4)
    assert mde(0.1, 3) == pytest.approx(0.1 * (stats.t.ppf(0.975, 2) + stats.t.ppf(0.8, 2)))
    assert mde(0.1, 1) == math.inf


def test_a_difference_without_spread_gets_the_sign_tests_p_not_zero():
    # every one of 6 facts loses the answer under b: the t test has no scale, and p = 0 would claim infinite
    # evidence; the exact two-sided sign test over the 6 clusters gives 2 * 0.5**6
    a = [1.0] * 12
    b = [0.0] * 12
    v = paired_verdict(a, b, clusters=[i // 2 for i in range(12)], threshold=0.05, metric="exact match")
    assert v.kind == "effect" and v.effect == -1.0
    assert v.p == pytest.approx(2 * 0.5**6) and v.p > 0
    # a handful of clusters cannot reach a small alpha this way
    v2 = paired_verdict([1.0, 1.0], [0.0, 0.0], clusters=[0, 1], threshold=0.05)
    assert v2.p == 1.0 / 2.0 and v2.kind == "inconclusive"


def test_a_binary_difference_keeps_its_interval_inside_minus_one_to_one():
    # 49 of 50 facts lose the answer in both prompts, one keeps it: the t widening alone would reach below -1
    a = [1.0] * 100
    b = [0.0] * 98 + [1.0, 1.0]
    v = paired_verdict(a, b, clusters=[i // 2 for i in range(100)], threshold=0.05, metric="exact match")
    assert v.kind == "effect" and v.effect == pytest.approx(-0.98)
    assert -1.0 <= v.lo < v.effect < v.hi <= 1.0


def test_paired_interval_is_the_verdicts_interval_and_spans_zero_on_one_discordant_unit():
    # 164 problems, one passes only under b (1/0 discordant): a BCa bootstrap puts the lower bound at exactly 0
    # (no resample goes below); the verdicts' interval (percentile widened by t) reaches below 0, and the task
    # table that shows it without a verdict gets the same numbers
    a = [1.0] * 80 + [0.0] * 84
    b = [1.0] * 81 + [0.0] * 83
    est, lo, hi = paired_interval(a, b)
    v = paired_verdict(a, b, threshold=0.05)
    assert (est, lo, hi) == pytest.approx((v.effect, v.lo, v.hi))
    assert est == pytest.approx(1 / 164) and lo < 0 < hi < 0.05
    with pytest.raises(ValueError, match="no paired units"):
        paired_interval([], [])
    e, lo1, hi1 = paired_interval([1.0, 0.0], [1.0, 1.0], clusters=[0, 0])  # one cluster: no interval
    assert e == 0.5 and math.isnan(lo1) and math.isnan(hi1)


def test_mean_interval_is_paired_interval_of_a_sample_against_zero_and_resamples_clusters():
    x = [0.3, -0.1, 0.2, 0.05, 0.4, -0.2, 0.1]
    assert mean_interval(x) == pytest.approx(paired_interval([0.0] * len(x), x))
    # 2 clusters of 30 identical values: as wide as two units allow, far wider than 60 independent values
    y = [0.0] * 30 + [1.0] * 30
    _, lo_c, hi_c = mean_interval(y, clusters=[i // 30 for i in range(60)])
    _, lo_i, hi_i = mean_interval(y)
    assert hi_c - lo_c > 3 * (hi_i - lo_i)
    for bad in ([], [1.0, math.nan]):
        with pytest.raises(ValueError):
            mean_interval(bad)
