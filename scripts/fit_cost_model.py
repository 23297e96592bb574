"""Fit the ``--dry-run`` cost model's rate (units of work per second, per device type) from measured runs.

    python scripts/fit_cost_model.py zyfa-study/results.jsonl runs/*.jsonl

Reads the provenance lines of ``zyfa accuracy`` and ``zyfa study`` result files: each run records the units of work
of the rows it made, the estimate ``--dry-run`` gives for them and the wall seconds they took
(:mod:`zyfa.accuracy.io.cost_model`). Prints, per device type, the rate that fits the runs (geometric mean of units per
second), the current rate of :data:`zyfa.accuracy.io.shard.UNITS_PER_SECOND`, and the range of measured / estimated time
under each: the line to put into ``UNITS_PER_SECOND`` when the runs were made on the machine the README's times
are for. A file without records (older runs) is named and skipped; no record at all exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zyfa.accuracy.io.cost_model import fit, records_of  # noqa: E402
from zyfa.accuracy.operator.cli import read_provenance  # noqa: E402


def read_records(path: Path) -> list[dict]:
    """The cost records of a result file's provenance."""
    return records_of(read_provenance(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="result files (.jsonl) of zyfa accuracy or zyfa study")
    args = parser.parse_args(argv)
    records = []
    for name in args.files:
        path = Path(name)
        if not path.is_file():
            print(f"fit_cost_model: no such file: {name}", file=sys.stderr)
            return 2
        found = read_records(path)
        if not found:
            print(f"{name}: no cost records (written before they were recorded); skipped")
        records += found
    fitted = fit(records)
    if not fitted:
        print("fit_cost_model: no run with work and a measured time in these files", file=sys.stderr)
        return 2
    print("| device | runs | fitted units/s | current units/s | measured/estimate, fitted | measured/estimate, "
          "current |")
    print("|---|---:|---:|---:|---|---|")
    for device, f in fitted.items():
        lo, hi = f["measured_over_estimate"]
        clo, chi = f["current_measured_over_estimate"]
        print(f"| {device} | {f['runs']} | {f['units_per_second']:.3g} | {f['current_units_per_second']:.3g} | "
              f"{lo:.2f}-{hi:.2f} | {clo:.2f}-{chi:.2f} |")
    print("\nUNITS_PER_SECOND = {" + ", ".join(f'"{d}": {f["units_per_second"]:.2e}' for d, f in fitted.items())
          + "}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
