"""The wall between a user's kernel and the toolkit: plug-ins run in a worker process.

By default every ``--kernel`` of a run lives in one worker process started with multiprocessing's ``spawn``
context (:class:`Worker`, shared by the plug-ins of the process, :func:`shared_worker`). The worker imports the
plug-in files (each file's folder first on its ``sys.path``), receives each call's inputs and sends the outputs
back. CPU tensors cross the pipe as bytes (one copy each way, no shared-memory segment per call); CUDA tensors
through :mod:`torch.multiprocessing`, by CUDA IPC handles (device memory is not copied through the host). What
this protects:

- **The inputs.** Each call gets fresh copies of q, k, v (on their device); after the call they are compared bit
  for bit with what was sent (by the worker for CPU inputs, by the toolkit for the CUDA copies it shares), and a
  kernel that wrote into them fails the row ("wrote into its inputs q, v").
  The toolkit's tensors (the cached probe inputs, the scored input) are never handed out. Done in-process too.
- **Time.** A call that does not return within the plug-in's time limit (``--kernel-timeout``, default
  :data:`DEFAULT_TIMEOUT_S`) fails its row ("timed out after N s"); the worker is killed and a new one started
  (the plug-ins loaded again) for the next call.
- **The process.** The worker's death (a crash, ``os._exit``, a signal) fails the row with its exit status and the
  worker is restarted; ``sys.exit`` and any exception inside the call fail the row; a non-daemon thread left
  running after the call fails the row and the worker is restarted (the thread dies with it); a change of the
  working directory fails the row and is undone. None of these reach the toolkit's exit status, its
  working directory or its output files.

``in_process`` plug-ins (``--kernel-in-process``) are called in the toolkit's process: faster (no transfer, no
worker start-up), still given copies of the inputs and checked for writes, threads and ``chdir``, but with no
time limit, and a crash, ``os._exit`` or a hang of the kernel is one of the toolkit's process.

Exposed:
    DEFAULT_TIMEOUT_S, KernelFault, Worker, shared_worker(), shutdown_shared_worker()
    protected_call(fn, q, k, v, kwargs) -> (out, lse)   (the in-process call with the same checks)
The options (``--kernel-timeout``, ``--kernel-in-process``) are in :mod:`zyfa.plugins`, which the commands
import before torch.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
from typing import Any

import torch
import torch.multiprocessing as tmp

from zyfa.plugins import DEFAULT_TIMEOUT_S, PluginError, PluginSource, check_signature, load_callable

__all__ = ["DEFAULT_TIMEOUT_S", "KernelFault", "Worker", "protected_call", "shared_worker", "shutdown_shared_worker"]

START_TIMEOUT_S = 300.0  # the worker's own start-up (spawn, import torch) on a loaded 2-core machine
_TENSORS = ("q", "k", "v")


class KernelFault(RuntimeError):
    """A call of a plug-in that failed; the message is the row's ``error`` after ``kernel 'X' ``."""


# ---------------------------------------------------------------------------------------------- checks

def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def _written(originals, copies) -> list[str]:
    """Names of the tensors whose copy differs, bit for bit, from the original."""
    return [n for n, a, b in zip(_TENSORS, originals, copies, strict=True)
            if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(_bits(a), _bits(b.to(a.device)))]


def _state() -> tuple[str, set[int]]:
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = ""
    return cwd, {t.ident for t in threading.enumerate() if not t.daemon}


def _breaches(before: tuple[str, set[int]]) -> list[str]:
    """What a call left behind: a new working directory (undone here), new non-daemon threads still running."""
    cwd, threads = before
    found = []
    try:
        now = os.getcwd()
    except OSError:
        now = "(a directory that no longer exists)"
    if now != cwd:
        found.append(f"changed the working directory to {now}")
        with contextlib.suppress(OSError):
            os.chdir(cwd)
    stray = [t for t in threading.enumerate() if not t.daemon and t.ident not in threads and t.is_alive()]
    if stray:
        found.append(f"left {len(stray)} non-daemon thread(s) running ({', '.join(t.name for t in stray[:3])})")
    return found


def _normalise(res) -> tuple[Any, Any]:
    if isinstance(res, (tuple, list)):
        if len(res) != 2:
            raise KernelFault(f"returned a {type(res).__name__} of {len(res)} items; expected out or (out, lse)")
        return res[0], res[1]
    return res, None


def _raised(e: BaseException) -> KernelFault:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return KernelFault(f"raised {type(e).__name__}: {msg}"[:500])


def protected_call(fn, q, k, v, kwargs: dict) -> tuple[Any, Any]:
    """Call ``fn`` in this process on copies of q, k, v: (out, lse or None). KernelFault for an exception inside
    (``SystemExit`` too; ``KeyboardInterrupt`` passes), inputs written into, a ``chdir`` (undone) or a
    non-daemon thread left running."""
    copies = tuple(t.clone() for t in (q, k, v))
    before = _state()
    try:
        res = fn(*copies, **kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the kernel's own failure becomes a failed row
        _breaches(before)
        raise _raised(e) from e
    found = _breaches(before)
    written = _written((q, k, v), copies)
    if written:
        found.insert(0, f"wrote into its inputs {', '.join(written)} (the contract's inputs are read-only)")
    if found:
        raise KernelFault("; ".join(found))
    return _normalise(res)


# ---------------------------------------------------------------------------------------------- transfer

class _Packed:
    """A CPU tensor as bytes: through the pipe in one copy, no shared-memory segment or file descriptor per call
    (CUDA tensors cross as torch.multiprocessing shares them: by CUDA IPC handles)."""

    __slots__ = ("data", "dtype", "shape")

    def __init__(self, t: torch.Tensor) -> None:
        self.dtype = str(t.dtype).removeprefix("torch.")
        self.shape = tuple(t.shape)
        self.data = _bits(t).numpy().tobytes()

    def tensor(self) -> torch.Tensor:
        """A writable tensor of its own (a copy of the bytes)."""
        raw = (torch.frombuffer(bytearray(self.data), dtype=torch.uint8) if self.data
               else torch.empty(0, dtype=torch.uint8))
        return raw.view(getattr(torch, self.dtype)).reshape(self.shape)

    def same(self, t: torch.Tensor) -> bool:
        """Whether ``t`` still holds these bytes (shape and dtype too)."""
        return (isinstance(t, torch.Tensor) and tuple(t.shape) == self.shape and str(t.dtype) == f"torch.{self.dtype}"
                and t.device.type == "cpu" and _bits(t).numpy().tobytes() == self.data)


def _pack(t):
    return _Packed(t) if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.requires_grad else t


def _unpack(t):
    return t.tensor() if isinstance(t, _Packed) else t


# ---------------------------------------------------------------------------------------------- worker side

def _die_with_parent() -> None:
    """Linux: the worker gets SIGKILL when the toolkit's process ends, even by SIGKILL (a worker busy in a kernel
    would otherwise outlive it)."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _serve(conn) -> None:
    """The worker's loop: ``("load", key, source, timeout)``, ``("call", key, q, k, v, kwargs)``, ``("stop",)``.
    Replies ``("ok", ...)``, ``("error", message)`` or ``("restart", message)`` (a thread left running: the
    parent kills this process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C reaches the whole process group
    _die_with_parent()
    fns: dict[str, Any] = {}
    conn.send(("ready", os.getpid()))
    last = None  # the previous call's result: CUDA IPC needs the producer to hold it until the parent has copied
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        last = None
        kind = msg[0]
        if kind == "stop":
            return
        if kind == "load":
            _, key, src = msg
            try:
                fn, where = load_callable(src)
                check_signature(src.spec, fn)
            except PluginError as e:
                conn.send(("error", str(e)))
                continue
            fns[key] = fn
            quant = getattr(fn, "quantization", None)
            conn.send(("ok", where, quant if isinstance(quant, (str, dict, type(None))) else repr(quant)))
            continue
        _, key, *packed, kwargs = msg
        q, k, v = (_unpack(t) for t in packed)
        if isinstance(q, torch.Tensor) and q.is_cuda:
            torch.cuda.set_device(q.device)  # the current device is the inputs', as in the toolkit's process
        before = _state()
        try:
            res = fns[key](q, k, v, **kwargs)
            out, lse = _normalise(res)
            written = [n for n, t, p in zip(_TENSORS, (q, k, v), packed, strict=True)
                       if isinstance(p, _Packed) and not p.same(t)]
            if written:  # CPU inputs came as bytes: checked here (CUDA ones by the parent, which shares them)
                raise KernelFault(f"wrote into its inputs {', '.join(written)} (the contract's inputs are read-only)")
        except KernelFault as e:
            _breaches(before)
            conn.send(("error", str(e)))
            continue
        except BaseException as e:  # noqa: BLE001 - SystemExit and the rest: the row fails, the worker lives
            _breaches(before)
            conn.send(("error", str(_raised(e))))
            continue
        found = _breaches(before)
        if found:
            conn.send(("restart" if any("thread" in f for f in found) else "error", "; ".join(found)))
            continue
        last = (out, lse)
        try:
            conn.send(("ok", _pack(out), _pack(lse)))
        except Exception as e:  # noqa: BLE001 - an output that cannot cross (a generator, a lambda)
            last = None
            conn.send(("error", f"returned an output that cannot be passed back: {type(e).__name__}: {e}"[:500]))
        q = k = v = res = out = lse = None  # the inputs' IPC handles released before the next request
    del last


# ---------------------------------------------------------------------------------------------- parent side

class Worker:
    """One worker process for the plug-ins of this process; restarted (the plug-ins loaded again) after a time-out,
    a death or a stray thread."""

    def __init__(self) -> None:
        self._proc = None
        self._conn = None
        self._sources: dict[str, PluginSource] = {}
        self._load_errors: dict[str, str] = {}
        self.starts = 0

    # -- process
    def _start(self) -> None:
        ctx = tmp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="zyfa-plugin-worker")
        with _main_hidden():
            proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        self.starts += 1
        if not parent.poll(START_TIMEOUT_S):
            self._kill()
            raise KernelFault(f"the plug-in worker process did not start within {START_TIMEOUT_S:g} s")
        try:
            parent.recv()
        except (EOFError, OSError):
            code = self._kill()
            raise KernelFault(f"the plug-in worker process ended at start-up ({_exit_words(code)})") from None
        self._load_errors = {}
        for key, src in self._sources.items():
            if not self._alive():
                self._load_errors[key] = "the new worker process ended while the plug-ins were loaded again"
                continue
            try:
                self._load(key, src)
            except KernelFault as e:
                self._load_errors[key] = str(e)

    def _kill(self) -> int | None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            conn.close()
        if proc is None:
            return None
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        return proc.exitcode

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def close(self) -> None:
        """Stop the worker (asked first, then killed)."""
        if self._conn is not None:
            with contextlib.suppress(OSError, ValueError):
                self._conn.send(("stop",))
            if self._proc is not None:
                self._proc.join(2)
        self._kill()

    # -- requests
    def _request(self, msg: tuple, timeout: float) -> tuple:
        """Send ``msg`` and wait ``timeout`` s for the reply; KernelFault (the worker killed) on time-out or death."""
        conn = self._conn
        try:
            conn.send(msg)
            if not conn.poll(timeout):
                self._kill()
                raise KernelFault(f"timed out after {timeout:g} s (its worker process was killed and restarted)")
            return conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            code = self._kill()
            raise KernelFault(f"ended its worker process ({_exit_words(code)}); the worker was restarted") from None

    def _load(self, key: str, src: PluginSource, timeout: float = START_TIMEOUT_S) -> tuple[str, Any]:
        reply = self._request(("load", key, src), timeout)
        if reply[0] != "ok":
            raise KernelFault(reply[1])
        return reply[1], reply[2]

    def load(self, src: PluginSource, timeout: float) -> tuple[str, Any]:
        """Import ``src`` in the worker: (where it came from, its ``quantization`` attribute). PluginError (one
        line naming the kernel) when it does not import, has no such function or a wrong signature, or its
        import dies or takes longer than ``timeout``."""
        key = src.name
        self._sources.pop(key, None)
        if not self._alive():
            self._kill()
            self._start()
        try:
            where, quant = self._load(key, src, timeout)
        except KernelFault as e:
            msg = str(e)
            raise PluginError(msg if msg.startswith("kernel ") else f"kernel {src.spec!r}: importing it {msg}") \
                from None
        self._sources[key] = src
        return where, quant

    def call(self, key: str, q, k, v, kwargs: dict, timeout: float) -> tuple[Any, Any]:
        """One call of plug-in ``key`` on copies of q, k, v: (out, lse or None), both on the inputs' device and
        owned by this process. KernelFault for whatever went wrong (see the module docstring)."""
        if not self._alive():
            self._kill()
            self._start()
        if key in self._load_errors:
            raise KernelFault(f"could not be loaded again in a new worker: {self._load_errors[key]}")
        copies = tuple(t if t.device.type == "cpu" else t.clone() for t in (q, k, v))  # CPU: sent as bytes
        reply = self._request(("call", key, *(_pack(t) for t in copies), kwargs), timeout)
        if reply[0] == "restart":
            self._kill()
            raise KernelFault(reply[1] + "; its worker process was restarted")
        if reply[0] != "ok":
            raise KernelFault(reply[1])
        out, lse = (t.clone() if isinstance(t, torch.Tensor) else _unpack(t) for t in reply[1:])
        del reply
        written = _written((q, k, v), copies)
        if written:
            raise KernelFault(f"wrote into its inputs {', '.join(written)} (the contract's inputs are read-only)")
        return out, lse


@contextlib.contextmanager
def _main_hidden():
    """Hide the ``__main__`` module's file and spec while the worker starts: spawn would run the parent's main
    script (a user's script, pytest, ``<stdin>``) in the worker again; the worker needs only this module."""
    main = sys.modules.get("__main__")
    saved = {a: getattr(main, a) for a in ("__file__", "__spec__") if main is not None and hasattr(main, a)}
    try:
        for a in saved:
            setattr(main, a, None) if a == "__spec__" else delattr(main, a)
        yield
    finally:
        for a, val in saved.items():
            setattr(main, a, val)


def _exit_words(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


_SHARED: list[Worker] = []


def shared_worker() -> Worker:
    """The process's plug-in worker (one for every plug-in; started at the first load)."""
    if not _SHARED:
        _SHARED.append(Worker())
    return _SHARED[0]


def shutdown_shared_worker() -> None:
    """Stop the process's plug-in worker, if any (also at exit)."""
    while _SHARED:
        _SHARED.pop().close()


atexit.register(shutdown_shared_worker)
