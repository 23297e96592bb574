"""Unplanned comparisons between the arms of HumanEval result files: pass@1 of B minus A, paired per problem, with
its 95% bootstrap interval over problems and the exact McNemar p, uncorrected. A plan compares each arm with its
baseline only; this prints the other pairs, as leads for a plan of their own, never as its verdict.

    python3 scripts/humaneval_arm_pairs.py --model qwen25coder-1.5b --arms cudnn-fp8,triton:fa3,triton:zyfa-hopper \\
        reports/humaneval-plan/he-*.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zyfa.accuracy.io.schemas import read_rows  # noqa: E402
from zyfa.accuracy.scoring.verdict import mcnemar_exact, paired_verdict  # noqa: E402
from zyfa.accuracy.tasks.stats import pass_arrays  # noqa: E402


def pairs(rows: list[dict], model: str, arms: list[str]) -> list[dict]:
    """One entry per pair (a, b) of ``arms``: b - a in pass@1 points over the problems both ran."""
    passed = pass_arrays(rows)
    out = []
    for a, b in itertools.combinations(arms, 2):
        pa, pb = passed.get((model, a), {}), passed.get((model, b), {})
        common = sorted(set(pa) & set(pb))
        if not common:
            raise ValueError(f"no problem has rows of both {a} and {b} for {model}")
        v = paired_verdict([float(pa[k]) for k in common], [float(pb[k]) for k in common], threshold=0.05)
        p, n01, n10 = mcnemar_exact([pa[k] for k in common], [pb[k] for k in common])
        out.append({"a": a, "b": b, "n": len(common), "diff": 100 * v.effect, "lo": 100 * v.lo, "hi": 100 * v.hi,
                    "p": p, "n01": n01, "n10": n10})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--model", required=True)
    ap.add_argument("--arms", required=True, help="comma-separated implementations")
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    try:
        if len(arms) < 2:
            raise ValueError("--arms: name two implementations or more")
        rows = [r for f in args.files for r in read_rows(f)[0] if r.get("kind") == "humaneval"]
        result = pairs(rows, args.model, arms)
    except (OSError, ValueError) as e:
        print(f"humaneval_arm_pairs: {e}", file=sys.stderr)
        return 2
    print("| B vs A | problems | Δ pass@1 B − A, points [95% CI] | McNemar p, uncorrected (n01/n10) |")
    print("|---|---|---|---|")
    for e in result:
        print(f"| {e['b']} vs {e['a']} | {e['n']} | {e['diff']:+.1f} [{e['lo']:+.1f}, {e['hi']:+.1f}] | "
              f"{e['p']:.2g} ({e['n01']}/{e['n10']}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
