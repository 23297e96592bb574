"""``zyfa impact --implementations/--kernel``: a registry kernel and a plug-in as SmolLM2's attention, one row each
with what ran."""

from __future__ import annotations

import json

from zyfa.cli import main

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_impact_with_an_implementation_and_a_plugin(tmp_path):
    out = tmp_path / "r.jsonl"
    assert main(["impact", "--models", "smollm2", "--recipes", "fp32", "--implementations", "sdpa-fp32",
                 "--kernel", f"{ROOT}/examples/fp8_torch_attention.py:attention", "--tokens", "64", "--windows", "1",
                 "--out", str(out), "--no-progress"]) == 0
    rows = {r["recipe"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"fp32", "sdpa-fp32", f"plugin:{ROOT}/examples/fp8_torch_attention.py:attention"}
    assert rows["sdpa-fp32"]["ran"] == {"sdpa-fp32": list(range(30))}
    assert rows["sdpa-fp32"]["kl_mean"] < 1e-6  # fp32 attention: the stock model's logits
    plug = rows[f"plugin:{ROOT}/examples/fp8_torch_attention.py:attention"]
    assert plug["implementation"] == plug["recipe"] and plug["kl_mean"] > 1e-5  # an FP8 kernel moves the logits
    assert "implementation" not in rows["fp32"]


def test_impact_refuses_a_recipe_as_implementation(tmp_path, capsys):
    assert main(["impact", "--models", "smollm2", "--implementations", "zyfa", "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "is a recipe; give it with --recipes" in capsys.readouterr().err
