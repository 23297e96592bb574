"""scripts/longctx_h200_call.sh on a CPU, the way a device call runs it: its stage folder (STAGE) brings a chunked file
and a text; it joins the file once every part is there, starts the background session from its STATE's own copy of
the tree, waits for it (WAIT) and packs the state. With no model in place and a short deadline the session only
logs; the GPU work itself runs on the device."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import stage_files  # noqa: E402  (scripts/stage_files.py)


def _call(stage: Path, tmp: Path, *, seconds: int = 25, wait: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "STAGE": str(stage), "STATE": str(tmp / "state"), "PARTS": str(tmp / "parts"),
           "SITE": str(tmp / "site"), "ZYFA_CACHE": str(tmp / "cache"), "OUT": str(tmp / "out"), "SIDE": "0",
           "MODELS": "smollm2", "WAIT": str(wait), "ZYFA_GIT_COMMIT": "0" * 40,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    (tmp / "out").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(ROOT / "scripts" / "longctx_h200_call.sh"), str(seconds)], env=env,
                          capture_output=True, text=True, timeout=600)


def test_two_calls_join_the_file_and_the_session_runs_from_its_own_copy(tmp_path):
    model = tmp_path / "src" / "weights.gguf"
    model.parent.mkdir()
    model.write_bytes(os.urandom(1_500_000))
    text = tmp_path / "src" / "essays-v1.txt"
    text.write_text("a haystack\n")
    stage_files.split([model], tmp_path / "all", chunk_mb=1.0)
    folders = stage_files.calls(tmp_path / "all", tmp_path / "repo", [text])
    assert [f.name for f in folders] == [".stage-01", ".stage-02"]

    first = _call(folders[0], tmp_path)
    assert first.returncode == 0, first.stderr
    assert "background session started" in first.stdout
    assert not (tmp_path / "cache" / "models" / "weights.gguf").exists()  # one part of two
    assert (tmp_path / "cache" / "texts" / "essays-v1.txt").read_text() == "a haystack\n"
    assert (tmp_path / "state-src" / "scripts" / "longctx_h200_background.sh").is_file()
    assert not list((tmp_path / "state-src").glob(".stage*")) and not (tmp_path / "state-src" / ".git").exists()

    second = _call(folders[1], tmp_path)
    assert second.returncode == 0, second.stderr
    assert "background session started" not in second.stdout  # the first call's session, not a second one
    assert (tmp_path / "cache" / "models" / "weights.gguf").read_bytes() == model.read_bytes()
    log = (tmp_path / "state" / "background.log").read_text()
    assert "start:" in log and "smollm2: its file never came; not run" in log and "all done" in log
    with tarfile.open(tmp_path / "out" / "longctx-state.tar.xz") as t:
        assert "./background.log" in t.getnames()
