"""The capture store's edges a user meets when things go wrong, with real files.

``check_writable``: where its probe file goes and what it is called (a hidden ``.NAME.XXXXXXXX.probe`` next to
the capture, removed again, never in the system temporary folder), and the one-line messages for a folder and a
file that cannot be written. Tests run as root here, and root ignores permission bits, so the unwritable
folder and file come from procfs: files cannot be created in ``/proc/sys/kernel`` and its read-only sysctl
entries (``ostype``) refuse to be opened for update even by root.

The writer: the message when closing the file fails (a real file-size limit, RLIMIT_FSIZE, hit by the final
flush), how the context manager treats that failure with and without an exception in the block, what a kill
at the ``layer:N:q:half`` fault-injection point leaves (the first half of the tokens written), the exact set of
group attributes, integer types of the head attributes, and a layer whose stored data cannot be decoded.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from zyfa.capture.record import LayerRecord
from zyfa.capture.store import CaptureFormatError, CaptureWriteError, open_capture, read_capture, read_token_ids
from zyfa.capture.writer import KILL_AT_ENV, CaptureWriter, check_writable

ROOT = Path(__file__).resolve().parents[2]
S, D = 24, 8
IDS = np.arange(7, 7 + S)[None]
# a folder in which nobody, root included, can create a file, and a file nobody can open for update
NO_FILES_FOLDER = Path("/proc/sys/kernel")
READ_ONLY_FILE = Path("/proc/sys/kernel/ostype")


def _meta(layers=(0,), q_heads=(0, 1, 2, 3)):
    return {
        "model": "synthetic", "model_source": "test", "model_package": "", "model_sha256": "a" * 64,
        "transformers_version": "-", "torch_version": "2.x", "text_source": "none", "text_sha256": "b" * 64,
        "window_offset": 0, "dtype": "float32", "layers": list(layers), "q_heads": list(q_heads),
        "num_layers": 2, "num_q_heads": 4, "num_kv_heads": 2, "head_dim": D,
    }


def _record(layer=0, q_heads=(0, 1, 2, 3), kv_heads=(0, 1), kv_of_q=(0, 0, 1, 1)):
    g = torch.Generator().manual_seed(11 + layer)
    return LayerRecord(
        layer=layer, layer_type="full_attention", q=torch.randn(1, 4, S, D, generator=g),
        k=torch.randn(1, 2, S, D, generator=g), v=torch.randn(1, 2, S, D, generator=g), sm_scale=0.25,
        causal=True, window=None, q_heads=tuple(q_heads), kv_heads=tuple(kv_heads), kv_head_of_q=tuple(kv_of_q),
        num_q_heads=4, num_kv_heads=2)


def _write_one_layer(path: Path) -> None:
    with CaptureWriter(path, _meta(), IDS) as w:
        w.write_layer(_record())
        w.finish()


# ------------------------------------------------------------------------------------------- check_writable

def test_probe_is_a_hidden_file_named_after_the_capture_and_removed(tmp_path, monkeypatch):
    """The probe is ``.NAME.<8 random characters>.probe`` in the output folder: hidden, recognisable as this
    capture's if a kill ever leaves it behind, and distinct from the writer's own ``.NAME.creating``."""
    seen = []
    real_unlink = os.unlink

    def unlink_and_record(p, *a, **kw):
        seen.append((Path(p), Path(p).exists()))
        return real_unlink(p, *a, **kw)

    monkeypatch.setattr(os, "unlink", unlink_and_record)
    out = tmp_path / "run" / "capture.h5"
    assert check_writable(out) == out
    monkeypatch.undo()
    assert len(seen) == 1
    probe, existed = seen[0]
    assert existed and probe.parent == out.parent
    # tempfile's random part: 8 characters of lower-case letters, digits and "_"
    assert re.fullmatch(r"\.capture\.h5\.[a-z0-9_]{8}\.probe", probe.name), probe.name
    assert list(out.parent.iterdir()) == []  # nothing left behind


def test_probe_goes_to_the_output_folder_even_when_the_temp_folder_is_unusable(tmp_path, monkeypatch):
    """The check is about the output folder: a broken TMPDIR (here a path below a regular file) changes nothing."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setattr(tempfile, "tempdir", str(blocker / "tmp"))
    out = tmp_path / "out" / "c.h5"
    assert check_writable(out) == out
    assert list(out.parent.iterdir()) == []


@pytest.mark.skipif(not NO_FILES_FOLDER.is_dir(), reason="needs Linux procfs (/proc/sys/kernel)")
def test_a_folder_where_no_file_can_be_created_is_refused(tmp_path, monkeypatch):
    """Refused with the OS's reason in words, even though the system temporary folder is writable."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = NO_FILES_FOLDER / "zyfa-capture.h5"
    with pytest.raises(CaptureWriteError) as e:
        check_writable(out)
    # procfs answers ENOENT to root (EACCES to other users): the reason in words either way
    assert re.fullmatch(re.escape(f"cannot write the capture to {out}: the folder {NO_FILES_FOLDER} is not writable ")
                        + r"\((No such file or directory|Permission denied)\)", str(e.value)), str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_folder_message_gives_the_reason_in_words(tmp_path):
    """The parenthesis holds the OS's reason (strerror), not the exception's repr with errno and path."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker / "c.h5"
    with pytest.raises(CaptureWriteError) as e:
        check_writable(out)
    assert str(e.value) == f"cannot write the capture to {out}: the folder {blocker} is not writable (File exists)"


@pytest.mark.skipif(not READ_ONLY_FILE.is_file(), reason="needs Linux procfs (/proc/sys/kernel/ostype)")
def test_an_existing_file_that_cannot_be_opened_for_update_is_refused(tmp_path):
    """The output name is a link to a read-only sysctl file: readable, but not writable even by root."""
    out = tmp_path / "c.h5"
    out.symlink_to(READ_ONLY_FILE)
    with open(out, "rb") as f:  # readable: only opening for update fails
        before = f.read()
    with pytest.raises(CaptureWriteError) as e:
        check_writable(out)
    assert str(e.value) == f"cannot write the capture to {out}: the file is not writable (Permission denied)"
    assert out.is_symlink() and READ_ONLY_FILE.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5"]  # the probe was removed


# ----------------------------------------------------------------------------------------- what is written

def test_group_attributes_are_exactly_the_documented_ones(tmp_path):
    """datasets/README.md lists the group attributes; the writer adds none of its own."""
    path = tmp_path / "c.h5"
    _write_one_layer(path)
    with h5py.File(path, "r") as f:
        g = f["layers/000"]
        assert set(g.attrs) == {"complete", "layer", "layer_type", "sm_scale", "causal", "window", "q_heads",
                                "kv_heads", "kv_head_of_q", "num_q_heads", "num_kv_heads"}
        assert bool(g.attrs["complete"]) is True
        assert {n: set(g[n].attrs) for n in "qkv"} == {n: {"dtype", "amax", "sha256"} for n in "qkv"}


def test_head_attributes_are_int64_whatever_integer_type_the_record_holds(tmp_path):
    """Head indices computed with numpy (int32 scalars here) are stored as int64 like the others."""
    path = tmp_path / "c.h5"
    i32 = np.arange(4, dtype=np.int32)
    rec = _record(q_heads=tuple(i32), kv_heads=tuple(i32[:2]), kv_of_q=tuple(i32 // 2))
    with CaptureWriter(path, _meta(), IDS) as w:
        w.write_layer(rec)
        w.finish()
    with h5py.File(path, "r") as f:
        a = f["layers/000"].attrs
        for name, want in (("q_heads", [0, 1, 2, 3]), ("kv_heads", [0, 1]), ("kv_head_of_q", [0, 0, 1, 1])):
            assert a[name].dtype == np.int64 and a[name].tolist() == want, name
    assert next(read_capture(path)).kv_head_of_q == (0, 0, 1, 1)


def test_a_capture_of_no_layers_keeps_integer_root_arrays(tmp_path):
    """Empty ``layers`` and ``q_heads`` are still the documented int arrays (numpy alone would make them float)."""
    path = tmp_path / "c.h5"
    with CaptureWriter(path, _meta(layers=(), q_heads=()), IDS) as w:
        w.finish()
    with h5py.File(path, "r") as f:
        assert f.attrs["layers"].dtype == np.int64 and f.attrs["layers"].shape == (0,)
        assert f.attrs["q_heads"].dtype == np.int64 and f.attrs["q_heads"].shape == (0,)
    info = open_capture(path)
    assert info.complete and info.complete_layers == []
    assert read_token_ids(path).tolist() == IDS.tolist()
    # the same request resumes the file instead of calling it a different capture
    with CaptureWriter(path, _meta(layers=(), q_heads=()), IDS) as w:
        assert w.resumed and w.pending_layers == []


def test_kill_at_the_half_point_leaves_the_first_half_of_the_tokens(tmp_path):
    """``layer:N:q:half`` (the crash tests' mid-dataset point) comes after tokens [0, S//2) of q are written
    and flushed, before the rest: a reader sees those values and the fill value 0 after them."""
    path = tmp_path / "c.h5"
    rec = _record()
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.capture.test_store_writable_check_and_writer_exit import _meta, _record, IDS
        from zyfa.capture.writer import CaptureWriter
        w = CaptureWriter({str(path)!r}, _meta(), IDS)
        w.write_layer(_record())
        sys.exit(3)
    """)
    env = dict(os.environ, **{KILL_AT_ENV: "layer:0:q:half"})
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -9, proc.stderr
    want = rec.q.numpy().copy()
    want[:, :, S // 2:] = 0.0
    with h5py.File(path, "r") as f:
        g = f["layers/000"]
        assert bool(g.attrs["complete"]) is False and "k" not in g
        assert np.array_equal(g["q"][()], want)
    assert open_capture(path).complete_layers == []


# ------------------------------------------------------------------------------------------- what is read

def test_layer_data_that_cannot_be_decoded_names_file_and_layer(tmp_path):
    """A compressed chunk overwritten with garbage (structure intact): one line naming the file and layer."""
    path = tmp_path / "c.h5"
    _write_one_layer(path)
    with h5py.File(path, "r") as f:
        chunk = f["layers/000/k"].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(chunk.byte_offset)
        fh.write(b"\xff" * chunk.size)
    assert open_capture(path).complete_layers == [0]  # metadata still fine
    with pytest.raises(CaptureFormatError) as e:
        list(read_capture(path))
    msg = str(e.value)
    assert msg.startswith(f"{path}: layer 0 data unreadable (truncated or corrupted?): "), msg
    assert "\n" not in msg


# --------------------------------------------------------------------------------- closing fails (size limit)

def _writer_whose_close_must_write(path: Path) -> CaptureWriter:
    """A writer whose open file holds unflushed data (written through its h5py handle, as any later HDF5 write
    would), so the final flush in ``close`` has to grow the file; then a file-size limit at the current size."""
    w = CaptureWriter(path, _meta(), IDS)
    w._f.create_dataset("pad", data=np.arange(1000.0))
    w._f.attrs["pad"] = np.arange(5000.0)
    return w


@pytest.fixture
def size_limited():
    """Set RLIMIT_FSIZE (Python ignores SIGXFSZ, so a write past it fails with EFBIG); restored afterwards."""
    old = resource.getrlimit(resource.RLIMIT_FSIZE)

    def limit(n: int):
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, old[1]))

    yield limit
    resource.setrlimit(resource.RLIMIT_FSIZE, old)


def test_close_failure_names_the_file(tmp_path, size_limited):
    path = tmp_path / "c.h5"
    w = _writer_whose_close_must_write(path)
    size_limited(path.stat().st_size)
    with pytest.raises(CaptureWriteError) as e:
        w.close()
    msg = str(e.value)
    assert msg.startswith(f"could not close {path} (") and msg.endswith("); is the disk full?"), msg
    assert "File too large" in msg or "file too large" in msg
    w.close()  # given up: a second close does nothing


def test_context_manager_reports_a_close_failure_after_a_clean_block(tmp_path, size_limited):
    path = tmp_path / "c.h5"
    with (pytest.raises(CaptureWriteError, match=f"could not close {re.escape(str(path))}"),
          _writer_whose_close_must_write(path)):
        size_limited(path.stat().st_size)


def test_context_manager_keeps_the_blocks_own_error_when_close_also_fails(tmp_path, size_limited):
    """The block's exception is the one the user sees; the close failure after it is not raised over it."""
    path = tmp_path / "c.h5"
    with pytest.raises(KeyError, match="the block's own error") as e, _writer_whose_close_must_write(path):
        size_limited(path.stat().st_size)
        raise KeyError("the block's own error")
    assert e.value.__context__ is None


# ------------------------------------------------------------------------------------------------ token ids

@pytest.mark.parametrize("ids", [IDS.astype(np.float64), torch.arange(7, 7 + S, dtype=torch.float32)[None],
                                 IDS.astype(np.uint16), IDS.astype(np.int32)])
def test_whole_number_token_ids_of_any_numeric_dtype_are_stored_as_those_integers(tmp_path, ids):
    """Token ids as a tokenizer or a tensor hands them over (float arrays of whole numbers included) are kept."""
    path = tmp_path / "cap.h5"
    with CaptureWriter(path, _meta(), ids) as w:
        w.write_layer(_record())
        w.finish()
    assert np.array_equal(np.asarray(read_token_ids(path)), IDS)


@pytest.mark.parametrize("ids, message", [
    (np.array([[1.5, 7.0, 9.0]]), "token_ids must be integers, got float64 values such as np.float64(1.5)"),
    (np.array([["7", "8"]]), "token_ids must be integers, got <U1 values such as np.str_('7')"),
    (np.array([[7, -1]]), "token_ids must lie in [0, 2^31 - 1] (the file stores them as int32), got -1 to 7"),
    (np.array([[0, 2**31]]), "token_ids must lie in [0, 2^31 - 1] (the file stores them as int32), got 0 to "
                             "2147483648"),
    (np.array([[0, 2**53 + 1]]), "token_ids must lie in [0, 2^31 - 1] (the file stores them as int32), got 0 to "
                                 "9007199254740993"),  # integers past float64's 53 bits, named exactly
])
def test_token_ids_that_are_not_int32_integers_are_refused_in_one_line(tmp_path, ids, message):
    with pytest.raises(ValueError) as e:
        CaptureWriter(tmp_path / "cap.h5", _meta(), ids)
    assert str(e.value) == message
    assert not (tmp_path / "cap.h5").exists()
