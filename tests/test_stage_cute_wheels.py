"""scripts/stage_cute_wheels.py on small real files (no network): the manifest's sizes and hashes, the chunks
stage_files.py cuts and joins back, the pip commands, and the one-line refusals."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from tests.load_file import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load():
    return load_script("stage_cute_wheels")


S = _load()


def _fake_wheels(folder: Path, size: int = 3000) -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    data = {}
    for i, (name, version) in enumerate(S.WHEELS):
        fname = f"{name.replace('-', '_')}-{version}-py3-none-manylinux_2_28_x86_64.whl"
        data[fname] = bytes((i * 7 + j) % 251 for j in range(size + 100 * i))
        (folder / fname).write_bytes(data[fname])
    return data


def test_manifest_has_each_wheels_size_and_sha256(tmp_path):
    data = _fake_wheels(tmp_path / "w")
    man = S.manifest(tmp_path / "w")
    assert json.loads((tmp_path / "w" / S.MANIFEST).read_text()) == man
    assert {w["name"] for w in man["wheels"]} == set(data)
    for w in man["wheels"]:
        assert w["bytes"] == len(data[w["name"]])
        assert w["sha256"] == hashlib.sha256(data[w["name"]]).hexdigest()
    assert man["install"] == S.install_command()


def test_manifest_refuses_a_missing_or_doubled_wheel(tmp_path):
    _fake_wheels(tmp_path / "w")
    victim = next((tmp_path / "w").glob("cuda_bindings-*.whl"))
    victim.unlink()
    with pytest.raises(ValueError, match="0 wheels of cuda-bindings"):
        S.manifest(tmp_path / "w")
    victim.write_bytes(b"x")
    (tmp_path / "w" / "cuda_bindings-13.4.0-py3-none-any.whl").write_bytes(b"y")
    with pytest.raises(ValueError, match="2 wheels of cuda-bindings"):
        S.manifest(tmp_path / "w")


def test_stage_chunks_join_back_to_the_same_bytes(tmp_path):
    data = _fake_wheels(tmp_path / "w")
    S.stage(tmp_path / "w", tmp_path / "chunks", chunk_mb=0.001)  # 1000-byte chunks: every wheel in several parts
    man = json.loads((tmp_path / "chunks" / "manifest.json").read_text())
    assert all(len(f["parts"]) >= 3 for f in man["files"] if f["name"].endswith(".whl"))
    assert S.stage_files.join(tmp_path / "chunks", tmp_path / "joined", None) == 0
    for name, payload in data.items():
        assert (tmp_path / "joined" / name).read_bytes() == payload
    assert json.loads((tmp_path / "joined" / S.MANIFEST).read_text())["install"] == S.install_command()


def test_pip_commands_pin_every_wheel_without_dependencies(tmp_path):
    cmds = S.download_commands(tmp_path, python_version="3.11", platform="manylinux_2_28_x86_64")
    assert [c[-1] for c in cmds] == S.pins()
    for c in cmds:
        assert c[:4] == [sys.executable, "-m", "pip", "download"] and "--no-deps" in c and "--only-binary=:all:" in c
        assert c[c.index("--python-version") + 1] == "3.11"
    assert "nvidia-cutlass-dsl==4.8.1" in S.install_command() and "--no-deps" in S.install_command()


def test_chunk_size_above_the_device_limit_refused(tmp_path, capsys):
    assert S.main(["stage", "--wheels", str(tmp_path), "--out", str(tmp_path / "c"), "--chunk-mb", "64",
                   "--no-download"]) == 2
    assert "--chunk-mb must be at most 60" in capsys.readouterr().err


def test_install_command_is_documented():
    assert S.install_command() in (ROOT / "docs" / "KERNEL.md").read_text()
