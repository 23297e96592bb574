"""The README's and docs/FINDINGS.md's verdict rows are generated (accuracy.study.findings) from the committed
result and plan files: each file's block must equal the generated one, so that neither drifts from the data."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from zyfa.accuracy.study.findings import (
    BEGIN,
    END,
    TARGETS,
    findings,
    render,
    replace_block,
)
from zyfa.accuracy.study.plan_findings import plan_files, retrieval_findings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def block():
    return render(findings(ROOT))


@pytest.mark.parametrize("name", TARGETS)
def test_the_committed_block_is_the_generated_one(block, name):
    text = (ROOT / name).read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    mine = text[text.index(BEGIN):text.index(END) + len(END)]
    assert mine == block, f"{name}: regenerate with python -m zyfa.accuracy.study.findings --write"


def test_every_row_states_condition_unit_n_interval_and_verdict(block):
    rows = [line for line in block.splitlines() if line.startswith("| ") and "(generated)" not in line]
    assert len(rows) == len(findings(ROOT))
    for row in rows:
        question, condition, unit, figure, verdict, source = (c.strip() for c in row.strip("| ").split(" | "))
        assert "n = " in unit and condition and verdict and "`studies/" in source
        if verdict.startswith("untested"):
            assert "n = 0" in unit and figure == "–"
        else:
            assert "[" in figure and "tokens" in condition and "head dim" in condition
        first = verdict.split(";")[0]
        if "inconclusive" in first.replace(" 0 inconclusive", ""):
            assert "detect" in first  # a null says what it could have seen
    # the hd128 claims: intervals over the 28 layers, not the 336 heads as if independent
    assert sum("n = 336 in 28 layers (interval over layers)" in r for r in rows) == 3
    # the technique-1 sensitivity: each claim says under how many variants its verdict holds, and which change it
    assert sum("technique-1 variants against zyfa on all layers (28 clusters" in r for r in rows) == 3
    # (the plain chord puts zyfa's kernel-only error above CK's: the deq verdict rests on our MAD choice)
    assert any("`zyfa:mad_rounding=nearest,mad_offset=0`: deq contradicted (above the range)" in r for r in rows)
    # the long-context accumulator plans: one row per model of each plan (four models over three plans), each with
    # its cells counted by verdict and its plan named
    acc = [r for r in rows if "never-flushed" in r and "long-context retrieval" in r]
    assert len(acc) == 4 and all("fact, n = 50 per cell" in r and " inconclusive" in r for r in acc)
    assert {m for r in acc for m in ("gemma3", "qwen25coder-1.5b", "smollm2") if f"on {m} change (" in r} == {
        "gemma3", "qwen25coder-1.5b", "smollm2"}
    assert sum("`studies/accumulator-hd128.toml`" in r for r in acc) == 1
    # FP8 attention itself (cuDNN FP8 against cuDNN BF16): its question from the plan's description and contrast,
    # its 12 effect cells summarized per metric, the exploratory contrasts in the figure only
    fp8, = [r for r in rows if "`studies/fp8-retrieval-hd128.toml`" in r]
    question, _, _, figure, verdict, _ = (c.strip() for c in fp8.strip("| ").split(" | "))
    assert question.startswith("cuDNN's BF16 attention against cuDNN's FP8 attention") and \
        question.endswith("(cudnn-fp8 vs sdpa-bf16:cudnn)?")
    assert verdict.startswith("12 effects, 0 no effect above the threshold, 0 inconclusive of 12 cells")
    assert "exploratory" not in verdict and "exploratory, outside the rule: triton:fa3 vs sdpa-bf16:cudnn" in figure
    assert "exact -1 to -0.8 over 6 cells" in figure
    # complete runs (the 1.5B grid to 32K, the generated plan) name no missing cell (a cut run, which does, and a
    # plan with no rows at all: tests/test_plan_findings.py); the grid's exploratory contrasts in its figure only
    grid, = [r for r in rows if "`studies/longctx-1.5b.toml`" in r]
    assert "| fact, n = 50 per cell |" in grid and "no paired rows yet" not in grid
    assert "| 16 effects, 0 no effect above the threshold, 0 inconclusive of 16 cells;" in grid
    assert "cute:zyfa-hopper vs triton:zyfa-hopper 0 of 13 cells effects" in grid
    gen, = [r for r in rows if "`studies/fp8-retrieval-generated.toml`" in r]
    assert "no paired rows yet" not in gen and "| 8 effects, 0 no effect above the threshold, 0 inconclusive of 8 " \
        "cells;" in gen
    # the operator contrast plan: its primary condition's verdicts, the other conditions each beside it
    op, = [r for r in rows if "`studies/accumulator-operator.toml`" in r]
    assert "qwen25coder-1.5b, head dim 128, 2048 tokens (primary)" in op and "n = 28 layers" in op
    assert "| deq 1.465 [1.315, 1.632]; orig 1.011 [1.001, 1.023] | deq effect, orig no effect larger than 0.05; " \
        "other conditions, each its own verdict: smollm2" in op
    # HumanEval: each arm's paired problems of the 164 and, until all 164 are paired, a verdict that waits
    he, = [r for r in rows if "`studies/humaneval.toml`" in r]
    n = re.search(r"problem, n = (\d+)(?:–(\d+))? paired per arm \(of 164\)", he)
    assert n, he
    assert ("waits: " in he) == (int(n.group(1)) < 164) and "`reports/humaneval-plan/`" in he


def test_a_file_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="no generated findings block"):
        replace_block("# README\n", "x")
    assert replace_block(f"a\n{BEGIN}\nold\n{END}\nb", "NEW") == "a\nNEW\nb"


def test_the_accumulator_row_once_rows_under_the_plan_exist(tmp_path):
    """Planted rows under the plan's hash in a sub-folder of reports/longctx: one cell where flushing raises
    log p(answer) by 0.3 nats on every one of 50 facts (an effect) and both arms are exact everywhere (ceiling:
    left out, not counted as "no"); rows under another hash are ignored."""
    import shutil

    from zyfa.accuracy.io.results_io import jsonl_text
    from zyfa.accuracy.scoring.plan import load_plan

    shutil.copytree(ROOT / "studies", tmp_path / "studies")
    plan = load_plan(tmp_path / "studies" / "accumulator.toml")
    assert retrieval_findings(tmp_path)[0].verdict.startswith("untested at the condition")
    rows = []
    for fact in range(50):
        for depth in (0.25, 0.75):
            lp = -1.0 - 0.01 * fact
            for impl, v in ((plan.primary.a, lp), (plan.primary.b, lp + 0.3)):
                rows.append({"kind": "longctx", "model": plan.models[0], "task": plan.tasks[0],
                             "length": plan.lengths[0], "depth": depth, "seed": fact, "implementation": impl,
                             "recipe": None, "exact": True, "answer_logprob": v, "status": "ok", "plan_hash": plan.hash,
                             "input": f"{plan.models[0]}/{plan.tasks[0]}/L{plan.lengths[0]}/d{depth}/s{fact}"})
    out = tmp_path / "reports" / "longctx" / "accumulator" / "rows.jsonl"
    out.parent.mkdir(parents=True)
    out.write_text(jsonl_text(rows, {"plan_hash": plan.hash}))
    (tmp_path / "reports" / "longctx" / "other.jsonl").write_text(jsonl_text(
        [{**r, "plan_hash": "0" * 64, "input": r["input"] + "x"} for r in rows], {}))
    # one per model of each plan, the first plan first; its second model and the later plans have no rows here
    row, untested, *later = retrieval_findings(tmp_path)
    assert len(later) == len(plan_files(tmp_path)["retrieval"]) - 1  # one model each; the contrast plan is not one
    assert all(f.verdict.startswith("untested at the condition") for f in (untested, *later))
    assert row.source.startswith("`studies/accumulator.toml`") and "`reports/longctx/accumulator/`" in row.source
    assert row.unit == "fact, n = 50 per cell"
    assert row.verdict.startswith("1 effects, 0 no effect above the threshold, 0 inconclusive of 1 cells; "
                                  "1 ceiling/floor cells left out")
    assert f"{plan.tasks[0]} {plan.lengths[0]} answer_logprob +0.3 [" in row.figure


def test_a_generated_metric_reads_with_its_label_unit_and_lost_prompts(tmp_path):
    """A retrieval plan judging gen_exact (the greedily generated answer's exact match): the finding's condition
    names the metric by its label and unit (accuracy.scoring.plan.METRICS), and prompts whose generation failed
    are counted in its verdict."""
    from zyfa.accuracy.io.results_io import jsonl_text
    from zyfa.accuracy.scoring.plan import METRICS, load_plan

    (tmp_path / "studies").mkdir()
    text = (ROOT / "studies" / "accumulator.toml").read_text().replace("exact = 0.05", "gen_exact = 0.05")
    assert "gen_exact = 0.05" in text
    (tmp_path / "studies" / "accumulator.toml").write_text(text.replace("[primary]", "generate = 2\n\n[primary]"))
    plan = load_plan(tmp_path / "studies" / "accumulator.toml")
    rows = []
    for fact in range(50):
        for depth in (0.25, 0.75):
            for impl, ok in ((plan.primary.a, True), (plan.primary.b, fact % 2 == 0)):
                err = "decode refused" if (fact, depth, impl) == (7, 0.25, plan.primary.b) else None
                rows.append({"kind": "longctx", "model": plan.models[0], "task": plan.tasks[0],
                             "length": plan.lengths[0], "depth": depth, "seed": fact, "implementation": impl,
                             "recipe": None, "exact": True, "answer_logprob": -1.0, "status": "ok",
                             "gen_exact": None if err else ok, "gen_error": err, "plan_hash": plan.hash,
                             "input": f"{plan.models[0]}/{plan.tasks[0]}/L{plan.lengths[0]}/d{depth}/s{fact}"})
    out = tmp_path / "reports" / "longctx" / "gen" / "rows.jsonl"
    out.parent.mkdir(parents=True)
    out.write_text(jsonl_text(rows, {"plan_hash": plan.hash}))
    row = retrieval_findings(tmp_path)[0]
    assert METRICS["gen_exact"].phrase in row.condition and METRICS["answer_logprob"].phrase in row.condition
    assert "generated exact match (fraction of prompts whose greedily decoded answer" in row.condition
    assert f"{plan.tasks[0]} {plan.lengths[0]} gen_exact -0.495 [" in row.figure  # 49 of 99 paired prompts lost
    assert "; 1 prompts lost to generation errors (left out of both arms)" in row.verdict
