"""The cost model behind ``--dry-run``, checked against the runs it plans: each run records its estimate beside
its measured time, and :func:`fit` refits the rates from such records.

Units of work, per command (each command's cost function says how its cells are counted):

- ``accuracy``, ``study``: one accuracy row on an input costs batch x query heads x s_q x s_k x (d + d_v)
  (:func:`zyfa.accuracy.cli.cell_cost`).
- ``longctx``: one prompt of ``length`` tokens costs length x (length + 2048), the attention beside the rest of the
  prefill (:func:`zyfa.accuracy.longctx.cli.cell_cost`).
- ``impact``: one forward pass of n tokens costs n x (n + 2048) x (model file size / 1e8), plus, per layer whose
  attention is swapped, the accuracy command's cost of that attention at its rate (a truncating recipe's scaled by
  :data:`IMPACT_TRUNCATING_SCALE`) in impact units (:func:`zyfa.accuracy.impact.cli.cell_cost`); a row is one pass.
- ``tasks`` (humaneval): a prompt of p tokens and g generated ones cost p x (p + 2048) + g x (p + g / 2 + 2048),
  a prefill and g cached decode steps in the same units as longctx (:func:`generation_units`).

A device does :data:`RATES` ``[command][device type]`` units per second, and where
:data:`SECONDS_PER_CELL` has a value (accuracy and study rows on a GPU) each cell (row) costs that many seconds on
top: ``cells x seconds per cell + units / rate``. :func:`estimate_s` is the one place an estimate is made from the
two tables (``--dry-run``, the records). A finished run writes one :func:`record` into its provenance under
``cost_model`` (a resumed run adds one): the units of the rows it made, with the sizes they came from (``work``:
prompts, tokens, layers, ...), the rate, seconds per cell and estimate ``--dry-run`` would have printed, the measured
wall seconds, the machine's CPU count and load. ``zyfa accuracy``, ``study``, ``longctx`` and ``tasks`` keep it in
their file's provenance line; ``zyfa impact``, whose rows carry their own provenance, in the provenance of each row
the run made (:func:`records_in_file` reads either, each record once). ``scripts/fit_cost_model.py`` fits them per
(command, device type) (:func:`fit`): one rate from two runs or more (the geometric mean of units per measured
second, so each run counts by its ratio, not its size), or where the pair has a per-cell term both values from
three runs or more (least squares of log(measured / estimate), neither value negative).

Exposed: ``RATES``, ``SECONDS_PER_CELL``, ``CUDA_FIT_FILES``, ``CUDA_HELD_OUT_FILES``, ``IMPACT_TRUNCATING_SCALE``,
``rate(command, device_type)``, ``seconds_per_cell(command, device_type)``,
``estimate_s(command, device_type, units, cells)``, ``record(...)``, ``records_of(provenance)``,
``records_in_file(path)``, ``add_record(provenance, previous, ...)``, ``generation_units(prompt, generated)``,
``fit(records)``, ``MIN_RUNS``, ``PROVENANCE_KEY``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from zyfa.accuracy.io.results_io import run_provenances

# the provenance key holding a run's list of records (one per run and resumed run)
PROVENANCE_KEY = "cost_model"
# fewer runs than this fit no rate (one run's ratio says nothing of the spread); a pair with a per-cell term needs
# one more (two values fit two runs exactly)
MIN_RUNS = 2

# Units per second by command and device type. Where each value comes from:
# - accuracy, study, cpu: fitted by scripts/fit_cost_model.py on the README's `zyfa study` run on 2 idle cores
#   (3 December, commit 9626ac6: 502 cells measured in 119.5 s, estimated 2260 s at the old 2e8); accuracy's rows
#   are the same units, so it takes the study's rate until its own runs are fitted.
# - study, cuda: fitted with SECONDS_PER_CELL["study"]["cuda"] (below) from the committed H200 study files, whose
#   records were rebuilt from their rows (docs/COST_MODEL.md has the command, the files and each run's ratio).
#   accuracy, cuda: the study's values (same units).
# - longctx, cuda: fitted from the committed H200 files, records rebuilt from their rows (one rate; docs/COST_MODEL.md).
# - longctx, cpu; impact, cuda: not fitted; the values the operator rate gave before its fit (old rate / 50).
# - impact, cpu: fitted on the stock passes (rows' seconds_stock) of three SmolLM2 runs of `zyfa impact` at 128, 512
#   and 1024 tokens on 2 shared cores (docs/COST_MODEL.md; in-sample): the units of a stock pass per its seconds,
#   geometric mean (0.70e6 to 1.58e6 per run). Model loads are outside every impact estimate.
# - tasks, cuda: fitted from the 16 committed HumanEval partial files on the H200 (Qwen2.5-Coder, rows of three
#   resumed sessions), rebuilt from their rows' generation time; tasks, cpu: fitted from two SmolLM2 runs on
#   2 loaded cores (docs/COST_MODEL.md).
# The committed H200 files the cuda rates of study (and accuracy), longctx and tasks, and study's (and accuracy's)
# SECONDS_PER_CELL were fitted from, with
#   python scripts/fit_cost_model.py --from-rows <these files>
# (tests/accuracy/test_cost_model.py checks that RATES and SECONDS_PER_CELL hold what that command prints).
CUDA_FIT_FILES = (
    "reports/study/results.jsonl", "reports/study/results_flashinfer_fa3.jsonl", "reports/study-long/results.jsonl",
    "reports/study-long/results_fa3_kv_reverse.jsonl", "reports/sharding/study_single.jsonl",
    "reports/sharding/study_nccl_1rank.jsonl", "reports/longctx/results-smollm2.jsonl",
    "reports/longctx/results-gemma3.jsonl", "reports/longctx/results-qwen25coder.jsonl",
    "reports/longctx/results-smollm2-mi355x.jsonl", "reports/accumulator/results-gemma3.jsonl",
    "reports/accumulator/results-qwen25coder.jsonl",
    *(f"reports/humaneval/he-{i}.jsonl.partial" for i in range(16)),
)
# Committed cuda runs kept out of the fit, to check it on: `zyfa accuracy` at 32K tokens on an H100 (6 rows; its own
# record, estimated by the one-rate model of its day). docs/COST_MODEL.md has its estimate before and after.
CUDA_HELD_OUT_FILES = ("reports/accumulator-operator/length-qwen25coder-1.5b-32768-L0-2.jsonl",)
RATES: dict[str, dict[str, float]] = {
    "accuracy": {"cpu": 3.78e9, "cuda": 2.45e11},
    "study": {"cpu": 3.78e9, "cuda": 2.45e11},
    "longctx": {"cpu": 4.0e6, "cuda": 8.22e8},
    "impact": {"cpu": 1.07e6, "cuda": 1.0e9},
    "tasks": {"cpu": 1.13e4, "cuda": 1.55e4},
}
# Seconds per cell (one accuracy or study row) on top of units / RATES, by command and device type; a pair not here
# has none (its estimate is units / rate alone). On a GPU an accuracy row's time is mostly a fixed cost that its
# units do not see (its parts were not measured apart; a cold Triton cache adds its compiles): with one rate
# the six H200 study runs of CUDA_FIT_FILES were 0.01 to 34 times their estimate, and `zyfa accuracy` at 32K tokens
# on an H100 (reports/accumulator-operator/length-qwen25coder-1.5b-32768-L0-2.jsonl) took 36.8 s against 577 s
# estimated. study, cuda, with RATES["study"]["cuda"]: fitted from the study files of CUDA_FIT_FILES alone (0.35 to
# 2.35 times their estimate under the two values); the 32K run is not among them (CUDA_HELD_OUT_FILES: 2.41 times
# its estimate under them, out of sample; docs/COST_MODEL.md). accuracy, cuda: the study's (same rows). Every other
# pair, the CPU's included, keeps its one rate as it was.
SECONDS_PER_CELL: dict[str, dict[str, float]] = {
    "accuracy": {"cuda": 0.295},
    "study": {"cuda": 0.295},
}


# Units of one score (one query-key pair of one query head) of an emulated recipe whose emulation runs a truncating
# accumulator (Recipe.truncated_gemms: FP8 GEMMs on h200), in place of the d + d_v of every other row: that
# emulation models the accumulator product by product (zyfa.platforms.truncating_mma), 20 to 125 times the cost the
# plain unit gave (measured / estimate of the files below). Per score, the CPU runs of the accumulator-operator plans
# took 1.6 to 4.2 us at head dims 64 to 256 (1.6 at 8K tokens, 2.7 to 4.2 at 2K; no trend with the head dim, the
# spread is load and length), so the unit counts scores, not products. Fitted on the CPU (at the rate
# RATES["accuracy"]["cpu"]) by truncating_units_per_score(TRUNCATING_FIT_FILES). CPU only: on the H200 the study
# runs whose rows include such recipes fit no better with them counted apart (measured / estimate 0.015-33 to 0.03-39
# at per-score values from 300 to 10500, against 0.003-3.3 with the plain unit), so a GPU keeps the plain unit.
TRUNCATING_FIT_FILES = (
    "reports/accumulator-operator/gemma3-2048.jsonl", "reports/accumulator-operator/qwen25coder-0.5b-2048.jsonl",
    "reports/accumulator-operator/qwen25coder-1.5b-2048.jsonl", "reports/accumulator-operator/smollm2-2048.jsonl",
    "reports/accumulator-operator/length-qwen25coder-1.5b-2048-L0-2.jsonl",
    "reports/accumulator-operator/length-qwen25coder-1.5b-8192-L0-2.jsonl",
)
TRUNCATING_UNITS_PER_SCORE: dict[str, float] = {"cpu": 1.05e4}
# The fraction of TRUNCATING_UNITS_PER_SCORE that a truncating recipe's emulation costs per score as a model's
# attention (zyfa impact: the emulation alone, once per layer); an accuracy row's measured time holds more than its
# emulation (its FP64 references, its metrics), and which part makes the difference was not measured. Fitted on
# the CPU (docs/COST_MODEL.md, in-sample: three SmolLM2 runs of `zyfa impact` at 128, 512 and 1024 tokens) by
# zyfa.accuracy.impact.cli.impact_truncating_scale: the geometric mean over their fa3 rows of (row seconds - the
# stock pass's) / the attention's estimate at the unscaled unit (0.072 to 0.21 per run). A device type not here (a
# GPU) keeps the plain unit, as the accuracy command does there.
IMPACT_TRUNCATING_SCALE: dict[str, float] = {"cpu": 0.134}


def scores(row: dict) -> float:
    """The scores of one row's input: batch x query heads x s_q x s_k."""
    return float(row["batch"] * row["heads_q"] * row["seq_q"] * row["seq_k"])


def truncating_units_per_score(paths: Iterable[str | Path]) -> float:
    """The geometric mean over result files of a truncating-accumulator recipe's rows (one run each, on the CPU)
    of the units per score that make their estimate their measured time at RATES["accuracy"]["cpu"]. ValueError
    (one line) for a file that is not one CPU run of `zyfa accuracy` over all its rows."""
    logs = []
    for path in paths:
        recs = records_in_file(path)
        with open(path, encoding="utf-8") as f:
            rows = [r for r in map(json.loads, f) if r.get("record") != "provenance"]
        if len(recs) != 1 or recs[0].get("device_type") != "cpu" or recs[0].get("cells") != len(rows):
            raise ValueError(f"{path}: not one CPU run of zyfa accuracy over all its {len(rows)} rows")
        logs.append(math.log(recs[0]["measured_s"] * rate("accuracy", "cpu") / sum(map(scores, rows))))
    if not logs:
        raise ValueError("no files to fit the truncating accumulator's units from")
    return math.exp(sum(logs) / len(logs))


def rate(command: str, device_type: str) -> float:
    """Units per second of ``command`` on a ``device_type`` device (a device type the table lacks: the cpu's)."""
    rates = RATES[command]
    return rates.get(device_type, rates["cpu"])


def seconds_per_cell(command: str, device_type: str) -> float:
    """Seconds per cell of ``command`` on a ``device_type`` device on top of its units (0 where
    :data:`SECONDS_PER_CELL` has none; a device type the table lacks: the cpu's, as :func:`rate`)."""
    per_cell = SECONDS_PER_CELL.get(command, {})
    return per_cell.get(device_type, per_cell.get("cpu", 0.0))


def estimate_s(command: str, device_type: str, units: float, cells: float) -> float:
    """The seconds ``--dry-run`` gives ``cells`` cells (rows) of ``units`` in all of ``command`` on a
    ``device_type`` device: cells x :func:`seconds_per_cell` + units / :func:`rate`. ``cells`` 0: the units'
    time alone (work that is not a row of the command, as an impact layer's attention)."""
    return _seconds(units, cells, rate(command, device_type), seconds_per_cell(command, device_type))


def _seconds(units: float, cells: float, units_per_second: float, per_cell: float) -> float:
    """The model: cells x seconds per cell + units / units per second."""
    return cells * per_cell + units / units_per_second


def generation_units(prompt: int, generated: int) -> float:
    """The units of a prompt of ``prompt`` tokens and ``generated`` tokens decoded with a cache (``tasks``)."""
    p, g = float(prompt), float(generated)
    return p * (p + 2048) + g * (p + g / 2 + 2048)


def record(units: float, measured_s: float, device_type: str, *, command: str, cells: int,
           work: dict | None = None) -> dict:
    """One run's estimate beside its measurement: ``units`` of work over ``cells`` rows took ``measured_s``
    wall seconds on a ``device_type`` device; ``work``: the sizes the units were counted from. ``seconds_per_cell``
    is the per-cell term of the estimate (a record written before it had none: 0)."""
    per_s = rate(command, device_type)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    # record_id: two runs alike in every field (a fast test's, within one second) are still two records
    rec = {"record_id": uuid.uuid4().hex[:12], "command": command, "device_type": device_type, "cells": int(cells),
           "units": float(units),
           "units_per_second": per_s, "seconds_per_cell": seconds_per_cell(command, device_type),
           "estimate_s": round(estimate_s(command, device_type, units, cells), 3), "measured_s": round(measured_s, 3),
           "cpu_count": os.cpu_count(), "load_1min": None if load is None else round(load, 2),
           "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if work:
        rec["work"] = dict(work)
    return rec


def add_record(provenance: dict, previous: dict | None, units: float, measured_s: float, device_type: str, *,
               command: str, cells: int, work: dict | None = None) -> dict:
    """Put the records of ``previous`` (the provenance of the file a resumed run continues, else None: those of
    every run segment it names, each once, as a segment cut before it finished left none of its own in the
    partial's last provenance line) and this run's :func:`record` into ``provenance``; returns this run's record."""
    rec = record(units, measured_s, device_type, command=command, cells=cells, work=work)
    earlier, seen = [], set()
    for seg in run_provenances(previous):
        for r in records_of(seg):
            key = r.get("record_id") or json.dumps(r, sort_keys=True)
            if key not in seen:
                seen.add(key)
                earlier.append(r)
    provenance[PROVENANCE_KEY] = [*earlier, rec]
    return rec


def records_of(provenance: dict) -> list[dict]:
    """The cost records of one provenance (none for a file written before they were recorded)."""
    recs = (provenance or {}).get(PROVENANCE_KEY) or []
    return [r for r in (recs if isinstance(recs, list) else [recs]) if isinstance(r, dict)]


def records_in_file(path: str | Path) -> list[dict]:
    """Every cost record of a result file, each once: its provenance line's, and those in its rows' own provenance
    (``zyfa impact``); lines that are not JSON objects are skipped."""
    out, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(obj, dict):
                continue
            prov = obj if obj.get("record") == "provenance" else obj.get("provenance")
            for r in records_of(prov if isinstance(prov, dict) else {}):
                # one record repeated in a file (impact: in every row's provenance) counts once; by its id, or by
                # its whole content for a record written before records had ids
                key = r.get("record_id") or json.dumps(r, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out.append(r)
    return out


def fit(records: Iterable[dict]) -> dict[tuple[str, str], dict]:
    """Per (command, device type), over the records with work and time: the fitted units per second, the current
    rate and seconds per cell, and the range of measured / estimated time under the fitted values and under those
    each run was estimated with; fitted, also the records used (``records``) and each one's measured / estimated
    time under the fitted values (``ratios``). A pair with a per-cell term (:data:`SECONDS_PER_CELL`) also gets
    its fitted ``seconds_per_cell``: the two values minimise the sum of squared log(measured / estimate) over its
    runs (:func:`_fit_two_terms`); any other pair one rate, the geometric mean of units / measured seconds. Fewer
    than :data:`MIN_RUNS` records (one more with a per-cell term) fit nothing: the entry has ``refused``, one line
    saying why, and no rate."""
    by_key: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r.get("units", 0) > 0 and r.get("measured_s", 0) > 0:
            by_key.setdefault((str(r.get("command")), str(r.get("device_type"))), []).append(r)
    out = {}
    for (command, device_type), recs in sorted(by_key.items()):
        known = command in RATES
        two_terms = device_type in SECONDS_PER_CELL.get(command, {})
        entry = {"runs": len(recs), "current_units_per_second": rate(command, device_type) if known else math.nan,
                 "current_seconds_per_cell": seconds_per_cell(command, device_type) if known else math.nan,
                 "current_measured_over_estimate": _ratios(recs)}
        need = MIN_RUNS + 1 if two_terms else MIN_RUNS
        if len(recs) < need:
            entry["refused"] = (f"{command} on {device_type}: {len(recs)} run{'s' if len(recs) > 1 else ''}; "
                                + ("a rate and seconds per cell are" if two_terms else "a rate is")
                                + f" fitted from {need} or more")
        else:
            if two_terms:
                per_cell, per_s = _fit_two_terms(recs)
                entry["seconds_per_cell"] = per_cell
            else:
                per_cell, per_s = 0.0, math.exp(sum(math.log(r["units"] / r["measured_s"]) for r in recs) / len(recs))
            ratios = [r["measured_s"] / _seconds(r["units"], r.get("cells", 0), per_s, per_cell) for r in recs]
            entry.update({"units_per_second": per_s, "measured_over_estimate": (min(ratios), max(ratios)),
                          "records": recs, "ratios": ratios})
        out[(command, device_type)] = entry
    return out


def _fit_two_terms(recs: Sequence[dict], grid: int = 2000, zooms: int = 40) -> tuple[float, float]:
    """(seconds per cell, units per second) minimising the sum over ``recs`` of log(measured / (cells x seconds per
    cell + units / units per second))^2, neither term negative. Every such pair is k x ((1 - t) x A, t x B) for
    t in [0, 1] and k > 0, with A the seconds per cell alone would fit and B the seconds per unit (geometric means);
    at a given t the best log k is the mean log ratio, so t is searched alone: a grid over [0, 1], then ``zooms``
    finer grids around the best point. t = 1 gives the one-rate fit (per cell 0), t = 0 the per-cell fit alone;
    a rate term of 0 is infinite units per second."""
    m = [r["measured_s"] for r in recs]
    c = [float(r.get("cells", 0)) for r in recs]
    u = [r["units"] for r in recs]
    with_cells = [mi / ci for mi, ci in zip(m, c, strict=True) if ci > 0]
    cell_s = math.exp(sum(map(math.log, with_cells)) / len(with_cells)) if with_cells else 0.0
    unit_s = math.exp(sum(math.log(mi / ui) for mi, ui in zip(m, u, strict=True)) / len(m))

    def at(t: float) -> tuple[float, float]:  # (sum of squared log ratios, best log k) at t
        est = [(1 - t) * ci * cell_s + t * ui * unit_s for ci, ui in zip(c, u, strict=True)]
        if min(est) <= 0:  # t = 0 with a run of no cells: no estimate
            return math.inf, 0.0
        logs = [math.log(mi / e) for mi, e in zip(m, est, strict=True)]
        mean = sum(logs) / len(logs)
        return sum((x - mean) ** 2 for x in logs), mean

    if cell_s == 0:  # no run counts cells: the rate alone
        return 0.0, 1 / unit_s
    lo, hi = 0.0, 1.0
    for _ in range(zooms):
        points = [lo + (hi - lo) * i / grid for i in range(grid + 1)]
        best = min(points, key=lambda t: at(t)[0])
        step = (hi - lo) / grid
        lo, hi, grid = max(0.0, best - step), min(1.0, best + step), 20
    k = math.exp(at(best)[1])
    return k * (1 - best) * cell_s, (1 / (k * best * unit_s) if best > 0 else math.inf)


def _ratios(recs: Sequence[dict]) -> tuple[float, float]:
    """(min, max) of measured / estimated time under the rate each run was estimated with."""
    r = [x["measured_s"] / x["estimate_s"] for x in recs if x.get("estimate_s")]
    return (min(r), max(r)) if r else (math.nan, math.nan)
