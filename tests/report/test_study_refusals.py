"""zyfa study with a recipe that refuses some inputs: a rotating scheme (zyfa+hadamard) cannot take MLA's head dim
192 (zyfa.rotation needs a power of two). The study leaves those (input, recipe) pairs out, says so in the report,
runs everything else, and a study cut short resumes to the rows of an uninterrupted one."""

from __future__ import annotations

from zyfa.accuracy.study.run import refusals

from tests.faults import disk_full_after_rows, result_rows, rows_match
from zyfa.cli import main as zyfa

ARGS = ["study", "--max-seq", "128", "--captures", "none", "--gaussian-filter", "d64|d192",
        "--recipes", "zyfa,zyfa+hadamard", "--impact", "none", "--implementations", "none", "--device", "cpu",
        "--no-progress"]


def test_refusals_name_the_rotating_recipe_on_non_power_of_two_head_dims():
    from zyfa.accuracy.inputs.attention_input import GaussianSpec, make_gaussian

    inputs = [make_gaussian(GaussianSpec(heads_q=1, heads_kv=1, seq=16, head_dim=d, head_dim_v=dv))
              for d, dv in ((64, None), (192, 128))]
    got = refusals(inputs, ["zyfa", "zyfa+hadamard", "zyfa+block+hadamard", "zyfa+smooth"])
    assert set(got) == {(inputs[1].name, "zyfa+hadamard"), (inputs[1].name, "zyfa+block+hadamard")}
    assert all("power-of-two head dim, got 192" in why for why in got.values())


def test_refused_pairs_are_left_out_and_said(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert zyfa([*ARGS, "--out", "st"]) == 0
    rows = result_rows(tmp_path / "st" / "results.jsonl")
    pairs = [(r["input"], r["recipe"]) for r in rows]
    d192 = sorted({i for i, _ in pairs if "d192" in i})
    d64 = sorted({i for i, _ in pairs if "d64" in i})
    assert len(d192) == len(d64) == 3
    assert [rc for i, rc in pairs if i in d192] == ["zyfa"] * 3  # the rotation refuses head dim 192
    assert sorted(rc for i, rc in pairs if i in d64) == ["zyfa"] * 3 + ["zyfa+hadamard"] * 3
    md = (tmp_path / "st" / "report.md").read_text(encoding="utf-8")
    assert "Not run, refused by the recipe: `zyfa+hadamard` (Hadamard rotation needs a power-of-two head dim" in md
    assert all(i in md.split("Not run, refused by the recipe")[1].split("\n")[0] for i in d192)


def test_a_study_with_refusals_cut_short_resumes_to_the_uninterrupted_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert zyfa([*ARGS, "--out", "whole"]) == 0
    with disk_full_after_rows(monkeypatch, 7):
        assert zyfa([*ARGS, "--out", "st"]) == 2
    assert len(result_rows(tmp_path / "st.partial" / "accuracy_rows.jsonl.partial" / "rank-0.jsonl")) == 7
    assert zyfa([*ARGS, "--out", "st", "--resume"]) == 0
    assert rows_match(result_rows(tmp_path / "st" / "results.jsonl"), result_rows(tmp_path / "whole" / "results.jsonl"))
