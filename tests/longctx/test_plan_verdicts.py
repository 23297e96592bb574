"""A study plan on long-context rows: verdicts by the plan's rule on planted rows (the fact as the unit, ceiling
cells uninformative, Holm over the primary cells), the report refusing rows of a changed plan, and ``zyfa longctx
--plan`` end to end on SmolLM2 (short prompts): the plan supplies the grid, every row carries its hash, bad plans
are one line before any work."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from zyfa.accuracy.io.command import UsageError
from zyfa.accuracy.io.results_io import jsonl_text
from zyfa.accuracy.longctx.args import plan_generate
from zyfa.accuracy.longctx.section import RenderError, render_folder
from zyfa.accuracy.longctx.verdicts import plan_blocks, plan_verdicts
from zyfa.accuracy.scoring.plan import load_plan

from zyfa.cli import main

PLAN = """
name = "planted"
models = ["smollm2"]
tasks = ["needle"]
lengths = [128, 192]
depths = [0.0, 0.5, 1.0]
facts = 4
pilot = true
baselines = ["sdpa-fp32"]

[primary]
a = "fp8-never"
b = "fp8-flushed"

[metrics]
answer_logprob = 0.05
exact = 0.05

[[exploratory]]
a = "sdpa-fp32"
b = "fp8-never"
"""


def _row(plan_hash, impl, length, depth, seed, exact, lp):
    return {"kind": "longctx", "model": "smollm2", "task": "needle", "length": length, "depth": depth, "seed": seed,
            "implementation": impl, "recipe": None, "exact": exact, "answer_logprob": lp, "status": "ok",
            "plan_hash": plan_hash,
            "input": f"smollm2/needle/L{length}/d{round(depth * 100)}/s{seed}"}


def _planted(plan_hash):
    """At 128 every arm is exact (ceiling) and the flushed kernel is 0.5 nats surer per prompt, the fact adding a
    shared offset; at 192 the arms agree up to noise."""
    rng = np.random.default_rng(0)
    rows = []
    for n in (128, 192):
        for s in range(4):
            fact = rng.normal(0, 0.2)
            for d in (0.0, 0.5, 1.0):
                base = -2.0 + fact  # a log-probability: below 0 with the noise (a renderer refuses > 0)
                rows.append(_row(plan_hash, "sdpa-fp32", n, d, s, True, base))
                never = base - (0.5 if n == 128 else 0.0)
                rows.append(_row(plan_hash, "fp8-never", n, d, s, True, never))
                rows.append(_row(plan_hash, "fp8-flushed", n, d, s, n == 128 or (s, d) != (0, 0.0),
                                 base + float(rng.normal(0, 0.3 if n == 192 else 0.01))))
    return rows


@pytest.fixture
def plan_file(tmp_path):
    p = tmp_path / "plan.toml"
    p.write_text(PLAN)
    return p


def test_verdicts_by_the_plans_rule(plan_file):
    plan = load_plan(plan_file)
    res = plan_verdicts(plan, _planted(plan.hash))
    by = {(r["contrast"].exploratory, r["length"], r["metric"]): r for r in res}
    lp128 = by[(False, 128, "answer_logprob")]
    assert lp128["verdict"].kind == "effect" and lp128["verdict"].direction == "better"
    assert lp128["verdict"].n_units == 12 and lp128["verdict"].n_clusters == 4  # 3 depths x 4 facts
    assert lp128["p_adjusted"] >= lp128["verdict"].p
    assert by[(False, 128, "exact")]["label"] == "uninformative (ceiling)"
    lp192 = by[(False, 192, "answer_logprob")]
    assert lp192["verdict"].kind == "inconclusive" and math.isfinite(lp192["verdict"].detectable)
    assert lp192["label"].startswith("inconclusive (could detect only ≥ ")
    assert by[(True, 128, "answer_logprob")]["contrast"].exploratory
    assert math.isnan(by[(True, 128, "answer_logprob")]["p_adjusted"])  # outside the family
    blocks = plan_blocks(plan, _planted(plan.hash))
    table = next(b for b in blocks if b[0] == "table")
    assert len(table[3]) == len(res) == 2 * 2 * 2
    text = " ".join(b[1] for b in blocks if b[0] == "p")
    assert f"hash {plan.short_hash}" in text and "Pilot" in text and "1 uninformative" in text


def test_holm_downgrades_an_effect_that_does_not_survive(plan_file):
    """Two primary cell-metrics with p just under alpha: alone each is an effect; Holm over the family is not."""
    plan = load_plan(plan_file)
    rows = []
    rng = np.random.default_rng(3)
    for n in (128, 192):
        for s in range(4):
            for d in (0.0, 0.5, 1.0):
                delta = [0.06, 0.02, 0.09, 0.05][s] + float(rng.normal(0, 0.0005))
                rows.append(_row(plan.hash, "fp8-never", n, d, s, True, -1.0))
                rows.append(_row(plan.hash, "fp8-flushed", n, d, s, True, -1.0 + delta))
    res = [r for r in plan_verdicts(plan, rows) if r["metric"] == "answer_logprob" and not r["contrast"].exploratory]
    assert all(r["verdict"].kind == "effect" for r in res)
    assert all(r["verdict"].p < plan.alpha <= r["p_adjusted"] for r in res), [r["verdict"].p for r in res]
    assert all(r["label"].startswith("inconclusive after holm (adjusted p = ") for r in res)


def test_a_cut_run_keeps_its_missing_cells_in_the_family(plan_file):
    """Rows of only the first length (a run cut before 192): the 192 cells still count in Holm's family (p = 1), so
    the adjusted p of the cell that ran is the one the whole plan gives it, and the report says the plan is
    incomplete."""
    plan = load_plan(plan_file)
    rows = [r for r in _planted(plan.hash) if r["length"] == 128]
    res = {(r["length"], r["metric"]): r for r in plan_verdicts(plan, rows) if not r["contrast"].exploratory}
    lp = res[(128, "answer_logprob")]
    assert res[(192, "answer_logprob")]["verdict"] is None and res[(192, "exact")]["verdict"] is None
    # family: the informative 128 cell plus the two missing 192 cells; the ceiling cell is left out as before
    assert lp["p_adjusted"] == pytest.approx(min(1.0, 3 * lp["verdict"].p))
    assert math.isnan(res[(192, "answer_logprob")]["p_adjusted"])
    text = " ".join(b[1] for b in plan_blocks(plan, rows) if b[0] == "p")
    assert "The plan is incomplete: 2 of its primary cell-metrics have no paired rows yet" in text
    complete = " ".join(b[1] for b in plan_blocks(plan, _planted(plan.hash)) if b[0] == "p")
    assert "incomplete" not in complete


def test_render_states_the_verdict_and_refuses_a_changed_plan(plan_file, tmp_path):
    plan = load_plan(plan_file)
    results = tmp_path / "r.jsonl"
    results.write_text(jsonl_text(_planted(plan.hash), {"command": "planted"}))
    md = render_folder(str(results), tmp_path / "out", plan=str(plan_file)).read_text()
    assert "Study plan planted: verdicts by its rule" in md and "uninformative (ceiling)" in md
    assert md.index("Study plan planted") < md.index("Long-context retrieval")
    plan_file.write_text(PLAN.replace("answer_logprob = 0.05", "answer_logprob = 0.5"))  # moved after the data
    with pytest.raises(RenderError, match="the plan changed after its rows were written"):
        render_folder(str(results), tmp_path / "out2", plan=str(plan_file))
    assert not (tmp_path / "out2").exists()


def test_render_of_a_plan_without_a_stock_baseline_is_its_verdicts(plan_file, tmp_path):
    """A plan whose every arm is a kernel (no sdpa-fp32, fp32 or stock rows, as fp8-retrieval-generated) renders its
    verdicts with a line saying the descriptive tables need such a baseline, instead of refusing the whole report."""
    plan = load_plan(plan_file)
    results = tmp_path / "r.jsonl"
    results.write_text(jsonl_text([r for r in _planted(plan.hash) if r["implementation"] != "sdpa-fp32"],
                                  {"command": "planted"}))
    md = render_folder(str(results), tmp_path / "out", plan=str(plan_file)).read_text()
    assert "Study plan planted: verdicts by its rule" in md
    assert "the plan's verdicts above are the whole report" in md and "Long-context retrieval" not in md
    with pytest.raises(RenderError, match="no long-context rows with a baseline"):  # without a plan: still refused
        render_folder(str(results), tmp_path / "out2")


GEN_PLAN = PLAN.replace("exact = 0.05", "gen_exact = 0.05").replace("pilot = true", "pilot = true\ngenerate = 2")


def _gen_row(plan_hash, impl, length, depth, seed, gen_exact, error=None):
    row = _row(plan_hash, impl, length, depth, seed, True, -1.0)
    row.update(gen_exact=None if error else gen_exact, gen_contains=None if error else gen_exact,
               gen_text=None if error else "x", gen_error=error)
    return row


def test_verdicts_on_generated_answers_count_the_prompts_lost_to_generation_errors(tmp_path):
    """Planted gen_exact rows: at 128 the flushed arm's generated answer is wrong on every prompt of facts 0-2, and
    two prompts of fact 3 failed to generate (one in each arm, gen_error): both leave both arms and are counted, not
    paired against the other arm's value (an effect of -0.9 over the 10 paired prompts); at 192 the arms agree (the
    ceiling)."""
    path = tmp_path / "gen.toml"
    path.write_text(GEN_PLAN)
    plan = load_plan(path)
    failed = {(128, "fp8-never", 0.0, 3), (128, "fp8-flushed", 1.0, 3)}
    rows = []
    for n in (128, 192):
        for s in range(4):
            for d in (0.0, 0.5, 1.0):
                for impl in ("sdpa-fp32", "fp8-never", "fp8-flushed"):
                    ok = not (n == 128 and impl == "fp8-flushed" and s < 3)
                    err = "decode refused" if (n, impl, d, s) in failed else None
                    rows.append(_gen_row(plan.hash, impl, n, d, s, ok, err))
    res = {(r["length"], r["metric"]): r for r in plan_verdicts(plan, rows) if not r["contrast"].exploratory}
    g = res[(128, "gen_exact")]
    assert g["gen_lost"] == 2 and g["dropped"] == 0
    assert g["verdict"].n_units == 12 - 2 and g["verdict"].n_clusters == 4
    assert g["verdict"].kind == "effect" and g["verdict"].direction == "worse"
    assert g["verdict"].effect == pytest.approx(-9 / 10)  # facts 0-2: 9 paired prompts lost, fact 3: 1 left, right
    assert res[(192, "gen_exact")]["label"] == "uninformative (ceiling)" and res[(192, "gen_exact")]["gen_lost"] == 0
    assert res[(128, "answer_logprob")]["gen_lost"] == 0  # teacher-forced: the failed generation takes nothing
    assert res[(128, "answer_logprob")]["verdict"].n_units == 12
    blocks = plan_blocks(plan, rows)
    table = next(b for b in blocks if b[0] == "table")
    cell = next(tr for tr in table[3] if tr[3] == "128" and tr[4] == "generated exact match"
                and "exploratory" not in tr[0])
    assert cell[6] == "10 (4), 2 lost to generation errors"
    text = " ".join(b[1] for b in blocks if b[0] == "p")
    assert "generated exact match 0.05 fraction of prompts" in text and "len(answer) + 2 tokens" in text
    assert "2 prompts of the primary contrast were lost to generation errors" in text
    # the failed rows' gen_ values were None: without the error they would be simply unpaired
    plain = [{**r, "gen_error": None} for r in rows]
    unpaired = next(r for r in plan_verdicts(plan, plain) if r["length"] == 128 and r["metric"] == "gen_exact"
                    and not r["contrast"].exploratory)
    assert unpaired["gen_lost"] == 0 and unpaired["dropped"] == 2 and unpaired["verdict"].n_units == 10


# ---------------------------------------------------------------------------------------------- the CLI

CLI_PLAN = """
name = "cli"
models = ["smollm2"]
tasks = ["needle"]
lengths = [128]
depths = [0.5]
facts = 2
pilot = true

[primary]
a = "fp32"
b = "bf16"

[metrics]
answer_logprob = 0.05
exact = 0.05
"""


def _rows(path):
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "longctx"]


def test_longctx_plan_end_to_end(tmp_path, capsys):
    plan_path = tmp_path / "cli.toml"
    plan_path.write_text(CLI_PLAN)
    out = tmp_path / "r.jsonl"
    # the plan overrides --tasks/--seeds: the grid is the plan's; --models may only pick a subset of its models
    assert main(["longctx", "--plan", str(plan_path), "--models", "smollm2", "--seeds", "9", "--device", "cpu",
                 "--no-progress", "--out", str(out)]) == 0
    assert "zyfa longctx: plan cli (" in capsys.readouterr().err
    rows = _rows(out)
    plan = load_plan(plan_path)
    assert len(rows) == 1 * 1 * 1 * 2 * 2  # depths x facts x implementations
    assert {r["implementation"] for r in rows} == {"fp32", "bf16"}
    assert {r["model"] for r in rows} == {"smollm2"} and {r["seed"] for r in rows} == {0, 1}
    assert all(r["plan_hash"] == plan.hash and r["plan"] == "cli" for r in rows)
    prov = json.loads(out.read_text().splitlines()[0])
    assert prov["plan_hash"] == plan.hash
    report = tmp_path / "rep"
    assert main(["longctx", "--render", str(out), "--plan", str(plan_path), "--out", str(report)]) == 0
    assert "Study plan cli: verdicts by its rule" in (report / "report.md").read_text()
    plan_path.write_text(CLI_PLAN.replace("exact = 0.05", "exact = 0.1"))
    capsys.readouterr()
    assert main(["longctx", "--render", str(out), "--plan", str(plan_path), "--out", str(tmp_path / "rep2")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "the plan changed after its rows were written" in err


def test_plan_first_fact_runs_fresh_facts(tmp_path):
    """A plan's first_fact picks the seeds, so its prompts carry facts the default seeds did not."""
    plan_path = tmp_path / "later.toml"
    plan_path.write_text(CLI_PLAN.replace("facts = 2", "facts = 2\nfirst_fact = 7"))
    out = tmp_path / "r.jsonl"
    assert main(["longctx", "--plan", str(plan_path), "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
    rows = _rows(out)
    assert {r["seed"] for r in rows} == {7, 8}
    assert all(r["input"].endswith(("/s7", "/s8")) for r in rows)


def test_plan_models_subset_only(tmp_path, capsys):
    plan_path = tmp_path / "cli.toml"
    plan_path.write_text(CLI_PLAN)
    out = tmp_path / "r.jsonl"
    assert main(["longctx", "--plan", str(plan_path), "--models", "gemma3", "--device", "cpu", "--no-progress",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "zyfa longctx: --models: 'gemma3' is not a model of plan cli (smollm2)"
    assert not list(tmp_path.glob("r.jsonl*"))


@pytest.mark.parametrize("edit, line", [
    (('tasks = ["needle"]', 'tasks = ["ruler"]'), "unknown task 'ruler'"),
    (("lengths = [128]", "lengths = [16384]"), "length 16384 is above smollm2's context of 8192 tokens"),
    (('b = "bf16"', 'b = "zyfa-nope"'), "unknown implementation 'zyfa-nope'"),
    (('a = "fp32"', 'a = "sdpa-fp32"'), "the primary contrast is not one factor: sdpa-fp32 runs as kernel and bf16 "
                                        "as emulator"),
    (("facts = 2\npilot = true", "facts = 2"), "facts = 2 is below 50 per cell"),
])
def test_bad_plan_is_one_line_before_any_work(tmp_path, capsys, edit, line):
    plan_path = tmp_path / "bad.toml"
    plan_path.write_text(CLI_PLAN.replace(*edit))
    out = tmp_path / "r.jsonl"
    assert main(["longctx", "--plan", str(plan_path), "--device", "cpu", "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert line in err and err.count("\n") == 0 and err.startswith("zyfa longctx: plan ")
    assert not list(tmp_path.glob("r.jsonl*"))


GEN_CLI_PLAN = CLI_PLAN.replace("exact = 0.05", "gen_exact = 0.05").replace("pilot = true",
                                                                          "pilot = true\ngenerate = 2")


@pytest.mark.parametrize("flag", ["0", "3"])
def test_a_plan_that_generates_refuses_another_generate_before_any_work(tmp_path, capsys, flag):
    plan_path = tmp_path / "gen.toml"
    plan_path.write_text(GEN_CLI_PLAN)
    out = tmp_path / "r.jsonl"
    assert main(["longctx", "--plan", str(plan_path), "--generate", flag, "--device", "cpu", "--no-progress",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"zyfa longctx: --generate {flag}: plan cli generates 2 tokens past each answer (its generate = 2, "
                   "part of its hash); leave --generate out or give --generate 2")
    assert not list(tmp_path.glob("r.jsonl*"))


def test_a_plan_that_generates_supplies_its_n(tmp_path, capsys):
    """Without --generate (or with the same N) the plan's generate applies: the dry run (no model loaded) says so."""
    plan_path = tmp_path / "gen.toml"
    plan_path.write_text(GEN_CLI_PLAN)
    for extra in ([], ["--generate", "2"]):
        assert main(["longctx", "--plan", str(plan_path), *extra, "--device", "cpu", "--no-progress", "--out",
                     str(tmp_path / "r.jsonl"), "--dry-run"]) == 0
        assert "answers generated (len(answer) + 2 tokens at most)" in capsys.readouterr().err
    assert not list(tmp_path.glob("r.jsonl*"))


def test_plan_generate_rule():
    assert plan_generate(None, 4, "p") == 4 and plan_generate(4, 4, "p") == 4
    assert plan_generate(None, 0, "p") == 0 and plan_generate(3, 0, "p") == 3  # a plan without generate: the flag's
    with pytest.raises(UsageError, match="^--generate 0: plan p generates 4 tokens past each answer"):
        plan_generate(0, 4, "p")
