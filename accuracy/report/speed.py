"""The speed section of the report, from ``zyfa bench`` JSON files: a TFLOP/s pivot by implementation and the bench
table's every-row section, whose cells come from the bench's own renderer (:func:`zyfa.bench.table.row_cells`), so
the report and ``bench.md`` show a row alike."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from zyfa.accuracy.report.blocks import fmt
from zyfa.accuracy.report.document import Doc

from zyfa.bench.table import ROW_HEADER, checked_rows, row_cells


def load_bench(paths: Sequence[str | Path]) -> list[tuple[str, dict, list[dict]]]:
    """(file name, metadata, rows) of each benchmark JSON (``zyfa bench``: ``{"meta": {...}, "rows": [...]}``;
    a bare list of rows is accepted too)."""
    out = []
    for p in paths:
        path = Path(p)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e.msg})") from None
        meta: dict = {}
        if isinstance(data, dict):
            rows = next((data[k] for k in ("rows", "results") if isinstance(data.get(k), list)), None)
            for k in ("meta", "provenance"):
                if isinstance(data.get(k), dict):
                    meta.update(data[k])
            if rows is None:
                raise ValueError(f"{path}: no 'rows' list in the benchmark JSON")
        elif isinstance(data, list):
            rows = data
        else:
            raise ValueError(f"{path}: benchmark JSON must be a list of rows or an object holding one")
        out.append((path.name, meta, [r for r in rows if isinstance(r, dict)]))
    return out


def bench_label(r: dict) -> str:
    impl, rec = r.get("impl") or r.get("kernel") or "", r.get("recipe") or ""
    return f"{impl} {rec}".strip() if rec and rec != impl else str(impl or rec)


def _has_tflops_table(rows: list[dict]) -> bool:
    """Whether a bench file's rows make the TFLOP/s-by-implementation table (rows with a time and a name)."""
    ok = [r for r in rows if "error" not in r and r.get("tflops") is not None]
    return bool(ok) and any(k in r for r in ok for k in ("input", "h", "h_kv", "d_qk", "d_v", "s", "causal")) \
        and any(("impl" in r or "kernel" in r) for r in ok)


def speed_anchor(bench: list) -> str | None:
    """The anchor of the first table :func:`section_speed` writes (the first file's TFLOP/s table, else its rows),
    for a link to the speed results; None without benchmark files (the report then has no speed table)."""
    if not bench:
        return None
    return "t-bench-0-tflops" if _has_tflops_table(bench[0][2]) else "t-bench-0"


def section_speed(doc: Doc, bench: list) -> None:
    doc.h(2, "Speed")
    if not bench:
        doc.p("No benchmark results given (`zyfa bench` on a GPU writes `reports/bench/bench_<date>.json`; pass it "
              "with `--bench`). Technique 2 of ZYFA (ping-pong) acts on speed only and is measured there.")
        return
    doc.p("From the benchmark files as written by `zyfa bench` (values as recorded: TFLOP/s = FLOPs / median "
          "kernel time, FLOPs = 4·b·h·s²·d, 2·(d_qk+d_v) for MLA, halved for causal; SM clock and power: means "
          "during the timed run). Technique 2 of ZYFA (ping-pong) acts on speed only.")
    for i, (name, meta, rows) in enumerate(bench):
        info = []
        for k in ("device", "date", "git_commit", "command", "inputs_note"):
            if meta.get(k):
                info.append(f"{k}: `{meta[k]}`" if k == "command" else f"{k}: {meta[k]}")
        if isinstance(meta.get("versions"), dict):
            info.append("versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()))
        doc.p(f"**{name}**" + ("; " + "; ".join(info) if info else ""))
        rows = checked_rows(rows)  # a row in an older form refused, as the bench's Markdown does
        ok = [r for r in rows if "error" not in r and r.get("tflops") is not None]
        shape_keys = [k for k in ("input", "h", "h_kv", "d_qk", "d_v", "s", "causal") if any(k in r for r in ok)]
        if _has_tflops_table(rows):
            labels = list(dict.fromkeys(bench_label(r) for r in ok))
            cases = list(dict.fromkeys(tuple(r.get(k) for k in shape_keys) for r in ok))
            val = {(tuple(r.get(k) for k in shape_keys), bench_label(r)): r["tflops"] for r in ok}
            doc.p("TFLOP/s by implementation, one row per input shape (same run):")
            body = [[*(fmt(v, "num") for v in case), *(fmt(val.get((case, lab)), "num") for lab in labels)]
                    for case in cases]
            doc.table(f"t-bench-{i}-tflops", [*shape_keys, *labels], body)
        try:
            body = [row_cells(r) for r in rows]
        except KeyError as e:
            doc.p(f"Every benchmark row: left out, a row has no {e.args[0]!r} field (not a `zyfa bench` file).")
            continue
        doc.p("Every benchmark row (as in the bench's own Markdown):")
        doc.table(f"t-bench-{i}", list(ROW_HEADER), body)
