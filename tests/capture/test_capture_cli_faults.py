"""Fault injection for ``zyfa capture``: SIGKILL at random points, a full disk, read-only outputs.

The real command runs in a subprocess on a tiny random Gemma-3 directory (``tiny_model.py``) and is killed
with SIGKILL: as its file is created, right after it appears, at a randomly drawn write boundary, and at a
random moment. After
every kill nothing complete is lost, and the final rerun's file equals an uninterrupted run's, dataset for
dataset. A writer that raises ENOSPC and a read-only output folder give one clear line, and earlier files stay
byte for byte as they were.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from argparse import ArgumentParser
from pathlib import Path

import h5py
import numpy as np
import pytest
from zyfa.capture import cli
from zyfa.capture.store import open_capture
from zyfa.capture.writer import KILL_AT_ENV

ROOT = Path(__file__).resolve().parents[2]
SEQ = 48


def _args(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", str(model_dir), "--text", "pydoc", "--tokens", str(SEQ), "--out", str(out),
            "--no-progress", *extra]


def _zyfa_capture(model_dir: Path, out: Path, kill_at: str | None = None, kill_after_s: float | None = None):
    """Run ``zyfa capture`` in a subprocess; SIGKILL it at a write boundary or after a delay once its file (or
    the temporary one) exists. Returns (return code, stdout + stderr)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop(KILL_AT_ENV, None)
    if kill_at:
        env[KILL_AT_ENV] = kill_at
    proc = subprocess.Popen([sys.executable, "-m", "zyfa.cli", "capture", *_args(model_dir, out)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if kill_after_s is not None:
            creating = out.with_name(f".{out.name}.creating")
            deadline = time.monotonic() + 120
            while proc.poll() is None and not (out.exists() or creating.exists()) and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(kill_after_s)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        text, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, text


def _datasets(path: Path) -> dict[str, bytes]:
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, (o.dtype.str, o.shape, o[()].tobytes()))
                     if isinstance(o, h5py.Dataset) else None)
    return out


def _layer_data(path: Path, layer: int) -> dict:
    return {k: v for k, v in _datasets(path).items() if k.startswith(f"layers/{layer:03d}/")}


@pytest.fixture(scope="module")
def reference(tiny_gemma3_dir, tmp_path_factory):
    """An uninterrupted run of the same command (in this process, through the CLI's own entry point)."""
    path = tmp_path_factory.mktemp("ref") / "tiny.h5"
    assert _main(_args(tiny_gemma3_dir, path)) == 0
    return path


def _main(argv: list[str]) -> int:
    parser = ArgumentParser()
    cli.add_arguments(parser)
    return cli.main(parser.parse_args(argv))


def test_killed_capture_resumes_to_the_uninterrupted_result(tiny_gemma3_dir, reference, tmp_path, capsys):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    boundary = rng.choice([f"layer:{i}:{p}" for i in (0, 1) for p in ("group", "q:half", "k:half", "v:half",
                                                                         "data", "flag")] + ["finish:layers"])
    delay = rng.uniform(0.0, 0.03)  # after the file appears: the two layers take a few tens of ms to write
    out = tmp_path / "tiny.h5"
    want = {i: _layer_data(reference, i) for i in (0, 1)}
    kept: set[int] = set()
    kills = (("create:opened", None), ("create:renamed", None), (boundary, None), (None, delay))
    for kill_at, kill_after in kills:
        rc, text = _zyfa_capture(tiny_gemma3_dir, out, kill_at, kill_after)
        note = f"seed {seed}, kill at {kill_at or f'{kill_after:.3f} s'}: rc {rc}\n{text}"
        assert rc in (-signal.SIGKILL, 0), note
        if kill_at is not None:
            assert rc == -signal.SIGKILL, note  # the boundary was reached
        if not out.exists():  # killed before the rename: nothing under the final name, nothing lost
            assert not kept, note
            continue
        info = open_capture(out)  # whatever the moment, the file under the final name is a valid capture
        done = set(info.complete_layers)
        assert kept <= done, note  # nothing complete is ever lost ...
        for i in done:
            assert _layer_data(out, i) == want[i], note  # ... and what is complete is exactly right
        kept = done
        if kill_at == "create:renamed":
            assert done == set() and not info.complete, note
    assert _main(_args(tiny_gemma3_dir, out)) == 0  # the final rerun, uninterrupted (in this process)
    text = capsys.readouterr().out
    assert f"wrote {out}" in text, text
    assert (f"{len(kept)} already complete (resumed)" in text) == bool(kept), text
    assert open_capture(out).complete
    assert _datasets(out) == _datasets(reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.h5"]  # no temporary file left


def test_disk_full_mid_layer_is_one_clear_line_and_keeps_earlier_files(tiny_gemma3_dir, reference, tmp_path,
                                                                       monkeypatch, capsys):
    earlier = tmp_path / "earlier.h5"
    earlier.write_bytes(reference.read_bytes())
    before = earlier.read_bytes()
    out = tmp_path / "tiny.h5"
    real_setitem = h5py.Dataset.__setitem__
    writes = []

    def full_disk(self, key, value):
        writes.append(self.name)
        if self.name.startswith("/layers/001/"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_setitem(self, key, value)

    monkeypatch.setattr(h5py.Dataset, "__setitem__", full_disk)
    rc = _main(_args(tiny_gemma3_dir, out))
    err = capsys.readouterr().err
    assert rc == 4, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"zyfa capture: could not write {out}") and "No space left on device" in lines[0]
    assert "rerun the same command to resume" in lines[0]
    assert "/layers/001/q" in writes
    assert earlier.read_bytes() == before  # an earlier file in the same folder: untouched
    info = open_capture(out)  # the interrupted file: layer 0 complete and exactly right
    assert info.complete_layers == [0] and not info.complete
    assert _layer_data(out, 0) == _layer_data(reference, 0)
    monkeypatch.setattr(h5py.Dataset, "__setitem__", real_setitem)  # space freed: the same command resumes
    assert _main(_args(tiny_gemma3_dir, out)) == 0
    assert "1 already complete (resumed)" in capsys.readouterr().out
    assert _datasets(out) == _datasets(reference)


def test_unwritable_output_fails_before_the_model_loads(tiny_gemma3_dir, tmp_path, monkeypatch, capsys):
    import zyfa.capture.models

    def no_load(*a, **kw):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(zyfa.capture.models, "load_model", no_load)
    for out, why in ((Path("/sys/zyfa-capture.h5"), "the folder /sys is not writable"),  # read-only, even as root
                     (tmp_path, "it is a folder; give a file name")):
        rc = _main(_args(tiny_gemma3_dir, out))
        err = capsys.readouterr().err
        assert rc == 4 and err.strip() == f"zyfa capture: cannot write the capture to {out}: {why}" + (
            " (Permission denied)" if str(out).startswith("/sys") else ""), err
    assert not Path("/sys/zyfa-capture.h5").exists()


def _writes_into_read_only_folders(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    probe.chmod(0o555)
    try:
        (probe / "x").touch()
        return True
    except PermissionError:
        return False
    finally:
        probe.chmod(0o755)


def test_read_only_folder_keeps_the_earlier_capture(tiny_gemma3_dir, reference, tmp_path, capsys):
    if _writes_into_read_only_folders(tmp_path):
        pytest.skip("this user writes into read-only folders anyway (root; the /sys case covers it)")
    folder = tmp_path / "ro"
    folder.mkdir()
    earlier = folder / "tiny.h5"
    with h5py.File(reference, "r") as src, h5py.File(earlier, "w") as dst:  # an interrupted earlier capture
        for k, v in src.attrs.items():
            dst.attrs[k] = v
        dst.attrs["complete"] = False
        src.copy("token_ids", dst)
        dst.create_group("layers")
        src.copy("layers/000", dst["layers"])
    before = earlier.read_bytes()
    folder.chmod(0o555)
    try:
        rc = _main(_args(tiny_gemma3_dir, earlier))
    finally:
        folder.chmod(0o755)
    err = capsys.readouterr().err
    assert rc == 4 and err.count("\n") == 1 and "not writable" in err and str(folder) in err, err
    assert earlier.read_bytes() == before


def test_a_file_that_is_not_a_capture_is_kept_and_the_error_names_overwrite(tiny_gemma3_dir, reference, tmp_path,
                                                                            capsys):
    out = tmp_path / "tiny.h5"
    out.write_bytes(b"my notes, not HDF5")
    rc = _main(_args(tiny_gemma3_dir, out))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "cannot be read as an HDF5 file" in err and "--overwrite" in err
    assert out.read_bytes() == b"my notes, not HDF5"
    assert _main(_args(tiny_gemma3_dir, out, "--overwrite")) == 0
    assert _datasets(out) == _datasets(reference) and np.array_equal(
        open_capture(out).attrs["layers"], [0, 1])
