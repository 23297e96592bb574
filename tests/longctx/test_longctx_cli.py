"""``zyfa longctx`` end to end on SmolLM2 (short prompts): rows, resume across a stop, one-line refusals, exit codes,
and the rendered section."""

from __future__ import annotations

import json

import pytest

from zyfa.cli import main

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
BASE = ["longctx", "--models", "smollm2", "--lengths", "128,192", "--depths", "0,1", "--seeds", "2",
        "--no-progress", "--device", "cpu"]


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
])
def test_bad_input_is_one_line(tmp_path, capsys, extra, message):
    args = BASE + ["--implementations", "sdpa-fp32", "--out", str(tmp_path / "r.jsonl")]
    assert main(args + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any(message in line for line in err), err
    assert not any("Traceback" in line for line in err)


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
    assert main(args + ["--force", "--allow-failed"]) == 0


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
