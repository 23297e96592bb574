"""``zyfa study`` under torchrun with gloo, in real processes: the ranks share the accuracy rows, rank 0 merges
them and writes the study; its rows equal a single process's (run ids, times and ranks aside); a killed rank's
study resumes with another number of ranks, and a killed plain study resumes under torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults import (
    ROOT,
    kill_rank_when,
    kill_when,
    path_without_chromium,
    result_rows,
    rows_match,
    torchrun_cmd,
    torchrun_env,
)

# 3 Gaussian inputs of 1024 tokens (plain, causal, outliers) x 4 recipes; zyfa-hopper's accumulator emulation
# makes rows slow enough on a CPU for a kill to land mid-run
STUDY = ["study", "--captures", "none", "--gaussian-filter", "d64", "--max-seq", "1024", "--recipes",
         "zyfa,zyfa-hopper,ck,bf16", "--implementations", "none", "--impact", "none", "--device", "cpu",
         "--no-progress"]
N_ROWS = 12
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    """torchrun's environment without Chromium on PATH (the screenshot is tested elsewhere)."""
    return {**torchrun_env(ROOT), "PATH": path_without_chromium(tmp_path_factory.mktemp("bin"))}


def _plain(cwd: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zyfa", *STUDY, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def _torchrun(cwd: Path, env: dict, n: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(torchrun_cmd(n, *STUDY, *args), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def _rows(path: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "rank"} for r in result_rows(path)]


def _prov(path: Path) -> dict:
    return json.loads(path.read_text().splitlines()[0])


@pytest.fixture(scope="module")
def single(tmp_path_factory, env) -> list[dict]:
    d = tmp_path_factory.mktemp("single")
    res = _plain(d, env, "--out", "st")
    assert res.returncode == 0, res.stderr
    rows = result_rows(d / "st" / "results.jsonl")
    assert len(rows) == N_ROWS and not any("rank" in r for r in rows)
    assert "world_size" not in _prov(d / "st" / "results.jsonl"), "one process without torchrun is not sharded"
    return rows


def test_two_ranks_equal_one_process(tmp_path, env, single):
    res = _torchrun(tmp_path, env, 2, "--out", "st")
    assert res.returncode == 0, res.stdout + res.stderr
    out = tmp_path / "st"
    assert rows_match(_rows(out / "results.jsonl"), single)
    prov = _prov(out / "results.jsonl")
    assert prov["world_size"] == 2 and prov["backend"] == "gloo" and prov["wall_time_s"] > 0
    assert sum(r["rows"] for r in prov["ranks"]) == N_ROWS and all(r["rows"] > 0 for r in prov["ranks"])
    assert {r["rank"] for r in result_rows(out / "results.jsonl")} == {0, 1}
    assert "was a sharded run (torchrun" in (out / "report.md").read_text()
    assert "2 ranks (gloo)" in (out / "report.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"], "no stage, rank files or lock left"
    assert not (out / "accuracy_rows.jsonl").exists()


def test_dry_run_prints_the_plan(tmp_path, env):
    res = _plain(tmp_path, env, "--dry-run", "3")
    assert res.returncode == 0, res.stderr
    assert f"{N_ROWS} cells to run on 3 rank(s)" in res.stdout and "rank 2: 4 cells" in res.stdout
    assert not list(tmp_path.iterdir()), "a dry run writes nothing"
    bad = _plain(tmp_path, env, "--dry-run", "-2")
    said = [ln for ln in bad.stderr.splitlines() if ln.strip() and not ln.startswith("[zyfa study")]
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and said == [
        "zyfa study: error: --dry-run takes a number of ranks of at least 1"]


def test_killed_rank_then_three_ranks_resume(tmp_path, env, single):
    rank1 = tmp_path / "st.partial" / "accuracy_rows.jsonl.partial" / "rank-1.jsonl"
    killed, res = kill_rank_when(torchrun_cmd(2, *STUDY, "--out", "st"), tmp_path, env, rank1, 1, 2)
    if not killed or (tmp_path / "st").exists():
        pytest.skip("the study finished before the kill landed (machine too fast for this input)")
    assert res.returncode != 0, res.stdout
    kept = [r for f in sorted(rank1.parent.glob("rank-*.jsonl")) for r in _rows(f)]
    assert 1 <= len(kept) < N_ROWS, "the finished rows are kept, the killed rank's row in flight is not"
    by_key = {(r["input"], r["recipe"]): r for r in single}
    full = [{k: by_key[(r["input"], r["recipe"])][k] for k in r} for r in kept]  # before features are added
    assert rows_match(kept, full), "the kept rows are an uninterrupted study's rows"

    refused = _torchrun(tmp_path, env, 3, "--out", "st")
    said = [ln for ln in refused.stderr.splitlines() if ln.startswith("zyfa study: error:")]
    assert refused.returncode != 0 and len(said) == 3 and all("add --resume" in ln for ln in said), refused.stderr

    res = _torchrun(tmp_path, env, 3, "--out", "st", "--resume")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(kept)} rows done" in res.stderr
    assert rows_match(_rows(tmp_path / "st" / "results.jsonl"), single)
    assert _prov(tmp_path / "st" / "results.jsonl")["world_size"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"]


def test_killed_plain_study_resumes_under_torchrun(tmp_path, env, single):
    watch = tmp_path / "st.partial" / "accuracy_rows.jsonl.partial" / "rank-0.jsonl"
    at = kill_when([*STUDY, "--out", "st"], tmp_path, watch, 4, env_extra=env)  # provenance + 3 rows
    if at == -2:
        pytest.skip("the study finished before the kill landed")
    res = _torchrun(tmp_path, env, 2, "--out", "st", "--resume")
    assert res.returncode == 0, res.stdout + res.stderr
    assert rows_match(_rows(tmp_path / "st" / "results.jsonl"), single)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"]
