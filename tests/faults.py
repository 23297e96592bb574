"""Fault injection for the reliability tests: read-only folders, tiny file systems, killed subprocesses.

Real faults, not mocks, where the machine allows them: a read-only folder is a folder chmod'ed 0o555 (as a
normal user) or a tmpfs remounted read-only (as root, whom permissions do not stop); a full disk is a tiny
tmpfs (root only; the in-process ENOSPC writer in the tests covers other machines); a kill is SIGKILL sent to
a real ``zyfa`` subprocess once its output file holds a chosen number of lines.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Row keys that describe how and when a row was made, not what it measured: left out of "same rows" checks.
RUN_FIELDS = ("run_id",)


@contextlib.contextmanager
def disk_full_after_rows(monkeypatch, rows: int):
    """Inside the block, ``os.write`` raises ENOSPC once ``rows`` result rows (lines starting ``{"run_id":``) have
    been written: a disk that fills mid-run, on any machine. ``os.write`` is restored on leaving."""
    import errno

    real_write = os.write
    seen = {"n": 0}

    def write_until_full(fd, data):
        seen["n"] += bytes(data[:10]) == b'{"run_id":'
        if seen["n"] > rows:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write_until_full)
    try:
        yield
    finally:
        monkeypatch.setattr(os, "write", real_write)


def _mount(*args: str) -> bool:
    try:
        return subprocess.run(["mount", *args], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _umount(path: Path) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=20)


@contextlib.contextmanager
def readonly_dir(path: Path, files: dict[str, bytes] | None = None):
    """``path`` made a read-only folder holding ``files`` (skips the test where that cannot be done)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        for name, data in (files or {}).items():
            (path / name).write_bytes(data)
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    if not _mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)):
        pytest.skip("running as root and cannot mount a tmpfs: no read-only folder to test with")
    try:
        for name, data in (files or {}).items():
            (path / name).write_bytes(data)
        if not _mount("-o", "remount,ro", str(path)):
            pytest.skip("cannot remount the tmpfs read-only")
        yield path
    finally:
        _umount(path)


@contextlib.contextmanager
def tiny_fs(path: Path, size: str = "64k"):
    """A tmpfs of ``size`` at ``path`` (root only; skips otherwise)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)):
        pytest.skip("a tiny file system needs root and mount (the in-process ENOSPC test covers this machine)")
    try:
        yield path
    finally:
        _umount(path)


def path_without_chromium(folder: Path) -> str:
    """A PATH holding only links to Python and git (so a run finds no Chromium, but git still works)."""
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    for prog, target in (("python3", sys.executable), ("git", shutil.which("git"))):
        if target and not (folder / prog).exists():
            (folder / prog).symlink_to(target)
    return str(folder)


def zyfa_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "zyfa.cli", *args]


def env() -> dict:
    e = dict(os.environ)
    # Under mutation testing (scripts/mutation_test.py), mutmut's statistics pass sets MUTANT_UNDER_TEST=stats;
    # a child started in another folder cannot find mutmut's settings then and exits. The hits are recorded in
    # the pytest process only, so the child needs none; a named mutant still passes through to the child.
    if e.get("MUTANT_UNDER_TEST") == "stats":
        del e["MUTANT_UNDER_TEST"]
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    # One thread per child, as torchrun_env gives each rank: with several, MKL's fp32 and fp64 sums vary from
    # process to process (seen in the 8th digit of a bf16 row's metrics, the same command run four times), so
    # the rows of a resumed process could not be compared with an uninterrupted one's
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


def run_zyfa(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(zyfa_cmd(*args), cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return -1


def kill_when(args: list[str], cwd: Path, watch: Path, lines: int, *, extra_delay: float = 0.0,
              timeout: float = 600, env_extra: dict | None = None) -> int:
    """Start ``zyfa *args``, SIGKILL it once ``watch`` holds ``lines`` complete lines (``lines`` 0: once the
    file exists, -1: as soon as the process runs), after ``extra_delay`` seconds more. Returns the number of
    lines ``watch`` held at the kill, or -2 when the process ended before the kill point (the test then knows
    the point was not reached)."""
    proc = subprocess.Popen(zyfa_cmd(*args), cwd=cwd, env={**env(), **(env_extra or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                return -2
            n = count_lines(watch)
            if lines < 0 or (lines == 0 and n >= 0) or (lines > 0 and n >= lines):
                break
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{watch} never reached {lines} lines")
            time.sleep(0.005)
        if extra_delay:
            time.sleep(extra_delay)
        proc.send_signal(signal.SIGKILL)
        if proc.wait(timeout=60) == 0:  # it finished during the extra delay, before the signal landed
            return -2
        return count_lines(watch)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)


def result_rows(path: Path) -> list[dict]:
    """The rows of a JSONL result file (complete lines only), minus the provenance record and RUN_FIELDS, and
    minus wall times (``time_*``), which measure the run, not the recipe; NaN as "nan" so rows compare."""
    rows = []
    for line in path.read_bytes().decode().splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        obj = json.loads(line)
        if obj.get("record") == "provenance":
            continue
        rows.append({k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in obj.items()
                     if k not in RUN_FIELDS and not k.startswith("time_")})
    return rows


def rows_match(got: list[dict], want: list[dict], rel: float = 1e-9) -> bool:
    """Whether two runs' rows (:func:`result_rows`) are the same, floats to ``rel``: the CPU's float64 BLAS (MKL)
    picks its kernels by buffer alignment, so the FP64 oracle of a resumed process can differ from an uninterrupted
    one's in the 11th digit (what ran before it in the process moves its allocations); every other field must be
    equal."""
    if len(got) != len(want):
        return False
    for a, b in zip(got, want, strict=True):
        if a.keys() != b.keys():
            return False
        for k, x in a.items():
            y = b[k]
            if isinstance(x, float) and isinstance(y, float):
                if not math.isclose(x, y, rel_tol=rel, abs_tol=1e-300):
                    return False
            elif x != y:
                return False
    return True


def torchrun_env(root: Path) -> dict:
    """The environment for a torchrun launch of ``root``'s package: one thread per rank, no inherited launch
    variables (a test run under torchrun must not leak its rank into the ranks it starts)."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (torchrun's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(n: int, *args: str) -> list[str]:
    """``python -m torch.distributed.run --nproc-per-node n ... -m zyfa *args`` on a free local port."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-addr",
            "127.0.0.1", "--master-port", str(free_port()), "-m", "zyfa", *args]  # zyfa/__main__.py


def rank_pid(launcher: int, rank: int) -> int | None:
    """The PID of the worker with RANK=rank among the launcher's descendants (from /proc)."""
    todo, seen = [launcher], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in environ and pid != launcher:
                return pid
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return None


def kill_rank_when(cmd: list[str], cwd: Path, env_: dict, watch: Path, rank: int, lines: int,
                   timeout: float = 240) -> tuple[bool, subprocess.CompletedProcess]:
    """Start the torchrun ``cmd``, SIGKILL rank ``rank``'s worker once ``watch`` holds ``lines`` complete lines.
    Returns (killed, the finished launcher's result, stdout with stderr)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env_, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = False
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if count_lines(watch) >= lines:
                pid = rank_pid(proc.pid, rank)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed = True
                    break
            time.sleep(0.005)
        log, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    return killed, subprocess.CompletedProcess(cmd, proc.returncode, log, "")
