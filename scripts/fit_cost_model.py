"""Fit the ``--dry-run`` cost model's rates (units of work per second, per command and device type) from measured runs.

    python scripts/fit_cost_model.py zyfa-study/results.jsonl zyfa-longctx/results.jsonl runs/*.jsonl

Reads the cost records of result files of ``zyfa accuracy``, ``study``, ``longctx``, ``impact`` and ``tasks``: each
run records the units of work of the rows it made, the estimate ``--dry-run`` gives for them and the wall seconds
they took (:mod:`zyfa.accuracy.cost_model`; in the file's provenance line, or for ``zyfa impact`` in its rows'
provenance). Prints, per (command, device type), the rate that fits the runs (geometric mean of units per second),
the current rate of :data:`zyfa.accuracy.cost_model.RATES`, and the range of measured / estimated time under each:
the values to put into ``RATES`` when the runs were made on the machine the README's times are for. A (command,
device type) with fewer than 2 runs is named in one line and not fitted; a file without records (older runs) is
named and skipped; no rate fitted at all exits with status 2. Imports no torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zyfa.accuracy.cost_model import MIN_RUNS, fit, records_in_file  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="result files (.jsonl) of zyfa accuracy, study, longctx, impact or "
                                                 "tasks")
    args = parser.parse_args(argv)
    records = []
    for name in args.files:
        path = Path(name)
        if not path.is_file():
            print(f"fit_cost_model: no such file: {name}", file=sys.stderr)
            return 2
        found = records_in_file(path)
        if not found:
            print(f"{name}: no cost records (written before they were recorded); skipped")
        records += found
    fitted = fit(records)
    for f in fitted.values():
        if "refused" in f:
            print(f"fit_cost_model: {f['refused']}", file=sys.stderr)
    fitted = {k: f for k, f in fitted.items() if "refused" not in f}
    if not fitted:
        print(f"fit_cost_model: no (command, device) with {MIN_RUNS} or more runs with work and a measured time in "
              "these files", file=sys.stderr)
        return 2
    print("| command | device | runs | fitted units/s | current units/s | measured/estimate, fitted | "
          "measured/estimate, current |")
    print("|---|---|---:|---:|---:|---|---|")
    for (command, device), f in fitted.items():
        lo, hi = f["measured_over_estimate"]
        clo, chi = f["current_measured_over_estimate"]
        print(f"| {command} | {device} | {f['runs']} | {f['units_per_second']:.3g} | "
              f"{f['current_units_per_second']:.3g} | {lo:.2f}-{hi:.2f} | {clo:.2f}-{chi:.2f} |")
    print()
    for (command, device), f in fitted.items():
        print(f'RATES["{command}"]["{device}"] = {f["units_per_second"]:.2e}')
    return 0


if __name__ == "__main__":
    sys.exit(main())
