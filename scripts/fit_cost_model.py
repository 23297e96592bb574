"""Fit the ``--dry-run`` cost model's rates (units of work per second, and seconds per cell where the model has them,
per command and device type) from measured runs.

    python scripts/fit_cost_model.py zyfa-study/results.jsonl zyfa-longctx/results.jsonl runs/*.jsonl

Reads the cost records of result files of ``zyfa accuracy``, ``study``, ``longctx``, ``impact`` and ``tasks``: each
run records the units of work of the rows it made, the estimate ``--dry-run`` gives for them and the wall seconds
they took (:mod:`zyfa.accuracy.io.cost_model`; in the file's provenance line, or for ``zyfa impact`` in its rows'
provenance). Prints, per (command, device type), the values that fit the runs (:func:`zyfa.accuracy.io.cost_model.fit`:
one rate, the geometric mean of units per second; where :data:`~zyfa.accuracy.io.cost_model.SECONDS_PER_CELL` has the
pair, a rate and seconds per cell, least squares of log(measured / estimate)), the current values of
:data:`~zyfa.accuracy.io.cost_model.RATES` and ``SECONDS_PER_CELL``, and the range of measured / estimated time under
each: the values to put into those tables when the runs were made on the machine the README's times are for. A
(command, device type) with fewer than 2 runs (3 with seconds per cell) is named in one line and not fitted; a file
without records (older runs) is named and skipped (``--from-rows`` rebuilds its record instead, below); no rate
fitted at all exits with status 2. Imports no torch.

``--per-run``: also each run fitted on, its estimate under the fitted values beside its measured time.

``--count-as FROM=TO``: fit the records of command FROM as TO's (commands whose rows are the same units, e.g.
``accuracy=study``), to see how a run of one moves the other's fit.

``--from-rows``: files written before the records carry enough to rebuild one record each, by the same units: a
``zyfa study`` file its runner's wall time (``study_accuracy_s``) and its rows' shapes
(:func:`zyfa.accuracy.operator.cli.key_cost`, every row being that run's); a ``zyfa longctx`` file its rows'
``seconds`` (each prompt's share of its batch's scoring time: model loads and probes are not in it) and lengths
(:func:`zyfa.accuracy.longctx.cli.cell_cost`), over all the sessions that resumed it; a ``zyfa tasks humaneval``
file (or ``.partial``) its rows' ``generate_seconds`` (the sandbox and the drift pass are not in it) and tokens
(:func:`zyfa.accuracy.io.cost_model.generation_units`). Such a record says ``rebuilt_from``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zyfa.accuracy.io.cost_model import MIN_RUNS, fit, generation_units, record, records_in_file  # noqa: E402
from zyfa.accuracy.io.results_io import row_key, run_provenances  # noqa: E402
from zyfa.accuracy.longctx.cli import cell_cost as prompt_cost  # noqa: E402
from zyfa.accuracy.operator.cli import cell_cost, key_cost  # noqa: E402

SHAPE = ("batch", "heads_q", "seq_q", "seq_k", "head_dim", "head_dim_v")


def row_cost(row: dict, device: str) -> float:
    """:func:`key_cost` of a study row on a ``device`` type from its shape and recipe (a recipe name this version
    cannot read is costed as a plain one)."""
    shape = {k: row[k] for k in SHAPE}
    try:
        return key_cost(shape, row_key(row), device_type=device)
    except ValueError:
        return cell_cost(shape)


def rebuilt_record(path: Path) -> dict | None:
    """One record rebuilt from a study or long-context file written before the records (None for another file)."""
    lines = []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:  # a killed run's last line
            continue
    # the last provenance record: a resumed run's latest segment, listing the earlier ones (whose devices are named)
    prov = next((x for x in reversed(lines) if x.get("record") == "provenance"), {})
    rows = [r for r in lines if r.get("record") != "provenance"]
    device = str(prov.get("device") or "").split(":")[0]
    if not device or not rows:
        return None
    if prov.get("study_accuracy_s") and all(all(k in r for k in SHAPE) for r in rows):
        rec = record(sum(row_cost(r, device) for r in rows), prov["study_accuracy_s"], device, command="study",
                     cells=len(rows))
        rec["rebuilt_from"] = "provenance study_accuracy_s; rows' shapes and recipes"
    elif all(r.get("kind") == "longctx" and r.get("seconds") is not None for r in rows):
        rec = record(sum(prompt_cost(int(r["length"]), 1) for r in rows), sum(float(r["seconds"]) for r in rows),
                     device, command="longctx", cells=len(rows),
                     work={"prompts": len(rows), "tokens": sum(int(r["length"]) for r in rows),
                           "models": sorted({r.get("model") for r in rows})})
        rec["rebuilt_from"] = "rows' seconds (scoring only) and lengths"
    elif all(r.get("kind") == "humaneval" for r in rows):
        made = [(int(r.get("prompt_tokens") or 0), int(r.get("generated_tokens") or 0)) for r in rows]
        rec = record(sum(generation_units(p, g) for p, g in made),
                     sum(float(r.get("generate_seconds") or 0) for r in rows), device, command="tasks",
                     cells=len(rows), work={"rows": len(rows), "prompt_tokens": sum(p for p, _ in made),
                                            "generated_tokens": sum(g for _, g in made), "model": prov.get("model")})
        rec["rebuilt_from"] = "rows' generate_seconds (generation only) and tokens"
    else:
        return None
    rec.update({"date_utc": prov.get("date_utc"), "load_1min": None, "cpu_count": prov.get("cpu_count"),
                "device_name": " + ".join(dict.fromkeys(str(n) for p in run_provenances(prov)
                                                        if (n := p.get("device_name") or p.get("cuda_device"))))
                or None, "file": str(path)})
    return rec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="result files (.jsonl) of zyfa accuracy, study, longctx, impact or "
                                                 "tasks")
    parser.add_argument("--from-rows", action="store_true",
                        help="rebuild the record of a study or long-context file written before the records")
    parser.add_argument("--per-run", action="store_true",
                        help="also list each run fitted on with its estimate under the fitted values")
    parser.add_argument("--count-as", action="append", default=[], metavar="FROM=TO",
                        help="fit the records of command FROM as command TO's (same units, e.g. accuracy=study)")
    args = parser.parse_args(argv)
    count_as = dict(x.split("=", 1) for x in args.count_as if "=" in x)
    if len(count_as) != len(args.count_as):
        print("fit_cost_model: --count-as takes FROM=TO, e.g. accuracy=study", file=sys.stderr)
        return 2
    records = []
    for name in args.files:
        path = Path(name)
        if not path.is_file():
            print(f"fit_cost_model: no such file: {name}", file=sys.stderr)
            return 2
        found = records_in_file(path)
        if not found and args.from_rows:
            found = [r for r in [rebuilt_record(path)] if r is not None]
            print(f"{name}: " + (f"record rebuilt from its {found[0]['rebuilt_from']}" if found else
                                 "no cost records, and none can be rebuilt from its rows; skipped"))
        elif not found:
            print(f"{name}: no cost records (written before they were recorded); skipped")
        records += [{"file": name, **r} for r in found]
    records = [{**r, "command": count_as[r["command"]]} if r.get("command") in count_as else r for r in records]
    fitted = fit(records)
    for f in fitted.values():
        if "refused" in f:
            print(f"fit_cost_model: {f['refused']}", file=sys.stderr)
    fitted = {k: f for k, f in fitted.items() if "refused" not in f}
    if not fitted:
        print(f"fit_cost_model: no (command, device) with {MIN_RUNS} or more runs with work and a measured time in "
              "these files", file=sys.stderr)
        return 2
    print("| command | device | runs | fitted units/s | fitted s/cell | current units/s | current s/cell | "
          "measured/estimate, fitted | measured/estimate, current |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    for (command, device), f in fitted.items():
        lo, hi = f["measured_over_estimate"]
        clo, chi = f["current_measured_over_estimate"]
        per_cell = f"{f['seconds_per_cell']:.3g}" if "seconds_per_cell" in f else "-"
        print(f"| {command} | {device} | {f['runs']} | {f['units_per_second']:.3g} | {per_cell} | "
              f"{f['current_units_per_second']:.3g} | {f['current_seconds_per_cell']:.3g} | {lo:.2f}-{hi:.2f} | "
              f"{clo:.2f}-{chi:.2f} |")
    print()
    for (command, device), f in fitted.items():
        print(f'RATES["{command}"]["{device}"] = {f["units_per_second"]:.2e}')
        if "seconds_per_cell" in f:
            print(f'SECONDS_PER_CELL["{command}"]["{device}"] = {f["seconds_per_cell"]:.2e}')
    if args.per_run:
        print()
        print("| file | command | device | rows | units | measured s | estimate s, fitted | measured/estimate |")
        print("|---|---|---|---:|---:|---:|---:|---:|")
        for (command, device), f in fitted.items():
            for r, ratio in zip(f["records"], f["ratios"], strict=True):
                print(f"| {r.get('file') or '-'} | {command} | {device} | {r.get('cells')} | {r['units']:.3g} | "
                      f"{r['measured_s']:.1f} | {r['measured_s'] / ratio:.1f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
