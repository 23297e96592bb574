"""scripts/stage_files.py join: a file it verified is taken unhashed by later joins while its size and mtime match,
and hashed again (and refused or rejoined) once it changed."""

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
