"""Put the result files an earlier session cut (committed, then put into ``.stage/``) into a GPU session's state
folder, only those of the run's own plan, so that the run resumes them.

The GPU session scripts (scripts/humaneval_h200.sh, scripts/longctx_h200_call.sh) run each plan in a state folder of
its own and resume the files they find there. A file belongs to a run when its provenance carries the run's plan
hash (:func:`zyfa.accuracy.scoring.plan.plan_hash` of the plan file as it is now; no hash for a run without a plan).
Another plan's file is left where it is, with a line saying whose it is; a file the state folder already has is
never replaced. Without this, a second plan started beside a resumed one took the first plan's cut files as its
own (6 December).

    python3 scripts/seed_state.py STATE --from .stage --glob 'he-*.jsonl*' [--plan studies/X.toml]

Exposed: ``run_of(prov)``, ``describe(run)``, ``belongs(prov, plan_hash)``, ``seed(state, source, pattern,
plan_hash)``.
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import sys
from pathlib import Path

from zyfa.accuracy.io.schemas import read_rows
from zyfa.accuracy.report.hd128 import PlanFileError, plan_file_hash


def run_of(prov: dict) -> tuple:
    """What makes two files one run's: (plan hash or None, model, implementations)."""
    model = prov.get("model") or ",".join(prov.get("models") or ()) or None
    return prov.get("plan_hash"), model, tuple(sorted(prov.get("implementations") or ()))


def describe(run: tuple) -> str:
    plan, model, impls = run
    return f"{model} under {'plan ' + plan[:12] if plan else 'no plan'} running {', '.join(impls) or 'nothing'}"


def belongs(prov: dict, plan_hash: str | None) -> bool:
    return prov.get("plan_hash") == plan_hash


def seed(state: Path, source: Path, pattern: str, plan_hash: str | None) -> tuple[list[str], list[str]]:
    """Copy ``source``'s files matching ``pattern`` (lock files aside) that belong to the plan of hash ``plan_hash``
    (None: no plan) and are not in ``state`` yet; (copied names, "name: why" of those left)."""
    copied, left = [], []
    for path in sorted(source.iterdir()):
        if (not fnmatch.fnmatch(path.name, pattern) or path.name.endswith(".lock") or not path.is_file()
                or (state / path.name).exists()):
            continue
        try:
            _, prov = read_rows(path)
        except ValueError as e:  # SchemaError is a ValueError
            left.append(f"{path.name}: unreadable ({e})")
            continue
        if not belongs(prov, plan_hash):
            left.append(f"{path.name}: holds {describe(run_of(prov))}")
            continue
        shutil.copy2(path, state / path.name)
        copied.append(path.name)
    return copied, left


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("state", type=Path, help="the run's state folder")
    ap.add_argument("--from", dest="source", type=Path, required=True, help="where the earlier files are (.stage)")
    ap.add_argument("--glob", required=True, help="which files are result files (e.g. 'he-*.jsonl*')")
    ap.add_argument("--plan", type=Path, help="the run's plan file (without: a run of no plan)")
    args = ap.parse_args(argv)
    for d in (args.state, args.source):
        if not d.is_dir():
            print(f"seed_state: {d} is not a folder", file=sys.stderr)
            return 2
    try:
        plan_hash = plan_file_hash(args.plan) if args.plan is not None else None
    except PlanFileError as e:
        print(f"seed_state: --plan: {e}", file=sys.stderr)
        return 2
    copied, left = seed(args.state, args.source, args.glob, plan_hash)
    for why in left:
        print(f"seed_state: not seeded: {why}", file=sys.stderr)
    print(f"seeded {len(copied)} file(s) into {args.state}" + (f": {', '.join(copied)}" if copied else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
