"""The accuracy runner: inputs × recipes → result rows, each recipe's error against two FP64 references.

For every input and recipe, :func:`zyfa.emulator.emulate` runs the recipe and the FP64 oracle
(:func:`reference.attention.attention_fp64`) gives two references:

- ``deq_*`` metrics: against the oracle on the *dequantized* inputs the recipe saw (``Emulation.q_deq`` …):
  the error the kernel's own arithmetic adds (P rounding, row sums, accumulation, output rounding);
- ``orig_*`` metrics: against the oracle on the *original* inputs: the total error a user sees, including
  the quantization of Q, K and V.

The original reference is computed once per input; the dequantized one once per distinct quantization of
the inputs (recipes that quantize Q/K/V alike share it; a shared reference is checked to be for
bit-identical dequantized inputs before reuse, and one whose inputs equal the originals reuses the
original reference).

Exposed:
    run_accuracy(inputs, recipes, *, device="cpu", progress=True, seed=0) -> ResultRows
    write_results(rows, path, provenance=None)   .jsonl (provenance header record) or .csv (+ sidecar)
    read_results(path) -> ResultRows
    ResultRows: a list of flat dict rows with ``.provenance`` (dict) and ``.run_id``
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from accuracy.inputs import AttentionInput
from accuracy.metrics import compute_metrics
from accuracy.provenance import device_name, provenance
from accuracy.results_io import read_jsonl
from reference.attention import attention_fp64
from zyfa.emulator import emulate
from zyfa.recipes import Recipe, get_recipe

__all__ = ["QUANT_FIELDS", "ResultRows", "read_results", "resolve_device", "run_accuracy", "write_results"]

# Recipe fields that decide the dequantized inputs a kernel sees: recipes equal on these share a reference.
QUANT_FIELDS = ("q_format", "k_format", "v_format", "q_scale", "k_scale", "v_scale", "scale_block_q",
                "scale_block_kv", "k_smoothing")
# Per-metric keys of compute_metrics that describe the output, not the reference: kept once, unprefixed.
_UNPREFIXED = ("has_nan", "nonfinite_frac", "n_rows", "n_zero_ref_rows")


class ResultRows(list):
    """Result rows (flat dicts) plus the run's provenance record."""

    def __init__(self, rows: Iterable[dict] = (), provenance: dict | None = None):
        super().__init__(rows)
        self.provenance: dict = dict(provenance or {})

    @property
    def run_id(self) -> str | None:
        return self.provenance.get("run_id")


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto" -> cuda when available else cpu; "cuda" without a GPU -> ValueError."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA device is available (use --device cpu or auto)")
    return dev


def run_accuracy(
    inputs: AttentionInput | Sequence[AttentionInput],
    recipes: Recipe | str | Sequence[Recipe | str],
    *,
    device: str | torch.device = "cpu",
    progress: bool = True,
    seed: int = 0,
    chunk_size: int = 1024,
) -> ResultRows:
    """Run every recipe on every input; one flat row per (input, recipe), in that order.

    Args:
        inputs: attention inputs (:mod:`accuracy.inputs`).
        recipes: recipe names or :class:`~zyfa.recipes.Recipe` objects.
        device: "cpu", "cuda" or "auto"; the emulator and the oracle both run there.
        progress: a tqdm bar over (input × recipe) on stderr.
        seed: seeds torch's global generator before the run (the emulator is deterministic; recorded).
        chunk_size: query rows per block of the FP64 oracle.

    Returns:
        :class:`ResultRows`; each row holds ``run_id``, the input's name, shape and metadata (``input_*``),
        the recipe's name and ``recipe_short``, ``has_nan``, the ``deq_*`` and ``orig_*`` metrics, the
        emulator's stats (e.g. ``p_flushed_frac``) and wall times in seconds.
    """
    inputs = [inputs] if isinstance(inputs, AttentionInput) else list(inputs)
    recipes = [get_recipe(recipes)] if isinstance(recipes, (str, Recipe)) else [get_recipe(r) for r in recipes]
    if not inputs:
        raise ValueError("no inputs given")
    if not recipes:
        raise ValueError("no recipes given")
    dev = resolve_device(device)
    torch.manual_seed(seed)
    run_id = uuid.uuid4().hex[:12]
    prov = provenance({
        "run_id": run_id,
        "device": str(dev),
        "device_name": device_name(dev),
        "seed": seed,
        "recipes": [r.name for r in recipes],
        "inputs": [inp.name for inp in inputs],
    })
    rows = ResultRows(provenance=prov)
    bar = _progress(len(inputs) * len(recipes), enabled=progress)
    try:
        for inp in inputs:
            rows.extend(_run_input(inp, recipes, dev, run_id, chunk_size, bar))
    finally:
        bar.close()
    return rows


def _run_input(inp: AttentionInput, recipes: list[Recipe], dev: torch.device, run_id: str, chunk_size: int,
               bar) -> list[dict]:
    x = inp.to(dev)
    kw = {"causal": x.causal, "sm_scale": x.sm_scale, "window": x.window}
    t0 = time.perf_counter()
    ref_orig = attention_fp64(x.q, x.k, x.v, chunk_size=chunk_size, **kw)
    time_ref_orig = time.perf_counter() - t0
    orig32 = tuple(t.float() for t in (x.q, x.k, x.v))
    # quantization key -> (q_deq, k_deq, v_deq, (out, lse)); cleared per input
    cache: dict[tuple, tuple] = {}
    base = _input_fields(inp)
    rows = []
    for recipe in recipes:
        bar.set_postfix_str(f"{inp.name} {recipe.name}")
        t0 = time.perf_counter()
        em = emulate(x.q, x.k, x.v, recipe, **kw)
        _sync(dev)
        time_emulate = time.perf_counter() - t0

        deq = (em.q_deq, em.k_deq, em.v_deq)
        key = tuple(getattr(recipe, f) for f in QUANT_FIELDS)
        t0 = time.perf_counter()
        if all(torch.equal(a, b) for a, b in zip(deq, orig32, strict=True)):
            ref_deq, ref_deq_source = ref_orig, "orig"  # no quantization: the same FP64 problem
        elif key in cache and all(torch.equal(a, b) for a, b in zip(deq, cache[key][:3], strict=True)):
            ref_deq, ref_deq_source = cache[key][3], "shared"
        else:
            ref_deq = attention_fp64(*deq, chunk_size=chunk_size, **kw)
            cache[key] = (*deq, ref_deq)
            ref_deq_source = "computed"
        time_ref_deq = time.perf_counter() - t0

        m_deq = compute_metrics(em.out, ref_deq[0], lse=em.lse, lse_ref=ref_deq[1])
        m_orig = compute_metrics(em.out, ref_orig[0], lse=em.lse, lse_ref=ref_orig[1])
        row: dict[str, Any] = {"run_id": run_id, **base, "recipe": recipe.name, "recipe_short": recipe.short_str()}
        for k in _UNPREFIXED:
            row[k] = m_deq[k]
        row["has_nan"] = bool(m_deq["has_nan"] or m_orig["has_nan"])
        for prefix, m in (("deq_", m_deq), ("orig_", m_orig)):
            row.update({prefix + k: v for k, v in m.items() if k not in _UNPREFIXED})
        for k, v in em.stats.items():
            row[k if k not in row else f"emu_{k}"] = _plain(v)
        row.update({
            "ref_deq_source": ref_deq_source,
            "time_emulate_s": time_emulate,
            "time_ref_deq_s": time_ref_deq,
            "time_ref_orig_s": time_ref_orig,
            "device": str(dev),
        })
        rows.append(row)
        bar.update(1)
    return rows


def _input_fields(inp: AttentionInput) -> dict[str, Any]:
    fields: dict[str, Any] = {"input": inp.name, **inp.shape, "causal": bool(inp.causal), "window": inp.window,
                              "sm_scale": inp.sm_scale if inp.sm_scale is not None
                              else 1.0 / math.sqrt(inp.shape["head_dim"]),
                              "dtype": str(inp.q.dtype).replace("torch.", "")}
    fields.update(_flatten(inp.meta, "input_"))
    return fields


def _flatten(d: dict, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}_"))
        else:
            out[f"{prefix}{k}"] = _plain(v)
    return out


def _plain(v):
    """Python scalars/lists for JSON (tensors and numpy scalars converted)."""
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict, str)):
        return v.item()
    if isinstance(v, tuple):
        return list(v)
    return v


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class _NoBar:
    def set_postfix_str(self, *a, **k):
        pass

    def update(self, n=1):
        pass

    def close(self):
        pass


def _progress(total: int, *, enabled: bool):
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, file=sys.stderr, unit="run", desc="accuracy", dynamic_ncols=True)


# ---------------------------------------------------------------------------------------------- result files

def _sidecar(path: Path) -> Path:
    return path.with_suffix(".provenance.json")


def write_results(rows: Sequence[dict], path: str | Path, provenance: dict | None = None) -> Path:
    """Write rows as JSONL (first line: ``{"record": "provenance", ...}``) or CSV (+ ``.provenance.json``).

    Floats are written as numbers (JSON: non-finite ones as ``NaN``/``Infinity``, which Python's json and
    pandas read; CSV: ``nan``/``inf``). The CSV sidecar also records each column's type so that
    :func:`read_results` restores them exactly.
    """
    path = Path(path)
    prov = provenance if provenance is not None else getattr(rows, "provenance", {})
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise ValueError(f"result file must end in .jsonl or .csv, got {path.name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".jsonl":
        with open(path, "w") as f:
            f.write(json.dumps({"record": "provenance", **prov}) + "\n")
            for row in rows:
                f.write(json.dumps(row) + "\n")
        return path
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    types = {c: _column_type([row.get(c) for row in rows]) for c in columns}
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for row in rows:
            w.writerow([_cell(row.get(c)) for c in columns])
    _sidecar(path).write_text(json.dumps({"provenance": prov, "columns": types}, indent=1) + "\n")
    return path


def _column_type(values: list) -> str:
    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return "str"
    if kinds == {bool}:
        return "bool"
    if kinds == {int}:
        return "int"
    if kinds <= {int, float}:
        return "float"
    if kinds == {str}:
        return "str"
    return "json"


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)  # shortest round-trip form; nan, inf, -inf
    if isinstance(v, (int, str)):
        return str(v)
    return json.dumps(v)


def _parse(cell: str, kind: str | None):
    if kind == "str":
        return cell if cell != "" else None
    if cell == "":
        return None
    if kind == "bool":
        return cell.lower() == "true"
    if kind == "int":
        return int(cell)
    if kind == "float":
        return float(cell)
    if kind == "json":
        try:
            return json.loads(cell)
        except json.JSONDecodeError:
            return cell
    # no sidecar: best guess
    if cell.lower() in ("true", "false"):
        return cell.lower() == "true"
    for conv in (int, float):
        try:
            return conv(cell)
        except ValueError:
            pass
    return cell


def read_results(path: str | Path) -> ResultRows:
    """Rows and provenance from a file written by :func:`write_results`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"result file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return ResultRows(*read_jsonl(path))
    if suffix == ".csv":
        side = _sidecar(path)
        meta = json.loads(side.read_text()) if side.is_file() else {}
        types = meta.get("columns", {})
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows = [{k: _parse(v, types.get(k)) for k, v in r.items()} for r in reader]
        return ResultRows(rows, meta.get("provenance", {}))
    raise ValueError(f"result file must end in .jsonl or .csv, got {path.name!r}")
