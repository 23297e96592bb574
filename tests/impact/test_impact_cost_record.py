"""``zyfa impact`` records its --dry-run estimate beside its measured time (accuracy/io/cost_model.py) in the
provenance of each row a run made (impact rows carry their own provenance), and scripts/fit_cost_model.py reads
each run's record once."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from zyfa.accuracy.impact.cli import cell_cost
from zyfa.accuracy.io.cost_model import PROVENANCE_KEY, rate, records_in_file

ROOT = Path(__file__).resolve().parents[2]


def test_each_run_records_its_passes_in_its_rows(smollm2, tmp_path, monkeypatch):
    import zyfa.capture.models
    from zyfa.accuracy.impact import cli as impact_cli

    monkeypatch.setattr(zyfa.capture.models, "load_model", lambda name, **kw: smollm2)
    out = tmp_path / "results.jsonl"
    parser = argparse.ArgumentParser()
    impact_cli.add_arguments(parser)
    argv = ["--models", "smollm2", "--tokens", "32", "--windows", "1", "--out", str(out), "--no-progress"]
    assert impact_cli.main(parser.parse_args([*argv, "--recipes", "fp32"])) == 0
    assert impact_cli.main(parser.parse_args([*argv, "--recipes", "fp32,bf16", "--resume"])) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["recipe"] for r in rows] == ["fp32", "bf16"]  # no provenance line: rows only, as before
    first, second = records_in_file(out)
    assert rows[0]["provenance"][PROVENANCE_KEY] == [first] and rows[1]["provenance"][PROVENANCE_KEY] == [second]
    for rec, recipe in ((first, "fp32"), (second, "bf16")):
        units = cell_cost(("window", "smollm2", 0, recipe), 32, None)
        assert rec["command"] == "impact" and rec["device_type"] == "cpu" and rec["cells"] == 1
        assert rec["units"] == units
        assert rec["estimate_s"] == pytest.approx(units / rate("impact", "cpu"), abs=1e-3)
        assert 0 < rec["measured_s"] < 600
        assert rec["work"] == {"passes": 1, "tokens": 32, "models": ["smollm2"], "attention": [recipe]}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_cost_model.py"), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| impact | cpu | 2 |" in done.stdout
