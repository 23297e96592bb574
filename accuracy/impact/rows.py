"""``zyfa impact`` result files: reading, merging, the corrections a report needs, and dropping rows.

Results files hold one JSONL row per measurement (written by :class:`zyfa.accuracy.io.results_io.ResultsFile`), so
concurrent runs write one file each and a report merges them (:func:`load_rows`, then :func:`prepare_rows`: a
measurement found twice counts once, the latest by date; rows are read as they are stored: a row in an older form
is refused, naming ``scripts/migrate_rows.py``, which rewrites such files once (:func:`p_flushed_notes` says what
it changed in the p_flushed values).
:func:`drop_rows` (``zyfa impact --drop-rows model:recipe:window``) removes rows, keeping them in
``<file>.dropped``, so that a ``--resume`` run measures them again. Torch-free.

Exposed: ``read_rows``, ``row_key`` (:func:`accuracy.io.results_io.row_key`, re-exported), ``impact_key``, ``row_date``,
``json_default``, ``load_rows``, ``prepare_rows``, ``p_flushed_notes``, ``stale_rows``, ``dedup_rows``,
``process_key``, ``process_starts``, ``parse_drop_spec``, ``drop_rows``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from zyfa.accuracy.io.results_io import row_key
from zyfa.accuracy.io.schemas import read_rows as read_checked_rows
from zyfa.capture.fetch import sha256_file
from zyfa.capture.version import git_state

from zyfa.recipe_spec import get_recipe
from zyfa.recipes import Recipe

BLOCK_TOKENS = 256  # tokens per block for the pooled block CI and the per-block KL in the rows


def json_default(x):
    """``json.dumps(default=...)`` for numpy scalars and arrays."""
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serializable: {type(x)}")


def impact_key(kind: str, model: str, recipe: str, window: int, layer: int | None, n_tokens: int,
               text: str) -> tuple:
    """The :func:`accuracy.io.results_io.row_key` of the impact row these values describe (what a run plans and
    skips)."""
    return row_key({"kind": kind, "model": model, "recipe": recipe, "window": window, "layer": layer,
                    "n_tokens": n_tokens, "text": text})


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``zyfa impact`` results file, read as every renderer reads rows
    (:func:`zyfa.accuracy.io.schemas.read_rows`: each line checked by the impact row schema, a row in an older form
    refused in one line naming the migration, and in a run's ``.partial`` log a last line cut short by a kill left
    out); the provenance line is not a row."""
    return read_checked_rows(path)[0]



# Changes to the numerics of named recipes since the first impact rows: (commit, UTC, what, which recipes).
# Rows of those recipes written by a process started before the change measure the recipe as it was then:
# the report flags them (numbers unchanged) until they are measured again (the later row wins) or dropped.
RECIPE_CHANGES: tuple[tuple[str, str, str, Callable[[Recipe], bool]], ...] = (
    ("fdfa291", "2026-11-29T23:28:48Z", "ZYFA's MAD offset 0 -> 1/16 code, in every mad_fp8 recipe",
     lambda r: r.exp_method == "mad_fp8"),
    ("fdfa291", "2026-11-29T23:28:48Z", "the Hopper FP8 accumulator model fitted on the H200",
     lambda r: r.accumulator == "matrix_unit"),
    ("435c315", "2026-11-30T00:21:18Z", "the Hopper accumulator model: row blocks skip the KV tiles they "
     "cannot see, one truncation fewer", lambda r: r.accumulator == "matrix_unit"),
    ("63828c4", "2026-12-01T22:49:34Z", "FA3's KV tiles visited from the last to the first (kv_order=reverse), "
     "as its Hopper mainloop does", lambda r: r.kv_order == "reverse"),
)


def row_date(row: dict[str, Any]) -> str:
    """The row's UTC date as written (provenance ``date_utc``), or ""."""
    return str((row.get("provenance") or {}).get("date_utc") or "")


def process_key(row: dict[str, Any]) -> tuple:
    """Rows of one writing process: same file, and the run's start time or else the same command line."""
    p = row.get("provenance") or {}
    return (row.get("_file"), p.get("run_started_utc") or tuple(p.get("argv") or ()))


def process_starts(rows: list[dict[str, Any]]) -> dict[tuple, str]:
    """Process key -> its start: ``run_started_utc``, else an upper bound (the earliest row date less the
    row's own seconds and the stock pass's)."""
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    starts: dict[tuple, str] = {}
    for r in rows:
        p = r.get("provenance") or {}
        d = p.get("run_started_utc")
        if not d and row_date(r):
            try:
                t = dt.datetime.strptime(row_date(r), fmt)
                back = float(r.get("seconds") or 0) + float(r.get("seconds_stock") or 0)
                d = (t - dt.timedelta(seconds=back)).strftime(fmt)
            except (ValueError, TypeError):
                d = row_date(r)
        k = process_key(r)
        if d and (k not in starts or d < starts[k]):
            starts[k] = d
    return starts


def p_flushed_notes(rows: list[dict[str, Any]]) -> list[str]:
    """The report's notes on rows whose ``p_flushed_mean`` the migration (``scripts/migrate_rows.py``) changed: divided
    by the query heads (written by a process whose emulator counted the unmasked probabilities once per head), or
    NaN (not a fraction); each keeps ``p_flushed_mean_raw`` and a ``p_flushed_mean_note``."""
    fixed: dict[str, list] = defaultdict(list)
    bad, commits = [], set()
    for r in rows:
        if "p_flushed_mean_raw" not in r:
            continue
        v = r.get("p_flushed_mean")
        if isinstance(v, (int, float)) and v == v:
            fixed[r.get("model")].append(((r.get("provenance") or {}).get("num_q_heads"), row_date(r)))
            commits.update(re.findall(r"before commit (\w+)", str(r.get("p_flushed_mean_note"))))
        else:
            bad.append(r)
    notes = []
    if fixed:
        n = sum(len(v) for v in fixed.values())
        dates = sorted(d for v in fixed.values() for _, d in v)
        per = ", ".join(f"{m} ÷{v[0][0]}" for m, v in sorted(fixed.items(), key=lambda kv: str(kv[0])))
        notes.append(
            f"P flushed: {n} rows (written {dates[0]} to {dates[-1]} by processes started before commit "
            f"{', '.join(sorted(commits))}, which made the emulator count the unmasked probabilities once per "
            f"batch-head) recorded `p_flushed_mean` inflated by batch x query heads; the migration of the result "
            f"files (`scripts/migrate_rows.py`) divided it ({per}; each row keeps `p_flushed_mean_raw` and a "
            "`p_flushed_mean_note`).")
    if bad:
        notes.append(f"P flushed: {len(bad)} rows hold a value that is not a fraction; shown as nan "
                     f"({', '.join(sorted({_label(r) for r in bad})[:12])}).")
    return notes


def _label(row: dict[str, Any]) -> str:
    s = f"{row.get('model')}/{row.get('recipe')}/w{row.get('window')}"
    return s if row.get("layer") is None else f"{s}/layer {row['layer']}"


def stale_rows(rows: list[dict[str, Any]]) -> list[tuple[tuple, list[dict[str, Any]]]]:
    """[(change, rows)]: rows of recipes whose numerics changed (:data:`RECIPE_CHANGES`) after their process
    started (a row appears under each change it predates)."""
    starts = process_starts(rows)
    found: dict[tuple, list] = defaultdict(list)
    for r in rows:
        try:
            recipe = get_recipe(r.get("recipe"))
        except ValueError:
            continue
        start = starts.get(process_key(r), "9")
        for c in RECIPE_CHANGES:
            if c[3](recipe) and start < c[1]:
                found[c].append(r)
    return [(c, found[c]) for c in RECIPE_CHANGES if c in found]


def _labels(rows: list[dict[str, Any]]) -> str:
    """``model/recipe/wN`` of window rows; one ``model/recipe/wN per-layer sweep (k layers)`` per sweep."""
    win = sorted({_label(r) for r in rows if r.get("layer") is None})
    sweeps: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.get("layer") is not None:
            sweeps[f"{r.get('model')}/{r.get('recipe')}/w{r.get('window')}"] += 1
    return ", ".join([*win, *(f"{k} per-layer sweep ({n} layers)" for k, n in sorted(sweeps.items()))])


def dedup_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kept, superseded): one row per measurement key, the latest by date (then the later one in ``rows``)."""
    best: dict[tuple, tuple] = {}
    for i, r in enumerate(rows):
        k = row_key(r)
        cand = (row_date(r), i)
        if k not in best or cand >= best[k][0]:
            best[k] = (cand, r)
    keep_ids = {id(v[1]) for v in best.values()}
    return [r for r in rows if id(r) in keep_ids], [r for r in rows if id(r) not in keep_ids]


def prepare_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows a report shows and the notes it must carry: the migrated p_flushed values, repeated measurements merged
    (the latest kept), rows measured before a change to their recipe flagged."""
    rows = [r for r in rows if r.get("kind") in ("impact_window", "impact_layer")]
    notes = p_flushed_notes(rows)
    rows, old = dedup_rows(rows)
    if old:
        files = sorted({str(r.get("_file")) for r in old if r.get("_file")})
        notes.append(f"{len(old)} rows were measured again later (same model, recipe, window, layer, tokens and "
                     "text): the latest by date is shown"
                     + (f" (superseded rows from {', '.join(files)})" if files else "") + ".")
    for (commit, _when, what, _), stale in stale_rows(rows):
        notes.append(f"Measured before a recipe change: {_labels(stale)} were written by a process started before "
                     f"commit {commit} ({what}), so they measure the recipe as it was then (numbers shown as "
                     "recorded); measure them again (the later row is used) and drop these (`zyfa impact "
                     "--drop-rows`).")
    return rows, notes


def load_rows(paths: Iterable[str | Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, files) of several results files, e.g. one per concurrent process; each row tagged with ``_file``.

    ``files``: one dict per file (``label``, ``path``, ``sha256``, ``rows``). Pass the rows to
    :func:`section_blocks` or :func:`render_markdown`, which correct and merge them (:func:`prepare_rows`).
    """
    paths = [Path(p) for p in paths]
    names = [p.name for p in paths]
    rows, files = [], []
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"impact results not found: {p}")
        label = p.name if names.count(p.name) == 1 else str(p)
        got = read_rows(p)
        for r in got:
            r["_file"] = label
        rows += got
        files.append({"label": label, "path": str(p), "sha256": sha256_file(p), "rows": len(got)})
    return rows, files


# ------------------------------------------------------------------------------------------------- drop rows

def parse_drop_spec(spec: str) -> list[tuple[str, str, str, str]]:
    """``model:recipe:window[:layer],...`` -> patterns; ``*`` matches anything; layer: a number, ``none`` (the
    all-layer rows only) or ``*`` (the default: all-layer and per-layer rows)."""
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) not in (3, 4) or not all(parts):
            raise ValueError(f"--drop-rows: {item!r} is not model:recipe:window[:layer]")
        model, recipe, window = parts[:3]
        layer = parts[3] if len(parts) == 4 else "*"
        if window != "*" and not window.isdigit():
            raise ValueError(f"--drop-rows: window {window!r} in {item!r} is not a number or *")
        if layer not in ("*", "none") and not layer.isdigit():
            raise ValueError(f"--drop-rows: layer {layer!r} in {item!r} is not a number, none or *")
        if recipe != "*":
            recipe = get_recipe(recipe).name
        out.append((model, recipe, window, layer))
    if not out:
        raise ValueError("--drop-rows names no row")
    return out


def _drop_match(row: dict[str, Any], pat: tuple[str, str, str, str]) -> bool:
    model, recipe, window, layer = pat
    if row.get("kind") not in ("impact_window", "impact_layer"):
        return False
    lay = row.get("layer")
    return ((model == "*" or row.get("model") == model) and (recipe == "*" or row.get("recipe") == recipe)
            and (window == "*" or str(row.get("window")) == window)
            and (layer == "*" or (layer == "none" and lay is None) or (lay is not None and str(lay) == layer)))


def drop_rows(path: str | Path, patterns: list[tuple[str, str, str, str]] | str, *,
              reason: str | None = None) -> tuple[int, Path]:
    """Remove the rows matching ``patterns`` from a results JSONL file; returns (count, sidecar).

    The removed rows are appended, each with a ``dropped`` record (when, which spec, why, which commit), to
    ``<file>.dropped`` next to it (not a ``*.jsonl``, so globs over results files do not pick it up); every
    other line stays byte for byte. A later ``zyfa impact --resume`` with the same file measures exactly the
    dropped rows again. Do not drop from a file that a running ``zyfa impact`` appends to: the file is
    replaced atomically, and a change during the drop is detected and refused.
    """
    path = Path(path)
    spec = patterns if isinstance(patterns, str) else ",".join(":".join(p) for p in patterns)
    if isinstance(patterns, str):
        patterns = parse_drop_spec(patterns)
    before = path.stat()
    data = path.read_bytes()
    keep, dropped = [], []
    for line in data.decode("utf-8").splitlines(keepends=True):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and any(_drop_match(row, p) for p in patterns):
            dropped.append(row)
        else:
            keep.append(line if line.endswith("\n") else line + "\n")
    sidecar = path.with_name(path.name + ".dropped")
    if not dropped:
        return 0, sidecar
    commit = git_state().commit
    record = {"utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "spec": spec, "from": path.name, "git_commit": commit,
              "reason": reason}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(keep), encoding="utf-8")
    now = path.stat()
    if (now.st_size, now.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        tmp.unlink()
        raise RuntimeError(f"{path} changed while dropping rows (is a zyfa impact run writing to it?); nothing "
                           "was dropped")
    with sidecar.open("a", encoding="utf-8") as f:
        for row in dropped:
            f.write(json.dumps({**row, "dropped": record}, default=json_default) + "\n")
    os.replace(tmp, path)
    return len(dropped), sidecar
