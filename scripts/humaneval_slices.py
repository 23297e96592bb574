"""Which `zyfa tasks humaneval` processes to start so the problems left in a state folder finish together.

scripts/humaneval_h200.sh runs HumanEval in SLICES problem slices at once (slice K: problems K*164/SLICES to
(K+1)*164/SLICES - 1 into he-K.jsonl). When a run is cut, the slices are cut at different points, and resuming
them as they are leaves the GPU to the one or two slices with the most left. This prints one line per process
to start instead, ``FILE PROBLEMS``, with about ``left / processes`` problems each (the pieces are cut from the runs
of contiguous problems left, as evenly as that allows; each run gets a process of its own, so with more runs than
``--processes`` there are more processes than asked):

    python3 scripts/humaneval_slices.py STATE --slices 12 --processes 16

- a problem with a row of every implementation the files' runs name (their provenance's ``implementations``,
  which must agree) is done and is not run again;
- a problem with some rows in a cut file (``he-*.jsonl.partial``: a process runs all implementations of one
  problem before the next, so only its last problem can be incomplete) is continued in that same file, with
  ``--resume``, so no row is made twice;
- the other problems left go to files no run has written (``he-K.jsonl`` if slice K has no file yet, else
  ``he-K-J.jsonl``, K the slice of the file's first problem), each a contiguous run of problems.

PROBLEMS is a ``--problems`` list of ranges (``40-43,47-47``: a bare number would mean "the first N").

With ``--plan PLAN`` every file must belong to that plan (its provenance's ``plan_hash``, the hash of PLAN as it is
now); without it, to no plan. Files of two runs that differ in plan, model or implementations are refused too.
scripts/seed_state.py puts an earlier session's files of the run's plan into the state folder before this runs.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from zyfa.accuracy.io.schemas import read_rows
from zyfa.accuracy.tasks.plan import load_humaneval_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))

from seed_state import belongs, describe, run_of  # noqa: E402  (scripts/seed_state.py, beside this file)

N_PROBLEMS = 164
FILE = re.compile(r"^he-(\d+)(?:-(\d+))?\.jsonl(\.partial)?$")


def slice_bounds(k: int, slices: int, n: int = N_PROBLEMS) -> tuple[int, int]:
    """Problems ``a..b`` (inclusive) of slice ``k`` of ``slices``, as scripts/humaneval_h200.sh cuts them."""
    return k * n // slices, (k + 1) * n // slices - 1


def problem_index(task_id: str) -> int:
    return int(task_id.rsplit("/", 1)[1])


def read_state(state: Path, plan_hash: str | None = None, check_plan: bool = False
               ) -> tuple[dict[int, set[str]], dict[int, str], set[str], int]:
    """(implementations per problem over every file, the cut file holding each incomplete problem's rows, the
    names of every HumanEval file present, how many implementations a problem has; 0 with no file).

    Raises ValueError for files of different runs (plan, model or implementations) and, with ``check_plan``, for a
    file that does not belong to the plan of hash ``plan_hash`` (None: no plan)."""
    impls: dict[int, set[str]] = {}
    named: dict[tuple, str] = {}
    where: dict[int, set[str]] = {}
    names = set()
    for path in sorted(state.iterdir()):
        m = FILE.match(path.name)
        if not m:
            continue
        names.add(path.name.removesuffix(".partial"))
        rows, prov = read_rows(path)
        if check_plan and not belongs(prov, plan_hash):
            want = f"plan {plan_hash[:12]}" if plan_hash else "no plan"
            raise ValueError(f"{path.name} holds {describe(run_of(prov))}, not this run's {want}: "
                             "one plan's files per state folder")
        named.setdefault(run_of(prov), path.name)
        for r in rows:
            if r.get("kind") != "humaneval":
                continue
            i = problem_index(r["task_id"])
            impls.setdefault(i, set()).add(r["implementation"])
            if m.group(3):
                where.setdefault(i, set()).add(path.name.removesuffix(".partial"))
    if len(named) > 1:
        (a, fa), (b, fb) = list(named.items())[:2]
        raise ValueError(f"{fa} holds {describe(a)} but {fb} {describe(b)}: one run's files only")
    n_impls = len(next(iter(named), (None, None, ()))[2])
    return impls, {i: sorted(f)[0] for i, f in where.items()}, names, n_impls


def plan_processes(state: Path, slices: int, processes: int, n: int = N_PROBLEMS, plan_hash: str | None = None,
                   check_plan: bool = False) -> list[tuple[str, list[int]]]:
    """``[(file name, problems)]`` to start; see the module's docstring."""
    impls, home, names, n_impls = read_state(state, plan_hash, check_plan)
    if not n_impls:  # no file yet: every problem is left
        n_impls = 1
    home = {i: f for i, f in home.items() if len(impls[i]) < n_impls}
    left = [i for i in range(n) if len(impls.get(i, ())) < n_impls]
    # runs of contiguous problems: each incomplete problem starts one, in the file that holds its rows; then the run
    # whose pieces are largest gets one more piece until there are `processes` (or only single problems), so the
    # largest piece is as small as it can be (halving the largest instead leaves pieces up to twice that)
    runs: list[tuple[str | None, list[int]]] = []
    for i in left:
        if i in home or not runs or runs[-1][1][-1] != i - 1:
            runs.append((home.get(i), []))
        runs[-1][1].append(i)
    pieces = [1] * len(runs)
    while sum(pieces) < processes:
        j = max(range(len(runs)), key=lambda r: -(-len(runs[r][1]) // pieces[r]), default=None)
        if j is None or pieces[j] == len(runs[j][1]):
            break
        pieces[j] += 1
    # a run's pieces differ by one problem at most; the first stays in the run's file (its incomplete problem first)
    chunks = [(f if q == 0 else None, probs[q * len(probs) // m:(q + 1) * len(probs) // m])
              for (f, probs), m in zip(runs, pieces, strict=True) for q in range(m)]
    used = set(names)
    out: list[tuple[str, list[int]]] = []
    for f, probs in chunks:
        if f is None:
            k = next(k for k in range(slices) if slice_bounds(k, slices, n)[1] >= probs[0])
            f = next(c for c in (f"he-{k}.jsonl", *(f"he-{k}-{j}.jsonl" for j in range(1, 10_000))) if c not in used)
        used.add(f)
        out.append((f, probs))
    return out


def ranges(problems: list[int]) -> str:
    """``--problems`` text for sorted indices, always as ranges (``5-5``, never ``5``: that means "the first 5")."""
    spans, start, prev = [], problems[0], problems[0]
    for i in problems[1:]:
        if i != prev + 1:
            spans.append((start, prev))
            start = i
        prev = i
    spans.append((start, prev))
    return ",".join(f"{a}-{b}" for a, b in spans)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("state", type=Path, help="the folder of he-*.jsonl and he-*.jsonl.partial files")
    ap.add_argument("--slices", type=int, required=True, help="the SLICES the files were started with")
    ap.add_argument("--processes", type=int, required=True, help="how many processes to spread the rest over")
    ap.add_argument("--plan", type=Path, help="the run's plan file: every file must carry its hash")
    args = ap.parse_args(argv)
    plan_hash = None
    if args.plan is not None:
        try:
            plan_hash = load_humaneval_plan(args.plan).hash
        except (OSError, ValueError) as e:  # a PlanError is a ValueError
            print(f"humaneval_slices: --plan {args.plan}: {e}", file=sys.stderr)
            return 2
    if args.slices < 1 or args.processes < 1:
        print("humaneval_slices: --slices and --processes must be at least 1", file=sys.stderr)
        return 2
    if not args.state.is_dir():
        print(f"humaneval_slices: {args.state} is not a folder", file=sys.stderr)
        return 2
    try:
        plan = plan_processes(args.state, args.slices, args.processes, plan_hash=plan_hash,
                              check_plan=args.plan is not None)
    except ValueError as e:
        print(f"humaneval_slices: {e}", file=sys.stderr)
        return 2
    for f, probs in plan:
        print(f, ranges(probs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
