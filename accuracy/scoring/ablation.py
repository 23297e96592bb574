"""One-factor ablations: the same kernel or emulation with one recipe field changed, run on the same inputs, and
its rows paired per input.

``--ablate IMPL FIELD=V1,V2[,...]`` (``zyfa accuracy``, ``zyfa longctx``) names a base spec, a recipe spec
(``zyfa``, ``fa3@h200``) or our kernel's (``triton:fa3``), in the grammar of :mod:`zyfa.recipes`, and one field with
two or more values; :func:`parse_ablation` expands it into one spec per value (``IMPL:FIELD=V``: the base's own
overrides and platform kept, only that field set). Every row of those specs records its group:
``ablation_base`` (the base spec as given), ``ablation_field`` and ``ablation_value`` (the value as the grammar
writes it). :func:`ablation_pairs` aligns the rows of one group per unit (the row's ``input``: an input of
``zyfa accuracy``, a prompt of ``zyfa longctx``) into one array per value, for a paired comparison
(``zyfa.accuracy.scoring.verdict.paired_verdict(unit_ids, a, b, ...)``).

Exposed: :class:`Ablation`, :func:`parse_ablation`, :func:`ablation_tags`, :class:`AblationPairs`,
:func:`ablation_pairs`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from zyfa.recipe_spec import SpecError, SpecParts, format_field_value, overridable_fields, parse_field_value, split_spec


@dataclass(frozen=True)
class Ablation:
    """One ``--ablate``: the base spec, the field, its values (as the grammar writes them) and one spec each."""

    base: str
    field: str
    values: tuple[str, ...]
    specs: tuple[str, ...]

    def tags(self) -> dict[str, dict[str, str]]:
        """spec -> the row fields that name its group."""
        return {s: {"ablation_base": self.base, "ablation_field": self.field, "ablation_value": v}
                for s, v in zip(self.specs, self.values, strict=True)}


def parse_ablation(base: str, assignment: str) -> Ablation:
    """``("triton:fa3", "accum_flush_tiles=0,1")`` -> the specs ``triton:fa3:accum_flush_tiles=0`` and
    ``triton:fa3:accum_flush_tiles=1``. SpecError (one line) for a bad base spec, an unknown field, a bad value,
    fewer than two values or one given twice."""
    parts = split_spec(base)
    name, eq, text = assignment.partition("=")
    name = name.strip()
    fields = overridable_fields()
    if not eq or name not in fields:
        why = "not FIELD=V1,V2" if not eq else f"no field {name!r}"
        raise SpecError(f"--ablate {base} {assignment}: {why}; fields: {', '.join(fields)}")
    values = []
    for item in (v.strip() for v in text.split(",")):
        try:
            values.append(format_field_value(name, parse_field_value(name, item)))
        except ValueError as e:
            raise SpecError(f"--ablate {base} {assignment}: {name} {e}; fields: {', '.join(fields)}") from None
    if len(values) < 2 or len(set(values)) != len(values):
        raise SpecError(f"--ablate {base} {assignment}: give two or more different values of {name}")
    specs = []
    for v in values:
        over = tuple((k, x) for k, x in parts.overrides if k != name) + ((name, parse_field_value(name, v)),)
        specs.append(SpecParts(parts.namespace, parts.name, over, parts.platform).text())
    return Ablation(parts.text(), name, tuple(values), tuple(specs))


def ablation_tags(ablations: Iterable[Ablation], names: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Row name -> its group's fields, for every ablation; ``names`` maps a spec to the name its rows carry (a
    recipe's canonical name, e.g. ``fa3:accum_flush_tiles=0@h200`` -> ``fa3:accum_flush_tiles=0``)."""
    names = names or {}
    out: dict[str, dict[str, str]] = {}
    for a in ablations:
        for spec, tags in a.tags().items():
            out[names.get(spec, spec)] = tags
    return out


@dataclass
class AblationPairs:
    """One ablation group's rows aligned per unit: ``columns[value][i]`` is ``metric`` of unit ``unit_ids[i]``
    under that value. Units missing a value (or whose metric is not a finite number) are left out and counted."""

    base: str
    field: str
    metric: str
    values: list[str]
    unit_ids: list[str]
    columns: dict[str, np.ndarray]
    dropped: list[str] = field(default_factory=list)

    def diff(self, a: str | None = None, b: str | None = None) -> np.ndarray:
        """Per unit, ``b`` minus ``a`` (default: the second value minus the first)."""
        a = self.values[0] if a is None else a
        b = self.values[1] if b is None else b
        return self.columns[b] - self.columns[a]


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def ablation_pairs(rows: Iterable[dict], metric: str, *, unit: Sequence[str] = ("input",)) -> list[AblationPairs]:
    """Rows of every ablation group among ``rows``, aligned per unit (the ``unit`` fields joined by ``|``), one
    :class:`AblationPairs` per (base, field) in the order first met. Only rows with ``status`` absent or ``ok``
    count. A unit seen twice under one value raises ValueError (two runs' rows mixed)."""
    groups: dict[tuple[str, str], dict[str, dict[str, float | None]]] = {}
    for r in rows:
        if "ablation_field" not in r or r.get("status", "ok") != "ok":
            continue
        g = groups.setdefault((r["ablation_base"], r["ablation_field"]), {})
        col = g.setdefault(str(r["ablation_value"]), {})
        uid = "|".join(str(r.get(k)) for k in unit)
        if uid in col:
            raise ValueError(f"ablation {r['ablation_base']} {r['ablation_field']}={r['ablation_value']}: unit "
                             f"{uid!r} has two rows")
        col[uid] = _number(r.get(metric))
    out = []
    for (base, fld), cols in groups.items():
        values = list(cols)
        every = list(dict.fromkeys(u for c in cols.values() for u in c))
        keep = [u for u in every if all(cols[v].get(u) is not None for v in values)]
        out.append(AblationPairs(base, fld, metric, values, keep,
                                 {v: np.array([cols[v][u] for u in keep], dtype=float) for v in values},
                                 [u for u in every if u not in keep]))
    return out
