"""Contrast plans (accuracy/report/contrast.py): two recipe arms on a shipped capture, rows made by zyfa accuracy on
two layers, the verdict table rendered from them; a plan naming an unknown recipe refused in one line before any
file is written; the hd128 claims keep their figures (zyfa over peer) through the generalized pair figure."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from zyfa.accuracy.io.schemas import read_rows
from zyfa.accuracy.report.claims import CLAIMS, claim_figures, pair_figure
from zyfa.accuracy.report.contrast import load_contrast_plan, main
from zyfa.accuracy.report.front import source_label
from zyfa.accuracy.report.hd128 import PlanFileError, plan_file_hash

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "datasets" / "smollm2-lee-2048.h5"
PLAN = """
name = "tiny"
errors = ["deq_rel_l2", "orig_rel_l2"]
[[claims]]
a = "{a}"
b = "fa3"
threshold = 0.05
[[conditions]]
label = "smollm2, 256 tokens, layers 0 and 14"
inputs = "{inputs}"
layers = "0,14"
results = "{results}"
descriptive = {descriptive}
"""


def _plan(tmp_path, a="fa3:accum_flush_tiles=1", descriptive=False, name="plan.toml"):
    p = tmp_path / name
    p.write_text(PLAN.format(a=a, inputs=SAMPLE, results=tmp_path / "rows.jsonl",
                             descriptive=str(descriptive).lower()))
    return p


@pytest.mark.skipif(not SAMPLE.is_file(), reason="shipped sample capture datasets/smollm2-lee-2048.h5 absent")
def test_a_contrast_plan_from_rows_to_table(tmp_path):
    plan = load_contrast_plan(_plan(tmp_path))
    assert [(c.a, c.b) for c in plan.claims] == [("fa3:accum_flush_tiles=1", "fa3")]
    rows_path = tmp_path / "rows.jsonl"
    run = [sys.executable, "-m", "zyfa.cli", "accuracy", "--inputs", str(SAMPLE), "--layers", "0,14",
           "--max-tokens", "256", "--recipes", "fa3,fa3:accum_flush_tiles=1", "--device", "cpu", "--no-progress",
           "--out", str(rows_path)]
    subprocess.run(run, check=True, capture_output=True, cwd=ROOT)
    rows = read_rows(rows_path)[0]
    f = pair_figure(rows, ("fa3:accum_flush_tiles=1",), ("fa3",), "capture", "deq_rel_l2", head_dim=None)
    # zyfa accuracy rows carry one rel-L2 per input (over its 3 heads): the unit is the layer
    assert f["n"] == 2 and f["n_clusters"] == 2 and not f["per_head"]
    by = {(r["recipe"], r["input_layer"]): r["deq_rel_l2"] for r in rows}
    ratios = [by["fa3", layer] / by["fa3:accum_flush_tiles=1", layer] for layer in (0, 14)]
    assert f["ratio"] == pytest.approx(math.sqrt(ratios[0] * ratios[1]), rel=1e-9)
    assert f["label"]  # a verdict by the rule
    # at any head dim but the rows' one there is nothing to pair
    assert pair_figure(rows, ("fa3:accum_flush_tiles=1",), ("fa3",), "capture", "deq_rel_l2")["n"] == 0
    out = tmp_path / "report.md"
    assert main([str(tmp_path / "plan.toml"), "--out", str(out)]) == 0
    md = out.read_text()
    assert "`fa3` / `fa3:accum_flush_tiles=1`" in md and "2 layers (a layer's unit: rel-L2 over its query heads)" in md
    assert plan.hash[:12] in md and "zyfa accuracy --inputs" in md
    # the command and the machine each condition's rows came from, as its file's provenance records them
    prov = read_rows(rows_path)[1]
    where = source_label(str(rows_path), prov)
    assert f"--device cpu --out {rows_path}" in md and where in md and prov["git_commit"][:7] in where
    assert "Per unit of the descriptive conditions" not in md  # a condition with a verdict shows no unit table
    # the same rows under a descriptive condition: each layer's ratio beside the geometric mean
    f_orig = pair_figure(rows, ("fa3:accum_flush_tiles=1",), ("fa3",), "capture", "orig_rel_l2", head_dim=None)
    assert sorted(u[3] for u in f["units"]) == pytest.approx(sorted(ratios), rel=1e-12)
    assert main([str(_plan(tmp_path, descriptive=True, name="descriptive.toml")), "--out", str(out)]) == 0
    md = out.read_text()
    assert "Per unit of the descriptive conditions" in md and "descriptive only (2 layers)" in md
    orig = {u[2][2]: u[3] for u in f_orig["units"]}
    for layer, ratio in zip((0, 14), ratios, strict=True):
        assert f"| layer {layer} | {ratio:.3f} | {orig[layer]:.3f} |" in md


def test_a_plan_naming_an_unknown_recipe_is_refused_in_one_line(tmp_path, capsys):
    p = _plan(tmp_path, a="fa3-nonesuch")
    with pytest.raises(PlanFileError):
        load_contrast_plan(p)
    out = tmp_path / "report.md"
    assert main([str(p), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fa3-nonesuch" in err and "claim 1: a" in err
    assert not out.exists()


def test_the_shipped_plan_loads_and_the_hd128_plans_keep_their_hashes():
    plan = load_contrast_plan(ROOT / "studies" / "accumulator-operator.toml")
    assert [(c.a, c.b, c.threshold) for c in plan.claims] == [("fa3:accum_flush_tiles=1", "fa3", 0.05)]
    assert sum(c.primary for c in plan.conditions) == 1
    assert plan_file_hash(ROOT / "studies" / "hd128-claims.toml").startswith("57f43e1b0c86")
    assert plan_file_hash(ROOT / "studies" / "hd128-claims-clustered.toml").startswith("0726c7e6b231")


def test_claim_figures_are_zyfa_over_the_peer():
    rows = []
    for layer in range(3):
        for recipe, scale in (("zyfa", 0.5), ("ck", 1.0)):
            rows.append({"recipe": recipe, "input": f"m-L{layer}", "input_source": "capture", "input_model": "m",
                         "input_layer": layer, "head_dim": 128, "status": "ok", "heads_q": 2,
                         "deq_rel_l2_heads": [scale * (1 + layer), scale * (2 + layer)],
                         "orig_rel_l2_heads": [scale, scale]})
    f = next(x for x in claim_figures(rows) if x["claim"] is CLAIMS[0] and x["kind"] == "capture")
    assert f["ratio"] == pytest.approx(0.5) and f["n"] == 6 and f["n_clusters"] == 3
    assert f["verdict"] == "contradicted"

