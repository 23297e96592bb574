"""The statistics of the report's tables: a metric's mean with its bootstrap interval, the entries of a recipe
table (each recipe's emulation followed by the real kernels paired with it), and paired values per input.

Exposed: ``row_value(row, key)``, ``mean_ci(values, *, log)``, ``MIN_INTERVAL_N``, ``mean_or_ci(values, *, log)``,
``rows_by_recipe(rows)``, ``TableEntry``, ``table_entries(rows, recipes, real_rows)``, ``paired_rows(ra, rb, metric)``,
``paired_values(rows, a, b, metric)``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from zyfa.accuracy.report.real_kernels import measured_label
from zyfa.accuracy.report.results import input_key

__all__ = ["MIN_INTERVAL_N", "TableEntry", "mean_ci", "mean_or_ci", "paired_rows", "paired_values", "row_value",
           "rows_by_recipe", "table_entries"]


def row_value(row: dict, key: str) -> float:
    v = row.get(key)
    return math.nan if v is None else float(v)


def mean_ci(values, *, log: bool = False):
    """Mean and bootstrap 95% CI (scipy BCa via accuracy.scoring.metrics.bootstrap_ci); log: geometric mean."""
    from zyfa.accuracy.scoring.metrics import bootstrap_ci  # lazy: metrics imports torch, a report reads without

    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return (math.nan, math.nan, math.nan)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            lx = np.log(x)
        if not np.all(np.isfinite(lx)):
            return (math.nan, math.nan, math.nan)
        est, lo, hi = bootstrap_ci(lx)
        return (math.exp(est), math.exp(lo), math.exp(hi))
    if np.isinf(x).any():
        m = float(np.mean(x))
        return (m, m, m)
    return tuple(bootstrap_ci(x))


# fewer inputs than this: a per-model table gives the mean alone, no interval (a bootstrap over 2-3 layers
# carries no information; study_methods.md §1)
MIN_INTERVAL_N = 5


def mean_or_ci(values, *, log: bool = False):
    """:func:`mean_ci`, with the interval dropped (NaN bounds: the estimate alone) below :data:`MIN_INTERVAL_N`."""
    est, lo, hi = mean_ci(values, log=log)
    return (est, lo, hi) if len(values) >= MIN_INTERVAL_N else (est, math.nan, math.nan)


def rows_by_recipe(rows) -> dict[str, list[dict]]:
    out = defaultdict(list)
    for r in rows:
        out[r["recipe"]].append(r)
    return out


@dataclass
class TableEntry:
    """One row of a recipe table: a recipe's emulation, or a real kernel measured on one device."""

    label: str  # the recipe's name, or measured_label of the real kernel's rows
    rows: list  # a real kernel's rows that ran (status ok)
    real: bool = False
    paired: str | None = None  # a real kernel's paired recipe spec (None: paired with none)
    placed: str | None = None  # the recipe it is placed after (its paired recipe, or that spec's base recipe)
    self_quantizing: bool = False  # quantizes for itself: no error on a recipe's dequantized inputs (deq)

    def values(self, metric: str) -> list[float]:
        """The metric over the entry's rows: every row for a recipe (as before: a missing value is NaN); for a
        real kernel the rows that have it (none for ``deq_*`` of a kernel that quantizes for itself)."""
        if not self.real:
            return [row_value(r, metric) for r in self.rows]
        if self.self_quantizing and metric.startswith("deq_"):
            return []
        return [row_value(r, metric) for r in self.rows if r.get(metric) is not None]


def _placed(spec: str | None, recipes: list) -> str | None:
    """The recipe of ``recipes`` a real kernel paired with ``spec`` is placed after: the spec itself, else the
    recipe it overrides (``triton-amd`` for ``triton-amd:p_scale=tile_amax``), else None."""
    if not spec:
        return None
    if spec in recipes:
        return spec
    base = str(spec).split(":")[0]
    return base if base in recipes else None


def table_entries(rows: list, recipes: list, real_rows: Sequence[dict] = ()) -> list[TableEntry]:
    """The recipes with rows, in report order, each followed by the real kernels paired with it (one entry per
    implementation and device, their rows that ran), then the real kernels paired with no recipe of the table."""
    by = rows_by_recipe(rows)
    real: dict[str, list[dict]] = defaultdict(list)
    for r in real_rows:
        if r.get("status", "ok") in ("ok", "suspect"):  # scored rows (suspect: flagged in its table)
            real[measured_label(r)].append(r)
    after: dict[str | None, list[TableEntry]] = defaultdict(list)
    for label, rs in real.items():
        spec = rs[0].get("recipe")
        place = _placed(spec, recipes)
        after[place].append(TableEntry(label, rs, True, spec, place, rs[0].get("quantizes") == "self"))
    out = []
    for name in recipes:
        if by.get(name):
            out.append(TableEntry(name, by[name]))
        out += after.pop(name, [])
    for rest in after.values():
        out += rest
    return out


def paired_rows(ra: list, rb: list, metric: str) -> list[float]:
    """Per input in both (by :func:`input_key`), a's metric over b's (inputs where b's is not > 0 left out)."""
    va = {input_key(r): row_value(r, metric) for r in ra}
    vb = {input_key(r): row_value(r, metric) for r in rb}
    return [va[k] / vb[k] for k in va if k in vb and vb[k] > 0]


def paired_values(rows: list, a: str, b: str, metric: str) -> list[float]:
    return paired_rows([r for r in rows if r["recipe"] == a], [r for r in rows if r["recipe"] == b], metric)
