"""``zyfa longctx`` records its --dry-run estimate beside its measured time (accuracy/io/cost_model.py): one record per
run, a resumed run adding its own over the rows it made, and scripts/fit_cost_model.py fits the rate from them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from zyfa.accuracy.io.cost_model import rate, records_in_file
from zyfa.accuracy.longctx.cli import cell_cost

from zyfa.cli import main

ROOT = Path(__file__).resolve().parents[2]
ARGV = ["longctx", "--models", "smollm2", "--tasks", "passkey", "--lengths", "128", "--depths", "0.5", "--seeds", "1",
        "--no-progress", "--device", "cpu"]


@pytest.fixture
def session_model(monkeypatch, smollm2):
    import zyfa.capture.models

    monkeypatch.setattr(zyfa.capture.models, "load_model", lambda name, **kw: smollm2)


def test_each_run_records_the_units_of_its_rows_beside_its_time(session_model, tmp_path):
    out = tmp_path / "r.jsonl"
    assert main([*ARGV, "--implementations", "stock", "--out", str(out)]) == 0
    assert main([*ARGV, "--implementations", "stock,zyfa", "--out", str(out), "--resume"]) == 0
    rows = [r for r in map(json.loads, out.read_text().splitlines()) if r.get("kind") == "longctx"]
    assert [r["implementation"] for r in rows] == ["stock", "zyfa"]
    first, second = records_in_file(out)
    for rec in (first, second):  # one row each: the first run's stock row, the resumed run's zyfa row
        assert rec["command"] == "longctx" and rec["device_type"] == "cpu" and rec["cells"] == 1
        assert rec["units"] == cell_cost(rows[0]["length"], 1) == 128 * (128 + 2048)
        assert rec["units_per_second"] == rate("longctx", "cpu")
        assert rec["estimate_s"] == pytest.approx(rec["units"] / rate("longctx", "cpu"), abs=1e-3)
        assert 0 < rec["measured_s"] < 600
    assert first["work"] == {"prompts": 1, "tokens": 128, "models": ["smollm2"], "implementations": ["stock"]}
    assert second["work"] == {**first["work"], "implementations": ["stock", "zyfa"]}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_cost_model.py"), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| longctx | cpu | 2 |" in done.stdout and 'RATES["longctx"]["cpu"] = ' in done.stdout


def test_a_stopped_run_writes_no_record_and_its_resume_records_only_its_own_rows(session_model, tmp_path):
    out = tmp_path / "r.jsonl"
    argv = [*ARGV, "--implementations", "stock,zyfa", "--out", str(out), "--batch-tokens", "128"]
    assert main([*argv, "--max-seconds", "0.001"]) == 0  # one batch (one prompt), then it stops
    assert records_in_file(out.with_name("r.jsonl.partial")) == []
    assert main([*argv, "--resume"]) == 0
    (rec,) = records_in_file(out)
    assert rec["cells"] == 1 and rec["work"]["prompts"] == 1
