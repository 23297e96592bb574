"""The hd128 claims with the layer as the independent unit, their plans, and the technique-1 sensitivity run.

A design whose layers differ but whose heads within a layer agree gets a per-head interval that is too narrow; the
verdict uses the layer-clustered one. The plan files parse, their variants are the claims module's, the first plan
is unchanged, and the sensitivity driver runs a real slice of a shipped capture into rows the table uses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from zyfa.accuracy.report.blocks import blocks_markdown
from zyfa.accuracy.report.claims import VARIANTS, claim_figures
from zyfa.accuracy.report.document import Doc
from zyfa.accuracy.report.hd128 import (
    CLAIMS_PLAN,
    SENSITIVITY_PLAN,
    PlanFileError,
    hd128_section,
    load_sensitivity_plan,
    plan_file_hash,
)
from zyfa.accuracy.report.results import load_results
from zyfa.accuracy.study.hd128_sensitivity import main as sensitivity_main

ROOT = Path(__file__).resolve().parents[2]
HD128 = ROOT / "reports" / "hd128" / "results.jsonl"


def _rows(layer_log_ratios, heads=12, head_noise=0.002, seed=0):
    """hd128 capture rows: ck's per-head error, zyfa's = ck's x exp(the layer's log ratio + a small per-head
    noise); the three peers alike."""
    rng = np.random.default_rng(seed)
    rows = []
    for layer, lr in enumerate(layer_log_ratios):
        common = {"input": f"m-L{layer}-s2048", "input_content_hash": f"h{layer}", "input_source": "capture",
                  "input_model": "m", "input_layer": layer, "head_dim": 128, "head_dim_v": 128, "heads_q": heads}
        base = rng.lognormal(-5, 0.4, heads)
        zyfa = base * np.exp(lr + rng.normal(0, head_noise, heads))
        for name, e in (("zyfa", zyfa), ("ck", base), ("triton-amd", base), ("aiter", base)):
            rows.append({**common, "recipe": name, "deq_rel_l2_heads": e.tolist(), "orig_rel_l2_heads": e.tolist(),
                         "deq_rel_l2": float(e.mean()), "orig_rel_l2": float(e.mean())})
    return rows


def test_layer_clustered_interval_decides_where_heads_are_not_independent():
    rows = _rows([-0.10, -0.06, -0.02, 0.02, 0.06, 0.10])  # the layers differ, their 12 heads agree
    ck = next(f for f in claim_figures(rows) if f["kind"] == "capture" and f["claim"].key == "zyfa-ck"
              and f["error"] == "deq")
    assert ck["n"] == 72 and ck["n_clusters"] == 6
    # over 72 heads counted as independent the interval fits in ±5%: "reproduced"
    assert ck["lo_unit"] >= 0.95 and ck["hi_unit"] <= 1.05 and ck["verdict_unit"] == "reproduced"
    # over 6 layers it is several times wider and straddles the range: the verdict says so
    assert (ck["hi"] - ck["lo"]) > 3 * (ck["hi_unit"] - ck["lo_unit"])
    assert ck["lo"] < 0.95 < ck["hi"] and ck["verdict"].startswith("inconclusive")
    # with the layers alike the clustered interval is no wider than the per-head one needs: reproduced either way
    same = _rows([0.0] * 6)
    ck = next(f for f in claim_figures(same) if f["kind"] == "capture" and f["claim"].key == "zyfa-ck"
              and f["error"] == "deq")
    assert ck["verdict"] == ck["verdict_unit"] == "reproduced"


def test_committed_hd128_rows_give_both_intervals_and_n():
    figs = [f for f in claim_figures(load_results([HD128]).rows) if f["kind"] == "capture"]
    assert len(figs) == 6
    for f in figs:
        assert f["n"] == 336 and f["n_clusters"] == 28
        assert f["lo"] <= f["lo_unit"] and f["hi_unit"] <= f["hi"]  # clustering only widens here
    aiter = next(f for f in figs if f["claim"].key == "zyfa-aiter" and f["error"] == "deq")
    assert aiter["verdict"] == "contradicted" and aiter["lo"] > 0.38


def test_plans_parse_and_agree_with_the_claims_module():
    plan = load_sensitivity_plan()
    specs = [s for _, s in plan.variants]
    assert len(specs) == len(VARIANTS)
    for spec, (_, names) in zip(specs, VARIANTS, strict=True):
        assert spec in names
    assert set(plan.run) <= set(specs) and "zyfa" in specs
    # the first claims plan stays as declared (its hash), the clustered one supersedes it
    assert plan_file_hash(ROOT / "studies" / "hd128-claims.toml").startswith("57f43e1b0c86")
    assert "supersedes" in CLAIMS_PLAN.read_text() and plan_file_hash(CLAIMS_PLAN) != plan_file_hash(
        ROOT / "studies" / "hd128-claims.toml")


@pytest.mark.parametrize("text, problem", [
    ('run = []\n[variants]\na = "ck"\n', "must hold zyfa itself"),
    ('run = ["zyfa:nope=1"]\n[variants]\na = "zyfa"\n', "not one of its variants"),
    ('[variants]\na = "zyfa"\nb = "zyfa:nope=1"\n', "variant 'b'"),
    ('layers = "some"\n[variants]\na = "zyfa"\n', "layers must be"),
    ('variants = 3\n', "[variants] must map"),
])
def test_bad_sensitivity_plan_is_one_line(tmp_path, text, problem):
    p = tmp_path / "plan.toml"
    p.write_text(text)
    with pytest.raises(PlanFileError, match="plan .*plan.toml: ") as e:
        load_sensitivity_plan(p)
    assert problem in str(e.value) and "\n" not in str(e.value)


def test_sensitivity_driver_runs_a_real_slice(tmp_path, capsys):
    """One variant on one layer of the shipped hd128 capture (1024 tokens), then the section's table from them."""
    plan = tmp_path / "plan.toml"
    plan.write_text(SENSITIVITY_PLAN.read_text(encoding="utf-8").replace(
        'run = ["zyfa:mad_offset=0", "zyfa:mad_offset=0.25", "zyfa:mad_rounding=nearest,mad_offset=0", "zyfa-exp2"]',
        'run = ["zyfa:mad_offset=0"]'))
    capture = ROOT / "datasets" / "qwen25coder-1.5b-pydoc-1024.h5"
    out = tmp_path / "s.jsonl"
    # bad input: one line, nothing written
    assert sensitivity_main(["--plan", str(plan), "--inputs", str(tmp_path / "none.h5"), "--out", str(out)]) == 2
    assert "no such capture file" in capsys.readouterr().err and not out.exists()
    assert sensitivity_main(["--plan", str(plan), "--inputs", str(capture), "--layers", "0", "--out", str(out)]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    prov, rows = lines[0], lines[1:]
    assert prov["plan_hash"] == load_sensitivity_plan(plan).hash
    (row,) = rows
    assert row["recipe"] == "zyfa:mad_offset=0.0" and row["head_dim"] == 128
    assert len(row["deq_rel_l2_heads"]) == row["heads_q"] and all(math.isfinite(v) for v in row["deq_rel_l2_heads"])
    # the whole-input error lies within the spread of its heads' errors
    assert min(row["deq_rel_l2_heads"]) <= row["deq_rel_l2"] <= max(row["deq_rel_l2_heads"])
    # an existing --out is refused
    assert sensitivity_main(["--plan", str(plan), "--inputs", str(capture), "--layers", "0", "--out", str(out)]) == 2


def test_the_current_sensitivity_plan_takes_every_layer_and_supersedes_the_even_layers():
    plan, first = load_sensitivity_plan(), load_sensitivity_plan(ROOT / "studies" / "hd128-sensitivity.toml")
    assert plan.layers == "all" and first.layers == tuple(range(0, 28, 2))
    assert plan.variants == first.variants and plan.run == first.run and plan.name == "hd128-sensitivity-all"


def test_section_names_its_plans_and_restricts_the_sensitivity_to_their_layers():
    rows = _rows([0.0] * 4)
    rows += [{**r, "recipe": "zyfa:mad_offset=0.0"} for r in rows if r["recipe"] == "zyfa" and r["input_layer"] < 2]
    doc = Doc("t")
    hd128_section(rows, sensitivity_plan=ROOT / "studies" / "hd128-sensitivity.toml")(doc, False)
    md = "\n".join(blocks_markdown(doc.blocks))
    assert "hd128-claims-clustered.toml" in md and plan_file_hash(CLAIMS_PLAN)[:12] in md
    assert "95% interval over layer × head units" in md and "48 layer × head units in 4 layers" in md
    # the plan's layers are the even ones: layer 0 of the two that have the variant, layers 0 and 2 for zyfa
    assert "| trunc, offset 0 (`zyfa:mad_offset=0`) | zyfa-ck | deq |" in md
    assert "12 layer × head units in 1 layers" in md and "24 layer × head units in 2 layers" in md
