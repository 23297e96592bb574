"""scripts/stage_files.py: join takes a file it verified unhashed by later joins while its size and mtime match, and
hashes it again (and refuses or rejoins it) once it changed; calls makes every device call's folder up front."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import stage_files  # noqa: E402  (scripts/stage_files.py)


def test_a_joined_file_is_not_hashed_again_until_it_changes(tmp_path, capsys, monkeypatch):
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(3_000_001))
    stage_files.split([src], tmp_path / "parts", chunk_mb=1.0)
    into = tmp_path / "models"
    assert stage_files.join(tmp_path / "parts", into, None) == 0
    assert (into / "model.bin").read_bytes() == src.read_bytes()
    assert "joined and verified" in capsys.readouterr().err
    hashed = []
    real = stage_files.sha256_file
    monkeypatch.setattr(stage_files, "sha256_file", lambda p: hashed.append(p) or real(p))
    assert stage_files.join(tmp_path / "parts", into, None) == 0
    assert hashed == [] and "already in place (verified when joined)" in capsys.readouterr().err
    # the file changed in place (same size, new mtime): hashed again, found wrong, joined again from the parts
    data = bytearray((into / "model.bin").read_bytes())
    data[0] ^= 0xFF
    (into / "model.bin").write_bytes(bytes(data))
    os.utime(into / "model.bin", ns=(1, 1))
    assert stage_files.join(tmp_path / "parts", into, None) == 0
    assert hashed and (into / "model.bin").read_bytes() == src.read_bytes()
    assert "joined and verified" in capsys.readouterr().err


def test_calls_makes_every_calls_folder_and_their_parts_join(tmp_path, capsys):
    """``calls``: one folder per call, each with the manifest; a full chunk alone, small files' parts together up to
    one chunk's size; the --first files in the first call only; all the folders' parts join into the files."""
    big, small1, small2 = tmp_path / "model.gguf", tmp_path / "a.whl", tmp_path / "b.whl"
    big.write_bytes(os.urandom(2_500_000))
    small1.write_bytes(os.urandom(300_000))
    small2.write_bytes(os.urandom(400_000))
    text = tmp_path / "essays.txt"
    text.write_text("haystack\n")
    stage_files.split([small1, small2, big], tmp_path / "all", chunk_mb=1.0)
    repo = tmp_path / "repo"
    (repo / ".stage-07").mkdir(parents=True)  # an earlier session's folder: replaced
    assert stage_files.main(["calls", "--out", str(tmp_path / "all"), "--into", str(repo), "--first", str(text)]) == 0
    folders = sorted(repo.glob(".stage-*"))
    contents = [sorted(p.name for p in d.iterdir()) for d in folders]
    assert [d.name for d in folders] == [".stage-01", ".stage-02", ".stage-03", ".stage-04"]
    assert contents[0] == ["a.whl.part000", "b.whl.part000", "essays.txt", "manifest.json"]
    assert contents[1:] == [["manifest.json", f"model.gguf.part{k:03d}"] for k in range(3)]
    parts = tmp_path / "device"
    parts.mkdir()
    for d in folders:
        for p in d.glob("*.part*"):
            (parts / p.name).write_bytes(p.read_bytes())
    (parts / "manifest.json").write_bytes((folders[-1] / "manifest.json").read_bytes())
    assert stage_files.join(parts, tmp_path / "models", None) == 0
    for f in (big, small1, small2):
        assert (tmp_path / "models" / f.name).read_bytes() == f.read_bytes()


def test_calls_without_a_split_is_one_line(tmp_path, capsys):
    assert stage_files.main(["calls", "--out", str(tmp_path / "nothing"), "--into", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"stage_files: {tmp_path / 'nothing'}: no manifest.json (run split first)"
