"""A writer killed right after its new file was renamed into place leaves a readable, resumable, empty capture.

The kill-point suite (test_capture_store_kill_points.py) covers every boundary from one driver process; this
test also creates a capture in its own process first, so that a tool which maps tests to the functions they run
in-process (mutmut) knows this test exercises the file creation that the killed child runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import torch
from zyfa.capture.store import open_capture, read_capture
from zyfa.capture.writer import KILL_AT_ENV, CaptureWriter

from tests.capture.test_store_schema_and_errors import IDS, _meta, _write

ROOT = Path(__file__).resolve().parents[2]


def test_kill_right_after_the_rename(tmp_path):
    full = tmp_path / "full.h5"
    recs = _write(full)  # the same creation path, uninterrupted, in this process
    path = tmp_path / "killed" / "c.h5"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.capture.test_store_schema_and_errors import IDS, _meta, _record
        from zyfa.capture.writer import CaptureWriter
        w = CaptureWriter({str(path)!r}, _meta(), IDS)
        w.write_layer(_record(0))
        print("not killed", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, KILL_AT_ENV: "create:renamed"})
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert sorted(p.name for p in path.parent.iterdir()) == ["c.h5"]  # renamed: no temporary file left
    info = open_capture(path)
    assert info.complete_layers == [] and not info.complete and info.attrs["model"] == "synthetic"
    with h5py.File(path, "r") as f:
        assert list(f["layers"]) == [] and f["token_ids"][()].tolist() == IDS.tolist()
    with CaptureWriter(path, _meta(), IDS) as w:
        assert w.resumed and w.pending_layers == [0, 3]
        for r in recs:
            w.write_layer(r)
        w.finish()
    for a, b in zip(read_capture(full), read_capture(path), strict=True):
        assert all(torch.equal(getattr(a, n), getattr(b, n)) for n in "qkv")
