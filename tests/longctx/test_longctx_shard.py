"""Sharded ``zyfa longctx`` under torchrun with gloo, in real processes, on SmolLM2 with short prompts: two ranks
make the rows one process makes, bit for bit at the same thread count (torchrun gives each rank one thread, so
the single process runs with OMP_NUM_THREADS=1 too), in the same order; --dry-run prints the plan. Slow (each
process loads the model: tens of seconds on a small CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults import free_port, torchrun_env

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["longctx", "--models", "smollm2", "--lengths", "128", "--depths", "0,1", "--seeds", "1", "--tasks",
        "needle,passkey", "--no-progress", "--device", "cpu", "--implementations", "sdpa-fp32,stock"]
TIMEOUT_S = 420


def _env() -> dict:
    return torchrun_env(ROOT)


def _run(cwd: Path, cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)


def _rows(path: Path) -> tuple[dict, list[dict]]:
    objs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return objs[0], objs[1:]


def _what(rows):
    return [json.dumps({k: v for k, v in r.items() if k not in ("run_id", "rank", "device", "seconds")},
                       sort_keys=True) for r in rows]


def test_dry_run_plans_cells_per_rank(tmp_path):
    res = _run(tmp_path, [sys.executable, "-m", "zyfa.cli", *ARGS, "--dry-run", "2"])
    assert res.returncode == 0, res.stderr
    assert "4 cells to run on 2 rank(s)" in res.stdout and "rank 1: 2 cells" in res.stdout
    assert "smollm2 passkey L128 stock" in res.stdout
    bad = _run(tmp_path, [sys.executable, "-m", "zyfa.cli", *ARGS, "--dry-run", "-1"])
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == ["zyfa longctx: --dry-run takes a number of ranks of at least 1"]


@pytest.mark.slow
def test_two_ranks_equal_one_process(tmp_path):
    single = _run(tmp_path, [sys.executable, "-m", "zyfa.cli", *ARGS, "--out", "one.jsonl"])
    assert single.returncode == 0, single.stderr
    two = _run(tmp_path, [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                          "127.0.0.1", "--master-port", str(free_port()), "-m", "zyfa.cli", *ARGS,
                          "--out", "two.jsonl"])
    assert two.returncode == 0, two.stdout + two.stderr
    _, a = _rows(tmp_path / "one.jsonl")
    prov, b = _rows(tmp_path / "two.jsonl")
    assert len(a) == 8 and _what(b) == _what(a)
    assert sorted({r["rank"] for r in b}) == [0, 1] and prov["world_size"] == 2
    assert not (tmp_path / "two.jsonl.partial").exists()
