"""The --dry-run cost model beside measured runs: each run records its estimate and its time, and
scripts/fit_cost_model.py fits the rate from the records."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from zyfa.accuracy.io.cost_model import (
    CUDA_FIT_FILES,
    PROVENANCE_KEY,
    RATES,
    TRUNCATING_FIT_FILES,
    TRUNCATING_UNITS_PER_SCORE,
    fit,
    rate,
    record,
    records_in_file,
    records_of,
    truncating_units_per_score,
)
from zyfa.accuracy.operator.cli import cell_cost, key_cost, read_provenance

from zyfa.cli import main
from zyfa.recipe_spec import get_recipe

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
    assert rec["units_per_second"] == rate("accuracy", "cpu")
    assert rec["estimate_s"] == pytest.approx(units / rate("accuracy", "cpu"), abs=1e-3)
    assert 0 < rec["measured_s"] < 600
    assert rec["cpu_count"] >= 1
    # --resume with one more recipe: only its row is run, and it gets its own record
    assert main([*argv, "--recipes", "bf16,zyfa,fp32", "--resume"]) == 0
    recs = records_of(read_provenance(out))
    assert [r["cells"] for r in recs] == [2, 1]
    assert recs[1]["units"] == units / 2


SHAPE = {"batch": 1, "heads_q": 2, "seq_q": 48, "seq_k": 40, "head_dim": 64, "head_dim_v": 64}


def test_a_truncating_recipe_row_costs_its_per_score_units_on_the_cpu_only():
    plain = 2 * 48 * 40 * 128
    trunc = 2 * 48 * 40 * TRUNCATING_UNITS_PER_SCORE["cpu"]
    assert cell_cost(SHAPE) == plain
    assert cell_cost(SHAPE, "fa3") == cell_cost(SHAPE, get_recipe("fa3:accum_flush_tiles=1")) == trunc
    assert cell_cost(SHAPE, "zyfa-hopper", "cpu") == trunc
    assert cell_cost(SHAPE, "fa3", "cuda") == plain  # no GPU value fitted (cost_model's comment)
    # no truncating accumulator: mi355x's fp32 sums, BF16 on the H200, a recipe moved to mi355x
    assert cell_cost(SHAPE, "zyfa") == cell_cost(SHAPE, "bf16") == cell_cost(SHAPE, "fa3@mi355x") == plain
    # a real implementation's row: no emulation counted; a recipe row by name, or through the run's recipes
    assert key_cost(SHAPE, ("x", None, "fa3", "triton:fa3")) == plain
    assert key_cost(SHAPE, ("x", None, "fa3", None)) == trunc
    assert key_cost(SHAPE, ("x", None, "mine", None), {"mine": get_recipe("zyfa@h200")}) == trunc


def test_truncated_gemms_names_the_gemms_the_platform_truncates():
    assert get_recipe("fa3").truncated_gemms() == (True, True)
    assert get_recipe("fa3").truncated_gemms("mi355x") == (False, False)
    assert get_recipe("zyfa").truncated_gemms() == (False, False)
    assert get_recipe("zyfa").truncated_gemms("h200") == (True, True)
    assert get_recipe("bf16").truncated_gemms() == (False, False)  # BF16 wgmma sums in fp32 on the H200
    # FP8 Q·K with a BF16 P·V: only Q·K's sums truncate
    assert get_recipe("fa3:p_format=bf16,v_format=bf16").truncated_gemms() == (True, False)


def test_the_truncating_units_are_the_fit_of_the_committed_cpu_runs_and_bring_their_estimates_near():
    """TRUNCATING_UNITS_PER_SCORE["cpu"] is the fit of TRUNCATING_FIT_FILES (to 1%); under it each of those runs'
    measured time is within 2x of its estimate (the plain unit gave 21-125x)."""
    assert TRUNCATING_UNITS_PER_SCORE["cpu"] == pytest.approx(
        truncating_units_per_score(ROOT / f for f in TRUNCATING_FIT_FILES), rel=0.01)
    for name in TRUNCATING_FIT_FILES:
        lines = [json.loads(x) for x in (ROOT / name).read_text().splitlines()]
        prov, rows = lines[0], lines[1:]
        (rec,) = records_of(prov)
        estimate = sum(key_cost({k: r[k] for k in SHAPE}, (r["input"], None, r["recipe"], r.get("implementation")))
                       for r in rows) / rate("accuracy", "cpu")
        assert 0.5 < rec["measured_s"] / estimate < 2, (name, rec["measured_s"], estimate)
        assert rec["measured_s"] / rec["estimate_s"] > 20  # what the plain unit had estimated


def test_fit_is_the_geometric_mean_rate_per_command_and_device_and_reports_the_spread():
    recs = [record(1e9, 2.0, "cpu", command="study", cells=1), record(4e9, 2.0, "cpu", command="study", cells=3),
            record(0.0, 1.0, "cpu", command="study", cells=0), record(5e10, 1.0, "cuda", command="study", cells=1),
            record(4e6, 1.0, "cpu", command="longctx", cells=1), record(8e6, 1.0, "cpu", command="longctx", cells=2)]
    f = fit(recs)
    assert set(f) == {("study", "cpu"), ("study", "cuda"), ("longctx", "cpu")}
    s = f[("study", "cpu")]
    assert s["runs"] == 2  # the run with no work is left out
    assert s["units_per_second"] == pytest.approx(math.sqrt(5e8 * 2e9))
    lo, hi = s["measured_over_estimate"]
    assert lo == pytest.approx(0.5) and hi == pytest.approx(2.0)
    clo, chi = s["current_measured_over_estimate"]
    assert clo == pytest.approx(2.0 / (4e9 / rate("study", "cpu")), rel=1e-3)  # estimates kept to the ms
    assert f[("longctx", "cpu")]["units_per_second"] == pytest.approx(math.sqrt(4e6 * 8e6))
    # one run fits nothing: the entry says so in one line
    one = f[("study", "cuda")]
    assert "units_per_second" not in one and one["runs"] == 1
    assert one["refused"] == "study on cuda: 1 run; a rate is fitted from 2 or more"
    assert fit([]) == {}
    assert records_of({}) == [] and records_of({PROVENANCE_KEY: recs[:1]}) == recs[:1]


def test_records_are_read_from_the_provenance_line_and_from_rows_each_once(tmp_path):
    a, b = (record(1e9, 1.0, "cpu", command="impact", cells=n, work={"passes": n}) for n in (1, 2))
    path = tmp_path / "impact.jsonl"
    rows = [{"kind": "impact_window", "provenance": {PROVENANCE_KEY: [a]}},
            {"kind": "impact_window", "provenance": {PROVENANCE_KEY: [a]}},
            {"kind": "impact_layer", "provenance": {PROVENANCE_KEY: [b]}}, {"kind": "impact_window"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n", encoding="utf-8")
    assert records_in_file(path) == [a, b]
    assert a["work"] == {"passes": 1} and a["date_utc"].endswith("Z")


def test_two_runs_alike_in_every_measured_field_are_two_records(tmp_path):
    """Two fast runs of one shape in one second round to the same numbers and date: their ids keep them apart (the
    fit counted one run where there were two); a record from before ids is still read once."""
    a, b = (record(131072, 0.0123, "cpu", command="accuracy", cells=1) for _ in range(2))
    a["date_utc"] = b["date_utc"]
    assert a["record_id"] != b["record_id"] and {k: v for k, v in a.items() if k != "record_id"} == \
        {k: v for k, v in b.items() if k != "record_id"}
    old = {k: v for k, v in a.items() if k != "record_id"}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"record": "provenance", PROVENANCE_KEY: [a, b, old, old]}) + "\n", encoding="utf-8")
    assert records_in_file(path) == [a, b, old]


def test_the_fit_script_reads_result_files(tmp_path):
    out = tmp_path / "r.jsonl"
    argv = ["accuracy", "--seq", "32", "--heads", "1", "--head-dim", "64", "--device", "cpu", "--no-progress",
            "--out", str(out)]
    assert main([*argv, "--recipes", "bf16"]) == 0
    assert main([*argv, "--recipes", "bf16,fp32", "--resume"]) == 0  # a second run: two records
    old = tmp_path / "old.jsonl"
    old.write_text('{"record": "provenance", "git_commit": "x"}\n', encoding="utf-8")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_cost_model.py"), str(out), str(old)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{old}: no cost records" in done.stdout
    assert done.stdout.count("| accuracy | cpu | 2 |") == 1 and 'RATES["accuracy"]["cpu"] = ' in done.stdout
    # one run of a kind is named in one line and not fitted; nothing fitted at all is status 2
    one = tmp_path / "one.jsonl"
    assert main(["accuracy", "--seq", "32", "--heads", "1", "--head-dim", "64", "--recipes", "bf16", "--device",
                 "cpu", "--no-progress", "--out", str(one)]) == 0
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_cost_model.py"), str(one), str(old)],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [
        "fit_cost_model: accuracy on cpu: 1 run; a rate is fitted from 2 or more",
        "fit_cost_model: no (command, device) with 2 or more runs with work and a measured time in these files"]


def test_the_committed_cuda_rates_are_the_fit_of_the_committed_h200_files():
    """RATES' cuda values for study (accuracy: the same), longctx and tasks are what the fit script prints for the files
    named in CUDA_FIT_FILES, their records rebuilt from their rows (--from-rows)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_cost_model.py"), "--from-rows",
                           *CUDA_FIT_FILES], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| study | cuda | 6 |" in done.stdout and "| longctx | cuda | 6 |" in done.stdout
    assert "| tasks | cuda | 16 |" in done.stdout
    fitted = {}
    for line in done.stdout.splitlines():
        if line.startswith("RATES["):
            key, value = line.split(" = ")
            fitted[key] = float(value)
    assert fitted == {f'RATES["{c}"]["cuda"]': RATES[c]["cuda"] for c in ("longctx", "study", "tasks")}
    assert RATES["accuracy"]["cuda"] == RATES["study"]["cuda"]


def test_a_study_file_without_records_gets_one_rebuilt_from_its_rows():
    sys.path.insert(0, str(ROOT / "scripts"))
    from fit_cost_model import rebuilt_record

    path = ROOT / "reports" / "sharding" / "study_single.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rec = rebuilt_record(path)
    assert rec["command"] == "study" and rec["device_type"] == "cuda" and rec["cells"] == len(rows) - 1
    assert rec["units"] == sum(cell_cost(r) for r in rows[1:])
    assert rec["measured_s"] == rows[0]["study_accuracy_s"] and rec["rebuilt_from"].startswith("provenance")
