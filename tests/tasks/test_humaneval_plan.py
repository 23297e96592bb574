"""The HumanEval study plan: loading and its refusals, the verdict by its rule on planted rows (a 10-point loss over
164 problems found, a null with its detectable effect, an incomplete plan waits, a changed plan refused), and the
command's --plan paths (one line, nothing written)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from zyfa.accuracy.scoring.plan import PlanError
from zyfa.accuracy.tasks.plan import N_PROBLEMS, load_humaneval_plan, plan_verdicts, verdict_markdown

from zyfa.cli import main

STUDY = Path(__file__).resolve().parents[2] / "studies" / "humaneval.toml"
PLAN = """name = "t"
alpha = 0.05
threshold = 0.05
models = ["qwen25coder-1.5b"]
descriptive_models = ["qwen25coder"]
baseline = "stock"
arms = ["cudnn-fp8", "triton:fa3"]
"""


def _plan(tmp_path, text=PLAN):
    f = tmp_path / "plan.toml"
    f.write_text(text)
    return load_humaneval_plan(f)


def _rows(plan, model, impl, passed, n=N_PROBLEMS, plan_hash=None):
    return [{"kind": "humaneval", "status": "ok", "model": model, "implementation": impl, "baseline": plan.baseline,
             "task_id": f"HumanEval/{i}", "passed": bool(passed[i]), "recipe": None, "input": f"he/{model}/{i}",
             "plan_hash": plan.hash if plan_hash is None else plan_hash} for i in range(n)]


def _planted(seed=0, loss=0, discordant_pairs=6):
    """Baseline passes 60%; the arm flips ``discordant_pairs`` problems each way, plus ``loss`` more to fail."""
    rng = random.Random(seed)
    base = [rng.random() < 0.6 for _ in range(N_PROBLEMS)]
    arm = list(base)
    passing = [i for i in range(N_PROBLEMS) if base[i]]
    failing = [i for i in range(N_PROBLEMS) if not base[i]]
    rng.shuffle(passing)
    rng.shuffle(failing)
    for i in passing[:discordant_pairs + loss]:
        arm[i] = False
    for i in failing[:discordant_pairs]:
        arm[i] = True
    return base, arm


def test_the_study_file_loads_and_runs_the_arms_after_the_baseline():
    p = load_humaneval_plan(STUDY)
    assert p.models == ("qwen25coder-1.5b",) and p.descriptive_models == ("qwen25coder",)
    assert p.implementations[0] == "stock" and {"cudnn-fp8", "triton:fa3", "triton:zyfa-hopper"} <= set(p.arms)
    assert p.threshold == 0.05 and p.correction == "holm" and len(p.hash) == 64


@pytest.mark.parametrize("edit, msg", [
    (('arms = ["cudnn-fp8", "triton:fa3"]', 'arms = ["cudnn-fp8", "nosuch"]'), "unknown implementation"),
    (('models = ["qwen25coder-1.5b"]', 'models = ["gpt9"]'), "gpt9"),
    (("threshold = 0.05", "threshold = 0"), "threshold must be"),
    (("threshold = 0.05", "threshold = -0.1"), "threshold must be"),
    (('baseline = "stock"', 'baseline = "stock"\nextra = 1'), "unknown key 'extra'"),
])
def test_bad_plans_are_refused_in_one_line(tmp_path, edit, msg):
    with pytest.raises(PlanError, match=msg) as e:
        _plan(tmp_path, PLAN.replace(*edit))
    assert len(str(e.value).splitlines()) == 1


def test_a_planted_ten_point_loss_is_found_and_a_null_carries_its_detectable_effect(tmp_path):
    plan = _plan(tmp_path)
    base, lossy = _planted(loss=16)  # 16 of 164 problems lost net: about 10 points
    _, same = _planted(seed=0, loss=0, discordant_pairs=12)  # no net change, 24 of 164 problems discordant (15%)
    rows = (_rows(plan, "qwen25coder-1.5b", "stock", base) + _rows(plan, "qwen25coder-1.5b", "cudnn-fp8", lossy)
            + _rows(plan, "qwen25coder-1.5b", "triton:fa3", same))
    res = {r["arm"]: r for r in plan_verdicts(plan, rows) if r["model"] == "qwen25coder-1.5b"}
    loss = res["cudnn-fp8"]
    assert loss["complete"] and loss["n"] == N_PROBLEMS and loss["n10"] - loss["n01"] == 16
    assert loss["verdict"].effect == pytest.approx(-16 / N_PROBLEMS)
    assert loss["p_adjusted"] < 0.05 and loss["label"] == "effect (worse)"
    null = res["triton:fa3"]
    assert null["verdict"].effect == 0 and null["mcnemar_p"] == 1.0 and null["n01"] == null["n10"] == 12
    # at 15% discordance 164 problems cannot rule out 5 points: the null says what it could have detected
    detect = null["verdict"].detectable
    assert 0.05 < detect < 0.12 and null["label"] == f"inconclusive (could detect only ≥ {100 * detect:.1f} points)"
    md = verdict_markdown(plan, rows)
    assert "The plan is complete" in md and "effect (worse)" in md and "-9.8 [" in md and null["label"] in md


def test_an_incomplete_plan_says_so_and_waits(tmp_path):
    plan = _plan(tmp_path)
    base, lossy = _planted(loss=16)
    rows = _rows(plan, "qwen25coder-1.5b", "stock", base) + _rows(plan, "qwen25coder-1.5b", "cudnn-fp8", lossy, n=67)
    res = plan_verdicts(plan, rows)
    by = {(r["model"], r["arm"]): r for r in res}
    part = by[("qwen25coder-1.5b", "cudnn-fp8")]
    assert part["n_base"] == N_PROBLEMS and part["n_arm"] == 67 and part["n"] == 67 and not part["complete"]
    assert part["label"] == "waits: 67 of 164 problems paired" and part["p_adjusted"] == 1.0
    assert by[("qwen25coder-1.5b", "triton:fa3")]["label"] == "waits: no paired problems"
    assert not by[("qwen25coder", "cudnn-fp8")]["primary"]
    md = verdict_markdown(plan, rows)
    assert "**The plan is incomplete: 2 of its 2 primary contrasts" in md and "164/67/67" in md


def test_rows_of_a_changed_plan_are_refused(tmp_path):
    plan = _plan(tmp_path)
    base, _ = _planted()
    rows = _rows(plan, "qwen25coder-1.5b", "stock", base)
    changed = _plan(tmp_path, PLAN.replace("threshold = 0.05", "threshold = 0.1"))
    assert changed.hash != plan.hash
    with pytest.raises(PlanError, match="the plan changed after its rows were written"):
        plan_verdicts(changed, rows)
    with pytest.raises(PlanError, match="carry no plan hash"):
        plan_verdicts(plan, [{k: v for k, v in r.items() if k != "plan_hash"} for r in rows])


def test_the_command_refuses_in_one_line_before_any_file(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    bad = tmp_path / "bad.toml"
    bad.write_text(PLAN.replace("threshold = 0.05", "threshold = 0"))
    good = tmp_path / "plan.toml"
    good.write_text(PLAN)
    for argv, msg in ((["--plan", str(bad)], "threshold must be"),
                      (["--plan", str(good), "--model", "smollm2"], "not in plan"),
                      (["--plan", str(good), "--implementations", "stock,zyfa"], "leave out --implementations")):
        assert main(["tasks", "humaneval", "--device", "cpu", "--out", str(out), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "r.jsonl.partial").exists()


def test_summarize_with_the_plan_renders_the_verdict_and_refuses_other_rows(tmp_path, capsys):
    plan = _plan(tmp_path)
    base, lossy = _planted(loss=16)
    rows = _rows(plan, "qwen25coder-1.5b", "stock", base) + _rows(plan, "qwen25coder-1.5b", "cudnn-fp8", lossy)
    f = tmp_path / "he.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["tasks", "humaneval", "--summarize", str(f), "--plan", plan.source]) == 0
    text = capsys.readouterr().out
    assert "pass@1 %" in text and "effect (worse)" in text and "plan is incomplete: 1 of its 2" in text
    other = tmp_path / "other.toml"
    other.write_text(PLAN.replace("threshold = 0.05", "threshold = 0.1"))
    assert main(["tasks", "humaneval", "--summarize", str(f), "--plan", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert "plan changed after its rows" in err and len(err.splitlines()) == 1


def test_a_run_under_a_plan_takes_its_settings_and_writes_its_hash(tmp_path, capsys):
    """SmolLM2 on the CPU, one problem, the plan's 4 tokens: rows carry the plan's name and hash; --summarize --plan
    says the plan waits (1 of 164); resuming the file under an edited plan is refused in one line."""
    f = tmp_path / "plan.toml"
    f.write_text('name = "cpu"\nthreshold = 0.05\nmodels = ["smollm2"]\nbaseline = "stock"\narms = ["sdpa-fp32"]\n'
                 'dtype = "fp32"\nmax_new_tokens = 4\n')
    plan = load_humaneval_plan(f)
    out = tmp_path / "he.jsonl"
    argv = ["tasks", "humaneval", "--plan", str(f), "--problems", "1", "--device", "cpu", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    prov, rows = lines[0], lines[1:]
    assert prov["plan_hash"] == plan.hash and prov["model"] == "smollm2"
    assert [r["implementation"] for r in rows] == ["stock", "sdpa-fp32"]
    assert all(r["plan_hash"] == plan.hash and r["plan"] == "cpu" and r["max_new_tokens"] == 4 for r in rows)
    capsys.readouterr()
    assert main(["tasks", "humaneval", "--summarize", str(out), "--plan", str(f)]) == 0
    text = capsys.readouterr().out
    assert "waits: 1 of 164 problems paired" in text and "plan is incomplete: 1 of its 1" in text
    f.write_text(f.read_text().replace("threshold = 0.05", "threshold = 0.1"))
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "plan changed after its rows" in err and len(err.splitlines()) == 1
