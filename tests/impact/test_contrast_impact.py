"""Contrast plans with a whole-model condition (accuracy/report/contrast.py, kind = "impact"): the plan checked in
one line per problem, the command that makes its rows, the per-window figure on planted rows (an effect found, a
null bounded, rows of another text or length or a per-layer sweep left out), and the real path: `zyfa impact` on
SmolLM2 with the two arms, then the verdict table and the generated finding from those rows."""

from __future__ import annotations

import argparse
import json
import math

import pytest
from zyfa.accuracy.report.contrast import contrast_figures, impact_pair_figure, load_contrast_plan, main, run_command
from zyfa.accuracy.report.hd128 import PlanFileError
from zyfa.accuracy.study.plan_findings import contrast_findings

A, B = "zyfa", "zyfa:q_scale=head_kv,k_scale=head,v_scale=head"
PLAN = """
name = "heads"
[[claims]]
a = "{a}"
b = "{b}"
threshold = 0.10
text = "per-head descales"
[[conditions]]
kind = "impact"
label = "smollm2, every layer"
model = "{model}"
text = "lee"
tokens = {tokens}
windows = {windows}
metric = "{metric}"
results = "{results}"
primary = true
"""


def _plan(tmp_path, **kw):
    values = {"a": A, "b": B, "model": "smollm2", "tokens": 32, "windows": 2, "metric": "kl_mean",
              "results": tmp_path / "reports" / "rows.jsonl", **kw}
    p = tmp_path / "studies" / "heads.toml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(PLAN.format(**values))
    return p


def test_the_plan_is_checked_and_names_its_command(tmp_path):
    plan = load_contrast_plan(_plan(tmp_path))
    cond = plan.conditions[0]
    assert (cond.kind, cond.model, cond.text, cond.tokens, cond.windows) == ("impact", "smollm2", "lee", 32, 2)
    cmd = run_command(plan, cond)
    assert cmd.startswith("zyfa impact --models smollm2 --recipes ") and "--windows 2" in cmd and "--resume" in cmd
    assert f"{B},{A}" in cmd and "--text lee --tokens 32" in cmd
    for kw, said in (({"model": "nosuch"}, "model 'nosuch' is not in the registry"),
                     ({"windows": 0}, "windows must be a positive whole number"),
                     ({"metric": "ppl"}, "metric must be one of kl_mean")):
        with pytest.raises(PlanFileError, match=said):
            load_contrast_plan(_plan(tmp_path, **kw))
    bad = _plan(tmp_path)
    bad.write_text(bad.read_text().replace('kind = "impact"', 'kind = "model"'))
    with pytest.raises(PlanFileError, match="kind must be one of operator, impact"):
        load_contrast_plan(bad)


def _row(recipe, window, kl, **kw):
    return {"kind": "impact_window", "model": "smollm2", "recipe": recipe, "window": window, "layer": None,
            "text": "lee", "n_tokens": 32, "kl_mean": kl, **kw}


def test_the_figure_pairs_windows_and_leaves_other_rows_out(tmp_path):
    cond = load_contrast_plan(_plan(tmp_path, windows=8)).conditions[0]
    spread = (1.0, 1.1, 0.9, 1.05, 0.95, 1.02, 0.98, 1.0)
    rows = [_row(A, w, 1.0 * s) for w, s in enumerate(spread)]
    rows += [_row(B, w, 0.33 * s * (1.02 if w % 2 else 0.98)) for w, s in enumerate(spread)]
    rows += [_row(B, 0, 5.0, text="pydoc"), _row(B, 1, 5.0, n_tokens=64), _row(B, 2, 5.0, layer=3),
             _row("triton:fa3", 3, 5.0), _row(B, 9, 0.3)]  # not this condition's, or unpaired
    rec = impact_pair_figure(rows, A, B, cond, 0.10)
    assert rec["n"] == 8 and rec["n_clusters"] == 8 and rec["kind"] == "impact"
    assert rec["ratio"] == pytest.approx(0.33, rel=0.01) and rec["hi"] < 0.9 and rec["label"] == "effect"
    near = [_row(A, w, 1.0) for w in range(8)] + [_row(B, w, 1.0 + 0.01 * (-1) ** w) for w in range(8)]
    assert impact_pair_figure(near, A, B, cond, 0.10)["label"] == "no effect larger than 0.1"
    same = [_row(arm, w, 0.01 * (w + 1)) for arm in (A, B) for w in range(4)]  # one KV head: one computation
    assert impact_pair_figure(same, A, B, cond, 0.10)["label"] == (
        "identical in all 4 windows: the arms compute the same here")
    one = impact_pair_figure([_row(A, 0, 1.0), _row(B, 0, 0.5)], A, B, cond, 0.10)
    assert one["n"] == 1 and not math.isfinite(one["lo"]) and one["label"].startswith("inconclusive")
    assert impact_pair_figure([], A, B, cond, 0.10)["label"] == "untested (no paired rows)"


def test_impact_rows_to_verdict_table_and_finding(tmp_path, smollm2, monkeypatch):
    """The real path: zyfa impact makes both arms' rows on SmolLM2 (2 windows of 32 tokens), the contrast renders
    them, and the generated findings row states the condition, n and verdict."""
    import zyfa.capture.models
    from zyfa.accuracy.impact import cli as impact_cli

    monkeypatch.setattr(zyfa.capture.models, "load_model", lambda name, **kw: smollm2)
    plan_path = _plan(tmp_path)
    plan = load_contrast_plan(plan_path)
    out = tmp_path / "reports" / "rows.jsonl"
    parser = argparse.ArgumentParser()
    impact_cli.add_arguments(parser)
    argv = ["--models", "smollm2", "--recipes", f"{A},{B}", "--text", "lee", "--tokens", "32", "--windows", "2",
            "--out", str(out), "--no-progress"]
    assert impact_cli.main(parser.parse_args(argv)) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len({r["recipe"] for r in rows}) == 2
    rec = contrast_figures(plan, {plan.conditions[0].results: rows})[0]
    by = {(r["recipe"], r["window"]): r["kl_mean"] for r in rows}
    names = sorted({r["recipe"] for r in rows}, key=lambda n: n != "zyfa")  # the spec's row name second
    expect = math.sqrt(math.prod(by[names[1], w] / by[names[0], w] for w in (0, 1)))
    assert rec["n"] == 2 and rec["ratio"] == pytest.approx(expect, rel=1e-9)
    report = tmp_path / "report.md"
    assert main([str(plan_path), "--out", str(report)]) == 0
    md = report.read_text()
    assert "2 held-out windows of 32 tokens (each its own unit)" in md and "next-token KL" in md
    found = contrast_findings(tmp_path)
    assert len(found) == 1 and "smollm2's next-token KL" in found[0].question
    assert found[0].unit.startswith("n = 2 held-out windows") and found[0].unit.endswith("interval over windows")
