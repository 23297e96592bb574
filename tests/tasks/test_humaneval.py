"""HumanEval from the pinned wheel: the published solutions pass in the sandbox, wrong ones fail; problem
selection; the paired statistics on planted data; the command end to end on SmolLM2 (one problem, 8 tokens);
--summarize over several files of real rows refuses a row that two of them hold."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from zyfa.accuracy.tasks import humaneval
from zyfa.accuracy.tasks.humaneval import DATASET, load_problems, program, select_problems, truncate
from zyfa.accuracy.tasks.sandbox import Limits, run_sandboxed
from zyfa.accuracy.tasks.stats import drift_by_position, drift_trend, mcnemar_exact, paired_summary, summary_markdown

from zyfa.cli import main

REAL_ROWS = Path(__file__).resolve().parents[2] / "reports" / "humaneval-plan"


@pytest.fixture(scope="module")
def problems():
    return load_problems()


def test_the_dataset_is_the_pinned_one(problems):
    probs, prov = problems
    assert len(probs) == 164 and probs[0].task_id == "HumanEval/0" and probs[163].task_id == "HumanEval/163"
    assert prov["dataset_wheel_sha256"] == DATASET["wheel_sha256"] and len(prov["dataset_sha256"]) == 64


@pytest.mark.parametrize("index", [0, 2, 53])
def test_published_solutions_pass_and_a_wrong_one_fails(problems, index):
    p = problems[0][index]
    assert run_sandboxed(program(p, p.canonical_solution), Limits(cpu_seconds=5, wall_seconds=15)).passed
    wrong = run_sandboxed(program(p, "    return None\n"), Limits(cpu_seconds=5, wall_seconds=15))
    assert not wrong.passed and wrong.status == "failed"


def test_a_looping_completion_fails_and_the_next_passes(problems):
    p = problems[0][0]
    loop = run_sandboxed(program(p, "    while True:\n        pass\n"), Limits(cpu_seconds=1, wall_seconds=5))
    assert loop.status == "cpu_limit" and not loop.passed
    assert run_sandboxed(program(p, p.canonical_solution), Limits(cpu_seconds=5, wall_seconds=15)).passed


def test_truncate_at_the_first_stop_sequence():
    assert truncate("    return 1\n\ndef other():\n    pass") == "    return 1\n"
    assert truncate("    x = 1\n# note\nif True: pass") == "    x = 1"
    assert truncate("    return 2\n") == "    return 2\n"


def test_select_problems(problems):
    probs = problems[0]
    assert [p.task_id for p in select_problems(probs, "2")] == ["HumanEval/0", "HumanEval/1"]
    assert [p.task_id for p in select_problems(probs, "3-4,HumanEval/9,3")] == ["HumanEval/3", "HumanEval/4",
                                                                               "HumanEval/9"]
    assert len(select_problems(probs, None)) == 164
    for bad, msg in (("0", "give 1..164"), ("170-171", "outside 0..163"), ("HumanEval/x", "neither a task id")):
        with pytest.raises(ValueError, match=msg):
            select_problems(probs, bad)


def _rows(a: list[bool], b: list[bool]) -> list[dict]:
    rows = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        for name, ok in (("base", x), ("test", y)):
            rows.append({"kind": "humaneval", "status": "ok", "model": "m", "implementation": name, "baseline": "base",
                         "task_id": f"HumanEval/{i}", "passed": ok,
                         "drift_kl": [0.01 * (k + 1) for k in range(40)] if name == "test" else [],
                         "drift_top1": [k % 10 != 0 for k in range(40)] if name == "test" else []})
    return rows


def test_mcnemar_and_the_paired_interval_on_planted_data():
    # 20 problems: 12 pass both, 6 only the baseline passes, 1 only the test passes, 1 neither
    a = [True] * 12 + [True] * 6 + [False] + [False]
    b = [True] * 12 + [False] * 6 + [True] + [False]
    p, n01, n10 = mcnemar_exact(a, b)
    assert (n01, n10) == (1, 6) and p == pytest.approx(2 * (1 + 7) / 2 ** 7)  # exact binomial, two-sided
    assert mcnemar_exact([True, False], [True, False]) == (1.0, 0, 0)
    s = {e["implementation"]: e for e in paired_summary(_rows(a, b))}
    assert s["base"]["pass_at_1"] == pytest.approx(0.9) and "mcnemar_p" not in s["base"]
    t = s["test"]
    assert t["pass_at_1"] == pytest.approx(0.65) and t["diff"] == pytest.approx(-0.25)
    # 5 net losses in 20 problems (1/6 discordant): exact McNemar p = 0.125, and the interval (the verdicts' rule,
    # verdict.paired_interval) reaches just past 0 with it
    assert t["diff_low"] < -0.25 < 0 < t["diff_high"] < 0.05
    assert t["n01"] == 1 and t["n10"] == 6 and t["paired_problems"] == 20
    md = summary_markdown(_rows(a, b))
    assert "| m | test | 20 | 65.0" in md and "-25.0 [" in md and "Drift along" in md


def test_drift_by_position_bins():
    bins = drift_by_position(_rows([True], [True]), bins=(0, 16, 32))
    assert [b["positions"] for b in bins] == ["0-15", "16-31", "32-"]
    assert [b["tokens"] for b in bins] == [16, 16, 8]
    assert bins[0]["kl_mean"] == pytest.approx(0.085) and bins[2]["kl_mean"] == pytest.approx(0.365)
    assert bins[0]["top1_agree"] == pytest.approx(14 / 16)


def test_drift_trend_is_a_slope_per_doubling_inside_each_problem():
    """KL = c + 0.02 log2(pos + 1) in every problem, at levels c that differ by problem: the slope is 0.02 per
    doubling whatever the levels; a flat drift gives 0 inside its interval; a problem shorter than min_tokens and a
    lone problem give nothing; the interval is over problems (a noisy slope per problem widens it)."""
    def rows(slopes, n=64, levels=(0.1, 0.5, 0.9)):
        return [{"drift_kl": list(c + s * np.log2(np.arange(n) + 1.0))} for s, c in zip(slopes, levels, strict=True)]
    t = drift_trend(rows([0.02, 0.02, 0.02]))
    assert t["problems"] == 3 and t["slope"] == pytest.approx(0.02)
    assert t["early_kl"] == pytest.approx(0.5 + 0.02 * np.mean(np.log2(np.arange(16) + 1.0)))
    flat = drift_trend(rows([0.01, -0.01, 0.0]))
    assert flat["slope"] == pytest.approx(0.0, abs=1e-12) and flat["slope_lo"] < 0 < flat["slope_hi"]
    assert drift_trend(rows([0.02, 0.02, 0.02], n=31)) is None  # below min_tokens
    assert drift_trend(rows([0.02], levels=(0.1,))) is None  # one problem: no interval over problems
    md = summary_markdown(_rows([True] * 3, [True] * 3))  # 40 drift positions per problem, KL rising
    assert "KL slope per doubling" in md and "| m | test | 3 | +" in md


def test_drift_interval_resamples_problems_not_tokens():
    """Three problems whose 16 tokens each drift alike (KL 0.1, 0.2, 0.9): the interval over problems is as wide as
    three values allow, not as narrow as 48 tokens would make it; one problem alone has none."""
    rows = [{"task_id": f"HumanEval/{i}", "drift_kl": [kl] * 16, "drift_top1": [True] * 16}
            for i, kl in enumerate((0.1, 0.2, 0.9))]
    (b,) = drift_by_position(rows, bins=(0,))
    assert b["problems"] == 3 and b["tokens"] == 48 and b["kl_mean"] == pytest.approx(0.4)
    assert 0.1 - 1e-9 <= b["kl_lo"] < 0.25 and 0.55 < b["kl_hi"] <= 0.9 + 1e-9
    (one,) = drift_by_position(rows[:1], bins=(0,))
    assert one["problems"] == 1 and math.isnan(one["kl_lo"]) and math.isnan(one["kl_hi"])


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    for argv, msg in ((["--implementations", "stock,nosuch"], "nosuch"), (["--problems", "999"], "give 1..164"),
                      (["--model", "gpt9"], "gpt9"), (["--max-new-tokens", "0"], "at least 1")):
        assert main(["tasks", "humaneval", "--device", "cpu", "--out", str(out), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "r.jsonl.partial").exists()
    assert main(["tasks"]) == 2


def test_the_command_end_to_end_and_resume(tmp_path, capsys):
    """SmolLM2, the stock attention against sdpa-fp32 (both fp32: the same tokens), one problem, 8 tokens."""
    out = tmp_path / "he.jsonl"
    argv = ["tasks", "humaneval", "--model", "smollm2", "--implementations", "stock,sdpa-fp32", "--problems", "1",
            "--max-new-tokens", "8", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    prov, rows = lines[0], lines[1:]
    assert prov["record"] == "provenance" and prov["baseline"] == "stock"
    assert [r["implementation"] for r in rows] == ["stock", "sdpa-fp32"]
    base, test = rows
    assert all(r["status"] == "ok" and isinstance(r["passed"], bool) for r in rows)
    assert base["tokens"] == test["tokens"] and 1 <= len(base["tokens"]) <= 8
    assert test["decode"] == "cached" and test["ran_decode"] == {"sdpa-fp32": list(range(30))}
    assert test["layers_by_impl"] == {"sdpa-fp32": list(range(30))}
    assert len(test["drift_kl"]) == len(base["tokens"]) and max(test["drift_kl"]) < 1e-6 and all(test["drift_top1"])
    assert base["dataset_wheel_sha256"] == DATASET["wheel_sha256"] and base["sandbox_network"]
    assert "| smollm2 | sdpa-fp32 | 1 |" in capsys.readouterr().out
    # a finished file is refused without --resume; with it nothing is rerun
    assert main(argv) == 2
    assert "--resume" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0
    assert [json.loads(x) for x in out.read_text().splitlines()][1:] == rows


def test_out_of_memory_in_the_drift_keeps_the_scored_answer(tmp_path, capsys, monkeypatch):
    """The teacher-forced drift runs after the answer is scored; out of GPU memory there costs the drift, in one
    line on the row and one in the log, not the row or the run."""
    def oom(*_a, **_k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 98.00 MiB.\nmore detail")
    monkeypatch.setattr(humaneval, "sequence_drift", oom)
    out = tmp_path / "he.jsonl"
    assert main(["tasks", "humaneval", "--model", "smollm2", "--implementations", "stock,sdpa-fp32", "--problems",
                 "1", "--max-new-tokens", "4", "--device", "cpu", "--out", str(out), "--no-progress"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()][1:]
    test = rows[1]
    assert test["status"] == "ok" and isinstance(test["passed"], bool) and test["tokens"]
    assert test["drift_kl"] == [] and test["drift_kl_mean"] is None
    assert test["drift_error"] == "out of GPU memory: CUDA out of memory. Tried to allocate 98.00 MiB."
    assert "drift not measured (out of GPU memory)" in capsys.readouterr().err


def _real_file(path, problems):
    """A small file of real rows: the provenance record and the rows of ``problems`` of a file of the plan."""
    lines = (REAL_ROWS / "he-0.jsonl").read_text().splitlines(keepends=True)
    keep = [x for x in lines[1:] if json.loads(x).get("task_id") in {f"HumanEval/{i}" for i in problems}]
    assert len(keep) == 5 * len(problems)
    path.write_text(lines[0] + "".join(keep))
    return path


def test_summarize_refuses_a_row_in_two_files(tmp_path, capsys):
    a, b = _real_file(tmp_path / "a.jsonl", [0, 1]), _real_file(tmp_path / "b.jsonl.partial", [1, 2])
    for paths, row, second in ((f"{a},{b}", "HumanEval/1", b), (f"{a},{a}", "HumanEval/0", a)):  # a file twice too
        assert main(["tasks", "humaneval", "--summarize", paths]) == 2
        out, err = capsys.readouterr()
        assert out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert f"the row of qwen25coder-1.5b {row} under stock is in both {a} and {second}" in err


def test_summarize_takes_disjoint_files(tmp_path, capsys):
    a, b = _real_file(tmp_path / "a.jsonl", [0, 1]), _real_file(tmp_path / "b.jsonl.partial", [2, 3])
    assert main(["tasks", "humaneval", "--summarize", f"{a},{b}"]) == 0
    out, err = capsys.readouterr()
    assert "| qwen25coder-1.5b | stock | 4 |" in out and "| qwen25coder-1.5b | cudnn-fp8 | 4 |" in out and err == ""
