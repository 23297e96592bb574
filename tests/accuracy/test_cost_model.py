"""The --dry-run cost model beside measured runs: each run records its estimate and its time, and
scripts/fit_cost_model.py fits the rate from the records."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from zyfa.accuracy.io.cost_model import PROVENANCE_KEY, fit, record, records_of
from zyfa.accuracy.io.shard import UNITS_PER_SECOND
from zyfa.accuracy.operator.cli import cell_cost, read_provenance

from zyfa.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_records_its_estimate_beside_its_time_and_a_resume_adds_one(tmp_path):
    out = tmp_path / "r.jsonl"
    argv = ["accuracy", "--seq", "48", "--heads", "2", "--head-dim", "64", "--device", "cpu", "--no-progress",
            "--out", str(out)]
    assert main([*argv, "--recipes", "bf16,zyfa"]) == 0
    (rec,) = records_of(read_provenance(out))
    units = 2 * cell_cost({"batch": 1, "heads_q": 2, "seq_q": 48, "seq_k": 48, "head_dim": 64, "head_dim_v": 64})
    assert rec["command"] == "accuracy" and rec["device_type"] == "cpu" and rec["cells"] == 2
    assert rec["units"] == units
    assert rec["units_per_second"] == UNITS_PER_SECOND["cpu"]
    assert rec["estimate_s"] == pytest.approx(units / UNITS_PER_SECOND["cpu"], abs=1e-3)
    assert 0 < rec["measured_s"] < 600
    assert rec["cpu_count"] >= 1
    # --resume with one more recipe: only its row is run, and it gets its own record
    assert main([*argv, "--recipes", "bf16,zyfa,fp32", "--resume"]) == 0
    recs = records_of(read_provenance(out))
    assert [r["cells"] for r in recs] == [2, 1]
    assert recs[1]["units"] == units / 2


def test_fit_is_the_geometric_mean_rate_and_reports_the_spread():
    recs = [record(1e9, 2.0, "cpu", command="accuracy", cells=1), record(4e9, 2.0, "cpu", command="study", cells=3),
            record(0.0, 1.0, "cpu", command="accuracy", cells=0), record(5e10, 1.0, "cuda", command="study", cells=1)]
    f = fit(recs)
    assert set(f) == {"cpu", "cuda"}
    assert f["cpu"]["runs"] == 2  # the run with no work is left out
    assert f["cpu"]["units_per_second"] == pytest.approx(math.sqrt(5e8 * 2e9))
    lo, hi = f["cpu"]["measured_over_estimate"]
    assert lo == pytest.approx(0.5) and hi == pytest.approx(2.0)
    clo, chi = f["cpu"]["current_measured_over_estimate"]
    assert clo == pytest.approx(2.0 / (4e9 / UNITS_PER_SECOND["cpu"]), rel=1e-3)  # estimates kept to the ms
    assert f["cuda"]["units_per_second"] == pytest.approx(5e10)
    assert fit([]) == {}
    assert records_of({}) == [] and records_of({PROVENANCE_KEY: recs[:1]}) == recs[:1]


def test_the_fit_script_reads_result_files(tmp_path):
    out = tmp_path / "r.jsonl"
    assert main(["accuracy", "--seq", "32", "--heads", "1", "--head-dim", "64", "--recipes", "bf16", "--device",
                 "cpu", "--no-progress", "--out", str(out)]) == 0
    old = tmp_path / "old.jsonl"
    old.write_text('{"record": "provenance", "git_commit": "x"}\n', encoding="utf-8")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_cost_model.py"), str(out), str(old)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{old}: no cost records" in done.stdout
    assert "| cpu | 1 |" in done.stdout and "UNITS_PER_SECOND = {\"cpu\": " in done.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_cost_model.py"), str(old)],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "no run with work" in bad.stderr
