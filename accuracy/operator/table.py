"""What ``zyfa accuracy`` prints: the run's header and table (one line per row, or per recipe over the inputs),
the lines on NaN, refused, failed and unavailable rows, and each implementation's verdict with the exit status it
makes.

Exposed: ``format_table(rows, columns, *, per_input)``, ``print_report(rows, prov, inputs, columns, args)``,
``row_label(row)``, ``failed_rows_status(rows, command, *, allow)``, ``EXIT_FAILED_ROWS``, ``FAILED_STATUSES``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from zyfa.accuracy.io.results_io import run_provenances
from zyfa.accuracy.report.blocks import fmt
from zyfa.accuracy.scoring.kernel_verdicts import verdict_lines

__all__ = ["EXIT_FAILED_ROWS", "FAILED_STATUSES", "failed_rows_status", "format_table", "print_report", "row_label"]

# Exit status of a run that wrote everything but has failed or nonconforming rows (--allow-failed: 0).
EXIT_FAILED_ROWS = 3
# Real-kernel row statuses that count as failures for the exit status.
FAILED_STATUSES = ("failed", "nonconforming")


def row_label(row: dict) -> str:
    """A row's name in tables: the implementation's for a real kernel, else the recipe's."""
    return row.get("implementation") or row["recipe"]


def _commit(prov: dict) -> str:
    return (prov.get("git_commit") or "no git")[:10] + ("+dirty" if prov.get("git_dirty") else "")


def print_report(rows, prov: dict, inputs, columns, args) -> None:
    print(f"zyfa accuracy  run {prov.get('run_id')}  zyfa {prov.get('zyfa_version')} @ {_commit(prov)}  "
          f"torch {prov.get('torch')}  device {prov.get('device')} ({prov.get('device_name')})")
    earlier = run_provenances(prov)[:-1]  # a resumed run: the runs that made the rows before it
    if earlier:
        print("resumed from: " + "; ".join(f"run {p.get('run_id')} @ {_commit(p)}, device {p.get('device')} "
                                          f"({p.get('device_name')}), {p.get('date_utc')}" for p in earlier))
    names = [inp.name for inp in inputs]
    print("input: " + (names[0] if len(names) == 1 else f"{len(names)} inputs ({names[0]}, ..., {names[-1]})"))
    print()
    if any(r.get("real") for r in rows):  # real kernels: their error over their emulation's, and status
        columns = [*columns, *(c for c in ("real_emu_ratio", "real_vs_emu_rel_l2", "status") if c not in columns)]
    print(format_table(rows, columns, per_input=args.per_input or len(inputs) == 1))
    print()
    print("deq_: vs FP64 on the dequantized inputs the recipe saw (its arithmetic); "
          "orig_: vs FP64 on the original inputs (adds Q/K/V quantization).")
    nan_recipes = sorted({row_label(r) for r in rows if r.get("has_nan")})
    if nan_recipes:
        print(f"NaN/Inf in the output of: {', '.join(nan_recipes)}")
    for r in rows:
        if not r.get("real") and r.get("status") == "refused":
            print(f"refused: {r['recipe']} on {r['input']}: {r['reason']}")
        if r.get("real") and r.get("status") in ("failed", "unsupported", "nonconforming", "suspect"):
            print(f"{r['status']}: {r['implementation']} on {r['input']}: {r.get('error') or r.get('reason')}")
    for w in (prov.get("implementations_pairing_warnings") or {}).values():
        print(f"warning: {w}")
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.implementations.base import unavailable_lines

    for line in unavailable_lines(prov.get("implementations_unavailable") or {}):
        print(line)


def failed_rows_status(rows: Sequence[dict], command: str, *, allow: bool) -> int:
    """The exit status of a finished run, after its verdicts on stderr (one line per implementation that is not
    a clean ``ok`` with its reason, then the clean ones: :func:`zyfa.accuracy.scoring.kernel_verdicts.verdict_lines`):
    :data:`EXIT_FAILED_ROWS` when rows failed (``status`` in :data:`FAILED_STATUSES`), unless ``allow``
    (``--allow-failed``); else 0."""
    for line in verdict_lines(rows):
        print(f"{command}: {line}", file=sys.stderr)
    bad = [r for r in rows if r.get("status") in FAILED_STATUSES]
    if not bad:
        return 0
    kinds = ", ".join(f"{sum(r.get('status') == s for r in bad)} {s}" for s in FAILED_STATUSES
                      if any(r.get("status") == s for r in bad))
    if allow:
        print(f"{command}: {len(bad)} of {len(rows)} rows failed ({kinds}); exit 0 (--allow-failed)",
              file=sys.stderr)
        return 0
    print(f"{command}: {len(bad)} of {len(rows)} rows failed ({kinds}); every row was written; exit "
          f"{EXIT_FAILED_ROWS} (--allow-failed: 0)", file=sys.stderr)
    return EXIT_FAILED_ROWS


# ---------------------------------------------------------------------------------------------- table

# the printed table's number format by a column's suffix (a kind of report.blocks.fmt); others: errors, ".3e"
_COLUMN_KINDS = (("_db", "db"), ("_ratio", ".4f"), ("cosine", "cos"), ("_s", ".2f"), ("_frac", ".3g"))


def _fmt(col: str, v) -> str:
    """One cell of the printed table in the reports' one number format; an integer count as it is."""
    kind = next((k for suffix, k in _COLUMN_KINDS if col.endswith(suffix)), None)
    if kind is None and isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return fmt(v, kind or "err")


def _aggregate(rows: list[dict], col: str):
    vals = [r.get(col) for r in rows if r.get(col) is not None]
    if not vals:
        return None
    if all(isinstance(v, bool) for v in vals):
        return any(vals)
    if any(isinstance(v, str) for v in vals):
        return vals[0] if len(set(vals)) == 1 else "mixed"
    if col.endswith("_max") or "max_abs" in col:
        return max(vals)
    if col.startswith("time_"):
        return sum(vals)
    return sum(vals) / len(vals)


def format_table(rows: Sequence[dict], columns: Sequence[str], *, per_input: bool = True) -> str:
    """A Markdown (GitHub) table, recipes in the order run: one line per row, or per recipe aggregated over
    the inputs (mean; max for maxima; sum for times)."""
    if per_input:
        lead = ["recipe"] + (["input"] if len({r["input"] for r in rows}) > 1 else [])
        body = [[row_label(r)] + ([r["input"]] if len(lead) > 1 else []) + [_fmt(c, r.get(c)) for c in columns]
                for r in rows]
    else:
        lead = ["recipe", "inputs"]
        order = list(dict.fromkeys(row_label(r) for r in rows))
        body = []
        for name in order:
            group = [r for r in rows if row_label(r) == name]
            body.append([name, str(len(group))] + [_fmt(c, _aggregate(group, c)) for c in columns])
    header = lead + list(columns)
    widths = [max(len(header[i]), *(len(b[i]) for b in body)) for i in range(len(header))]
    n_lead = len(lead)

    def line(cells):
        return "| " + " | ".join(c.ljust(w) if i < n_lead else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))) + " |"

    sep = "|" + "|".join(("-" * (w + 2)) if i < n_lead else ("-" * (w + 1) + ":")
                         for i, w in enumerate(widths)) + "|"
    out = [line(header), sep, *(line(b) for b in body)]
    if not per_input:
        out.append("(per recipe: mean over inputs; max for maxima; sum for times)")
    return "\n".join(out)
