"""The cost model behind ``--dry-run``, checked against the runs it plans: each run records its estimate beside
its measured time, and :func:`fit` refits the rate from such records.

The model (:func:`accuracy.operator.cli.cell_cost`, :data:`accuracy.io.shard.UNITS_PER_SECOND`): one accuracy row on an
input costs batch x query heads x s_q x s_k x (d + d_v) units, and a device does a fixed number of units per second
(``cpu``, ``cuda``). A run of ``zyfa accuracy`` or ``zyfa study`` writes one :func:`record` per run (a resumed run
adds one) into its provenance under ``cost_model``: the units it ran, the rate and estimate ``--dry-run`` would
have printed, the measured wall seconds of the rows, and the machine's CPU count and load. ``scripts/fit_cost_model.py``
reads the records of result files and prints the rate that fits them (:func:`fit`: the geometric mean of units
per measured second, so that each run counts by its ratio, not by its size) with the spread of measured over
estimated time after the fit.

Exposed: ``record(...)``, ``records_of(provenance)``, ``fit(records)``, ``PROVENANCE_KEY``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence

from zyfa.accuracy.io.shard import UNITS_PER_SECOND

# the provenance key holding a run's list of records (one per run and resumed run)
PROVENANCE_KEY = "cost_model"
# the rate of a device type the model has none for (as --dry-run uses)
_DEFAULT_RATE = UNITS_PER_SECOND["cpu"]


def record(units: float, measured_s: float, device_type: str, *, command: str, cells: int) -> dict:
    """One run's estimate beside its measurement: ``units`` of work over ``cells`` rows took ``measured_s``
    wall seconds on a ``device_type`` device."""
    rate = UNITS_PER_SECOND.get(device_type, _DEFAULT_RATE)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"command": command, "device_type": device_type, "cells": int(cells), "units": float(units),
            "units_per_second": rate, "estimate_s": round(units / rate, 3), "measured_s": round(measured_s, 3),
            "cpu_count": os.cpu_count(), "load_1min": None if load is None else round(load, 2)}


def records_of(provenance: dict) -> list[dict]:
    """The cost records of one provenance (none for a file written before they were recorded)."""
    recs = provenance.get(PROVENANCE_KEY) or []
    return [r for r in (recs if isinstance(recs, list) else [recs]) if isinstance(r, dict)]


def fit(records: Iterable[dict]) -> dict[str, dict]:
    """Per device type: the fitted units per second (geometric mean of units / measured seconds over the records
    with work and time), the records used, the current rate, and the range of measured / estimated time under the
    fitted rate (1.0 everywhere: the model explains every run)."""
    by_type: dict[str, list[dict]] = {}
    for r in records:
        if r.get("units", 0) > 0 and r.get("measured_s", 0) > 0:
            by_type.setdefault(str(r.get("device_type")), []).append(r)
    out = {}
    for device_type, recs in sorted(by_type.items()):
        rate = math.exp(sum(math.log(r["units"] / r["measured_s"]) for r in recs) / len(recs))
        ratios = [r["measured_s"] / (r["units"] / rate) for r in recs]
        out[device_type] = {"units_per_second": rate, "runs": len(recs),
                            "current_units_per_second": UNITS_PER_SECOND.get(device_type, _DEFAULT_RATE),
                            "measured_over_estimate": (min(ratios), max(ratios)),
                            "current_measured_over_estimate": _ratios(recs)}
    return out


def _ratios(recs: Sequence[dict]) -> tuple[float, float]:
    """(min, max) of measured / estimated time under the rate each run was estimated with."""
    r = [x["measured_s"] / x["estimate_s"] for x in recs if x.get("estimate_s")]
    return (min(r), max(r)) if r else (math.nan, math.nan)
