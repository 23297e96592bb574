"""``zyfa longctx`` end to end on SmolLM2 (short prompts): rows, resume across a stop, one-line refusals, exit codes,
and the rendered section."""

from __future__ import annotations

import json

import pytest
from zyfa.accuracy.scoring.kernel_verdicts import verdict_lines

from zyfa.cli import main

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
BASE = ["longctx", "--models", "smollm2", "--lengths", "128,192", "--depths", "0,1", "--seeds", "2",
        "--no-progress", "--device", "cpu"]


@pytest.fixture
def quick_load(monkeypatch, smollm2):
    """``load_model`` returning the session's SmolLM2 after 0.3 s (a load the budget must not count), so the tests
    of the run discipline do not each spend a real load."""
    import time

    import zyfa.capture.models

    def load(name, **kw):
        time.sleep(0.3)
        return smollm2

    monkeypatch.setattr(zyfa.capture.models, "load_model", load)


def _rows(path):
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "longctx"]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    out = tmp_path_factory.mktemp("lc") / "r.jsonl"
    assert main(BASE + ["--implementations", "sdpa-fp32,stock,zyfa", "--out", str(out)]) == 0
    return out


def test_rows_cover_the_grid_and_say_what_ran(full):
    rows = _rows(full)
    assert len(rows) == 2 * 2 * 2 * 2 * 3  # tasks x lengths x depths x seeds x implementations
    assert {r["implementation"] for r in rows} == {"sdpa-fp32", "stock", "zyfa"}
    assert all(r["status"] == "ok" and isinstance(r["exact"], bool) for r in rows)
    z = [r for r in rows if r["implementation"] == "zyfa"]
    assert all(r["ran"] == {"emulator:zyfa": list(range(30))} for r in z)
    assert all(r["accumulation"] == "fp32" and r["platform"] == "mi355x" for r in z)
    assert {r["ran"]["stock sdpa (fp32)"] for r in rows if r["implementation"] == "stock"} == {"all"}
    assert all("teacher-forced" in r["decode"] for r in rows)
    # SmolLM2 retrieves at 128 tokens in fp32, and the fp32 paths agree on the answer's log probability
    base = {r["input"]: r for r in rows if r["implementation"] == "sdpa-fp32"}
    assert sum(r["exact"] for r in base.values()) >= len(base) // 2
    for r in rows:
        if r["implementation"] == "stock":
            assert r["answer_logprob"] == pytest.approx(base[r["input"]]["answer_logprob"], abs=1e-3)
    # the operator error of the first prompt of each batch, in the sampled layers
    op = [r for r in rows if r["op_rel_l2"]]
    assert {r["implementation"] for r in op} == {"sdpa-fp32", "zyfa"}
    assert all(set(r["op_rel_l2"]) == {"0", "14", "29"} for r in op)
    assert all(r["op_rel_l2_mean"] < 1e-5 for r in op if r["implementation"] == "sdpa-fp32")
    assert all(1e-3 < r["op_rel_l2_mean"] < 0.2 for r in op if r["implementation"] == "zyfa")


def test_stopped_run_resumes_to_the_same_rows(full, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    args = BASE + ["--implementations", "sdpa-fp32,stock,zyfa", "--out", str(out)]
    assert main(args + ["--max-seconds", "0"]) == 0
    assert "--resume" in capsys.readouterr().err
    assert not out.exists() and (tmp_path / "r.jsonl.partial").is_file()
    assert main(args) == 2  # the interrupted run's rows are not thrown away without --force
    assert main(args + ["--resume"]) == 0
    a, b = _rows(full), _rows(out)
    keep = ("input", "implementation", "exact", "answer_logprob", "greedy_answer", "op_rel_l2")
    assert [{k: r[k] for k in keep} for r in a] == [{k: r[k] for k in keep} for r in b]


@pytest.mark.parametrize("extra, message", [
    (["--lengths", "9000"], "above smollm2's context of 8192"),
    (["--lengths", "40"], "too short for the needle to fit"),
    (["--implementations", "nope"], "--implementations: unknown recipe 'nope'; known recipes: zyfa, "),
    (["--implementations", "triton:zyfa"], "cannot run here: no CUDA device"),
    (["--tasks", "haystack"], "unknown task 'haystack'"),
    (["--depths", "0,2"], "outside 0..1"),
    (["--models", "gpt5"], "unknown model 'gpt5'"),
    (["--layers", "100"], "--layers: layer 100 does not exist; smollm2 has layers 0..29"),
    (["--text", "nope"], "--text: unknown text 'nope'"),
    (["--max-seconds", "-1"], "--max-seconds must be 0 or more"),
])
def test_bad_input_is_one_line(tmp_path, capsys, extra, message, quick_load):
    """Each refusal is one line and leaves nothing behind (issue 44 fault 9: a ``.partial`` left by a refused run
    blocked the corrected command as "an interrupted run")."""
    args = BASE + ["--implementations", "sdpa-fp32", "--out", str(tmp_path / "r.jsonl")]
    assert main(args + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any(message in line for line in err), err
    assert not any("Traceback" in line for line in err)
    assert list(tmp_path.iterdir()) == []


def test_damaged_partial_is_one_line(tmp_path, capsys):
    """Issue 44 fault 8: a ``.partial`` with a line that is not UTF-8 (or not JSON, too deep, a list: the same path,
    tests/accuracy/test_run_harness.py) is refused naming file and line, exit 2, before the model loads."""
    partial = tmp_path / "r.jsonl.partial"
    partial.write_bytes(b'{"record": "provenance", "run_id": "x"}\n{"input": "\xff"}\n')
    assert main(BASE + ["--implementations", "sdpa-fp32", "--out", str(tmp_path / "r.jsonl"), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{partial}:2: not UTF-8" in err[0], err


def test_resume_asking_for_less_keeps_every_row(full, tmp_path, capsys, quick_load):
    """Issue 44 fault 1: ``--resume`` with fewer implementations kept 1/3 of the rows and deleted the rest, exit 0.
    The rows it does not plan are kept (after the planned ones), and it says so."""
    out = tmp_path / "r.jsonl"
    out.write_bytes(full.read_bytes())
    assert main(BASE + ["--implementations", "sdpa-fp32", "--out", str(out), "--resume"]) == 0
    assert "kept 32 rows" in capsys.readouterr().err
    a, b = _rows(full), _rows(out)
    assert len(b) == len(a) == 48
    key = lambda r: (r["input"], r["implementation"])  # noqa: E731
    assert sorted(b, key=key) == sorted(a, key=key)
    assert [r["implementation"] for r in b[:16]] == ["sdpa-fp32"] * 16


def test_failed_rows_exit_3_after_writing_them(tmp_path, capsys):
    plug = tmp_path / "raising.py"
    plug.write_text("def attention(q, k, v, *, causal, sm_scale, window):\n    raise RuntimeError('boom')\n")
    out = tmp_path / "r.jsonl"
    args = ["longctx", "--models", "smollm2", "--lengths", "128", "--depths", "0", "--seeds", "1", "--no-progress",
            "--device", "cpu", "--tasks", "passkey", "--implementations", "sdpa-fp32",
            "--kernel", f"{plug}:attention", "--out", str(out)]
    assert main(args) == 3
    rows = _rows(out)
    bad = [r for r in rows if r["implementation"].startswith("plugin:")]
    assert len(bad) == 1 and bad[0]["status"] == "failed" and "boom" in bad[0]["error"]
    # the same per-implementation lines as every scoring command (accuracy.scoring.kernel_verdicts.verdict_lines)
    err = capsys.readouterr().err.splitlines()
    assert [f"zyfa longctx: {x}" for x in verdict_lines(rows)] == [x for x in err if x.startswith(
        ("zyfa longctx: failed: ", "zyfa longctx: ok: "))]
    assert f"zyfa longctx: failed: plugin:{plug}:attention: {bad[0]['error']} (on its only row)" in err
    assert main(args + ["--force", "--allow-failed"]) == 0


def test_a_kernel_that_breaks_at_the_longest_length_fails_its_rows_and_the_run_goes_on(tmp_path, capsys):
    """With --fallback stock the run first probes each kernel at its longest length (equal coverage). A kernel that
    passes the conformance probes (128 tokens) and raises past 150 keys used to end the run there, with no row
    written; now its rows at 128 tokens are scored, those at 192 fail with its error, the other implementation's
    rows are untouched, and every row's coverage note names the failed probe."""
    plug = tmp_path / "short.py"
    plug.write_text("import torch.nn.functional as F\n"
                    "def attention(q, k, v, *, causal, sm_scale, window):\n"
                    "    if window is not None or q.shape[2] != k.shape[2]:\n"
                    "        raise ValueError('plain causal attention only')\n"
                    "    if k.shape[2] > 150:\n"
                    "        raise RuntimeError('no launch past 150 keys')\n"
                    "    g = q.shape[1] // k.shape[1]\n"
                    "    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)\n"
                    "    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,\n"
                    "                                          scale=sm_scale)\n")
    out = tmp_path / "r.jsonl"
    args = ["longctx", "--models", "smollm2", "--lengths", "128,192", "--depths", "0", "--seeds", "1",
            "--no-progress", "--device", "cpu", "--tasks", "passkey", "--implementations", "sdpa-fp32",
            "--kernel", f"{plug}:attention", "--fallback", "stock", "--out", str(out)]
    assert main(args) == 3  # failed rows, written
    rows = _rows(out)
    ours = {r["length"]: r for r in rows if r["implementation"].startswith("plugin:")}
    assert ours[128]["status"] == "ok" and ours[128]["exact"] is not None
    assert ours[192]["status"] == "failed" and "no launch past 150 keys" in ours[192]["error"]
    assert all(r["status"] == "ok" for r in rows if r["implementation"] == "sdpa-fp32") and len(rows) == 4
    assert all("failed its probe at 192 tokens" in r["coverage"] for r in rows)
    assert "failed its probe at 192 tokens" in capsys.readouterr().err


def test_render_section(full, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["longctx", "--render", str(full), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "Long-context retrieval" in md and "baseline retrieves at" in md
    assert (out / "fig_longctx_smollm2_needle.png").stat().st_size > 1000
    assert (out / "fig_longctx_heat_smollm2_passkey.png").is_file()
    assert main(["longctx", "--render", str(full), "--out", str(out)]) == 2  # report.md exists: not replaced
    assert "--force" in capsys.readouterr().err
    assert main(["longctx", "--render", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2
    # a run that was cut left only its .partial: the line names it and what to do
    (tmp_path / "cut.jsonl.partial").write_text(full.read_text())
    capsys.readouterr()
    assert main(["longctx", "--render", str(tmp_path / "cut.jsonl"), "--out", str(tmp_path / "rep2")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cut.jsonl.partial holds the rows of a run that was cut" in err, err
    assert main(["longctx", "--render", str(tmp_path / "cut.jsonl.partial"), "--out", str(tmp_path / "rep2")]) == 0


def test_a_kernel_that_ignores_the_mask_is_not_scored(tmp_path, capsys):
    plug = tmp_path / "nomask.py"
    plug.write_text("import torch\n"
                    "def attention(q, k, v, *, causal, sm_scale, window):\n"
                    "    g = q.shape[1] // k.shape[1]\n"
                    "    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)\n"
                    "    return torch.softmax(q.float() @ k.float().transpose(-1, -2) * sm_scale, -1) @ v.float()\n")
    out = tmp_path / "r.jsonl"
    args = ["longctx", "--models", "smollm2", "--lengths", "128", "--depths", "0", "--seeds", "1", "--no-progress",
            "--device", "cpu", "--tasks", "passkey", "--implementations", "sdpa-fp32",
            "--kernel", f"{plug}:attention", "--out", str(out)]
    assert main(args) == 3
    assert "conformance probe 'causal'" in capsys.readouterr().err
    bad = [r for r in _rows(out) if r["implementation"].startswith("plugin:")]
    assert len(bad) == 1 and bad[0]["status"] == "nonconforming" and bad[0]["exact"] is None


def test_budget_counts_work_and_a_resume_equals_an_uninterrupted_run(tmp_path, capsys, quick_load):
    """Issue 44 faults 10 and 11. ``--max-seconds`` counted the model's load, so a budget below the load time
    made no row, ever; now it counts scoring, and any budget above 0 makes at least one batch. A resume cut its
    batches from what was left of a cell, so the first prompt left gained the operator error (``op_rel_l2``)
    measured on a cell's first batch; now batches are cut from the whole cell and the resumed file equals an
    uninterrupted run's rows (wall times aside)."""
    from tests.faults import result_rows, rows_match

    args = ["longctx", "--models", "smollm2", "--tasks", "passkey", "--lengths", "128", "--depths", "0,1",
            "--seeds", "2", "--batch-tokens", "256", "--implementations", "sdpa-fp32,zyfa", "--no-progress",
            "--device", "cpu"]
    ref, out = tmp_path / "ref.jsonl", tmp_path / "r.jsonl"
    assert main(args + ["--out", str(ref)]) == 0
    assert main(args + ["--out", str(out), "--max-seconds", "0.001"]) == 0
    assert "--resume" in capsys.readouterr().err
    made = result_rows(tmp_path / "r.jsonl.partial")
    assert len(made) == 2 and all(r["implementation"] == "sdpa-fp32" for r in made)  # one batch of two prompts
    assert main(args + ["--out", str(out), "--resume"]) == 0

    def rows(path):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in result_rows(path)]

    a, b = rows(ref), rows(out)
    # rows by prompt, then implementation: the operator error on each cell's first prompt only
    assert len(a) == 8 and [r["op_rel_l2"] is not None for r in a] == [True, True] + [False] * 6
    assert rows_match(b, a)


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path):
    """Issue 44 fault 11 with a real kill: ``zyfa longctx`` SIGKILLed once its partial holds a random number of
    rows (inside a cell, possibly inside a batch), refused without ``--resume``, then resumed: the rows equal an
    uninterrupted process's (wall times aside), ``op_rel_l2`` on the same rows."""
    import random

    from tests.faults import kill_when, result_rows, rows_match, run_zyfa

    args = ["longctx", "--models", "smollm2", "--tasks", "passkey", "--lengths", "128", "--depths", "0,1",
            "--seeds", "2", "--batch-tokens", "256", "--implementations", "sdpa-fp32,zyfa", "--no-progress",
            "--device", "cpu"]
    full = run_zyfa(*args, "--out", "full.jsonl", cwd=tmp_path)
    assert full.returncode == 0, full.stderr
    partial = tmp_path / "r.jsonl.partial"
    at = kill_when([*args, "--out", "r.jsonl"], tmp_path, partial, 1 + random.randrange(1, 8))
    if at != -2:
        assert partial.is_file() and not (tmp_path / "r.jsonl").exists()
        refused = run_zyfa(*args, "--out", "r.jsonl", cwd=tmp_path)
        assert refused.returncode == 2 and "--resume" in refused.stderr
        res = run_zyfa(*args, "--out", "r.jsonl", "--resume", cwd=tmp_path)
        assert res.returncode == 0, res.stderr

    def rows(path):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in result_rows(path)]

    assert not partial.exists()
    assert rows_match(rows(tmp_path / "r.jsonl"), rows(tmp_path / "full.jsonl")), f"killed at {at} lines"
