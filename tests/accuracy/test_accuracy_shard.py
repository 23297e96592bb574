"""Sharded ``zyfa accuracy`` under torchrun with gloo, in real processes: the merged file equals a single
process's rows bit for bit (run ids, times, rank and device aside), resumes across rank counts, and a rank
killed by SIGKILL loses only its row in flight."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from zyfa.accuracy.io.results_io import run_provenances
from zyfa.accuracy.io.shard import Dist, ShardedResults, SharedOutputError, cells_digest, format_plan, plan
from zyfa.accuracy.operator.cli import read_finished

from tests.faults import kill_rank_when, torchrun_cmd, torchrun_env

ROOT = Path(__file__).resolve().parents[2]
RECIPES = "zyfa,ck,aiter,fp32,bf16,zyfa-exp2,triton-amd"
ARGS = ["accuracy", "--seq", "256", "--heads", "2", "--head-dim", "64", "--causal", "--no-progress",
        "--device", "cpu", "--recipes"]
N_ROWS = 7
TIMEOUT_S = 240  # a hung rendezvous or barrier fails the test instead of hanging it


def _env() -> dict:
    return torchrun_env(ROOT)


def _single(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zyfa.cli", *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def _torchrun(cwd: Path, n: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(torchrun_cmd(n, *args), cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def _lines(path: Path) -> tuple[dict, list[dict]]:
    objs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert objs[0]["record"] == "provenance"
    return objs[0], objs[1:]


def _what(rows: list[dict]) -> list[str]:
    """The rows as JSON text without the fields that say how and when they ran (bit-for-bit comparison)."""
    return [json.dumps({k: v for k, v in r.items() if k not in ("run_id", "rank", "device")
                        and not k.startswith("time_")}, sort_keys=True) for r in rows]


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("single")
    res = _single(d, *ARGS, RECIPES, "--out", "single.jsonl")
    assert res.returncode == 0, res.stderr
    _, rows = _lines(d / "single.jsonl")
    assert len(rows) == N_ROWS and "rank" not in rows[0]
    return _what(rows)


def test_plan_longest_first_to_least_loaded():
    costs = [1, 5, 3, 3, 2, 2, 8]
    shares = plan(costs, 3)
    # LPT: 8 -> r0, 5 -> r1, 3 -> r2, 3 -> r2 (3 < 5), 2 -> r1 (loads 8, 5, 6), 2 -> r2 (8, 7, 6), 1 -> r1
    assert shares == [[6], [0, 1, 4], [2, 3, 5]]
    assert sorted(i for s in shares for i in s) == list(range(len(costs)))
    assert plan(costs, 3) == shares, "the plan is deterministic"
    assert plan([1.0] * 5, 2) == [[0, 2, 4], [1, 3]]
    assert plan(costs, 1) == [list(range(len(costs)))]
    text = format_plan([f"c{i}" for i in range(len(costs))], shares, costs)  # a cell's seconds: its cost here
    assert "rank 0: 1 cells, estimated 8.0 s" in text and "rank 2: 3 cells, estimated 8.0 s" in text


class _TwoRanks(Dist):
    """Rank 0 of two, the other rank's digest given: the collectives answered in process (one rank's view)."""

    def __init__(self, other_cells):
        super().__init__(rank=0, world=2, backend="gloo")
        self.other = cells_digest(other_cells)

    def gather(self, obj):
        return [obj, self.other]

    def broadcast(self, obj):
        return obj


def test_ranks_that_would_run_different_cells_refuse_before_writing(tmp_path):
    """An implementation available on one GPU only, or another file on one node: the ranks' cells differ, and
    every rank refuses in one line before anything is written."""
    cells = [(("in-a", "zyfa"), 2.0), (("in-a", "ck"), 2.0), (("in-b", "zyfa"), 1.0)]
    out = tmp_path / "r.jsonl"
    for other in (cells[:2], [cells[0], cells[2], cells[1]], [*cells[:2], (("in-b", "zyfa"), 1.5)]):
        with pytest.raises(SharedOutputError) as e:
            ShardedResults.open(out, _TwoRanks(other), reader=read_finished, cells=cells)
        msg = str(e.value)
        assert msg.startswith("the ranks would run different cells (rank 0: 3, ") and "\n" not in msg
        assert "every rank must see the same inputs, implementations and arguments" in msg
        assert not list(tmp_path.iterdir()), "nothing written, no lock left"
    same = ShardedResults.open(out, _TwoRanks(list(cells)), reader=read_finished, cells=cells)
    assert (tmp_path / "r.jsonl.partial").is_dir()
    same.close()  # a run that wrote nothing leaves no folder behind (issue 44 fault 9)
    assert not (tmp_path / "r.jsonl.partial").exists()


def test_dry_run_prints_the_plan(tmp_path):
    res = _single(tmp_path, *ARGS, RECIPES, "--dry-run", "3")
    assert res.returncode == 0, res.stderr
    assert "on 3 rank(s)" in res.stdout and "rank 2: 2 cells" in res.stdout and "rank 0: 3 cells" in res.stdout
    assert not list(tmp_path.iterdir()), "a dry run writes nothing"
    bad = _single(tmp_path, *ARGS, RECIPES, "--dry-run", "-1")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_two_ranks_equal_one_process(tmp_path, single):
    res = _torchrun(tmp_path, 2, *ARGS, RECIPES, "--out", "two.jsonl")
    assert res.returncode == 0, res.stdout + res.stderr
    prov, rows = _lines(tmp_path / "two.jsonl")
    assert _what(rows) == single
    assert sorted({r["rank"] for r in rows}) == [0, 1] and all(r["device"] == "cpu" for r in rows)
    assert prov["world_size"] == 2 and prov["backend"] == "gloo" and prov["wall_time_s"] > 0
    assert [r["rows"] for r in prov["ranks"]] == [4, 3]
    assert len({r["run_id"] for r in rows}) == 1, "the ranks share one run id"
    assert not (tmp_path / "two.jsonl.partial").exists() and not (tmp_path / "two.jsonl.partial.lock").exists()


def test_resume_from_two_ranks_to_three(tmp_path, single):
    first = RECIPES.split(",")[:4]  # a 2-rank run of the first recipes, then 3 ranks resume with all of them
    res = _torchrun(tmp_path, 2, *ARGS, ",".join(first), "--out", "r.jsonl")
    assert res.returncode == 0, res.stdout + res.stderr
    again = _torchrun(tmp_path, 3, *ARGS, RECIPES, "--out", "r.jsonl")
    assert again.returncode != 0, "an existing --out is refused without --resume"  # torchrun: 1 when a rank fails
    said = [line for line in again.stderr.splitlines() if line.startswith("zyfa accuracy: error:")]
    assert len(said) == 3 and all("add --resume" in line for line in said), again.stderr
    res = _torchrun(tmp_path, 3, *ARGS, RECIPES, "--out", "r.jsonl", "--resume")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"4 of {N_ROWS} rows done" in res.stdout
    prov, rows = _lines(tmp_path / "r.jsonl")
    assert _what(rows) == single
    # two segments: the 2-rank run's rows keep its run_id, the 3-rank resume's have a new one; the file's provenance
    # is the resume's, listing the first run
    first, last = run_provenances(prov)
    assert prov["world_size"] == 3 and last["run_id"] == prov["run_id"] != first["run_id"]
    assert first["world_size"] == 2
    assert [r["run_id"] for r in rows if r["recipe"] in first["recipes"]] == [first["run_id"]] * 4
    assert {r["run_id"] for r in rows if r["recipe"] not in first["recipes"]} == {prov["run_id"]}


def test_sigkilled_rank_loses_only_its_row_in_flight(tmp_path, single):
    out, folder = tmp_path / "k.jsonl", tmp_path / "k.jsonl.partial"
    killed, res = kill_rank_when(torchrun_cmd(2, *ARGS, RECIPES, "--out", "k.jsonl"), tmp_path, _env(),
                                 folder / "rank-1.jsonl", 1, 2)  # provenance + its first row
    if not killed or out.exists():
        pytest.skip("the run finished before the kill landed (machine too fast for this input)")
    assert res.returncode != 0, res.stdout
    kept = {}
    for f in sorted(folder.glob("rank-*.jsonl")):
        _, rows = _lines(f)
        kept[f.name] = rows
    assert len(kept["rank-1.jsonl"]) >= 1, "the killed rank's finished rows are kept"
    made = [r for rows in kept.values() for r in rows]
    assert len(made) < N_ROWS and set(_what(made)) <= set(single), "kept rows are an uninterrupted run's rows"
    res = _torchrun(tmp_path, 3, *ARGS, RECIPES, "--out", "k.jsonl", "--resume")
    assert res.returncode == 0, res.stdout + res.stderr
    _, rows = _lines(out)
    assert _what(rows) == single
    assert not folder.exists()


def test_plain_process_continues_a_sharded_partial(tmp_path, single):
    """N = 1 is a change of N too: a plain run with --resume continues ``<out>.partial/``."""
    res = _torchrun(tmp_path, 2, *ARGS, ",".join(RECIPES.split(",")[:3]), "--out", "p.jsonl")
    assert res.returncode == 0, res.stdout + res.stderr
    # make it an interrupted sharded run: the finished rows back in rank files, no finished file
    prov, rows = _lines(tmp_path / "p.jsonl")
    folder = tmp_path / "p.jsonl.partial"
    folder.mkdir()
    (folder / "rank-0.jsonl").write_text("\n".join(json.dumps(o) for o in [{"record": "provenance", **prov},
                                                                              *rows[:2]]) + "\n")
    (folder / "rank-1.jsonl").write_text(json.dumps({"record": "provenance", **prov}) + "\n"
                                         + json.dumps(rows[2]) + "\n" + json.dumps(rows[2])[:40])  # torn line
    (tmp_path / "p.jsonl").unlink()
    refused = _single(tmp_path, *ARGS, RECIPES, "--out", "p.jsonl")
    assert refused.returncode == 2 and "interrupted" in refused.stderr and "Traceback" not in refused.stderr
    res = _single(tmp_path, *ARGS, RECIPES, "--out", "p.jsonl", "--resume")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"3 of {N_ROWS} rows done" in res.stdout
    _, rows = _lines(tmp_path / "p.jsonl")
    assert _what(rows) == single


def test_torchrun_continues_a_single_process_partial(tmp_path, single):
    """A single-process ``<out>.partial`` file (an interrupted plain run) is continued by 2 ranks."""
    res = _single(tmp_path, *ARGS, RECIPES, "--out", "s.jsonl")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "s.jsonl").read_text().splitlines()
    (tmp_path / "s.jsonl.partial").write_text("\n".join(text[:3]) + "\n" + text[3][:50])  # 2 rows and a torn one
    (tmp_path / "s.jsonl").unlink()
    res = _torchrun(tmp_path, 2, *ARGS, RECIPES, "--out", "s.jsonl", "--resume")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"2 of {N_ROWS} rows done" in res.stdout
    _, rows = _lines(tmp_path / "s.jsonl")
    assert _what(rows) == single
    assert not (tmp_path / "s.jsonl.partial").exists()


def test_a_live_run_on_the_output_refuses_every_rank(tmp_path):
    """Rank 0 takes the same lock a single-process run holds: a live run on --out refuses all ranks, none hangs."""
    from zyfa.outputs import RunLock

    lock = RunLock.acquire(tmp_path / "l.jsonl.partial")
    try:
        res = _torchrun(tmp_path, 2, *ARGS, "zyfa,ck", "--out", "l.jsonl")
    finally:
        lock.release()
    assert res.returncode != 0
    said = [line for line in res.stderr.splitlines() if line.startswith("zyfa accuracy: error:")]
    assert len(said) == 2 and all("another run is writing" in line for line in said), res.stderr
    assert not (tmp_path / "l.jsonl").exists() and not (tmp_path / "l.jsonl.partial").exists()
