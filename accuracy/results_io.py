"""Reading JSONL result files without torch (the report generator reads results, never runs kernels)."""

from __future__ import annotations

import json
from pathlib import Path


def read_jsonl(path: str | Path) -> tuple[list[dict], dict]:
    """(rows, provenance) of a JSONL result file: its first ``{"record": "provenance"}`` line is the provenance."""
    rows, prov = [], {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
            if obj.get("record") == "provenance":
                prov = prov or {k: v for k, v in obj.items() if k != "record"}
            else:
                rows.append(obj)
    return rows, prov
