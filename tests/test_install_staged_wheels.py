"""scripts/install_staged_wheels.sh: the wheels staged on the GPU machine go into one --target folder together, so
wheels that share a top-level folder (the CuTe DSL's nvidia_cutlass_dsl/) all keep their files; real wheels and pip."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install_staged_wheels.sh"


def _wheel(folder: Path, name: str, files: dict[str, str]) -> Path:
    """A minimal pure-Python wheel named ``name`` 1.0 holding ``files`` (path -> text)."""
    dist = f"{name}-1.0.dist-info"
    members = dict(files)
    members[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    members[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    members[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    whl = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in members.items():
            z.writestr(path, text)
    return whl


def _run(staged: Path, target: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(staged), str(target)], capture_output=True, text=True,
                          timeout=300)


def _imports(target: Path, module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], env={"PYTHONPATH": str(target)},
                          capture_output=True).returncode == 0


def test_wheels_sharing_a_folder_keep_every_file_as_they_arrive(tmp_path):
    staged, target = tmp_path / "models", tmp_path / "site"
    staged.mkdir()
    _wheel(staged, "shared_base", {"shared/__init__.py": "", "shared/base.py": "X = 1\n"})
    _wheel(staged, "shared_core", {"shared/core.py": "Y = 2\n"})
    r = _run(staged, target)
    assert r.returncode == 0 and "installed 2 wheel(s)" in r.stdout, r.stdout + r.stderr
    assert _imports(target, "shared.base") and _imports(target, "shared.core")
    assert _run(staged, target).stdout == ""  # nothing new: no pip, no line
    # a wheel that comes in a later call (the CuTe DSL's 92 MB libraries, in chunks) into the same folder: the
    # others' files stay (installed alone with --upgrade, it left shared/ with its own file only)
    _wheel(staged, "shared_libs", {"shared/libs.py": "Z = 3\n"})
    r = _run(staged, target)
    assert "installed 3 wheel(s)" in r.stdout, r.stdout + r.stderr
    assert all(_imports(target, m) for m in ("shared.base", "shared.core", "shared.libs"))


def test_a_broken_wheel_is_one_line_and_no_marker(tmp_path):
    staged, target = tmp_path / "models", tmp_path / "site"
    staged.mkdir()
    (staged / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip file")
    r = _run(staged, target)
    assert r.returncode == 1 and r.stdout.startswith("installing the wheels of ") and r.stdout.count("\n") == 1
    assert not list(target.glob(".installed-*"))
    assert _run(tmp_path / "empty", target).returncode == 0  # no folder, no wheel: nothing to do
