"""The result rows a report reads: loaded from result files (JSONL or CSV), a measurement made again kept once,
selected by recipe, grouped by model.

Exposed: ``Results``, ``load_results(paths)``, ``select_recipes(res, names)``, ``group_of(row)``,
``input_key(row)``, ``GAUSSIAN``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zyfa.accuracy.io.results_io import read_results, row_key, run_provenances
from zyfa.accuracy.io.schemas import check_provenance, read_rows

__all__ = ["GAUSSIAN", "Results", "group_of", "input_key", "load_results", "select_recipes"]

GAUSSIAN = "Gaussian inputs"


@dataclass
class Results:
    rows: list
    provenances: list  # (path, provenance dict)
    recipes: list  # in run order, zyfa first
    replaced: int = 0  # rows measured again in a later file or later in a file: the later one is kept
    orphans: int = 0  # rows whose run_id no provenance record of the files names, an earlier segment's included
    # (flagged in the report)


def _read_one(path: Path) -> tuple[list[dict], dict]:
    if path.suffix.lower() == ".jsonl":  # every line checked by its schema
        return read_rows(path)
    rows = read_results(path)
    return list(rows), check_provenance(rows.provenance or {}, f"{path} (its provenance)")


def load_results(paths: Sequence[str | Path]) -> Results:
    """Rows of every result file (JSONL or CSV), each tagged with ``_file``; recipes in run order."""
    rows, provs, order = [], [], []
    names = [Path(p).name for p in paths]
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise FileNotFoundError(f"result file not found: {path}")
        label = path.name if names.count(path.name) == 1 else str(path)
        r, prov = _read_one(path)
        for row in r:
            row["_file"] = label
        rows += r
        provs.append((label, prov))
        order += [x for x in prov.get("recipes", []) if x not in order]
    if not rows:
        raise ValueError(f"no result rows in {', '.join(map(str, paths))}")
    # every run segment's id: a resumed file's rows carry the id of the segment that made them
    runs = {seg.get("run_id") for _, p in provs for seg in run_provenances(p)} - {None}
    orphans = 0
    for row in rows:  # a row whose run has no provenance record: where it comes from is unknown
        if row.get("run_id") not in runs:
            row["_no_provenance"] = True
            orphans += 1
    # a measurement made again (a later file, or later in a file: a recipe whose numerics changed, measured anew)
    # replaces the earlier row in place, so no input counts twice in a mean or an interval
    kept: dict[tuple, dict] = {}
    for row in rows:
        kept[row_key(row, across_runs=True)] = row
    replaced = len(rows) - len(kept)
    rows = list(kept.values())
    order += [x for x in dict.fromkeys(r["recipe"] for r in rows) if x not in order]  # each once
    present = {r["recipe"] for r in rows}
    order = [x for x in order if x in present]
    if "zyfa" in order:
        order.remove("zyfa")
        order.insert(0, "zyfa")
    return Results(rows, provs, order, replaced, orphans)


def _real_selected(row: dict, names: Sequence[str]) -> bool:
    """Whether a real kernel's row goes with the selection ``names``: its implementation is named, or the recipe
    it is paired with is (the spec itself, its base recipe: ``triton-amd`` for ``triton-amd:p_scale=tile_amax``,
    or the emulation it was compared with, ``paired_spec``: ``zyfa@h200``)."""
    spec = row.get("recipe")
    keys = {row.get("implementation"), spec, row.get("paired_spec")}
    if spec:
        keys.add(str(spec).split(":")[0].split("@")[0])
    return bool(keys & set(names))


def select_recipes(res: Results, names: Sequence[str]) -> Results:
    """Only the rows of these recipes and the real kernels paired with them (:func:`_real_selected`); a name may
    also be a real implementation's (``flash-attn-triton-amd``: its rows alone). Each name must be in the
    results: ValueError naming the others."""
    impls = {r.get("implementation") for r in res.rows if r.get("real")} - {None}
    unknown = [x for x in names if x not in res.recipes and x not in impls]
    if unknown:
        have = ", ".join(res.recipes) + (f"; implementations: {', '.join(sorted(impls))}" if impls else "")
        raise ValueError(f"--recipes: not in the results: {', '.join(unknown)} (have {have})")
    rows = [r for r in res.rows if (_real_selected(r, names) if r.get("real") else r["recipe"] in names)]
    kept = {r["recipe"] for r in rows}
    return Results(rows, res.provenances, [x for x in res.recipes if x in names or x in kept], res.replaced,
                   sum(bool(r.get("_no_provenance")) for r in rows))


def group_of(row: dict) -> str:
    if row.get("input_source") == "capture":
        model = str(row.get("input_model") or row.get("input_file") or "capture")
        return model.rstrip("/").split("/")[-1]
    return GAUSSIAN


def input_key(row: dict):
    """The same inputs pair across result files: name and content hash (the file when there is no hash)."""
    return (row["input"], row.get("input_content_hash") or row.get("_file"))
