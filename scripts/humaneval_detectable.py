"""What a paired pass@1 comparison over HumanEval's 164 problems can detect (the numbers in studies/humaneval.toml).

For a share d of discordant problems (pass under one arm only): the normal approximation (z[1-a/2] + z[power]) *
sqrt(d / n), and the exact figure, the smallest loss in whole problems at which the exact McNemar test rejects at
``a`` with 80% power (both computed by zyfa.accuracy.tasks.plan: approx_detectable_loss, detectable_loss). Also the
95% interval's half-width 1.96 * sqrt(d / n). Alphas: 0.05 and 0.05/3 (Holm's first step over 3 arms).

    python scripts/humaneval_detectable.py [--n 164] [--d 0.05,0.10,0.15]
"""

from __future__ import annotations

import argparse
import math

from scipy import stats
from zyfa.accuracy.tasks.plan import approx_detectable_loss, detectable_loss


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
            approx = approx_detectable_loss(args.n, d, alpha)
            exact = detectable_loss(args.n, d, alpha)
            cells.append(f"{100 * approx:.1f} / " + ("not reachable" if math.isnan(exact) else f"{100 * exact:.1f}"))
        half = stats.norm.ppf(0.975) * math.sqrt(d / args.n)
        print(f"| {100 * d:g}% | {cells[0]} | {cells[1]} | ±{100 * half:.1f} |")


if __name__ == "__main__":
    main()
