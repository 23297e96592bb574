"""``zyfa impact`` under torchrun with gloo, in real processes on SmolLM2: the merged file holds a single
process's rows (provenance, times and ranks aside) in its order, a killed rank's run resumes with another number
of ranks, and the section names the ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults import ROOT, kill_rank_when, torchrun_cmd, torchrun_env

pytest.importorskip("transformers", reason="impact tests need the 'capture' extra (transformers, gguf)")
pytest.importorskip("gguf", reason="impact tests need the 'capture' extra (transformers, gguf)")

ARGS = ["impact", "--models", "smollm2", "--recipes", "fp32,aiter", "--tokens", "32", "--windows", "2",
        "--per-layer", "smollm2", "--layer-recipes", "aiter", "--layers", "28,29", "--no-progress"]
N_ROWS = 6  # 2 windows x 2 recipes, and aiter's sweep of 2 layers on window 0
TIMEOUT_S = 400
RUN_FIELDS = ("provenance", "seconds", "seconds_stock", "rank")  # how and when a row ran, not what it measured


@pytest.fixture(scope="module")
def env() -> dict:
    return torchrun_env(ROOT)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _what(rows: list[dict]) -> list[str]:
    return [json.dumps({k: v for k, v in r.items() if k not in RUN_FIELDS}, sort_keys=True) for r in rows]


def _torchrun(cwd: Path, env: dict, n: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(torchrun_cmd(n, *ARGS, *args), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def single_file(tmp_path_factory, env) -> Path:
    """A single process's results file."""
    d = tmp_path_factory.mktemp("single")
    res = subprocess.run([sys.executable, "-m", "zyfa", *ARGS, "--out", "r.jsonl"], cwd=d, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    assert res.returncode == 0, res.stderr
    return d / "r.jsonl"


@pytest.fixture(scope="module")
def single(single_file) -> list[str]:
    rows = _rows(single_file)
    assert len(rows) == N_ROWS and all(r["device"] == "cpu" and "rank" not in r for r in rows)
    return _what(rows)


def test_two_ranks_equal_one_process(tmp_path, env, single):
    res = _torchrun(tmp_path, env, 2, "--out", "r.jsonl")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = _rows(tmp_path / "r.jsonl")
    assert _what(rows) == single, "the same rows in the same order"
    assert {r["rank"] for r in rows} == {0, 1}
    sharding = rows[0]["provenance"]["sharding"]
    assert sharding["world_size"] == 2 and sharding["backend"] == "gloo" and sharding["wall_time_s"] > 0
    assert [r["rows"] for r in sharding["ranks"]] == [sum(r["rank"] == k for r in rows) for k in (0, 1)]
    md = (tmp_path / "impact.md").read_text()
    assert "`r.jsonl` was a sharded run (torchrun" in md and "2 ranks (gloo)" in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["impact.md", "r.jsonl"], "no rank files or lock left"


def test_dry_run_prints_the_plan(tmp_path, env):
    res = subprocess.run([sys.executable, "-m", "zyfa", *ARGS, "--out", "r.jsonl", "--dry-run", "2"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert res.returncode == 0, res.stderr
    assert "plan: 5 cells to run on 2 rank(s)" in res.stdout and "layer smollm2 0 aiter" in res.stdout
    assert not list(tmp_path.iterdir()), "a dry run writes nothing"


def test_killed_rank_then_three_ranks_resume(tmp_path, env, single):
    rank1 = tmp_path / "r.jsonl.partial" / "rank-1.jsonl"
    killed, res = kill_rank_when(torchrun_cmd(2, *ARGS, "--out", "r.jsonl"), tmp_path, env, rank1, 1, 2,
                                 timeout=TIMEOUT_S)
    if not killed or (tmp_path / "r.jsonl").exists():
        pytest.skip("the run finished before the kill landed")
    assert res.returncode != 0, res.stdout
    kept = [r for f in sorted(rank1.parent.glob("rank-*.jsonl")) for r in _rows(f) if "kind" in r]
    assert 1 <= len(kept) < N_ROWS and set(_what(kept)) <= set(single), "kept rows are an uninterrupted run's"
    refused = _torchrun(tmp_path, env, 3, "--out", "r.jsonl")
    said = [ln for ln in refused.stderr.splitlines() if ln.startswith("zyfa impact: error:")]
    assert refused.returncode != 0 and len(said) == 3 and all("add --resume" in ln for ln in said), refused.stderr
    res = _torchrun(tmp_path, env, 3, "--out", "r.jsonl", "--resume")
    assert res.returncode == 0, res.stdout + res.stderr
    assert _what(_rows(tmp_path / "r.jsonl")) == single
    assert not (tmp_path / "r.jsonl.partial").exists()


def test_plain_rows_in_out_are_kept_by_a_sharded_resume(tmp_path, env, single_file, single):
    """A single process's rows in --out (an interrupted plain run appends there) are kept by a sharded --resume."""
    (tmp_path / "r.jsonl").write_text("".join(line + "\n" for line in single_file.read_text().splitlines()[:3]))
    res = _torchrun(tmp_path, env, 2, "--out", "r.jsonl", "--resume")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = _rows(tmp_path / "r.jsonl")
    assert _what(rows) == single and sum("rank" not in r for r in rows) == 3, "the 3 kept rows were not run again"
