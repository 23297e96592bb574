"""A paired contrast outside a study plan's rule, on the plan's own rows: post hoc, so exploratory.

    python3 scripts/posthoc_contrast.py --plan studies/accumulator-hd128.toml \
        --rows reports/accumulator-hd128/results-qwen25coder-1.5b.jsonl --contrast stock,triton:fa3

Prints one line per (model, task, length, metric): b − a paired per prompt, its 95% interval clustered by fact, the
smallest effect the cell could detect and the verdict by the plan's thresholds, every line marked post hoc. The
plan's rule, α and thresholds are reused; nothing is corrected for multiplicity, and no line is a finding of the
plan: a contrast chosen after seeing the rows needs a plan of its own and fresh rows to become one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zyfa.accuracy.longctx.scores import load_rows  # noqa: E402
from zyfa.accuracy.longctx.verdicts import plan_verdicts  # noqa: E402
from zyfa.accuracy.scoring.plan import PlanError, load_plan, parse_plan  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", required=True, help="the study plan whose rows and thresholds are used")
    ap.add_argument("--rows", required=True, help="its result rows (comma-separated .jsonl files)")
    ap.add_argument("--contrast", required=True, metavar="A,B", help="b against a: effect = b − a per prompt")
    args = ap.parse_args(argv)
    try:
        plan = load_plan(args.plan)
        a, _, b = args.contrast.partition(",")
        if not a or not b:
            raise PlanError(f"--contrast {args.contrast!r}: give two implementations as A,B")
        data = tomllib.loads(Path(args.plan).read_text())
        data["exploratory"] = [{"a": a, "b": b}]
        posthoc = parse_plan(data, args.plan)
        rows = [r for r in load_rows(args.rows)[0] if r.get("plan_hash") == plan.hash]
    except (PlanError, OSError, ValueError) as e:
        print(f"posthoc_contrast: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if not rows:
        print(f"posthoc_contrast: no rows of plan {plan.name} ({plan.short_hash}) in {args.rows}", file=sys.stderr)
        return 2
    impls = {r.get("implementation") for r in rows}
    missing = [x for x in (a, b) if x not in impls]
    if missing:
        print(f"posthoc_contrast: {missing[0]} has no rows under this plan (it ran: {', '.join(sorted(impls))})",
              file=sys.stderr)
        return 2
    print(f"post hoc (outside plan {plan.name}'s rule, not corrected): {b} − {a}, paired per prompt, "
          f"95% interval clustered by fact")
    for v in plan_verdicts(posthoc, rows):
        if not v["contrast"].exploratory or v["verdict"] is None:
            continue
        d = v["verdict"]
        print(f"{v['model']} {v['task']} {v['length']} {v['metric']}: {d.effect:+.3g} [{d.lo:+.3g}, {d.hi:+.3g}] "
              f"n = {d.n_units} prompts in {d.n_clusters} facts; detectable {d.detectable:.3g}; {d.label} (post hoc)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
