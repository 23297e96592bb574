"""The flags of a length sweep (``zyfa cliffs``), from its rows alone: the rule that picks out NaN/Inf rows,
error jumps, refused and failed lengths (docs/CLIFFS.md), the one-line commands that reproduce a flag, and the
reading of sweep files, so a finished file can be re-rendered anywhere. The sweep that writes the rows is
:mod:`zyfa.accuracy.cliffs.sweep`.

Exposed:
    FLAG_KINDS
    CliffRule, find_flags(rows, rule=CliffRule()) -> list[dict];  flagged_rows(rows, rule) -> the rows they need
    reproducers(flag, provenance) -> {"cliffs": str, "accuracy": str | None}
    read_sweeps(paths) -> (rows, provenance)  sweep files (.jsonl or an unfinished .partial), several merged
    merge_provenance(provs, names) -> dict    the provenance of several sweeps as one
    finite_or_none(v) -> float | None         a metric value, None unless a finite number
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zyfa.accuracy.io.results_io import run_provenances
from zyfa.accuracy.io.schemas import read_rows

__all__ = ["FLAG_KINDS", "CliffRule", "find_flags", "finite_or_none", "flagged_rows", "merge_provenance",
           "read_sweeps", "reproducers"]

FLAG_KINDS = ("nonfinite", "jump", "refused", "failed")


def finite_or_none(v) -> float | None:
    """``v`` where it is a finite number, else None (a NaN, an infinity, a missing value)."""
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


# ---------------------------------------------------------------------------------------------- the flag rule

@dataclass(frozen=True)
class CliffRule:
    """The flag rule, per series (one implementation, mask and shape), on the error ``metric``:

    - ``nonfinite``: a row with ``nonfinite_rows`` > 0 (query rows with any NaN/Inf in the output);
    - ``jump``: an ok row with a finite error e(L) where at least ``min_neighbours`` ok rows with a finite error
      lie at lengths L' with 0 < |L' - L| <= ``half_window``, e(L) > ``factor`` x their median, and
      e(L) > ``floor`` (so noise at tiny errors, an FP32 recipe's, is not flagged);
    - ``refused``: the kernel refused the length (its input limits, or an exception inside it), with the reason;
    - ``failed``: the kernel's output was malformed or it did not load, with the error.
    """

    metric: str = "orig_rel_l2"
    factor: float = 3.0
    half_window: int = 16
    min_neighbours: int = 8
    floor: float = 1e-3

    def describe(self) -> str:
        return (f"{self.metric}(L) > {self.factor:g} x the median of {self.metric} at the lengths within "
                f"+-{self.half_window} of L (L itself excluded, at least {self.min_neighbours} such lengths "
                f"measured) and > {self.floor:g}")


def _series_key(row: dict) -> tuple:
    return (row.get("implementation"), row.get("mask"), row.get("shape"), row.get("head_dim"))


def find_flags(rows: Sequence[dict], rule: CliffRule = CliffRule()) -> list[dict]:
    """The flags of ``rows`` (sweep rows, any order; a series is one implementation, mask, shape and head dim),
    sorted by series, then length.

    Each flag: ``implementation``, ``impl_kind``, ``recipe``, ``mask``, ``shape``, ``chunk``, ``seq_q``, ``head_dim``,
    ``length``, ``kind`` (one of :data:`FLAG_KINDS`), ``error`` (the metric at L, None if not finite),
    ``neighbour_median``, ``ratio`` and ``n_neighbours`` (for jumps), ``nonfinite_rows``, ``reason``.
    """
    series: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        series.setdefault(_series_key(r), {})[int(r["length"])] = r
    flags = []
    for key in sorted(series, key=lambda k: tuple(str(x) for x in k)):
        by_len = series[key]
        lengths = sorted(by_len)
        err = {L: finite_or_none(by_len[L].get(rule.metric)) for L in lengths if by_len[L].get("status") == "ok"}
        err = {L: e for L, e in err.items() if e is not None}
        for L in lengths:
            r = by_len[L]
            base = {k: r.get(k) for k in ("implementation", "impl_kind", "recipe", "mask", "shape", "chunk", "seq_q",
                                          "head_dim")}
            base.update(length=L, error=err.get(L), neighbour_median=None, ratio=None, n_neighbours=None,
                        nonfinite_rows=r.get("nonfinite_rows"), reason=r.get("reason"))
            status = r.get("status")
            if status in ("refused", "failed"):
                flags.append({**base, "kind": status})
                continue
            if (r.get("nonfinite_rows") or 0) > 0:
                flags.append({**base, "kind": "nonfinite"})
                continue
            e = err.get(L)
            if e is None:
                continue
            near = [err[m] for m in err if m != L and abs(m - L) <= rule.half_window]
            if len(near) < rule.min_neighbours:
                continue
            med = statistics.median(near)
            if e > rule.factor * med and e > rule.floor:
                flags.append({**base, "kind": "jump", "neighbour_median": med,
                              "ratio": e / med if med > 0 else math.inf, "n_neighbours": len(near)})
    return flags


def flagged_rows(rows: Sequence[dict], rule: CliffRule = CliffRule()) -> list[dict]:
    """The rows :func:`find_flags` needs to find the same flags again: every flagged row, and the rows within
    ``rule.half_window`` of each jump (its neighbours), in their order in ``rows``. A small file for reports that
    table the flags of a large sweep (``zyfa cliffs --render ... --flagged-out``)."""
    keep: set[tuple] = set()
    for f in find_flags(rows, rule):
        span = rule.half_window if f["kind"] == "jump" else 0
        keep.update((f["implementation"], f["mask"], f["shape"], f.get("head_dim"), L)
                    for L in range(f["length"] - span, f["length"] + span + 1))
    return [r for r in rows if (*_series_key(r), int(r["length"])) in keep]


# ---------------------------------------------------------------------------------------------- reproducers

def _selector(flag: dict, command: str) -> list[str]:
    """The flags naming the flag's subject to ``zyfa cliffs`` or (``command="accuracy"``) ``zyfa accuracy``."""
    name, kind, recipe = flag["implementation"], flag.get("impl_kind"), flag.get("recipe")
    if kind == "recipe":
        return ["--recipes", name]
    lead = ["--recipes", "none"] if command == "accuracy" else []
    if kind == "plugin":
        spec = name[len("plugin:"):] if name.startswith("plugin:") else name
        return lead + ["--kernel", spec] + (["--kernel-recipe", recipe] if recipe else [])
    return lead + ["--implementations", name]


def _with_head_dim(args, flag: dict) -> list[str]:
    """``args`` with its ``--head-dim`` set to the flag's (rows of several head dims rendered together)."""
    args = list(args or [])
    if flag.get("head_dim") is not None and "--head-dim" in args:
        args[args.index("--head-dim") + 1] = str(flag["head_dim"])
    return args


def reproducers(flag: dict, provenance: dict) -> dict[str, str | None]:
    """One-line commands reproducing ``flag``: ``cliffs`` (``zyfa cliffs`` at the flagged length, or the
    +-half window around it for a jump, which the rule needs) and ``accuracy`` (``zyfa accuracy`` on the same
    input at that length, s_q = s_k only; None where it cannot express the point). Built from the provenance's
    ``repro_args`` / ``accuracy_args`` (the input's options, as the command line gave them)."""
    L = int(flag["length"])
    rule = provenance.get("rule") or {}
    half = int(rule.get("half_window", CliffRule.half_window))
    lengths = f"{max(1, L - half)}-{L + half}" if flag["kind"] == "jump" else str(L)
    cl = ["zyfa", "cliffs", *_with_head_dim(provenance.get("repro_args"), flag), "--lengths", lengths, "--mask",
          flag["mask"]]
    if flag["shape"] == "chunk":
        cl += ["--shapes", "chunk", "--chunk", str(flag.get("chunk"))]
    cl += _selector(flag, "cliffs")
    cl += ["--out", f"cliffs-L{L}"]
    acc = None
    base = provenance.get("accuracy_args")
    src = (provenance.get("input_source") or {})
    own_mask = "causal" if src.get("causal") else "none"
    expressible = flag["shape"] == "equal" and base is not None and (
        src.get("source") == "gaussian" or flag["mask"] == own_mask)
    if expressible:
        acc = ["zyfa", "accuracy", *_with_head_dim(base, flag)]
        acc += ["--seq", str(L)] if src.get("source") == "gaussian" else ["--max-tokens", str(L)]
        if flag["mask"] == "causal" and src.get("source") == "gaussian":
            acc.append("--causal")
        acc += _selector(flag, "accuracy")
        acc = shlex.join(acc)
    return {"cliffs": shlex.join(cl), "accuracy": acc}


# ---------------------------------------------------------------------------------------------- reading

def read_sweeps(paths, *, flag: str = "--render") -> tuple[list[dict], dict]:
    """(rows, provenance) of one or several sweep files (a list, or comma-separated): finished ``cliffs.jsonl``
    files or an unfinished run's ``cliffs.jsonl.partial``; several are merged (:func:`merge_provenance`).
    FileNotFoundError / ValueError (one line, naming ``flag``) for a missing file, a file that is not a sweep's,
    or no rows at all."""
    items = [p.strip() for p in paths.split(",")] if isinstance(paths, str) else [str(p) for p in paths]
    files = [Path(p) for p in items if p]
    if not files:
        raise ValueError(f"{flag} names no file")
    rows, provs = [], []
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(f"{flag}: no such file {path}")
        r, p = _read_partial(path) if path.name.endswith(".partial") else read_rows(path)
        if p.get("record_kind") != "cliffs":
            raise ValueError(f"{flag}: {path} is not a zyfa cliffs result file (its provenance is not a sweep's)")
        rows += r
        provs.append(p)
    if not rows:
        raise ValueError(f"{flag}: {', '.join(map(str, files))} holds no rows")
    return rows, merge_provenance(provs, [str(f) for f in files])


def _read_partial(path: Path) -> tuple[list[dict], dict]:
    """(rows, provenance) of an unfinished run's ``cliffs.jsonl.partial`` (its complete lines), so what a run cut
    short has measured can be rendered too; the provenance says ``partial: true``."""
    rows, prov = read_rows(path, partial=True)
    return rows, {**prov, "partial": True}


def merge_provenance(provs: list[dict], names: list[str]) -> dict:
    """One provenance for rows of several sweeps rendered together (``--render a.jsonl,b.jsonl``: e.g. one file
    per group of kernels run in parallel): the first's, with the subjects and the kernels not run of all, the
    lengths of each file where they differ, and ``merged_from``: one entry per run segment of each file (a resumed
    sweep has several)."""
    if len(provs) == 1:
        return provs[0]
    out = dict(provs[0])
    out["subjects"] = [s for p in provs for s in p.get("subjects") or []]
    out["implementations_unavailable"] = {k: v for p in provs for k, v in (p.get("implementations_unavailable")
                                                                          or {}).items()}
    specs = list(dict.fromkeys(p.get("lengths") for p in provs))
    if len(specs) > 1:
        out["lengths"] = "; ".join(
            f"{', '.join(s['name'] for s in p.get('subjects') or []) or '-'}: {p.get('lengths')}" for p in provs)
    out["merged_from"] = [{"file": n, "run_id": seg.get("run_id"), "date_utc": seg.get("date_utc"),
                           "partial": bool(p.get("partial")), "git_commit": seg.get("git_commit"),
                           "git_dirty": seg.get("git_dirty")}
                          for n, p in zip(names, provs, strict=True) for seg in run_provenances(p) or [p]]
    return out
