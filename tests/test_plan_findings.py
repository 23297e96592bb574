"""The generated findings of the study plans (accuracy.study.plan_findings) where the committed data cannot reach a
path: every plan before any of its rows ("untested at the condition" with its planned n), the HumanEval plan once
rows under its hash exist (planted in a copy of the plan: each arm's verdict by the plan's own rule), and a contrast
plan whose primary condition has only a run's partial rows."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from zyfa.accuracy.io.results_io import jsonl_text
from zyfa.accuracy.scoring.plan import load_plan
from zyfa.accuracy.study.finding import UNTESTED, UNTESTED_PREFIX
from zyfa.accuracy.study.plan_findings import (
    contrast_findings,
    humaneval_findings,
    plan_files,
    plan_findings,
    retrieval_findings,
)
from zyfa.accuracy.tasks.plan import N_PROBLEMS, load_humaneval_plan

ROOT = Path(__file__).resolve().parents[1]


def test_every_plan_without_rows_is_untested_with_its_planned_n(tmp_path):
    shutil.copytree(ROOT / "studies", tmp_path / "studies")
    files = plan_files(tmp_path)
    contrast = ["accumulator-operator.toml", "per-head-descales-models.toml", "per-head-descales-qwen05.toml",
                "per-head-descales.toml", "rowsum-mma-operator.toml"]
    # accumulator-operator-length.toml: every condition descriptive, so it claims nothing and makes no finding
    assert [f.name for f in files["contrast"]] == sorted([*contrast, "accumulator-operator-length.toml"])
    assert [f.name for f in files["humaneval"]] == ["humaneval-0.5b.toml", "humaneval-bf16.toml",
                                                    "humaneval-flashinfer.toml", "humaneval-k-smoothing.toml",
                                                    "humaneval-paper-recipe.toml", "humaneval.toml"]
    assert {"accumulator.toml", "fp8-retrieval-hd128.toml", "fp8-retrieval-generated.toml"} <= {
        f.name for f in files["retrieval"]}
    assert not any(f.name.startswith("hd128-") for kind in files.values() for f in kind)  # findings.py's own
    out = plan_findings(tmp_path)
    n_retrieval = sum(len(load_plan(f).models) for f in files["retrieval"])
    assert len(out) == n_retrieval + len(contrast) + 6  # a contrast plan: one claim, one primary; HumanEval: one each
    for f in out:
        assert f.verdict.startswith(UNTESTED) and f.figure == "–" and "n = 0 (" in f.unit, f
        assert f.source.startswith("`studies/") and "reports/" not in f.source
    assert sum("(50 facts per cell planned)" in f.unit for f in out) == n_retrieval
    # a retrieval design's detectable difference, in units of the per-fact spread SD_f that only rows show: the t
    # test over 50 facts at α = 0.05 and 80% power, (t[0.975, 49] + t[0.8, 49]) / √50 = 0.404, and at Holm's first
    # step over the plan's cell-metrics (the 1.5B grid: 1 model × 2 tasks × 4 lengths × 2 metrics = 16, α/16)
    grid = next(f for f in out if "studies/longctx-1.5b.toml" in f.source)
    assert ("the design finds a cell's difference of 0.40 × SD_f with 80% power at α = 0.05 (0.56 × SD_f at "
            "Holm's first step over 16 cell-metrics)") in grid.verdict
    assert all("× SD_f with 80% power" in f.verdict for f in out if "facts per cell planned" in f.unit)
    by = {f.source.split("`")[1]: f for f in out if f.unit == f"problem, n = 0 ({N_PROBLEMS} problems per arm planned)"}
    assert sorted(by) == ["studies/humaneval-0.5b.toml", "studies/humaneval-bf16.toml",
                          "studies/humaneval-flashinfer.toml", "studies/humaneval-k-smoothing.toml",
                          "studies/humaneval-paper-recipe.toml", "studies/humaneval.toml"]
    he, fi = by["studies/humaneval.toml"], by["studies/humaneval-flashinfer.toml"]
    ks = by["studies/humaneval-k-smoothing.toml"]  # a baseline that is not stock: the one factor, K smoothing
    assert "arm − triton:fa3" in ks.condition and "(triton:fa3:k_smoothing=true vs triton:fa3)" in ks.question
    # the detectable loss each plan's header states: Holm's first step over 3 contrasts, and one contrast alone
    assert "loss of 7.9 points at 10% or 10.4 points at 15% discordant problems with 80% power" in he.verdict
    assert "loss of 7.3 points at 10% or 9.1 points at 15% discordant problems with 80% power" in fi.verdict
    assert "exact McNemar, 1 contrast, no correction" in fi.condition


def _he_rows(plan, model, impl, passed, plan_hash):
    return [{"kind": "humaneval", "status": "ok", "model": model, "implementation": impl, "baseline": plan.baseline,
             "task_id": f"HumanEval/{i}", "passed": bool(p), "recipe": None, "input": f"he/{model}/{i}",
             "plan_hash": plan_hash} for i, p in enumerate(passed)]


def test_the_humaneval_row_once_rows_under_its_hash_exist(tmp_path):
    """Planted rows: the baseline passes ~60% of 164 problems; cudnn-fp8 loses 20 of them net (12 more flip each
    way), the other arms pass exactly as the baseline. The row then gives each arm's paired difference and the
    plan's verdict (an effect for cudnn-fp8, no effect larger than 5 points for the others); rows written under
    another hash (a file beside them) are left out; the descriptive model without rows is not mentioned."""
    (tmp_path / "studies").mkdir()
    shutil.copy(ROOT / "studies" / "humaneval.toml", tmp_path / "studies" / "humaneval.toml")
    plan = load_humaneval_plan(tmp_path / "studies" / "humaneval.toml")
    assert humaneval_findings(tmp_path)[0].verdict.startswith(UNTESTED)
    rng = random.Random(0)
    base = [rng.random() < 0.6 for _ in range(N_PROBLEMS)]
    passing = [i for i in range(N_PROBLEMS) if base[i]]
    failing = [i for i in range(N_PROBLEMS) if not base[i]]
    lossy = list(base)
    for i in passing[:32]:
        lossy[i] = False
    for i in failing[:12]:
        lossy[i] = True
    model = plan.models[0]
    rows = _he_rows(plan, model, plan.baseline, base, plan.hash) + _he_rows(plan, model, "cudnn-fp8", lossy, plan.hash)
    rows += [r for arm in plan.arms if arm != "cudnn-fp8" for r in _he_rows(plan, model, arm, base, plan.hash)]
    out = tmp_path / "reports" / "humaneval-plan" / "he.jsonl"
    out.parent.mkdir(parents=True)
    out.write_text(jsonl_text(rows, {"plan_hash": plan.hash}))
    (tmp_path / "reports" / "humaneval-plan" / "old.jsonl").write_text(jsonl_text(
        _he_rows(plan, model, "cudnn-fp8", [False] * N_PROBLEMS, "0" * 64), {}))
    row, = humaneval_findings(tmp_path)
    assert row.unit == f"problem, n = {N_PROBLEMS} paired per arm (of {N_PROBLEMS})"
    assert row.source == f"`studies/humaneval.toml` ({plan.short_hash}), `reports/humaneval-plan/`"
    assert row.figure.startswith(f"cudnn-fp8 {100 * -20 / N_PROBLEMS:+.1f} [")
    assert row.verdict.startswith("cudnn-fp8: effect")
    assert "triton:fa3: no effect larger than 5 points" in row.verdict
    assert "qwen25coder:" not in row.verdict and " on qwen25coder" not in row.figure
    assert "tokens" in row.condition and "head dim 128" in row.condition


def test_a_contrast_plan_on_partial_rows_says_so_and_leaves_missing_conditions_out(tmp_path):
    """The operator contrast plan with only its primary condition's rows, as a run's .partial log: the row's figure
    is the committed one (the same rows), its condition says the rows are partial, and the secondary conditions
    without rows are not named."""
    (tmp_path / "studies").mkdir()
    shutil.copy(ROOT / "studies" / "accumulator-operator.toml", tmp_path / "studies")
    results = "reports/accumulator-operator/qwen25coder-1.5b-2048.jsonl"
    (tmp_path / results).parent.mkdir(parents=True)
    shutil.copy(ROOT / results, tmp_path / (results + ".partial"))
    row, = contrast_findings(tmp_path)
    full = next(f for f in contrast_findings(ROOT) if f.source.startswith("`studies/accumulator-operator.toml`"))
    assert row.figure == full.figure == "deq 1.465 [1.315, 1.632]; orig 1.011 [1.001, 1.023]"
    assert "(primary) (partial rows);" in row.condition and "(partial rows)" not in full.condition
    assert row.verdict == "deq effect, orig no effect larger than 0.05"
    assert "other conditions" in full.verdict
    assert row.source.endswith("`reports/accumulator-operator/`")


def test_a_cut_runs_partial_rows_count_and_the_verdict_waits(tmp_path):
    """Rows of a run cut by device time stay in ``<out>.partial`` until resumed: the HumanEval row reads them and
    waits for the problems it lacks (n and the interim figure stated), and a retrieval plan whose partial rows hold
    one arm only says how many rows it has and that none is paired yet."""
    (tmp_path / "studies").mkdir()
    for name in ("humaneval.toml", "fp8-retrieval-generated.toml"):
        shutil.copy(ROOT / "studies" / name, tmp_path / "studies" / name)
    plan = load_humaneval_plan(tmp_path / "studies" / "humaneval.toml")
    model, n = plan.models[0], 40
    rows = [r for impl in (plan.baseline, *plan.arms)
            for r in _he_rows(plan, model, impl, [i % 2 == 0 for i in range(n)], plan.hash)]
    part = tmp_path / "reports" / "humaneval-plan" / "he-0.jsonl.partial"
    part.parent.mkdir(parents=True)
    part.write_text(jsonl_text(rows, {"plan_hash": plan.hash}))
    row, = humaneval_findings(tmp_path)
    assert row.unit == f"problem, n = {n} paired per arm (of {N_PROBLEMS})"
    assert f"waits: {n} of {N_PROBLEMS} problems paired" in row.verdict
    # the generated plan's committed run, cut at two points as device time would cut it (its rows alternate the arms
    # prompt by prompt, niah before multikey): first one arm's rows of its first cell only, then niah complete
    done = ROOT / "reports" / "fp8-retrieval-generated" / "results-qwen25coder-1.5b.jsonl"
    lc_plan = load_plan(tmp_path / "studies" / "fp8-retrieval-generated.toml")
    prov, *records = (json.loads(line) for line in done.read_text().splitlines())
    assert prov["record"] == "provenance" and prov["plan_hash"] == lc_plan.hash
    dest = tmp_path / "reports" / "fp8-retrieval-generated" / (done.name + ".partial")
    dest.parent.mkdir(parents=True)
    first = (lc_plan.tasks[0], lc_plan.lengths[0])
    one_arm = [r for r in records if (r["task"], r["length"]) == first and r["implementation"] == lc_plan.primary.a]
    assert 0 < len(one_arm) < len(records)
    dest.write_text(jsonl_text(one_arm, prov))
    found, = retrieval_findings(tmp_path)
    assert found.verdict.startswith(UNTESTED_PREFIX)
    assert f"{len(one_arm)} rows under this plan, none paired yet" in found.verdict
    # a run cut after the first task: its cells have verdicts, the other task's are named as untested
    task = lc_plan.tasks[0]
    dest.write_text(jsonl_text([r for r in records if r["task"] == task], prov))
    found, = retrieval_findings(tmp_path)
    assert not found.verdict.startswith(UNTESTED_PREFIX)
    missing = [f"{t} {n}" for t in lc_plan.tasks if t != task for n in lc_plan.lengths]
    n_metrics = len(lc_plan.tasks) * len(lc_plan.lengths) * len(lc_plan.metrics)
    assert missing and (f"interim: {len(missing) * len(lc_plan.metrics)} of {n_metrics} cell-metrics have no paired "
                        f"rows yet ({', '.join(missing)}: untested") in found.verdict
    # the whole run, still named .partial: no cell is left untested
    shutil.copy(done, dest)
    found, = retrieval_findings(tmp_path)
    assert "interim" not in found.verdict and "untested" not in found.verdict, found.verdict
