"""Output files that lose nothing: checked before any work, appended row by row, replaced atomically.

Every command that writes results uses these primitives (standard library only, so any package may):

- :func:`check_writable` / :func:`check_dir_writable`: before a run starts, prove that the output can be
  written (a real probe file in the target folder, so read-only mounts, ``/proc`` and missing folders fail
  here, not after an hour of work) and that the file system has the free space the caller estimates.
- :func:`atomic_write_text` / :func:`atomic_write_bytes`: write a temporary file in the same folder, fsync it
  and rename it over the target: a reader sees the old file or the new one, never a truncated one.
- :class:`AppendLog`: a line-oriented log appended and fsync'd one line at a time (a killed run keeps every
  line it finished; :func:`read_complete_lines` drops a torn last line).
- :class:`StagedFolder`: an output folder whose files change together: a run writes into ``<out>.partial/``
  (kept across a kill, so the run can resume), then the finished folder is renamed into place.
- :class:`RunLock`: one live run per output. An OS lock (``fcntl.flock``) on ``<out>.partial.lock``, held from
  the moment the output is checked until the run ends (the kernel drops it when the process dies, however it
  dies), so a second run on the same output, ``--force`` or not, is refused naming the live run's PID and start
  time, and a lock file left by a dead run is recognised as stale and taken over.

Failures raise :class:`OutputError` (a ``ValueError``) whose message is one line naming the path and the cause.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["OutputError", "AppendLog", "RunLock", "RunLockedError", "StagedFolder", "atomic_write_bytes",
           "atomic_write_text", "check_dir_writable", "check_writable", "lock_path", "partial_path",
           "read_complete_lines"]

# Free space a run keeps in hand beyond its own estimate (other writers share the disk).
MIN_FREE_BYTES = 1 << 20


class OutputError(ValueError):
    """An output that cannot be written (the message is one line naming the path and why)."""


def _reason(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "no space left on device"
    if e.errno == errno.EROFS:
        return "read-only file system"
    return e.strerror or str(e)


def partial_path(path: str | Path) -> Path:
    """Where an unfinished run keeps its rows: ``<name>.partial`` next to ``path``."""
    path = Path(path)
    return path.with_name(path.name + ".partial")


def lock_path(partial: str | Path) -> Path:
    """The lock file guarding ``partial`` (a run's ``<out>.partial`` file or folder): ``<out>.partial.lock``.

    The lock is not taken on ``<out>.partial`` itself because that file is truncated when a run starts over and
    removed (a folder: renamed) when it finishes; a lock on it would be lost with it."""
    partial = Path(partial)
    return partial.with_name(partial.name + ".lock")


class RunLockedError(OutputError):
    """Another live process holds the output's :class:`RunLock`."""


class RunLock:
    """An exclusive, non-blocking ``fcntl.flock`` on ``<out>.partial.lock`` for the whole of a run.

    :meth:`acquire` refuses (:class:`RunLockedError`, one line naming the live holder's PID and start time) while
    another process holds it. The kernel releases a flock when its process exits, even by SIGKILL, so a lock file
    that can be locked belongs to a dead run: it is stale, and is taken over (:attr:`stale` holds what that run
    wrote: ``pid``, ``started``). The file records the holder (``{"pid", "started", "argv"}``); :meth:`release`
    removes it while still locked. A process that opened the file just before its removal sees, once it gets the
    lock, that the path no longer names the inode it locked, and starts again, so two runs never both hold it.
    """

    def __init__(self, path: Path, fd: int, stale: dict | None):
        self.path = path
        self._fd: int | None = fd
        self.stale = stale

    @classmethod
    def acquire(cls, partial: str | Path, *, what: str | None = None) -> RunLock:
        path = lock_path(partial)
        what = what or str(Path(partial))
        for _ in range(100):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise OutputError(f"cannot create the lock file {path}: {_reason(e)}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_holder(fd)
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise OutputError(f"cannot lock {path}: {_reason(e)}") from None
                raise RunLockedError(
                    f"another run is writing {what}: {_holder_words(holder)} holds {path}; wait for it to "
                    "finish or stop it (--force does not replace a live run's output)") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # removed (or replaced) by the holder that just released it: lock the new one
                os.close(fd)
                continue
            stale = _read_holder(fd)
            try:
                data = json.dumps({"pid": os.getpid(), "started": _dt.datetime.now(_dt.timezone.utc)
                                   .strftime("%Y-%m-%d %H:%M:%S UTC"), "argv": sys.argv[:8]}).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, data + b"\n", 0)
                os.fsync(fd)
            except OSError as e:
                os.close(fd)
                raise OutputError(f"cannot write the lock file {path}: {_reason(e)}") from None
            return cls(path, fd, stale)
        raise OutputError(f"cannot lock {path}: it keeps being replaced by another process")

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = None


def _read_holder(fd: int) -> dict | None:
    try:
        data = os.pread(fd, 4096, 0)
        obj = json.loads(data.decode("utf-8")) if data.strip() else None
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def _holder_words(holder: dict | None) -> str:
    if not holder or not isinstance(holder.get("pid"), int):
        return "a live process (PID not yet recorded)"
    return f"PID {holder['pid']}, started {holder.get('started', 'at an unknown time')},"


def _probe(folder: Path) -> None:
    """Create, write, fsync and remove a probe file in ``folder`` (OutputError on any failure)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".zyfa-probe-", dir=folder)
    except OSError as e:
        raise OutputError(f"cannot write in {folder}: {_reason(e)}") from None
    try:
        os.write(fd, b"x")
        os.fsync(fd)
    except OSError as e:
        raise OutputError(f"cannot write in {folder}: {_reason(e)}") from None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)


def _check_space(folder: Path, need_bytes: int, what: str) -> None:
    try:
        free = shutil.disk_usage(folder).free
    except OSError as e:
        raise OutputError(f"cannot check free space of {folder}: {_reason(e)}") from None
    need = int(need_bytes) + MIN_FREE_BYTES
    if free < need:
        raise OutputError(f"not enough free space for {what} in {folder}: {free / 1e6:.1f} MB free, "
                          f"about {need / 1e6:.1f} MB needed")


def check_writable(path: str | Path, *, need_bytes: int = 0) -> Path:
    """Check that the file ``path`` can be created or replaced, with ``need_bytes`` free (plus a margin).

    The folder must exist (it is not created); ``path`` must not be a directory. Returns ``path``.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{path} is a directory; give a file name")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.exists():
        raise OutputError(f"folder {folder} does not exist (create it first)")
    if not folder.is_dir():
        raise OutputError(f"{folder} is not a folder")
    _probe(folder)
    _check_space(folder, need_bytes, path.name)
    return path


def check_dir_writable(folder: str | Path, *, need_bytes: int = 0) -> Path:
    """Check that files can be written in ``folder`` (created later if missing: its nearest existing
    ancestor is probed instead), with ``need_bytes`` free. Returns ``folder``."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{folder} exists and is not a folder")
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise OutputError(f"cannot create folder {folder}: {probe} is not a folder")
    _probe(probe)
    _check_space(probe, need_bytes, str(folder))
    return folder


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _mode_for(path: Path) -> int:
    """The replaced file's permissions, else those a plain open() would give (0o666 less the umask)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Replace ``path`` by ``data`` atomically (temporary file in the same folder, fsync, rename).

    On failure the temporary file is removed, ``path`` is untouched, and OutputError names the cause."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {_reason(e)}") from None
    try:
        try:
            os.fchmod(fd, _mode_for(path))
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputError(f"cannot write {path}: {_reason(e)} (the previous file, if any, is unchanged)") from None
    _fsync_dir(folder)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """:func:`atomic_write_bytes` of UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def read_complete_lines(path: str | Path) -> tuple[list[str], int]:
    """(lines, byte length of the complete part) of a line log: a last line without its newline (a write cut
    short by a kill) is left out."""
    data = Path(path).read_bytes()
    end = data.rfind(b"\n") + 1
    return data[:end].decode("utf-8").splitlines(), end


class AppendLog:
    """Append lines to ``path``, each written whole and fsync'd before :meth:`write_line` returns.

    ``fresh=True`` starts the file empty; otherwise it is continued after its last complete line (a torn
    last line is cut off first).
    """

    def __init__(self, path: str | Path, *, fresh: bool):
        self.path = Path(path)
        try:
            if fresh:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            else:
                _, end = read_complete_lines(self.path)
                self._fd = os.open(self.path, os.O_WRONLY)
                os.ftruncate(self._fd, end)
                os.lseek(self._fd, end, os.SEEK_SET)
        except OSError as e:
            raise OutputError(f"cannot write {self.path}: {_reason(e)}") from None

    def write_line(self, line: str) -> None:
        if "\n" in line:
            raise ValueError("a log line must not contain a newline")
        try:
            _write_all(self._fd, (line + "\n").encode("utf-8"))
            os.fsync(self._fd)
        except OSError as e:
            raise OutputError(f"cannot write {self.path}: {_reason(e)} "
                              "(the lines written before are kept)") from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> AppendLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class StagedFolder:
    """An output folder written as a whole: files go into :attr:`stage` (``<out>.partial/``), and
    :meth:`commit` renames it to ``<out>``, so a report and its results always come from the same run.

    :meth:`open` decides before any work: an existing ``<out>`` or ``<out>.partial`` is refused unless
    ``force`` (start over: an interrupted run's stage is cleared; the old ``<out>`` stays until the commit)
    or ``resume`` (continue in the existing stage; a finished ``<out>`` alone has nothing to resume).
    """

    def __init__(self, final: Path, *, resumed: bool, lock: RunLock | None = None):
        self.final = final
        self.stage = final.with_name(final.name + ".partial")
        self.resumed = resumed
        self.lock = lock

    @classmethod
    def open(cls, final: str | Path, *, force: bool = False, resume: bool = False, need_bytes: int = 0,
             flag: str = "--out") -> StagedFolder:
        final = Path(final)
        if force and resume:
            raise OutputError("--force and --resume exclude each other")
        if not final.name or final.name in (".", ".."):
            raise OutputError(f"{flag} {final} names no folder")
        stage = final.with_name(final.name + ".partial")
        for p in (final, stage):
            if p.exists() and not p.is_dir():
                raise OutputError(f"{p} exists and is not a folder; choose another {flag}")
        check_dir_writable(final.parent, need_bytes=need_bytes)
        lock = RunLock.acquire(stage, what=str(final))  # a live run on this folder: refused, --force or not
        try:
            if (final.exists() or stage.exists()) and not (force or resume):
                what = (f"an interrupted run is in {stage}" if stage.exists() else f"{final} exists")
                raise OutputError(f"{what}: add --resume to continue it, --force to start over, or choose "
                                  f"another {flag}")
            if resume and not stage.exists() and final.exists():
                raise OutputError(f"{final} is a finished run and there is no interrupted one ({stage}) to "
                                  "resume; use --force to run it again")
            resumed = resume and stage.exists()
            try:
                if force and stage.exists():
                    shutil.rmtree(stage)
                stage.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise OutputError(f"cannot create {stage}: {_reason(e)}") from None
        except BaseException:
            lock.release()
            raise
        return cls(final, resumed=resumed, lock=lock)

    def release(self) -> None:
        """Drop the run's lock (:meth:`commit` does; call it when a run ends without committing)."""
        if self.lock is not None:
            self.lock.release()

    def commit(self, keep: Callable[[str], bool] = lambda name: False) -> list[str]:
        """Rename the stage to ``<out>``. Files of the old ``<out>`` for which ``keep(name)`` is true and that
        the stage lacks (e.g. a hand-written README) are carried over; the rest of the old folder is removed
        (so nothing stale, such as an old screenshot, stays beside the new report). Returns the removed names.
        """
        removed: list[str] = []
        try:
            if self.final.exists():
                for old in sorted(self.final.iterdir()):
                    if (self.stage / old.name).exists():
                        continue
                    if keep(old.name) and old.is_file():
                        shutil.copy2(old, self.stage / old.name)
                    else:
                        removed.append(old.name)
                trash = self.final.with_name(f".{self.final.name}.old-{os.getpid()}")
                os.rename(self.final, trash)
                os.rename(self.stage, self.final)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.rename(self.stage, self.final)
        except OSError as e:
            raise OutputError(f"cannot move {self.stage} to {self.final}: {_reason(e)} (the finished run stays "
                              f"in {self.stage})") from None
        _fsync_dir(self.final.parent)
        self.release()
        return removed
