"""Aggregates of long-context rows: accuracy with intervals per cell and per length, the baseline exclusion, and
each implementation's paired difference from the FP32 baseline on the same prompts (torch-free).

Rules (docs/LONGCTX.md):

- The **baseline** is the first of :data:`BASELINES` present in the rows (``sdpa-fp32``: attention in fp32).
- A **cell** is (model, task, length, depth); its seeds are its samples. The baseline **retrieves** in a cell
  when its exact-match accuracy there is at least :data:`BASELINE_MIN` (half the seeds). Cells where it does not
  are kept out of every comparison and marked in the heatmaps.
- Accuracy is the fraction of prompts whose greedy answer is exact, with a 95% Wilson score interval.
- The paired difference is, per prompt, ``log p(answer | implementation) - log p(answer | baseline)``; its mean
  over the prompts of the retrieving cells of a length has a 95% bootstrap interval
  (:func:`zyfa.accuracy.scoring.metrics.bootstrap_ci`). The accuracy drop is the baseline's accuracy minus the
  implementation's on the same prompts.

Exposed: ``BASELINES``, ``BASELINE_MIN``, ``load_rows``, ``baseline_of``, ``wilson``, ``cell_table``,
``length_table``, ``retrieving_lengths``, ``accumulator_comparison``.
"""

from __future__ import annotations

import glob
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from zyfa.accuracy.io.schemas import read_rows
from zyfa.accuracy.scoring.metrics import bootstrap_ci

__all__ = ["BASELINES", "BASELINE_MIN", "accumulator_comparison", "baseline_of", "cell_table", "length_table",
           "load_rows", "retrieving_lengths", "wilson"]

BASELINES = ("sdpa-fp32", "fp32", "stock")
BASELINE_MIN = 0.5


def load_rows(spec: str | Sequence[str]) -> tuple[list[dict], list[dict]]:
    """(long-context rows, provenance records) of JSONL files: comma-separated paths or quoted globs. A row
    measured in several files counts once: the later file's (by the order given, globs sorted). Every line is
    checked by its schema (:func:`zyfa.accuracy.io.schemas.read_rows`)."""
    paths: list[str] = []
    for part in ([spec] if isinstance(spec, str) else list(spec)):
        for item in (p.strip() for p in str(part).split(",") if p.strip()):
            hits = sorted(glob.glob(item)) if any(c in item for c in "*?[") else [item]
            if not hits:
                raise FileNotFoundError(f"{item}: no such file")
            paths += hits
    by_key: dict[tuple, dict] = {}
    provs = []
    for p in paths:
        if not Path(p).is_file():
            cut = f"{p}.partial"
            raise FileNotFoundError(f"{p}: no such file" + (
                f"; {cut} holds the rows of a run that was cut: name it to render them (an interim report), or "
                "finish the run with --resume" if Path(cut).is_file() else ""))
        rows, prov = read_rows(p)  # every line checked by its schema: file:line: field: problem
        provs.append(prov)
        for r in rows:
            if r.get("kind") == "longctx":
                by_key[(r["input"], r.get("implementation"))] = r
    return list(by_key.values()), provs


def baseline_of(rows: Iterable[dict]) -> str | None:
    names = {r.get("implementation") for r in rows if r.get("status") == "ok"}
    return next((b for b in BASELINES if b in names), None)


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float, float]:
    """(k/n, low, high): the Wilson score interval of a proportion (NaNs for n = 0)."""
    if n <= 0:
        return math.nan, math.nan, math.nan
    p = k / n
    if k == n:  # the closed forms, free of rounding at the edges
        return 1.0, n / (n + z * z), 1.0
    if k == 0:
        return 0.0, 0.0, z * z / (n + z * z)
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return p, max(0.0, centre - half), min(1.0, centre + half)


def _ok(rows: Iterable[dict]) -> list[dict]:
    return [r for r in rows if r.get("status") == "ok" and r.get("exact") is not None]


def cell_table(rows: Sequence[dict], baseline: str | None = None) -> dict[tuple, dict]:
    """(model, task, length, depth, implementation) -> {n, exact, acc, low, high, baseline_ok}."""
    baseline = baseline or baseline_of(rows)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in _ok(rows):
        groups[(r["model"], r["task"], int(r["length"]), float(r["depth"]), r["implementation"])].append(r)
    base_ok = {}
    for (m, t, n, d, impl), rs in groups.items():
        if impl == baseline:
            base_ok[(m, t, n, d)] = sum(bool(r["exact"]) for r in rs) / len(rs) >= BASELINE_MIN
    out = {}
    for key, rs in groups.items():
        k = sum(bool(r["exact"]) for r in rs)
        acc, lo, hi = wilson(k, len(rs))
        out[key] = {"n": len(rs), "exact": k, "acc": acc, "low": lo, "high": hi,
                    "baseline_ok": base_ok.get(key[:4])}
    return out


def length_table(rows: Sequence[dict], baseline: str | None = None) -> dict[tuple, dict]:
    """(model, task, length, implementation) -> the comparison with the baseline on its retrieving cells:
    n prompts, acc (teacher-forced exact match, Wilson interval), base_acc, drop, dlogp (mean, low, high),
    op_rel_l2 (median of the measured layers' mean), the cells kept / all, and the generated answers' score where
    the rows have one (``gen_n`` prompts with a generated answer, ``gen_acc``: the fraction whose answer contains
    every part of the expected one, ``gen_contains``; NaN without)."""
    baseline = baseline or baseline_of(rows)
    cells = cell_table(rows, baseline)
    base_rows = {(r["model"], r["task"], int(r["length"]), float(r["depth"]), int(r["seed"])): r
                 for r in _ok(rows) if r.get("implementation") == baseline}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in _ok(rows):
        groups[(r["model"], r["task"], int(r["length"]), r["implementation"])].append(r)
    op: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r.get("kind") == "longctx" and r.get("op_rel_l2_mean") is not None:
            op[(r["model"], r["task"], int(r["length"]), r["implementation"])].append(float(r["op_rel_l2_mean"]))
    out = {}
    for (m, t, n, impl), rs in groups.items():
        kept = [r for r in rs if cells.get((m, t, n, float(r["depth"]), baseline), {}).get("baseline_ok")]
        all_cells = {float(r["depth"]) for r in rs}
        kept_cells = {float(r["depth"]) for r in kept}
        k = sum(bool(r["exact"]) for r in kept)
        acc, lo, hi = wilson(k, len(kept))
        pairs = [(r, base_rows.get((m, t, n, float(r["depth"]), int(r["seed"])))) for r in kept]
        pairs = [(r, b) for r, b in pairs if b is not None]
        base_acc = sum(bool(b["exact"]) for _, b in pairs) / len(pairs) if pairs else math.nan
        diffs = [r["answer_logprob"] - b["answer_logprob"] for r, b in pairs
                 if r.get("answer_logprob") is not None and b.get("answer_logprob") is not None]
        ci = bootstrap_ci(diffs) if diffs else None
        ops = sorted(op.get((m, t, n, impl), []))
        gen = [r["gen_contains"] for r in kept if isinstance(r.get("gen_contains"), bool)]
        out[(m, t, n, impl)] = {
            "n": len(kept), "acc": acc, "low": lo, "high": hi, "base_acc": base_acc,
            "drop": (base_acc - acc) if pairs else math.nan,
            "dlogp": ci.estimate if ci else math.nan, "dlogp_low": ci.low if ci else math.nan,
            "dlogp_high": ci.high if ci else math.nan,
            "op_rel_l2": ops[len(ops) // 2] if ops else None,
            "cells_kept": len(kept_cells), "cells": len(all_cells),
            "acc_all": wilson(sum(bool(r["exact"]) for r in rs), len(rs))[0],
            "gen_n": len(gen), "gen_acc": sum(gen) / len(gen) if gen else math.nan,
        }
    return out


def retrieving_lengths(rows: Sequence[dict], baseline: str | None = None) -> dict[tuple, list[int]]:
    """(model, task) -> the lengths at which the baseline retrieves in at least half of the depths' cells."""
    baseline = baseline or baseline_of(rows)
    cells = cell_table(rows, baseline)
    per: dict[tuple, list[bool]] = defaultdict(list)
    for (m, t, n, _d, impl), c in cells.items():
        if impl == baseline:
            per[(m, t, n)].append(bool(c["baseline_ok"]))
    out: dict[tuple, list[int]] = defaultdict(list)
    for (m, t, n), oks in sorted(per.items()):
        if sum(oks) * 2 >= len(oks):
            out[(m, t)].append(n)
    return dict(out)


def accumulator_comparison(rows: Sequence[dict], groups: dict[str, str], never: str, others: Sequence[str],
                           baseline: str | None = None) -> dict[tuple, dict]:
    """(model, task, length) -> the accumulator hypothesis tested on the baseline's retrieving cells, paired per
    prompt: each class's accuracy (the mean over its implementations, per prompt, then over the prompts) and mean
    Δ log p against the baseline, and the per-prompt difference ``never - other`` for each of ``others`` with a
    95% bootstrap interval. ``groups``: implementation -> class; the classes ``never`` and ``others`` are compared,
    on the prompts every compared class has rows for.

    Returns per key: ``n`` prompts, ``base_acc``, ``classes`` {class: {acc, dlogp, impls: {impl: acc}}}, and
    ``diffs`` {other: {acc: (est, low, high), dlogp: (est, low, high)}}."""
    baseline = baseline or baseline_of(rows)
    cells = cell_table(rows, baseline)
    ok = _ok(rows)
    base = {(r["model"], r["task"], int(r["length"]), float(r["depth"]), int(r["seed"])): r
            for r in ok if r.get("implementation") == baseline}
    wanted = [never, *others]
    per: dict[tuple, dict[str, dict[tuple, list[tuple[float, float | None]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    impl_rows: dict[tuple, dict[str, dict[str, list[bool]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for r in ok:
        g = groups.get(r.get("implementation"))
        if g not in wanted:
            continue
        m, t, n, d, s = r["model"], r["task"], int(r["length"]), float(r["depth"]), int(r["seed"])
        b = base.get((m, t, n, d, s))
        if b is None or not cells.get((m, t, n, d, baseline), {}).get("baseline_ok"):
            continue
        dl = (r["answer_logprob"] - b["answer_logprob"]
              if r.get("answer_logprob") is not None and b.get("answer_logprob") is not None else None)
        per[(m, t, n)][g][(d, s)].append((float(bool(r["exact"])), dl))
        impl_rows[(m, t, n)][g][r["implementation"]].append(bool(r["exact"]))
    out = {}
    for key, by_class in sorted(per.items()):
        if any(c not in by_class for c in wanted):
            continue
        prompts = sorted(set.intersection(*(set(by_class[c]) for c in wanted)))
        if not prompts:
            continue

        acc = {c: [_mean_at(by_class[c][p], 0) for p in prompts] for c in wanted}
        dlp = {c: [_mean_at(by_class[c][p], 1) for p in prompts] for c in wanted}
        m, t, n = key
        base_acc = sum(bool(base[(m, t, n, d, s)]["exact"]) for d, s in prompts) / len(prompts)
        classes = {c: {"acc": sum(acc[c]) / len(prompts), "dlogp": _nanmean(dlp[c]),
                       "impls": {i: sum(v) / len(v) for i, v in sorted(impl_rows[key][c].items())}} for c in wanted}
        diffs = {}
        for o in others:
            da = [a - b for a, b in zip(acc[never], acc[o], strict=True)]
            dd = [a - b for a, b in zip(dlp[never], dlp[o], strict=True) if not (math.isnan(a) or math.isnan(b))]
            ca = bootstrap_ci(da)
            cd = bootstrap_ci(dd) if dd else None
            diffs[o] = {"acc": (ca.estimate, ca.low, ca.high),
                        "dlogp": (cd.estimate, cd.low, cd.high) if cd else (math.nan, math.nan, math.nan)}
        out[key] = {"n": len(prompts), "base_acc": base_acc, "classes": classes, "diffs": diffs}
    return out


def _mean_at(pairs: Sequence[tuple[float, float | None]], i: int) -> float:
    return _nanmean([v[i] for v in pairs if v[i] is not None])


def _nanmean(xs: Sequence[float]) -> float:
    vals = [x for x in xs if not math.isnan(x)]
    return sum(vals) / len(vals) if vals else math.nan
