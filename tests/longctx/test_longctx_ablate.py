"""``zyfa longctx --ablate``: one recipe field changed, the same prompts, rows paired per prompt (SmolLM2, CPU)."""

from __future__ import annotations

import json

from zyfa.accuracy.scoring.ablation import ablation_pairs

from zyfa.cli import main

BASE = ["longctx", "--models", "smollm2", "--tasks", "passkey", "--lengths", "128", "--depths", "0,1", "--seeds", "1",
        "--layers", "0,1", "--no-progress", "--device", "cpu"]


def test_ablate_runs_only_the_ablation_on_the_same_prompts_and_pairs_per_prompt(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert main(BASE + ["--ablate", "zyfa", "p_scale=pow2_block,none", "--out", str(out)]) == 0, \
        capsys.readouterr().err
    rows = [r for r in map(json.loads, out.read_text().splitlines()) if r.get("kind") == "longctx"]
    assert {r["implementation"] for r in rows} == {"zyfa:p_scale=pow2_block", "zyfa:p_scale=none"}
    assert all((r["ablation_base"], r["ablation_field"]) == ("zyfa", "p_scale") for r in rows)
    assert {r["ablation_value"]: r["implementation"] for r in rows} == {
        "pow2_block": "zyfa:p_scale=pow2_block", "none": "zyfa:p_scale=none"}
    [p] = ablation_pairs(rows, "answer_logprob")
    assert p.values == ["pow2_block", "none"] and len(p.unit_ids) == 2 and not p.dropped
    assert set(p.unit_ids) == {r["input"] for r in rows}  # one unit per prompt, both values on each
    assert (p.diff() != 0).all()  # unscaled P changes the answer's log probability on every prompt


def test_a_bad_ablation_is_one_line_before_any_model_loads(tmp_path, capsys):
    assert main(BASE + ["--ablate", "zyfa", "accum_flush_tiles=0,maybe", "--out", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "accum_flush_tiles takes an integer, not 'maybe'" in err[0]
    assert not any(tmp_path.iterdir())
