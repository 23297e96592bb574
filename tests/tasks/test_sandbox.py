"""The sandbox of generated code: a looping, a memory-hungry, a sleeping and a network-touching program are
stopped and scored failed, each with its reason, and the caller goes on; a correct program passes."""

from __future__ import annotations

import os
import socket
import threading

import pytest
from zyfa.accuracy.tasks.sandbox import Limits, network_isolation, run_sandboxed

FAST = Limits(cpu_seconds=2, wall_seconds=6, memory_bytes=1 << 30)
WEAK = ((), "sockets blocked in the child's Python only (test)")


def test_a_correct_program_passes_and_a_wrong_one_fails():
    ok = run_sandboxed("def f(x):\n    return x + 1\nassert f(1) == 2\n", FAST)
    assert ok.passed and ok.status == "passed" and ok.returncode == 0
    bad = run_sandboxed("def f(x):\n    return x\nassert f(1) == 2\n", FAST)
    assert not bad.passed and bad.status == "failed" and "AssertionError" in bad.stderr_tail


def test_a_looping_program_is_stopped_at_its_cpu_limit():
    out = run_sandboxed("while True:\n    pass\n", FAST)
    assert not out.passed and out.status == "cpu_limit"
    assert out.seconds < FAST.wall_seconds


def test_a_sleeping_program_is_killed_at_the_wall_limit():
    out = run_sandboxed("import time\ntime.sleep(60)\n", Limits(cpu_seconds=2, wall_seconds=1.5))
    assert not out.passed and out.status == "timeout" and out.seconds < 10


def test_a_memory_hungry_program_hits_its_memory_limit():
    out = run_sandboxed("x = bytearray(4 << 30)\nassert len(x)\n", FAST)
    assert not out.passed and out.status == "memory_limit"


def test_environment_and_directory_are_the_sandbox_own(monkeypatch):
    monkeypatch.setenv("ZYFA_SECRET_TOKEN", "hunter2")
    prog = ("import os, sys\n"
            "assert 'ZYFA_SECRET_TOKEN' not in os.environ, 'environment leaked'\n"
            "assert os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'], os.getcwd()\n"
            "assert os.path.basename(os.getcwd()).startswith('zyfa-sandbox-')\n"
            f"assert os.getcwd() != {os.getcwd()!r}\n")
    out = run_sandboxed(prog, FAST)
    assert out.passed, out.stderr_tail


def test_destructive_calls_are_refused(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("x")
    out = run_sandboxed(f"import os\nos.remove({str(victim)!r})\n", FAST)
    assert not out.passed and "os.remove is disabled" in out.stderr_tail
    assert victim.exists()


@pytest.fixture
def listener():
    """A TCP server on this machine's loopback that greets whoever connects: reachable without isolation."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(20)

    def serve():
        try:
            while True:
                conn, _ = srv.accept()
                conn.sendall(b"hello")
                conn.close()
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def _touch_network(port: int) -> str:
    return ("import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "assert s.recv(5) == b'hello'\n")


def test_the_listener_is_reachable_outside_the_sandbox(listener):
    """The network probe can fail: the same connection succeeds from this process."""
    s = socket.create_connection(("127.0.0.1", listener), timeout=3)
    assert s.recv(5) == b"hello"
    s.close()


@pytest.mark.parametrize("network", [None, WEAK], ids=["namespace-or-probe", "socket-guard"])
def test_a_network_touching_program_fails(listener, network):
    out = run_sandboxed(_touch_network(listener), FAST, network=network)
    assert not out.passed and out.status == "failed"
    assert out.isolation == (network or network_isolation())[1]


@pytest.mark.skipif(not network_isolation()[0], reason=f"no network namespace here: {network_isolation()[1]}")
def test_the_namespace_holds_against_the_raw_socket_module(listener):
    """Under a network namespace even ``_socket`` (which the in-process guard cannot stop) finds no network."""
    prog = ("import _socket\n"
            "s = _socket.socket()\n"
            "s.settimeout(3)\n"
            f"s.connect(('127.0.0.1', {listener}))\n")
    out = run_sandboxed(prog, FAST)
    assert not out.passed and out.status == "failed"


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="cpu_seconds must be positive"):
        Limits(cpu_seconds=0)
