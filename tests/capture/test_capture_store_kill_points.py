"""Crash safety of the capture store at every write boundary, with real SIGKILLs and real HDF5 files.

A child process writes a three-layer capture and kills itself with SIGKILL at one named boundary (the
store's ``ZYFA_CAPTURE_KILL_AT`` fault injection): before and after the file is renamed into place, before a
layer's data, in the middle of each dataset, between the data and the layer's ``complete`` flag, after the
flag, and around the root flag. Then the file left behind must show exactly the layers that were complete,
never a half-written one as complete, and a rerun must finish it with the same content as an uninterrupted
run. Also: the reader's check that a layer marked complete really is complete.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from zyfa.capture.store import CaptureFormatError, open_capture, read_capture
from zyfa.capture.writer import KILL_AT_ENV, CaptureWriter

from tests.capture.test_capture_store import IDS, _call, _meta, _write

ROOT = Path(__file__).resolve().parents[2]

# boundary -> (file under the final name?, complete layers left, root complete?)
BOUNDARIES = {
    "create:opened": (False, None, False),
    "create:written": (False, None, False),
    "create:renamed": (True, [], False),
    "layer:0:group": (True, [], False),
    "layer:1:group": (True, [0], False),
    "layer:1:q:half": (True, [0], False),
    "layer:1:k:half": (True, [0], False),
    "layer:1:v:half": (True, [0], False),
    "layer:1:data": (True, [0], False),
    "layer:1:flag": (True, [0, 1], False),
    "layer:2:data": (True, [0, 1], False),
    "finish:layers": (True, [0, 1, 2], False),
    "finish:flag": (True, [0, 1, 2], True),
}


def _kill_at_each(runs: list[tuple[str, Path]]) -> dict[Path, int]:
    """Write a capture per (boundary, path) in a forked child of one driver process (torch and h5py import
    once). Returns path -> the child's wait status: -SIGKILL if it died at the boundary, else its exit code.
    """
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.capture.test_capture_store import _call, _meta, IDS
        from zyfa.capture.writer import CaptureWriter
        for boundary, path in zip(sys.argv[1::2], sys.argv[2::2]):
            pid = os.fork()
            if pid == 0:
                os.environ[{KILL_AT_ENV!r}] = boundary
                w = CaptureWriter(path, _meta(), IDS)
                for i in range(3):
                    w.write_layer(_call(i))
                w.finish()
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            print(code, path, flush=True)
    """)
    args = [a for b, p in runs for a in (b, str(p))]
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {Path(line.split(" ", 1)[1]): int(line.split(" ", 1)[0]) for line in proc.stdout.splitlines()}


def _content(path: Path) -> dict:
    """Every dataset's bytes and every attribute, except the two that differ between runs by design."""
    out = {}

    def visit(name, obj):
        for k, v in obj.attrs.items():
            if k not in ("created", "git_commit"):
                out[f"{name}@{k}"] = np.asarray(v).tolist()
        if isinstance(obj, h5py.Dataset):
            out[name] = (str(obj.dtype), obj.shape, obj[()].tobytes())

    with h5py.File(path, "r") as f:
        for k, v in f.attrs.items():
            if k not in ("created", "git_commit"):
                out[f"/@{k}"] = np.asarray(v).tolist()
        f.visititems(visit)
    return out


# two more kills for the tests below, in the same driver process
EXTRA = {"half-written": "layer:1:q:half", "leftover": "create:written"}


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    paths = {b: tmp_path_factory.mktemp("killed") / f"{b.replace(':', '-')}.h5" for b in BOUNDARIES}
    extra = {name: tmp_path_factory.mktemp(name) / "c.h5" for name in EXTRA}
    codes = _kill_at_each([*((b, p) for b, p in paths.items()), *((EXTRA[n], p) for n, p in extra.items())])
    return paths, extra, codes


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    path = tmp_path_factory.mktemp("full") / "full.h5"
    _write(path)
    return _content(path)


@pytest.mark.parametrize("boundary", list(BOUNDARIES))
def test_kill_at_boundary_leaves_exact_state_and_resumes(boundary, killed, uninterrupted):
    paths, _, codes = killed
    path = paths[boundary]
    assert codes[path] == -signal.SIGKILL, f"the writer never reached {boundary}"
    exists, complete_layers, root_complete = BOUNDARIES[boundary]
    assert path.exists() == exists
    creating = path.with_name(f".{path.name}.creating")
    assert creating.exists() == (not exists)  # a kill before the rename leaves only the temporary file
    if exists:
        info = open_capture(path)  # always a readable capture under the final name
        assert info.complete_layers == complete_layers and info.complete == root_complete
        if complete_layers:
            got = list(read_capture(path, allow_incomplete=True))
            assert [r.layer for r in got] == complete_layers
    # the rerun resumes (or, before the rename, starts afresh) and gives the uninterrupted run's content
    with CaptureWriter(path, _meta(), IDS) as w:
        assert w.resumed == exists
        todo = w.pending_layers
        assert todo == [i for i in range(3) if i not in (complete_layers or [])]
        for i in todo:
            w.write_layer(_call(i))
        w.finish()
    assert _content(path) == uninterrupted
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary file left


def test_half_written_layer_is_never_read_as_complete(killed):
    """Straight after a kill mid-dataset the group holds a dataset with only half its values written."""
    _, extra, codes = killed
    path = extra["half-written"]
    assert codes[path] == -signal.SIGKILL
    with h5py.File(path, "r") as f:
        g = f["layers/001"]
        assert not g.attrs["complete"] and "q" in g and "k" not in g
    assert open_capture(path).complete_layers == [0]
    with pytest.raises(CaptureFormatError, match=r"layers \[1\] not captured"):
        list(read_capture(path, layers=[1], allow_incomplete=True))


def _complete_file(tmp_path) -> Path:
    path = tmp_path / "c.h5"
    _write(path)
    return path


def test_layer_marked_complete_without_a_dataset_is_refused(tmp_path):
    path = _complete_file(tmp_path)
    with h5py.File(path, "a") as f:
        del f["layers/001/v"]
    with pytest.raises(CaptureFormatError, match=r"layers/001: dataset v missing"):
        open_capture(path)


def test_layer_marked_complete_with_half_its_values_is_refused(tmp_path):
    """Right shape, right flag, but the second half of q never written (zeros): the checksum catches it."""
    path = _complete_file(tmp_path)
    with h5py.File(path, "a") as f:
        ds = f["layers/001/q"]
        ds[:, :, ds.shape[2] // 2:] = 0
    assert open_capture(path).complete_layers == [0, 1, 2]  # structure alone looks fine
    with pytest.raises(CaptureFormatError, match=r"layer 1 tensor q does not match the sha256"):
        list(read_capture(path))
    assert [r.layer for r in read_capture(path, layers=[0, 2])] == [0, 2]


def test_root_marked_complete_with_an_incomplete_layer_is_refused(tmp_path):
    path = _complete_file(tmp_path)
    with h5py.File(path, "a") as f:
        f["layers/002"].attrs["complete"] = False
    with pytest.raises(CaptureFormatError, match=r"marked complete but layers \[2\] are missing or incomplete"):
        open_capture(path)
    with h5py.File(path, "a") as f:
        del f["layers/002"]
    with pytest.raises(CaptureFormatError, match=r"marked complete but layers \[2\] are missing or incomplete"):
        open_capture(path)


def test_nan_and_inf_in_a_capture_are_located(tmp_path):
    """A model that overflowed: the writer stores what it saw, the reader names file, layer, tensor, place."""
    path = tmp_path / "c.h5"
    calls = [_call(i) for i in range(3)]
    calls[2].k[0, 1, 17, 3] = float("nan")
    calls[2].k[0, 1, 20, 0] = float("inf")
    with CaptureWriter(path, _meta(), IDS) as w:
        for c in calls:
            w.write_layer(c)
        w.finish()
    with pytest.raises(CaptureFormatError) as e:
        list(read_capture(path))
    msg = str(e.value)
    assert msg.startswith(str(path)) and "\n" not in msg
    assert "layer 2 tensor k holds 1 NaN and 1 Inf values (first at batch 0, head 1, token 17)" in msg
    assert [r.layer for r in read_capture(path, layers=[0, 1])] == [0, 1]  # other layers still load
    # a selection that leaves the bad KV head out loads: q head 0 uses KV head 0
    (r,) = read_capture(path, layers=[2], heads=[0])
    assert r.k.isfinite().all()


def test_leftover_temporary_file_is_replaced(killed):
    """A kill before the rename leaves .NAME.creating; the next run overwrites it and removes it."""
    _, extra, codes = killed
    path = extra["leftover"]
    assert codes[path] == -signal.SIGKILL
    tmp = path.with_name(".c.h5.creating")
    assert tmp.exists() and not path.exists()
    _write(path)
    assert not tmp.exists() and open_capture(path).complete
    assert sorted(p.name for p in path.parent.iterdir()) == ["c.h5"]
