"""What a paired pass@1 comparison over HumanEval's 164 problems can detect (the numbers in studies/humaneval.toml).

For a share d of discordant problems (pass under one arm only) and a net loss delta (a fraction of problems):
the normal approximation (z[1-a/2] + z[power]) * sqrt(d / n), and the exact figure, the smallest loss in whole
problems at which the exact McNemar test (zyfa.accuracy.scoring.verdict.mcnemar_exact's test) rejects at ``a``
with the given power, the discordant count ~ Binomial(n, d) and the losses among them ~ Binomial(N, (d + delta) / 2d).
Also the 95% interval's half-width 1.96 * sqrt(d / n). Alphas: 0.05 and 0.05/3 (Holm's first step over 3 arms).

    python scripts/humaneval_detectable.py [--n 164] [--d 0.05,0.10,0.15]
"""

from __future__ import annotations

import argparse
import math

from scipy import stats


def power(n: int, d: float, delta: float, alpha: float) -> float:
    """Probability that the exact two-sided McNemar test rejects at ``alpha``."""
    q = (d + delta) / (2 * d)
    total = 0.0
    for big_n in range(1, n + 1):
        w = stats.binom.pmf(big_n, n, d)
        if w < 1e-12:
            continue
        reject = [k for k in range(big_n + 1) if min(1.0, 2 * stats.binom.cdf(min(k, big_n - k), big_n, 0.5)) < alpha]
        total += w * sum(stats.binom.pmf(k, big_n, q) for k in reject)
    return total


def exact_detectable(n: int, d: float, alpha: float, target: float = 0.8) -> float:
    """The smallest loss k / n (k whole problems, at most d) with ``target`` power; NaN when none reaches it."""
    return next((k / n for k in range(1, round(d * n) + 1) if k / n <= d and power(n, d, k / n, alpha) >= target),
                math.nan)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=164)
    ap.add_argument("--d", default="0.05,0.10,0.15", help="discordance rates, comma-separated")
    args = ap.parse_args()
    print("| d | MDE a=0.05 approx / exact (points) | MDE a=0.05/3 approx / exact | 95% half-width |")
    print("|---|---|---|---|")
    for d in (float(x) for x in args.d.split(",")):
        cells = []
        for alpha in (0.05, 0.05 / 3):
            approx = (stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(0.8)) * math.sqrt(d / args.n)
            exact = exact_detectable(args.n, d, alpha)
            cells.append(f"{100 * approx:.1f} / " + ("not reachable" if math.isnan(exact) else f"{100 * exact:.1f}"))
        half = stats.norm.ppf(0.975) * math.sqrt(d / args.n)
        print(f"| {100 * d:g}% | {cells[0]} | {cells[1]} | ±{100 * half:.1f} |")


if __name__ == "__main__":
    main()
