"""The README's set-up (``python3 -m venv .venv``) leaves the clone clean: ``.venv/`` is ignored (issue 32)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a checkout")
def test_readme_venv_is_ignored(tmp_path):
    assert "python3 -m venv .venv" in (ROOT / "README.md").read_text()
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True, timeout=300)
    shutil.copy(ROOT / ".gitignore", clone / ".gitignore")  # this checkout's, committed or not
    subprocess.run(["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "ignore",
                    "--allow-empty"], check=True,
                   capture_output=True, timeout=60)
    (clone / ".venv" / "bin").mkdir(parents=True)
    (clone / ".venv" / "bin" / "python").write_text("")
    (clone / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    status = subprocess.run(["git", "-C", str(clone), "status", "--porcelain"], capture_output=True, text=True,
                            check=True, timeout=60).stdout
    assert status == "", status
