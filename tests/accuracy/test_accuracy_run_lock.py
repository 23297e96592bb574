"""One live run per ``--out``: two real ``zyfa`` processes on the same output (issue 32).

The first run's plug-in kernel sleeps, so it is alive, holding ``r.jsonl.partial.lock``, while the second starts.
The second (``--force`` or not) is refused with one line naming the first's PID and start time, and the first's
rows and the old file are untouched. Once the first is SIGKILLed, its lock is stale: a plain rerun is told of an
interrupted run (naming the dead PID) and ``--force`` proceeds. A StagedFolder (``zyfa study``) is locked alike.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.faults import env, run_zyfa, zyfa_cmd
from zyfa.outputs import RunLock, RunLockedError, StagedFolder, lock_path

SLOW_KERNEL = """
import time
def attention(q, k, v, *, causal, sm_scale, window):
    if q.shape[2] == 64:  # the run's input (the conformance probes, 128 tokens, pass through at once)
        time.sleep(300)
    return q
"""
SMALL = ["accuracy", "--seq", "64", "--heads", "2", "--head-dim", "64", "--device", "cpu", "--no-progress"]


def _wait_for_holder(lock, proc, timeout=120.0) -> dict:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, "the first run ended before it held the lock"
        try:
            holder = json.loads(lock.read_text())
            if holder.get("pid") == proc.pid:
                return holder
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise TimeoutError("the first run never took the lock")


def test_second_run_refused_while_first_alive_then_proceeds_once_it_is_killed(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW_KERNEL)
    assert run_zyfa(*SMALL, "--recipes", "fp32", "--out", "r.jsonl", cwd=tmp_path).returncode == 0
    old = (tmp_path / "r.jsonl").read_bytes()
    first = subprocess.Popen(zyfa_cmd(*SMALL, "--recipes", "fp32", "--kernel", "slow.py:attention",
                                      "--out", "r.jsonl", "--force"),
                             cwd=tmp_path, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lock = tmp_path / "r.jsonl.partial.lock"
        holder = _wait_for_holder(lock, first)
        t0 = time.monotonic()
        while not (tmp_path / "r.jsonl.partial").is_file():  # its rows file started: it is scoring the kernel
            assert first.poll() is None and time.monotonic() - t0 < 120
            time.sleep(0.05)
        for extra in ([], ["--force"], ["--resume"]):
            second = run_zyfa(*SMALL, "--recipes", "fp32", "--out", "r.jsonl", *extra, cwd=tmp_path, timeout=300)
            assert second.returncode == 2, (extra, second.stdout, second.stderr)
            lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
            assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
            assert f"PID {first.pid}" in lines[0] and holder["started"] in lines[0], lines[0]
            assert "interrupted" not in lines[0] and "another run is writing" in lines[0], lines[0]
            assert first.poll() is None
        assert (tmp_path / "r.jsonl").read_bytes() == old  # the finished file of before: untouched
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=60)
    assert lock.exists()  # left by the killed run: stale, not live
    plain = run_zyfa(*SMALL, "--recipes", "fp32", "--out", "r.jsonl", cwd=tmp_path, timeout=300)
    assert plain.returncode == 2
    assert "interrupted run" in plain.stderr and f"PID {first.pid}" in plain.stderr \
        and "no longer running" in plain.stderr, plain.stderr
    forced = run_zyfa(*SMALL, "--recipes", "fp32", "--out", "r.jsonl", "--force", cwd=tmp_path, timeout=300)
    assert forced.returncode == 0, forced.stderr
    assert not lock.exists() and not (tmp_path / "r.jsonl.partial").exists()
    assert "wrote 1 rows" in forced.stdout


def test_run_lock_is_exclusive_across_processes_and_released(tmp_path):
    partial = tmp_path / "x.partial"
    held = RunLock.acquire(partial)
    # another process cannot take it while this one holds it
    code = ("import sys; from zyfa.outputs import RunLock, RunLockedError\n"
            "try:\n    RunLock.acquire(sys.argv[1])\nexcept RunLockedError as e:\n    print(e); sys.exit(7)\n")
    child = subprocess.run([sys.executable, "-c", code, str(partial)], env=env(), capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == 7 and f"PID {os.getpid()}" in child.stdout, child
    held.release()
    assert not lock_path(partial).exists()
    again = RunLock.acquire(partial)
    assert again.stale is None
    again.release()


def test_staged_folder_is_locked_for_the_run(tmp_path):
    stage = StagedFolder.open(tmp_path / "study", force=True)
    assert lock_path(stage.stage).exists()
    code = ("import sys; from zyfa.outputs import StagedFolder, OutputError\n"
            "try:\n    StagedFolder.open(sys.argv[1], force=True)\n"
            "except OutputError as e:\n    print(e); sys.exit(7)\n")
    child = subprocess.run([sys.executable, "-c", code, str(tmp_path / "study")], env=env(), capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == 7 and "another run is writing" in child.stdout, child
    assert stage.stage.is_dir()  # --force of the second run did not clear the live stage
    (stage.stage / "report.md").write_text("x")
    stage.commit()
    assert not lock_path(stage.stage).exists() and (tmp_path / "study" / "report.md").is_file()
    with pytest.raises(RunLockedError):
        held = RunLock.acquire(tmp_path / "other.partial")
        try:
            RunLock.acquire(tmp_path / "other.partial")  # the same process twice: flock locks per open file
        finally:
            held.release()
