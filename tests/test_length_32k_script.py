"""scripts/length_32k_h200.sh refuses before anything runs: a pydoc text that is not the 2K/8K captures' (the GPU
machine's Python extracts another), and waits while the model is not staged."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from zyfa.capture.models import MODELS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "length_32k_h200.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("sha256sum") is None,
                                reason="needs bash and sha256sum")


def _run(tmp_path, text: Path, with_model: bool):
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    if with_model:
        (cache / "models" / MODELS["qwen25coder-1.5b"].file_name).write_bytes(b"not read before the text is checked")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path), "ZYFA_CACHE": str(cache),
           "TEXT": str(text), "OUT": str(tmp_path / "out"), "STATE": str(tmp_path / "state")}
    (tmp_path / "out").mkdir()
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_another_pydoc_text_is_refused_in_one_line_and_nothing_starts(tmp_path):
    text = tmp_path / "pydoc-py312.txt"
    text.write_text("the reference of another Python\n")
    done = _run(tmp_path, text, with_model=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.count("\n") == 1 and "not the 2K/8K captures' pydoc text" in done.stdout
    assert not (tmp_path / "state" / "started").exists() and not (tmp_path / "state" / "src").exists()


def test_without_the_staged_model_it_says_so_and_waits(tmp_path):
    done = _run(tmp_path, tmp_path / "missing.txt", with_model=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is not there yet (stage and join it first)" in done.stdout
