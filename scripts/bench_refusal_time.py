"""How long the ``zyfa`` command takes to refuse a bad argument, beside how long importing torch takes.

    python scripts/bench_refusal_time.py                 # 5 runs of each command, the median and the worst
    python scripts/bench_refusal_time.py --runs 10 -- accuracy --seq -5

Each run is a fresh ``python -m zyfa ...`` process (what a user types), timed from start to exit; the command must
exit with status 2. The same is done for ``python -c "import torch"``, the cost the refusal path avoids. Prints a
Markdown table with the machine, the Python and the commit. Not a test: the time depends on the machine and its
load (tests/zyfa/test_fast_refusals.py checks that no heavy module is imported on the refusal path).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zyfa.capture.version import git_label, git_state  # noqa: E402

COMMANDS = [
    ["accuracy", "--seq", "-5"],
    ["accuracy", "--recipes", "nope"],
    ["study", "--max-seq", "-5"],
    ["impact", "--tokens", "-1"],
    ["longctx", "--lengths", "-5"],
    ["cliffs", "--max-length", "-1"],
    ["report", "--results", "no/such.jsonl", "--out", "x"],
    # a bad implementation name or plug-in spec, in each command that takes one
    ["accuracy", "--implementations", "nope"],
    ["accuracy", "--kernel", "no/such.py:fn"],
    ["study", "--implementations", "triton:nope"],
    ["cliffs", "--kernel", "no/such.py:fn"],
    ["impact", "--implementations", "nope"],
    ["longctx", "--implementations", "nope"],
    ["tasks", "humaneval", "--kernel", "no/such.py:fn"],
    ["bench", "--kernel", "no/such.py:fn"],
]


def _time(argv: list[str], runs: int, expect: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True)
        out.append(time.perf_counter() - t0)
        if done.returncode != expect:
            raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}, expected {expect}: {done.stderr.strip()}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="processes per command (default 5)")
    parser.add_argument("command", nargs="*", help="one zyfa command line to time instead of the default set")
    args = parser.parse_args()
    if args.runs < 1:
        print("bench_refusal_time: --runs must be >= 1", file=sys.stderr)
        return 2
    commands = [args.command] if args.command else COMMANDS
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; Python {platform.python_version()}; "
          f"commit {git_label(git_state(ROOT))}; {args.runs} runs each\n")
    print("| command | exit | median s | worst s |")
    print("|---|---:|---:|---:|")
    for argv in commands:
        t = _time(["-m", "zyfa", *argv], args.runs, 2)
        print(f"| `zyfa {' '.join(argv)}` | 2 | {statistics.median(t):.2f} | {max(t):.2f} |", flush=True)
    t = _time(["-c", "import torch"], args.runs, 0)
    print(f"| `python -c \"import torch\"` (for scale) | 0 | {statistics.median(t):.2f} | {max(t):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
