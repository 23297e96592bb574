"""Verdicts from paired per-unit results: the effect, its interval over the independent units, and for a null the
smallest effect the design could have detected (docs: /work/shared/research/study_methods.md §1-§3).

A comparison of two implementations ``a`` and ``b`` on the same units (prompts, problems, layer x head) is a set of
per-unit differences ``b - a`` (or log ratios ``log(b / a)``). Units are not always independent: prompts built from
one fact at several depths share the fact. ``clusters`` names each unit's independent group; the interval is a
cluster bootstrap (whole clusters resampled, each cluster's rows kept together), so 3 facts x 30 depths give an
interval as wide as 3 samples, not 90.

The verdict follows one rule, stated here so that it is decided before the data:

1. ``uninformative (ceiling)``: every value of both arms sits at the ceiling (``ceiling``; for binary outcomes
   with ``higher_is_better`` it is 1), so neither arm can lose anything (``uninformative (floor)`` likewise when
   both sit at the floor). Such cells are left out of counts, not counted as "no".
2. ``no effect larger than X``: the whole interval lies inside ``±threshold`` (X = the threshold); for a ratio
   the interval lies inside ``[1 - threshold, 1 + threshold]``.
3. ``effect``: the interval excludes 0 (1 for a ratio) and reaches beyond the threshold.
4. ``inconclusive (could detect only ≥ X)``: otherwise; X is the minimum detectable effect at ``alpha`` and 80%
   power, ``(t[1-alpha/2] + t[0.8]) x SE`` with the standard error over the clusters and k - 1 degrees of freedom.

The interval is the cluster bootstrap's percentile interval, widened where few clusters make it too narrow: it is
the union of the percentile interval and the t interval ``estimate ± t[1-alpha/2, k-1] x SE``, SE being the
bootstrap's standard deviation times sqrt(k / (k - 1)). One cluster gives no interval (NaN) and an inconclusive
verdict.

Exposed: ``cluster_bootstrap``, ``paired_verdict``, ``paired_interval`` and ``mean_interval`` (its interval alone,
for two paired arms or one sample), ``Verdict``, ``mcnemar_exact``, ``holm``, ``spearman_with_p``, ``mde`` (minimum
detectable effect from a standard error).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["LABEL_CEILING", "LABEL_EFFECT", "LABEL_FLOOR", "POWER", "Verdict", "cluster_bootstrap", "holm",
           "mcnemar_exact", "mde", "mean_interval", "paired_interval", "paired_verdict", "spearman_with_p"]

POWER = 0.8
LABEL_EFFECT = "effect"
LABEL_CEILING = "uninformative (ceiling)"
LABEL_FLOOR = "uninformative (floor)"


# ---------------------------------------------------------------------------------------------- cluster bootstrap

def _cluster_codes(n: int, clusters) -> tuple[np.ndarray, int]:
    if clusters is None:
        return np.arange(n), n
    clusters = list(clusters)
    if len(clusters) != n:
        raise ValueError(f"clusters has {len(clusters)} entries for {n} values")
    codes: dict[Hashable, int] = {}
    out = np.fromiter((codes.setdefault(c, len(codes)) for c in clusters), dtype=np.int64, count=n)
    return out, len(codes)


def _bootstrap(values, clusters, stat, n_boot: int, seed: int) -> tuple[float, np.ndarray, int]:
    """(estimate, bootstrap replicates, number of clusters)."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("cluster_bootstrap needs at least one value")
    if not np.all(np.isfinite(x)):
        raise ValueError("cluster_bootstrap: values hold NaN or infinity; drop or fix them first")
    if n_boot < 1:
        raise ValueError("n_boot must be at least 1")
    codes, k = _cluster_codes(x.size, clusters)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, k, size=(n_boot, k))
    if stat == "mean":
        sums = np.bincount(codes, weights=x, minlength=k)
        counts = np.bincount(codes, minlength=k).astype(np.float64)
        est = float(x.mean())
        reps = sums[pick].sum(axis=1) / counts[pick].sum(axis=1)
        return est, reps, k
    fn: Callable[[np.ndarray], float]
    if stat == "median":
        fn = np.median
    elif callable(stat):
        fn = stat
    else:
        raise ValueError(f"stat must be 'mean', 'median' or a function, not {stat!r}")
    members = [x[codes == c] for c in range(k)]
    reps = np.array([float(fn(np.concatenate([members[c] for c in row]))) for row in pick])
    return float(fn(x)), reps, k


def cluster_bootstrap(values, clusters=None, *, stat="mean", n_boot: int = 10000, alpha: float = 0.05,
                      seed: int = 0) -> tuple[float, float, float]:
    """(estimate, lo, hi): the statistic of ``values`` and its percentile interval from resampling whole clusters.

    ``clusters`` gives each value's independent unit (a fact, a layer, a problem); None: each value is its own
    unit. Each resample draws as many clusters as there are, with replacement, and keeps each drawn cluster's values
    together. ``stat``: "mean", "median" or a function of a 1-D array. One cluster: (estimate, NaN, NaN).

    Raises:
        ValueError: no values, NaN or infinite values, clusters of another length, a bad ``stat`` or ``n_boot``.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), not {alpha}")
    est, reps, k = _bootstrap(values, clusters, stat, n_boot, seed)
    if k < 2:
        return est, math.nan, math.nan
    lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    return est, float(lo), float(hi)


def mde(se: float, n_clusters: int, alpha: float = 0.05, power: float = POWER) -> float:
    """The minimum detectable effect of a two-sided test at ``alpha`` with ``power``: ``(t[1-alpha/2] + t[power])
    x se`` with ``n_clusters - 1`` degrees of freedom (infinite for fewer than two clusters)."""
    if n_clusters < 2 or not math.isfinite(se):
        return math.inf
    df = n_clusters - 1
    return float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * se)


# ---------------------------------------------------------------------------------------------- the verdict

def _fmt(x: float) -> str:
    if not math.isfinite(x):
        return "∞" if x > 0 else ("-∞" if x < 0 else "n/a")
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}" if a >= 0.01 else f"{x:.2g}"


@dataclass(frozen=True)
class Verdict:
    """A paired comparison's verdict (module docstring: the rule).

    ``effect``, ``lo``, ``hi``: the mean difference b - a and its interval (for ``ratio``: the geometric-mean
    ratio b / a and its interval). ``half_width``: half the interval's width (on the ratio's log scale, as a
    fraction, for a ratio). ``detectable``: the minimum detectable effect at ``alpha`` and 80% power (as a fraction
    of 1 for a ratio). ``kind``: "effect", "equivalent", "inconclusive", "ceiling" or "floor".
    """

    label: str
    kind: str
    effect: float
    lo: float
    hi: float
    n_units: int
    n_clusters: int
    threshold: float
    alpha: float
    half_width: float
    detectable: float
    metric: str = ""
    ratio: bool = False
    higher_is_better: bool = True
    arm_a: str = "a"
    arm_b: str = "b"
    p: float = math.nan

    @property
    def informative(self) -> bool:
        """False for ceiling and floor cells (leave them out of counts)."""
        return self.kind not in ("ceiling", "floor")

    @property
    def direction(self) -> str:
        """"better", "worse" or "" (no effect): b against a, by ``higher_is_better``."""
        if self.kind != "effect":
            return ""
        up = self.effect > (1.0 if self.ratio else 0.0)
        return "better" if up == self.higher_is_better else "worse"

    def _interval(self) -> str:
        level = f"{100 * (1 - self.alpha):g}%"
        if not math.isfinite(self.lo):
            return f"no {level} interval (one independent unit)"
        return f"{level} interval [{_fmt(self.lo)}, {_fmt(self.hi)}]"

    def _n(self) -> str:
        if self.n_clusters == self.n_units:
            return f"n = {self.n_units}"
        return f"n = {self.n_units} units in {self.n_clusters} independent clusters"

    def sentence(self, condition: str = "") -> str:
        """One sentence: condition, metric, n, effect and interval, the verdict, and for a null its detectable
        effect."""
        what = self.metric or ("ratio" if self.ratio else "difference")
        contrast = f"{self.arm_b} vs {self.arm_a}"
        head = f"{condition}: " if condition else ""
        est = (f"{what} {contrast} {_fmt(self.effect)}" if self.ratio
               else f"{what} {contrast} {'+' if self.effect > 0 else ''}{_fmt(self.effect)}")
        body = f"{head}{est}, {self._interval()}, {self._n()}"
        if self.kind == "ceiling":
            return f"{body}: uninformative, every arm at the ceiling (left out of counts)."
        if self.kind == "floor":
            return f"{body}: uninformative, every arm at the floor (left out of counts)."
        if self.kind == "effect":
            return f"{body}: an effect ({self.arm_b} {self.direction})."
        bound = f"±{_fmt(self.threshold)}" if not self.ratio else f"1 ± {_fmt(self.threshold)}"
        if self.kind == "equivalent":
            return (f"{body}: no effect larger than {_fmt(self.threshold)} (the interval lies inside {bound}; "
                    f"detectable effect {_fmt(self.detectable)}).")
        return (f"{body}: inconclusive, the design could detect only effects ≥ {_fmt(self.detectable)} at "
                f"α = {self.alpha:g} and 80% power (half-width {_fmt(self.half_width)}; threshold {bound}).")


def _pair(a, b, units, clusters):
    """Aligned (a, b, unit ids, cluster ids) from sequences or from mappings unit -> value."""
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            raise ValueError("a and b must both be sequences or both be mappings unit -> value")
        if units is not None:
            raise ValueError("units come from the mappings' keys; do not pass units with mappings")
        keys = [k for k in a if k in b]
        missing = (len(a) - len(keys)) + (len(b) - len(keys))
        if missing:
            raise ValueError(f"{missing} unit(s) appear in only one arm (a paired comparison needs both arms on "
                             f"every unit), e.g. {next(k for k in [*a, *b] if k not in a or k not in b)!r}")
        av = [a[k] for k in keys]
        bv = [b[k] for k in keys]
        if isinstance(clusters, Mapping):
            clusters = [clusters[k] for k in keys]
        elif callable(clusters):
            clusters = [clusters(k) for k in keys]
        units = keys
    else:
        av, bv = list(a), list(b)
        if len(av) != len(bv):
            raise ValueError(f"a has {len(av)} values and b {len(bv)}: a paired comparison needs one of each per unit")
        if units is not None:
            units = list(units)
            if len(units) != len(av):
                raise ValueError(f"units has {len(units)} entries for {len(av)} pairs")
            if len(set(units)) != len(units):
                raise ValueError("units repeat: each unit appears once per arm")
    return np.asarray(av, dtype=np.float64), np.asarray(bv, dtype=np.float64), units, clusters


def _interval(d, codes, alpha: float, n_boot: int, seed: int, bounds=None) -> tuple[float, float, float, float, int]:
    """(mean, lo, hi, SE, clusters) of ``d`` by the module's interval rule (its docstring); NaN bounds and SE below
    two clusters. ``bounds``: the range the mean cannot leave (a difference of 0/1 outcomes lies in [-1, 1])."""
    est, reps, k = _bootstrap(d, codes, "mean", n_boot, seed)
    if k < 2:
        return est, math.nan, math.nan, math.nan, k
    plo, phi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    se = float(np.std(reps, ddof=1)) * math.sqrt(k / (k - 1)) if reps.size > 1 else 0.0
    tq = float(stats.t.ppf(1 - alpha / 2, k - 1))
    lo, hi = min(float(plo), est - tq * se), max(float(phi), est + tq * se)
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    return est, lo, hi, se, k


def mean_interval(values, *, clusters=None, alpha: float = 0.05, seed: int = 0,
                  n_boot: int = 10000) -> tuple[float, float, float]:
    """(mean, lo, hi) of one sample of per-unit values (a per-problem slope, a per-fact difference) by the interval
    rule of :func:`paired_verdict` (the module docstring), over ``clusters`` (None: each value its own unit).
    Fewer than two clusters: NaN bounds.

    Raises:
        ValueError: no values, NaN or infinite values.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("no values to summarise")
    if not np.all(np.isfinite(x)):
        raise ValueError("values hold NaN or infinity")
    codes, _ = _cluster_codes(x.size, clusters)
    est, lo, hi, _, _ = _interval(x, codes, alpha, n_boot, seed)
    return float(est), float(lo), float(hi)


def paired_interval(a, b, *, clusters=None, alpha: float = 0.05, seed: int = 0,
                    n_boot: int = 10000) -> tuple[float, float, float]:
    """(mean of b - a, lo, hi): the interval :func:`paired_verdict` judges by, without a verdict, for tables that
    show a paired difference beside (or without) one. Binary arms keep the bounds inside [-1, 1]. One cluster:
    NaN bounds."""
    av, bv, _, clusters = _pair(a, b, None, clusters)
    if av.size == 0:
        raise ValueError("no paired units to compare")
    codes, _ = _cluster_codes(av.size, clusters)
    binary = bool(np.all(np.isin(av, (0.0, 1.0))) and np.all(np.isin(bv, (0.0, 1.0))))
    est, lo, hi, _, _ = _interval(bv - av, codes, alpha, n_boot, seed, bounds=(-1.0, 1.0) if binary else None)
    return float(est), float(lo), float(hi)


def paired_verdict(a, b, *, units=None, clusters=None, threshold: float, alpha: float = 0.05,
                   higher_is_better: bool = True, metric: str = "", ratio: bool = False, seed: int = 0,
                   ceiling: float | None = None, n_boot: int = 10000, arms: Sequence[str] = ("a", "b")) -> Verdict:
    """The verdict on ``b`` against ``a``, paired per unit (module docstring: the rule).

    ``a``, ``b``: aligned sequences (one value per unit, ``units`` optionally naming them) or mappings unit ->
    value (paired on the keys; ``clusters`` may then be a mapping unit -> cluster or a function of the unit).
    ``clusters``: each unit's independent group (the fact of a prompt, the layer of a head); None: units are
    independent. ``threshold``: the smallest effect that matters (a difference, or for ``ratio`` a fraction of 1).
    ``ceiling``: the best possible value; None means 1 for binary outcomes (every value 0 or 1) when
    ``higher_is_better`` (and 0 as the floor), else no ceiling check. ``arms``: names of a and b for the sentence.

    Raises:
        ValueError: unpaired or empty input, NaN values, a non-positive value with ``ratio``, a bad threshold.
    """
    if not threshold > 0 or not math.isfinite(threshold):
        raise ValueError(f"threshold must be a positive number, not {threshold!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), not {alpha}")
    av, bv, units, clusters = _pair(a, b, units, clusters)
    if av.size == 0:
        raise ValueError("no paired units to compare")
    if not (np.all(np.isfinite(av)) and np.all(np.isfinite(bv))):
        raise ValueError("a or b holds NaN or infinity; drop the units that failed first (and say so)")
    common = {"n_units": int(av.size), "threshold": float(threshold), "alpha": float(alpha), "metric": metric,
              "ratio": ratio, "higher_is_better": higher_is_better, "arm_a": arms[0], "arm_b": arms[1]}
    codes, k = _cluster_codes(av.size, clusters)
    binary = bool(np.all(np.isin(av, (0.0, 1.0))) and np.all(np.isin(bv, (0.0, 1.0))))
    top = ceiling if ceiling is not None else (1.0 if binary and higher_is_better else None)
    floor = 0.0 if ceiling is None and binary and higher_is_better else None
    for edge, kind, label in ((top, "ceiling", LABEL_CEILING), (floor, "floor", LABEL_FLOOR)):
        if edge is not None and np.all(av == edge) and np.all(bv == edge):
            zero = 1.0 if ratio else 0.0
            return Verdict(label=label, kind=kind, effect=zero, lo=zero, hi=zero, n_clusters=k, half_width=0.0,
                           detectable=math.inf, **common)
    if ratio:
        if np.any(av <= 0) or np.any(bv <= 0):
            raise ValueError("ratio=True needs positive values in both arms")
        d = np.log(bv) - np.log(av)
    else:
        d = bv - av
    bounds = (-1.0, 1.0) if binary and not ratio else None  # a difference of 0/1 outcomes lies in [-1, 1]
    est, lo, hi, se, k = _interval(d, codes, alpha, n_boot, seed, bounds=bounds)
    if k < 2:
        p = math.nan
    else:
        if se == 0:  # every cluster the same difference: the t test has no scale; the exact sign test over
            # the k clusters (all k of one sign) is the p it can carry, never 0
            p = 1.0 if est == 0 else min(1.0, 2.0 * 0.5**k)
        else:
            p = float(2 * stats.t.sf(abs(est) / se, k - 1))
    half = (hi - lo) / 2 if math.isfinite(lo) else math.inf
    detect = mde(se, k, alpha)
    if ratio:
        lim_lo, lim_hi = math.log1p(-threshold) if threshold < 1 else -math.inf, math.log1p(threshold)
    else:
        lim_lo, lim_hi = -threshold, threshold
    if not math.isfinite(lo):
        kind = "inconclusive"
    elif lo >= lim_lo and hi <= lim_hi:
        kind = "equivalent"
    elif lo > 0 or hi < 0:
        kind = "effect"
    else:
        kind = "inconclusive"
    if kind == "effect" and se == 0 and not p < alpha:  # a spread-free interval over too few clusters
        kind = "inconclusive"
    if ratio:  # report on the ratio scale; half-width and detectable effect as fractions of 1
        est, lo, hi = math.exp(est), math.exp(lo), math.exp(hi)
        half = math.expm1(half) if math.isfinite(half) else math.inf
        detect = math.expm1(detect) if math.isfinite(detect) else math.inf
    label = {"effect": LABEL_EFFECT, "equivalent": f"no effect larger than {_fmt(threshold)}",
             "inconclusive": f"inconclusive (could detect only ≥ {_fmt(detect)})"}[kind]
    return Verdict(label=label, kind=kind, effect=float(est), lo=float(lo), hi=float(hi), n_clusters=k,
                   half_width=float(half), detectable=float(detect), p=p, **common)


# ---------------------------------------------------------------------------------------------- tests and tables

def mcnemar_exact(a_pass, b_pass) -> tuple[float, int, int]:
    """(two-sided exact p, n01, n10) for paired binary outcomes: n01 = units a fails and b passes, n10 = units a
    passes and b fails. p is the exact binomial test of the discordant pairs against 1/2 (1.0 with none).

    Raises:
        ValueError: arms of different lengths.
    """
    a = np.asarray(a_pass, dtype=bool).ravel()
    b = np.asarray(b_pass, dtype=bool).ravel()
    if a.shape != b.shape:
        raise ValueError(f"a_pass has {a.size} outcomes and b_pass {b.size}: McNemar pairs one of each per unit")
    n01 = int(np.sum(~a & b))
    n10 = int(np.sum(a & ~b))
    n = n01 + n10
    if n == 0:
        return 1.0, n01, n10
    p = min(1.0, 2.0 * float(stats.binom.cdf(min(n01, n10), n, 0.5)))
    return p, n01, n10


def holm(pvalues) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order (NaN stays NaN and does not count)."""
    p = np.asarray(pvalues, dtype=np.float64).ravel()
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    if ok.size == 0:
        return out.tolist()
    if np.any((p[ok] < 0) | (p[ok] > 1)):
        raise ValueError("p-values must lie in [0, 1]")
    order = ok[np.argsort(p[ok], kind="stable")]
    m = order.size
    adj = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out[order] = np.minimum(adj, 1.0)
    return out.tolist()


def spearman_with_p(x, y) -> tuple[float, float, int]:
    """(Spearman's rho, its two-sided p, n) over the pairs where both values are finite; NaN rho and p for fewer
    than three pairs or a constant side.

    Raises:
        ValueError: x and y of different lengths.
    """
    xv = np.asarray(x, dtype=np.float64).ravel()
    yv = np.asarray(y, dtype=np.float64).ravel()
    if xv.shape != yv.shape:
        raise ValueError(f"x has {xv.size} values and y {yv.size}")
    keep = np.isfinite(xv) & np.isfinite(yv)
    n = int(keep.sum())
    xv, yv = xv[keep], yv[keep]
    if n < 3 or np.all(xv == xv[0]) or np.all(yv == yv[0]):
        return math.nan, math.nan, n
    res = stats.spearmanr(xv, yv)
    return float(res.statistic), float(res.pvalue), n
