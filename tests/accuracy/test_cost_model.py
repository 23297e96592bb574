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
    CUDA_HELD_OUT_FILES,
    PROVENANCE_KEY,
    RATES,
    SECONDS_PER_CELL,
    TRUNCATING_FIT_FILES,
    TRUNCATING_UNITS_PER_SCORE,
    estimate_s,
    fit,
    rate,
    record,
    records_in_file,
    records_of,
    seconds_per_cell,
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
    assert rec["units_per_second"] == rate("accuracy", "cpu") and rec["seconds_per_cell"] == 0  # the CPU: one rate
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
            record(0.0, 1.0, "cpu", command="study", cells=0), record(5e10, 1.0, "cuda", command="longctx", cells=1),
            record(4e6, 1.0, "cpu", command="longctx", cells=1), record(8e6, 1.0, "cpu", command="longctx", cells=2)]
    f = fit(recs)
    assert set(f) == {("study", "cpu"), ("longctx", "cuda"), ("longctx", "cpu")}
    s = f[("study", "cpu")]
    assert s["runs"] == 2  # the run with no work is left out
    assert s["units_per_second"] == pytest.approx(math.sqrt(5e8 * 2e9))
    lo, hi = s["measured_over_estimate"]
    assert lo == pytest.approx(0.5) and hi == pytest.approx(2.0)
    clo, chi = s["current_measured_over_estimate"]
    assert clo == pytest.approx(2.0 / (4e9 / rate("study", "cpu")), rel=1e-3)  # estimates kept to the ms
    assert f[("longctx", "cpu")]["units_per_second"] == pytest.approx(math.sqrt(4e6 * 8e6))
    # one run fits nothing: the entry says so in one line
    one = f[("longctx", "cuda")]
    assert "units_per_second" not in one and one["runs"] == 1
    assert one["refused"] == "longctx on cuda: 1 run; a rate is fitted from 2 or more"
    assert fit([]) == {}
    assert records_of({}) == [] and records_of({PROVENANCE_KEY: recs[:1]}) == recs[:1]


def test_a_gpu_accuracy_row_costs_seconds_per_cell_on_top_of_its_units_and_its_record_says_so():
    """On cuda, accuracy and study estimate cells x SECONDS_PER_CELL + units / rate, and a record keeps the per-cell
    term beside the rate; every other pair (the CPU, longctx, impact, tasks) has none."""
    assert SECONDS_PER_CELL["accuracy"]["cuda"] == SECONDS_PER_CELL["study"]["cuda"] > 0
    for command in ("accuracy", "study"):
        per_cell = seconds_per_cell(command, "cuda")
        assert estimate_s(command, "cuda", 4e11, 6) == pytest.approx(6 * per_cell + 4e11 / rate(command, "cuda"))
        rec = record(4e11, 30.0, "cuda", command=command, cells=6)
        assert rec["seconds_per_cell"] == per_cell and rec["units_per_second"] == rate(command, "cuda")
        assert rec["estimate_s"] == pytest.approx(estimate_s(command, "cuda", 4e11, 6), abs=1e-3)
        assert estimate_s(command, "cpu", 4e11, 6) == 4e11 / rate(command, "cpu")
        assert estimate_s(command, "mps", 4e11, 6) == estimate_s(command, "cpu", 4e11, 6)  # unknown: the cpu's
    for command in ("longctx", "impact", "tasks"):
        assert seconds_per_cell(command, "cuda") == seconds_per_cell(command, "cpu") == 0
        assert record(4e11, 30.0, "cuda", command=command, cells=6)["estimate_s"] == \
            pytest.approx(4e11 / rate(command, "cuda"), abs=1e-3)


def test_dry_run_prints_each_rows_estimate_with_its_per_cell_term(tmp_path, monkeypatch, capsys):
    """--dry-run's seconds are estimate_s per row, the per-cell term included: given one second per row on the CPU
    here, two small rows are planned at 1 s each plus their units' time."""
    monkeypatch.setitem(SECONDS_PER_CELL, "accuracy", {"cpu": 1.0})
    assert main(["accuracy", "--seq", "48", "--heads", "2", "--head-dim", "64", "--device", "cpu", "--recipes",
                 "bf16,zyfa", "--dry-run", "1", "--out", str(tmp_path / "r.jsonl")]) == 0
    out = capsys.readouterr().out
    units = cell_cost({"batch": 1, "heads_q": 2, "seq_q": 48, "seq_k": 48, "head_dim": 64, "head_dim_v": 64})
    assert f"estimated {2 * (1 + units / rate('accuracy', 'cpu')):.1f} s of work" in out
    assert out.count(f"({1 + units / rate('accuracy', 'cpu'):.2f} s)") == 2
    assert not list(tmp_path.iterdir())


def test_a_per_cell_fit_finds_the_values_its_runs_were_made_with_and_needs_three_runs():
    """Runs timed exactly by a per-cell cost and a rate give both back; runs timed by a rate alone give no per-cell
    cost; two runs fit nothing."""
    def runs(per_cell, per_s):
        return [{"command": "study", "device_type": "cuda", "cells": c, "units": u,
                 "measured_s": c * per_cell + u / per_s}
                for c, u in ((918, 9e11), (44, 4e10), (478, 8e13), (12, 2e12), (48, 5e9))]

    both = fit(runs(0.3, 2e11))[("study", "cuda")]
    assert both["seconds_per_cell"] == pytest.approx(0.3, rel=1e-4)
    assert both["units_per_second"] == pytest.approx(2e11, rel=1e-4)
    assert both["measured_over_estimate"] == pytest.approx((1.0, 1.0), rel=1e-6)
    assert both["ratios"] == pytest.approx([1.0] * 5, rel=1e-6) and len(both["records"]) == 5
    rate_only = fit(runs(0.0, 2e11))[("study", "cuda")]
    assert rate_only["seconds_per_cell"] == pytest.approx(0, abs=1e-9)
    assert rate_only["units_per_second"] == pytest.approx(2e11, rel=1e-4)
    two = fit(runs(0.3, 2e11)[:2])[("study", "cuda")]
    assert two["refused"] == "study on cuda: 2 runs; a rate and seconds per cell are fitted from 3 or more"


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


def _fit_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_cost_model.py"), "--from-rows", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def _printed_values(stdout: str) -> dict[str, float]:
    """The ``RATES[...] = v`` and ``SECONDS_PER_CELL[...] = v`` lines the fit script printed."""
    return {key: float(value) for key, value in (line.split(" = ") for line in stdout.splitlines()
                                                 if line.startswith(("RATES[", "SECONDS_PER_CELL[")))}


def test_the_committed_cuda_rates_are_the_fit_of_the_committed_h200_files():
    """RATES' cuda values for study (accuracy: the same), longctx and tasks, and SECONDS_PER_CELL's for study
    (accuracy: the same), are what the fit script prints for the files named in CUDA_FIT_FILES, their records
    rebuilt from their rows (--from-rows)."""
    done = _fit_script(*CUDA_FIT_FILES)
    assert done.returncode == 0, done.stderr
    assert "| study | cuda | 6 |" in done.stdout and "| longctx | cuda | 6 |" in done.stdout
    assert "| tasks | cuda | 16 |" in done.stdout
    assert _printed_values(done.stdout) == {
        **{f'RATES["{c}"]["cuda"]': RATES[c]["cuda"] for c in ("longctx", "study", "tasks")},
        'SECONDS_PER_CELL["study"]["cuda"]': SECONDS_PER_CELL["study"]["cuda"]}
    assert RATES["accuracy"]["cuda"] == RATES["study"]["cuda"]
    assert SECONDS_PER_CELL["accuracy"] == SECONDS_PER_CELL["study"] == {"cuda": SECONDS_PER_CELL["study"]["cuda"]}


def test_the_held_out_gpu_accuracy_run_is_estimated_nearer_by_the_committed_model_than_by_its_own_record():
    """The 32K-token `zyfa accuracy` run on cuda (CUDA_HELD_OUT_FILES, not fitted on) was recorded with the
    one-rate estimate of its day; the committed per-cell model's estimate of the same rows is nearer its measured
    time (on a log scale). Fitted on with --count-as accuracy=study, it is one run more of study's."""
    for name in CUDA_HELD_OUT_FILES:
        (rec,) = records_in_file(ROOT / name)
        assert rec["command"] == "accuracy" and rec["device_type"] == "cuda" and "seconds_per_cell" not in rec
        now = estimate_s("accuracy", "cuda", rec["units"], rec["cells"])
        assert abs(math.log(rec["measured_s"] / now)) < abs(math.log(rec["measured_s"] / rec["estimate_s"]))
        assert name not in CUDA_FIT_FILES
    alone = _fit_script(*CUDA_FIT_FILES, *CUDA_HELD_OUT_FILES)
    assert alone.returncode == 0 and "fit_cost_model: accuracy on cuda: 1 run; a rate and seconds per cell are " \
        "fitted from 3 or more" in alone.stderr
    pooled = _fit_script(*CUDA_FIT_FILES, *CUDA_HELD_OUT_FILES, "--count-as", "accuracy=study", "--per-run")
    assert pooled.returncode == 0, pooled.stderr
    assert "| study | cuda | 7 |" in pooled.stdout and "| accuracy | cuda |" not in pooled.stdout
    assert f"| {CUDA_HELD_OUT_FILES[0]} | study | cuda | 6 |" in pooled.stdout  # its line of --per-run
    assert _printed_values(pooled.stdout)['SECONDS_PER_CELL["study"]["cuda"]'] > 0


def test_a_study_file_without_records_gets_one_rebuilt_from_its_rows():
    sys.path.insert(0, str(ROOT / "scripts"))
    from fit_cost_model import rebuilt_record

    path = ROOT / "reports" / "sharding" / "study_single.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rec = rebuilt_record(path)
    assert rec["command"] == "study" and rec["device_type"] == "cuda" and rec["cells"] == len(rows) - 1
    assert rec["units"] == sum(cell_cost(r) for r in rows[1:])
    assert rec["measured_s"] == rows[0]["study_accuracy_s"] and rec["rebuilt_from"].startswith("provenance")
