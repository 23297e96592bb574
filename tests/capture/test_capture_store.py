"""The HDF5 store without a model: bit-exact round trips, resume, corrupted files, a full disk."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from zyfa.capture.hook import select_heads
from zyfa.capture.record import LayerRecord
from zyfa.capture.store import CaptureFormatError, CaptureMismatchError, open_capture, read_capture
from zyfa.capture.writer import CaptureWriter

N_Q, N_KV, S, D = 6, 2, 40, 16


def _meta(layers=(0, 1, 2), q_heads=(0, 1, 4), dtype="float32"):
    return {
        "model": "synthetic", "model_source": "test", "model_package": "", "model_sha256": "0" * 64,
        "transformers_version": "-", "torch_version": torch.__version__, "text_source": "none",
        "text_sha256": "1" * 64, "window_offset": 0, "dtype": dtype, "layers": list(layers),
        "q_heads": list(q_heads), "num_layers": 3, "num_q_heads": N_Q, "num_kv_heads": N_KV, "head_dim": D,
    }


def _call(layer, q_heads=(0, 1, 4), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + layer)
    qh, kvh, kv_of_q = select_heads(N_Q, N_KV, q_heads)
    # values with awkward bits: random mantissas, a huge and a tiny one, a subnormal, -0
    q = torch.randn(1, len(qh), S, D, generator=g) * 3
    q[0, 0, 0, :4] = torch.tensor([3.0e38, 1.0e-40, -0.0, 448.0])
    k = torch.randn(1, len(kvh), S, D, generator=g)
    v = torch.randn(1, len(kvh), S, D, generator=g)
    return LayerRecord(layer=layer, layer_type="sliding_attention" if layer == 1 else "full_attention",
                         q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), sm_scale=D**-0.5, causal=True,
                         window=8 if layer == 1 else None, q_heads=qh, kv_heads=kvh, kv_head_of_q=kv_of_q,
                         num_q_heads=N_Q, num_kv_heads=N_KV)


IDS = np.arange(S)[None]


def _write(path, dtype=torch.float32, **kw):
    calls = [_call(i, dtype=dtype) for i in range(3)]
    with CaptureWriter(path, _meta(dtype=str(dtype).removeprefix("torch.")), IDS, **kw) as w:
        for c in calls:
            w.write_layer(c)
        w.finish()
    return calls


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_round_trip_is_bit_exact(tmp_path, dtype):
    path = tmp_path / "c.h5"
    calls = _write(path, dtype)
    recs = list(read_capture(path))
    assert [r.layer for r in recs] == [0, 1, 2]
    for c, r in zip(calls, recs, strict=True):
        for name in "qkv":
            a, b = getattr(c, name), getattr(r, name)
            assert b.dtype == dtype
            # q heads (0, 1, 4) use kv heads (0, 0, 1): not equal groups, so K/V come expanded per q head
            if name != "q":
                a = a[:, list(c.kv_head_of_q)]
            assert torch.equal(_bits(a), _bits(b)), name
        assert (r.window, r.causal, r.layer_type, r.sm_scale) == (c.window, True, c.layer_type, D**-0.5)
        assert r.q_heads == (0, 1, 4) and r.kv_heads == (0, 0, 1)


def test_head_selection_keeps_gqa_groups(tmp_path):
    path = tmp_path / "c.h5"
    calls = _write(path)
    (r,) = read_capture(path, layers=[2], heads=[0, 1])
    assert r.q.shape == (1, 2, S, D) and r.k.shape == (1, 1, S, D) and r.kv_heads == (0,)
    assert torch.equal(r.q, calls[2].q[:, :2]) and torch.equal(r.k, calls[2].k[:, :1])
    with pytest.raises(CaptureFormatError, match="no query heads"):
        list(read_capture(path, heads=[2]))
    with pytest.raises(CaptureFormatError, match=r"layers \[7\] not captured"):
        list(read_capture(path, layers=[7]))


def test_interrupted_write_resumes_to_identical_data(tmp_path):
    full, part = tmp_path / "full.h5", tmp_path / "part.h5"
    _write(full)
    calls = [_call(i) for i in range(3)]
    with pytest.raises(RuntimeError, match="simulated crash"), \
            CaptureWriter(part, _meta(), IDS, fail_after_layers=2) as w:
        for c in calls:
            w.write_layer(c)
    info = open_capture(part)
    assert not info.complete and info.complete_layers == [0, 1]
    with pytest.raises(CaptureFormatError, match="incomplete capture"):
        list(read_capture(part))
    assert [r.layer for r in read_capture(part, allow_incomplete=True)] == [0, 1]
    # a layer group left half-written by a crash must not count as complete, and is rewritten
    with h5py.File(part, "a") as f:
        g = f["layers"].create_group("002")
        g.attrs["complete"] = False
    with CaptureWriter(part, _meta(), IDS) as w:
        assert w.resumed and w.pending_layers == [2]
        w.write_layer(calls[2])
        w.finish()
    for a, b in zip(read_capture(full), read_capture(part), strict=True):
        assert all(torch.equal(getattr(a, n), getattr(b, n)) for n in "qkv")


def test_rerun_with_different_parameters_refuses(tmp_path):
    path = tmp_path / "c.h5"
    _write(path)
    with pytest.raises(CaptureMismatchError, match="q_heads"):
        CaptureWriter(path, _meta(q_heads=(0,)), IDS)
    with pytest.raises(CaptureMismatchError, match="token_ids"):
        CaptureWriter(path, _meta(), IDS + 1)
    with CaptureWriter(path, _meta(q_heads=(0,)), IDS, overwrite=True) as w:
        assert not w.resumed and w.pending_layers == [0, 1, 2]


def test_truncated_file_gives_clear_error(tmp_path):
    path = tmp_path / "c.h5"
    _write(path)
    data = path.read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CaptureFormatError, match=r"cut\.h5.*truncated"):
        list(read_capture(cut))
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5 at all" * 10)
    with pytest.raises(CaptureFormatError, match=r"junk\.h5 cannot be read as an HDF5 file"):
        open_capture(junk)


def test_foreign_and_wrong_version_files(tmp_path):
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(CaptureFormatError, match="not a ZYFA capture"):
        list(read_capture(foreign))
    path = tmp_path / "c.h5"
    _write(path)
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = 99
    with pytest.raises(CaptureFormatError, match="schema version 99; this reader reads version 1"):
        list(read_capture(path))
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = 1
        del f.attrs["model_sha256"]
    with pytest.raises(CaptureFormatError, match="root attributes missing: model_sha256"):
        open_capture(path)
    _write(path, overwrite=True)
    with h5py.File(path, "a") as f:
        del f["layers/001/k"]
        f["layers/001"].create_dataset("k", data=np.zeros((1, 2, S + 1, D), np.float32)).attrs["dtype"] = "float32"
    with pytest.raises(CaptureFormatError, match=r"layers/001/k: shape \(1, 2, 41, 16\)"):
        open_capture(path)


def test_full_disk_keeps_complete_layers(tmp_path):
    """A file-size limit makes writes fail like a full disk: our error, and the earlier layers stay."""
    path = tmp_path / "c.h5"
    root = Path(__file__).resolve().parents[2]
    script = textwrap.dedent(f"""
        import resource, signal, sys
        sys.path.insert(0, {str(root)!r})
        from tests.capture.test_capture_store import _call, _meta, IDS
        from zyfa.capture.store import CaptureWriteError
        from zyfa.capture.writer import CaptureWriter
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of being killed
        w = CaptureWriter({str(path)!r}, _meta(), IDS)
        w.write_layer(_call(0))
        import os
        resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize({str(path)!r}) + 20000,) * 2)
        try:
            w.write_layer(_call(1))
            w.write_layer(_call(2))
        except CaptureWriteError as e:
            print("ERR", e)
            sys.exit(0)
        sys.exit("no error")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "not enough space to write layer 1" in proc.stdout and str(path) in proc.stdout
    info = open_capture(path)
    assert 0 in info.complete_layers and not info.complete
    (r,) = read_capture(path, layers=[0], allow_incomplete=True)
    assert torch.equal(r.q, _call(0).q)


def test_killed_writer_leaves_a_resumable_file(tmp_path):
    """SIGKILL in the middle of a capture (no chance to close the file): complete layers survive, resume works."""
    import signal
    import time

    path, full = tmp_path / "killed.h5", tmp_path / "full.h5"
    root = Path(__file__).resolve().parents[2]
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(root)!r})
        from tests.capture.test_capture_store import _call, _meta, IDS
        from zyfa.capture.writer import CaptureWriter
        w = CaptureWriter({str(path)!r}, _meta(), IDS)
        for i in range(3):
            w.write_layer(_call(i))
            print(i, flush=True)
            time.sleep(60 if i == 1 else 0)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "0" and proc.stdout.readline().strip() == "1"
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    info = open_capture(path)
    assert not info.complete and info.complete_layers == [0, 1]
    with CaptureWriter(path, _meta(), IDS) as w:
        assert w.pending_layers == [2]
        w.write_layer(_call(2))
        w.finish()
    _write(full)
    for a, b in zip(read_capture(full), read_capture(path), strict=True):
        assert all(torch.equal(getattr(a, n), getattr(b, n)) for n in "qkv")
