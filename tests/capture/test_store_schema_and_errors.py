"""The capture store against its documented schema (datasets/README.md), with real HDF5 files.

What the writer puts in the file (root, group and dataset attributes, chunks and filters, the complete flags and
their order), what the reader gives back (every ``LayerRecord`` field, head selections, token ids), and the one
line each refusal prints (foreign or inconsistent files, a different capture at the same path, a layer that
was not requested, not enough space). Expected values are computed here from the inputs (numpy, hashlib), not by
the store.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import resource
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from zyfa.capture.record import LayerRecord
from zyfa.capture.store import (
    SCHEMA,
    SCHEMA_VERSION,
    CaptureFormatError,
    CaptureMismatchError,
    CaptureWriteError,
    open_capture,
    read_capture,
    read_token_ids,
)
from zyfa.capture.writer import CaptureWriter, check_writable

S, D = 24, 8
IDS = np.arange(100, 100 + S)[None]


def _meta(layers=(0, 3), q_heads=(0, 1, 2, 3), dtype="float32", **extra):
    m = {
        "model": "synthetic", "model_source": "test", "model_package": "", "model_sha256": "a" * 64,
        "transformers_version": "-", "torch_version": "2.x", "text_source": "none", "text_sha256": "b" * 64,
        "window_offset": 0, "dtype": dtype, "layers": list(layers), "q_heads": list(q_heads), "num_layers": 4,
        "num_q_heads": 4, "num_kv_heads": 2, "head_dim": D,
    }
    m.update(extra)
    return m


def _record(layer, q_heads=(0, 1, 2, 3), kv_heads=(0, 1), kv_of_q=(0, 0, 1, 1), dtype=torch.float32, seed=0,
            window=None, sm_scale=0.3, causal=True, s=S):
    g = torch.Generator().manual_seed(100 * seed + layer)
    q = (torch.randn(1, len(q_heads), s, D, generator=g) * 2).to(dtype)
    k = torch.randn(1, len(kv_heads), s, D, generator=g).to(dtype)
    v = (torch.randn(1, len(kv_heads), s, D, generator=g) * 5).to(dtype)
    return LayerRecord(layer=layer, layer_type="sliding_attention" if window else "full_attention", q=q, k=k, v=v,
                       sm_scale=sm_scale, causal=causal, window=window, q_heads=tuple(q_heads),
                       kv_heads=tuple(kv_heads), kv_head_of_q=tuple(kv_of_q), num_q_heads=4, num_kv_heads=2)


def _write(path, recs=None, meta=None, ids=IDS, finish=True, **kw):
    recs = recs if recs is not None else [_record(0), _record(3, window=5, sm_scale=0.125, causal=False)]
    with CaptureWriter(path, meta or _meta(), ids, **kw) as w:
        for r in recs:
            w.write_layer(r)
        if finish:
            w.finish()
    return recs


# ---------------------------------------------------------------------------------------------- what is written

def test_root_attributes_as_documented(tmp_path):
    path = tmp_path / "c.h5"
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    _write(path, meta=_meta(extra_json={"w.whl": "abc"}, skipped=None, command="zyfa capture --x"))
    after = dt.datetime.now(dt.timezone.utc)
    with h5py.File(path, "r") as f:
        a = f.attrs
        assert a["schema"] == "zyfa-capture" == SCHEMA and int(a["schema_version"]) == 1 == SCHEMA_VERSION
        assert bool(a["complete"]) is True
        created = dt.datetime.fromisoformat(a["created"])
        assert created.tzinfo is not None and created.utcoffset() == dt.timedelta(0)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", a["created"])  # seconds, UTC
        assert before <= created <= after
        assert isinstance(a["git_commit"], str) and a["git_commit"]
        assert json.loads(a["extra_json"]) == {"w.whl": "abc"}  # dicts are stored as JSON text
        assert "skipped" not in a  # None values are left out
        assert a["command"] == "zyfa capture --x"
        assert a["model"] == "synthetic" and a["model_sha256"] == "a" * 64
        assert (int(a["batch"]), int(a["seq_len"])) == (1, S)  # from the token ids
        assert a["layers"].tolist() == [0, 3] and a["q_heads"].tolist() == [0, 1, 2, 3]
        assert a["layers"].dtype == np.int64
        ids = f["token_ids"]
        assert ids.dtype == np.int32 and ids.shape == (1, S) and ids[()].tolist() == IDS.tolist()
        assert ids.compression == "gzip"
        assert sorted(f["layers"]) == ["000", "003"]


def test_layers_and_heads_are_stored_sorted_and_one_dimensional_ids_get_a_batch(tmp_path):
    path = tmp_path / "c.h5"
    with CaptureWriter(path, _meta(layers=(3, 0), q_heads=(3, 1, 0, 2)), IDS[0]) as w:
        assert w.layers == [0, 3] and w.pending_layers == [0, 3]
        w.write_layer(_record(3))
        assert w.complete_layers == [3] and w.pending_layers == [0]
        w.write_layer(_record(0))
        w.finish()
    info = open_capture(path)
    assert info.attrs["layers"] == [0, 3] and info.attrs["q_heads"] == [0, 1, 2, 3]
    assert info.attrs["batch"] == 1 and info.attrs["seq_len"] == S
    ids = read_token_ids(path)
    assert ids.dtype == torch.int64 and ids.tolist() == IDS.tolist()  # int64, as an embedding lookup takes them


def test_group_and_dataset_attributes_as_documented(tmp_path):
    path = tmp_path / "c.h5"
    recs = _write(path)
    with h5py.File(path, "r") as f:
        for r in recs:
            g = f[f"layers/{r.layer:03d}"]
            a = g.attrs
            assert bool(a["complete"]) is True and int(a["layer"]) == r.layer
            assert a["layer_type"] == r.layer_type
            assert float(a["sm_scale"]) == r.sm_scale and bool(a["causal"]) == r.causal
            assert int(a["window"]) == (-1 if r.window is None else r.window)
            assert a["q_heads"].tolist() == list(r.q_heads) and a["kv_heads"].tolist() == list(r.kv_heads)
            assert a["kv_head_of_q"].tolist() == list(r.kv_head_of_q)
            assert (int(a["num_q_heads"]), int(a["num_kv_heads"])) == (4, 2)
            for name in "qkv":
                t = getattr(r, name)
                ds = g[name]
                want = t.numpy()
                assert ds.dtype == np.float32 and ds.shape == tuple(t.shape)
                assert np.array_equal(ds[()], want)
                assert ds.attrs["dtype"] == "float32"
                assert float(ds.attrs["amax"]) == float(np.abs(want.astype(np.float64)).max())
                assert ds.attrs["sha256"] == hashlib.sha256(np.ascontiguousarray(want).tobytes()).hexdigest()
                # one head by all the rows (far below 1 MiB here); shuffle + gzip
                assert ds.chunks == (1, 1, S, D)
                assert ds.compression == "gzip" and ds.shuffle


def test_chunks_are_about_one_mebibyte_of_rows(tmp_path):
    """d = 8 fp32: 32 bytes a row, so a 1 MiB chunk holds 32768 rows; a longer sequence is cut there."""
    s = 40000
    path = tmp_path / "c.h5"
    r = _record(0, q_heads=(0,), kv_heads=(0,), kv_of_q=(0,), s=s)
    with CaptureWriter(path, _meta(layers=(0,), q_heads=(0,)), np.zeros((1, s), np.int64)) as w:
        w.write_layer(r)
        w.finish()
    with h5py.File(path, "r") as f:
        assert f["layers/000/q"].chunks == (1, 1, (1 << 20) // (D * 4), D)
    (back,) = read_capture(path)
    assert torch.equal(back.q, r.q)


def test_uncompressed_option(tmp_path):
    path = tmp_path / "c.h5"
    _write(path, compression=None)
    with h5py.File(path, "r") as f:
        assert f["layers/000/q"].compression is None and f["token_ids"].compression is None


def test_bfloat16_is_stored_as_its_bits_and_float16_as_itself(tmp_path):
    for dtype, stored, name in ((torch.bfloat16, np.uint16, "bfloat16"), (torch.float16, np.float16, "float16")):
        path = tmp_path / f"{name}.h5"
        recs = _write(path, recs=[_record(0, dtype=dtype), _record(3, dtype=dtype)], meta=_meta(dtype=name))
        with h5py.File(path, "r") as f:
            ds = f["layers/000/v"]
            assert ds.dtype == stored and ds.attrs["dtype"] == name
            v = recs[0].v
            raw = v.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16 else v.numpy()
            assert np.array_equal(ds[()], raw)
            assert float(ds.attrs["amax"]) == v.abs().max().item()  # the value's amax, not the bits'
        for r, back in zip(recs, read_capture(path), strict=True):
            assert back.v.dtype == dtype and torch.equal(back.v.view(torch.int16), r.v.view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.float8_e4m3fn])
def test_dtypes_that_cannot_be_stored_exactly_are_refused(tmp_path, dtype):
    r = _record(0)
    r.q = r.q.to(dtype)
    with CaptureWriter(tmp_path / "c.h5", _meta(), IDS) as w, \
            pytest.raises(TypeError, match=re.escape(f"cannot store {dtype} exactly; capture in fp32 or bf16")):
        w.write_layer(r)


# ---------------------------------------------------------------------------------------------- what is read

def test_record_fields_come_back(tmp_path):
    path = tmp_path / "c.h5"
    recs = _write(path)
    back = list(read_capture(path))
    assert [b.layer for b in back] == [0, 3]
    for r, b in zip(recs, back, strict=True):
        assert (b.layer_type, b.sm_scale, b.causal, b.window) == (r.layer_type, r.sm_scale, r.causal, r.window)
        assert type(b.sm_scale) is float and type(b.causal) is bool
        assert b.window is None or type(b.window) is int
        assert (b.q_heads, b.kv_heads, b.kv_head_of_q) == ((0, 1, 2, 3), (0, 1), (0, 0, 1, 1))
        assert (b.num_q_heads, b.num_kv_heads) == (4, 2) and type(b.num_q_heads) is int
        assert b.model == "synthetic" and b.path == str(path) and b.meta["text_sha256"] == "b" * 64
        assert all(torch.equal(getattr(b, n), getattr(r, n)) for n in "qkv")
    assert back[1].window == 5 and back[0].window is None
    # a window of 0 is no window size at all (only the stored -1 means none): refused, naming file and layer
    path0 = tmp_path / "w0.h5"
    _write(path0, recs=[_record(0, window=0), _record(3)])
    with pytest.raises(CaptureFormatError, match=r"w0\.h5:/layers/000: attribute 'window' must be an integer >= 1"):
        next(iter(read_capture(path0)))


def test_layers_argument(tmp_path):
    path = tmp_path / "c.h5"
    recs = _write(path)
    assert [b.layer for b in read_capture(path, layers=[3])] == [3]
    assert [b.layer for b in read_capture(path, layers=[3, 0, 3])] == [0, 3]  # sorted, once each
    (b,) = read_capture(path, layers=(np.int64(3),))
    assert torch.equal(b.k, recs[1].k)
    with pytest.raises(CaptureFormatError) as e:
        list(read_capture(path, layers=[1, 3, 2]))
    assert str(e.value) == f"{path}: layers [1, 2] not captured; complete layers: [0, 3]"


def test_head_selection_equal_groups(tmp_path):
    """q heads (0, 1, 2, 3) use kv heads (0, 0, 1, 1)."""
    path = tmp_path / "c.h5"
    (r0, _) = _write(path)
    (b,) = read_capture(path, layers=[0], heads=[3, 2, 2])  # sorted, once each
    assert b.q_heads == (2, 3) and b.kv_heads == (1,) and b.kv_head_of_q == (0, 0)
    assert torch.equal(b.q, r0.q[:, 2:4]) and torch.equal(b.k, r0.k[:, 1:2]) and torch.equal(b.v, r0.v[:, 1:2])
    (b,) = read_capture(path, layers=[0], heads=[0, 2])  # one query head per kv head: groups of one
    assert b.q_heads == (0, 2) and b.kv_heads == (0, 1) and b.kv_head_of_q == (0, 1)
    assert torch.equal(b.q, r0.q[:, [0, 2]]) and torch.equal(b.k, r0.k) and torch.equal(b.v, r0.v)
    (b,) = read_capture(path, layers=[0], heads=[1])
    assert b.q_heads == (1,) and b.kv_heads == (0,) and torch.equal(b.k, r0.k[:, :1])


def test_head_selection_unequal_groups_expands_kv(tmp_path):
    path = tmp_path / "c.h5"
    (r0, _) = _write(path)
    (b,) = read_capture(path, layers=[0], heads=[0, 1, 2])  # kv (0, 0, 1): not equal groups
    assert b.q_heads == (0, 1, 2) and b.kv_heads == (0, 0, 1) and b.kv_head_of_q == (0, 1, 2)
    assert torch.equal(b.k, r0.k[:, [0, 0, 1]]) and torch.equal(b.v, r0.v[:, [0, 0, 1]])
    with pytest.raises(CaptureFormatError) as e:
        list(read_capture(path, layers=[3], heads=[1, 5, 7]))
    assert str(e.value) == f"{path}: layer 3 has no query heads [5, 7]; captured: (0, 1, 2, 3)"


def test_stored_unequal_groups_are_expanded_on_read(tmp_path):
    """A capture of q heads (0, 1, 3): kv rows (0, 1), kv_head_of_q (0, 0, 1)."""
    path = tmp_path / "c.h5"
    recs = [_record(i, q_heads=(0, 1, 3), kv_of_q=(0, 0, 1)) for i in (0, 3)]
    _write(path, recs=recs, meta=_meta(q_heads=(0, 1, 3)))
    b = next(iter(read_capture(path)))
    assert b.kv_heads == (0, 0, 1) and b.kv_head_of_q == (0, 1, 2)
    assert torch.equal(b.k, recs[0].k[:, [0, 0, 1]])
    (b,) = read_capture(path, layers=[0], heads=[0, 3])  # (0, 3) -> kv (0, 1): equal groups of one
    assert b.kv_heads == (0, 1) and b.kv_head_of_q == (0, 1) and torch.equal(b.k, recs[0].k)


def test_nan_message_names_the_model_head_and_counts(tmp_path):
    path = tmp_path / "c.h5"
    r0, r3 = _record(0), _record(3)
    r3.q[0, 2, 7, 1] = float("-inf")
    r3.q[0, 3, 2, 0] = float("nan")
    r3.q[0, 3, 9, 0] = float("nan")
    _write(path, recs=[r0, r3])
    with pytest.raises(CaptureFormatError) as e:
        list(read_capture(path, layers=[3]))
    assert str(e.value) == (
        f"{path}: layer 3 tensor q holds 2 NaN and 1 Inf values (first at batch 0, head 2, token 7); the model "
        "overflowed in this dtype or the file was altered: recapture (e.g. with --dtype fp32)")
    with pytest.raises(CaptureFormatError, match=re.escape("holds 2 NaN and 0 Inf values (first at batch 0, head 3, "
                                                           "token 2)")):
        list(read_capture(path, layers=[3], heads=[3]))  # the model's head index, not the row


# ---------------------------------------------------------------------------------------------- complete flags

def test_complete_flags_in_order(tmp_path):
    """Root complete only after finish(); each group complete after its data; an interrupted layer not."""
    path = tmp_path / "c.h5"
    w = CaptureWriter(path, _meta(), IDS)
    assert w.complete_layers == [] and not w.resumed
    w.write_layer(_record(0))
    w.close()
    with h5py.File(path, "r") as f:
        assert bool(f.attrs["complete"]) is False and bool(f["layers/000"].attrs["complete"]) is True
    info = open_capture(path)
    assert not info.complete and info.complete_layers == [0] and info.layers[0]["complete"]
    with CaptureWriter(path, _meta(), IDS) as w:
        assert w.resumed and w.complete_layers == [0] and w.pending_layers == [3]
        with pytest.raises(RuntimeError) as e:
            w.finish()
        assert str(e.value) == f"{path}: layers [3] were not written"
        w.write_layer(_record(3))
        w.finish()
        w.finish()  # a second finish is a no-op
    assert open_capture(path).complete


def test_rewriting_a_layer_replaces_it(tmp_path):
    path = tmp_path / "c.h5"
    with CaptureWriter(path, _meta(), IDS) as w:
        w.write_layer(_record(0, seed=1))
        w.write_layer(_record(0, seed=2))  # same layer again: the group is replaced
        w.write_layer(_record(3))
        w.finish()
    (b,) = read_capture(path, layers=[0])
    assert torch.equal(b.q, _record(0, seed=2).q)


def test_resume_drops_incomplete_layers_and_clears_the_root_flag(tmp_path):
    path = tmp_path / "c.h5"
    recs = _write(path)
    with h5py.File(path, "a") as f:  # layer 3 left as a crash would (the flag never set), and the root too
        f["layers/003"].attrs["complete"] = False
        f.attrs["complete"] = False
        f["layers/003/q"][0, 0, 0, 0] = 123.0
    w = CaptureWriter(path, _meta(), IDS)
    assert w.resumed and w.pending_layers == [3] and w.complete_layers == [0]
    w.close()
    with h5py.File(path, "r") as f:
        assert "003" not in f["layers"] and "000" in f["layers"] and not f.attrs["complete"]
    # a complete file reopened for resuming is not complete until finish() again
    path2 = tmp_path / "d.h5"
    _write(path2)
    with CaptureWriter(path2, _meta(), IDS) as w:
        assert w.resumed and w.pending_layers == []
    assert not open_capture(path2).complete
    with CaptureWriter(path2, _meta(), IDS) as w:
        w.finish()
    assert open_capture(path2).complete
    assert all(torch.equal(a.q, b.q) for a, b in zip(recs, read_capture(path2), strict=True))


def test_context_manager_closes_the_file_on_error(tmp_path):
    path = tmp_path / "c.h5"
    with pytest.raises(KeyError), CaptureWriter(path, _meta(), IDS) as w:
        w.write_layer(_record(0))
        raise KeyError("boom")
    # closed: the next writer resumes it
    with CaptureWriter(path, _meta(), IDS) as w:
        assert w.resumed and w.pending_layers == [3]


def test_fail_after_layers_test_hook(tmp_path):
    path = tmp_path / "c.h5"
    with CaptureWriter(path, _meta(layers=(0, 1, 3)), IDS, fail_after_layers=2) as w:
        w.write_layer(_record(0))
        with pytest.raises(RuntimeError, match=re.escape("simulated crash after 2 layer(s) (test hook)")):
            w.write_layer(_record(1))
    assert open_capture(path).complete_layers == [0, 1]


# ---------------------------------------------------------------------------------------------- refusals

def test_a_layer_not_requested_is_refused(tmp_path):
    path = tmp_path / "c.h5"
    with CaptureWriter(path, _meta(), IDS) as w:
        with pytest.raises(ValueError) as e:
            w.write_layer(_record(2))
        assert str(e.value) == f"layer 2 was not requested for {path} ([0, 3])"
        assert w.complete_layers == []


@pytest.mark.parametrize("key,value", [
    ("model", "other"), ("model_sha256", "c" * 64), ("text_source", "lee"), ("text_sha256", "d" * 64),
    ("window_offset", 5), ("dtype", "bfloat16"), ("layers", [0]), ("q_heads", [0, 1]),
])
def test_each_identity_attribute_is_compared(tmp_path, key, value):
    path = tmp_path / "c.h5"
    _write(path)
    with pytest.raises(CaptureMismatchError) as e:
        CaptureWriter(path, _meta(**{key: value}), IDS)
    assert str(e.value) == (f"{path} exists and holds a different capture ({key} differ); pass --overwrite to "
                            "replace it, or choose another output file")


def test_mismatch_lists_every_differing_attribute_and_ignores_others(tmp_path):
    path = tmp_path / "c.h5"
    _write(path)
    with pytest.raises(CaptureMismatchError, match=re.escape("(model, seq_len, dtype differ)")):
        CaptureWriter(path, _meta(model="m2", dtype="float16"), IDS[:, :10])
    # attributes outside the identity (provenance) may differ: the rerun resumes
    with CaptureWriter(path, _meta(torch_version="9.9", model_source="elsewhere", head_dim=99), IDS) as w:
        assert w.resumed
    # the same identity given as tuples, numpy arrays or numpy scalars
    meta = _meta(layers=(3, 0), q_heads=np.array([0, 1, 2, 3]), window_offset=np.int64(0))
    with CaptureWriter(path, meta, IDS) as w:
        assert w.resumed


def test_token_ids_are_compared_only_when_the_rest_agrees(tmp_path):
    path = tmp_path / "c.h5"
    _write(path)
    with pytest.raises(CaptureMismatchError, match=re.escape("(token_ids differ)")):
        CaptureWriter(path, _meta(), IDS + 1)
    with pytest.raises(CaptureMismatchError, match=re.escape("(model differ)")):
        CaptureWriter(path, _meta(model="x"), IDS + 1)


def test_an_existing_file_that_is_not_a_capture_is_not_resumed(tmp_path):
    path = tmp_path / "c.h5"
    path.write_bytes(b"plain text, not HDF5\n" * 20)
    with pytest.raises(CaptureMismatchError) as e:
        CaptureWriter(path, _meta(), IDS)
    msg = str(e.value)
    assert msg.startswith(f"{path} cannot be read as an HDF5 file") and "\n" not in msg
    assert msg.endswith(". It is not a capture this command can resume: pass --overwrite to replace it, or choose "
                        "another output file")
    assert path.read_bytes().startswith(b"plain text")  # untouched
    _write(path, overwrite=True)
    assert open_capture(path).complete


def test_output_path_that_is_a_folder(tmp_path):
    with pytest.raises(CaptureWriteError) as e:
        check_writable(tmp_path)
    assert str(e.value) == f"cannot write the capture to {tmp_path}: it is a folder; give a file name"
    with pytest.raises(CaptureWriteError, match="it is a folder"):
        CaptureWriter(tmp_path, _meta(), IDS)


def test_check_writable_makes_folders_and_leaves_no_probe(tmp_path):
    path = tmp_path / "a" / "b" / "c.h5"
    assert check_writable(str(path)) == path
    assert path.parent.is_dir() and list(path.parent.iterdir()) == []
    path.write_bytes(b"x")
    assert check_writable(path) == path and path.read_bytes() == b"x"  # an existing file is not changed


def test_check_writable_parent_is_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CaptureWriteError) as e:
        check_writable(blocker / "c.h5")
    msg = str(e.value)
    assert msg.startswith(f"cannot write the capture to {blocker / 'c.h5'}: the folder {blocker} is not writable (")
    assert "\n" not in msg


def test_check_writable_link_to_a_folder_is_a_folder(tmp_path):
    target = tmp_path / "d"
    target.mkdir()
    link = tmp_path / "link.h5"
    link.symlink_to(target)
    with pytest.raises(CaptureWriteError, match="it is a folder"):
        check_writable(link)


def _limit_file_size(soft: int):
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, old[1]))
    return old


def test_not_enough_space_is_refused_before_writing(tmp_path):
    """The file-size limit counts as the space left: need = bytes of q, k, v + 1 MiB."""
    if resource.getrlimit(resource.RLIMIT_FSIZE)[1] != resource.RLIM_INFINITY:
        pytest.skip("a hard file-size limit is set")
    path = tmp_path / "c.h5"
    w = CaptureWriter(path, _meta(), IDS)
    w.write_layer(_record(0))
    r = _record(3)
    need = sum(t.numel() * 4 for t in (r.q, r.k, r.v)) + (1 << 20)
    size = path.stat().st_size
    assert shutil.disk_usage(tmp_path).free > need + 10 * (1 << 20)
    old = _limit_file_size(size + need - 1)
    try:
        with pytest.raises(CaptureWriteError) as e:
            w.write_layer(r)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    assert str(e.value) == (
        f"not enough space to write layer 3 to {path}: about {need / 1e6:.1f} MB needed, "
        f"{(need - 1) / 1e6:.1f} MB available (disk full or file-size limit). Layers completed so far are kept; "
        "free space and rerun the same command to resume")
    info = open_capture(path)  # closed cleanly, layer 0 kept
    assert info.complete_layers == [0] and not info.complete


def test_a_file_already_over_the_limit_reports_zero_available(tmp_path):
    if resource.getrlimit(resource.RLIMIT_FSIZE)[1] != resource.RLIM_INFINITY:
        pytest.skip("a hard file-size limit is set")
    path = tmp_path / "c.h5"
    w = CaptureWriter(path, _meta(), IDS)
    old = _limit_file_size(path.stat().st_size - 10)
    try:
        with pytest.raises(CaptureWriteError, match=re.escape("MB needed, 0.0 MB available")):
            w.write_layer(_record(0))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)


def test_exactly_enough_space_is_accepted(tmp_path):
    if resource.getrlimit(resource.RLIMIT_FSIZE)[1] != resource.RLIM_INFINITY:
        pytest.skip("a hard file-size limit is set")
    path = tmp_path / "c.h5"
    r = _record(0)
    need = sum(t.numel() * 4 for t in (r.q, r.k, r.v)) + (1 << 20)
    with CaptureWriter(path, _meta(), IDS) as w:
        old = _limit_file_size(path.stat().st_size + need)
        try:
            w.write_layer(r)  # free == need: written
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old)
        assert w.complete_layers == [0]


# ---------------------------------------------------------------------------------------------- foreign files

def test_schema_attribute_stored_as_bytes_is_read(tmp_path):
    """Attributes written as fixed-length byte strings (other HDF5 writers) read as text."""
    path = tmp_path / "c.h5"
    _write(path)
    with h5py.File(path, "a") as f:
        f.attrs["schema"] = np.bytes_(b"zyfa-capture")
        f.attrs["model"] = np.bytes_(b"synthetic")
    info = open_capture(path)
    assert info.attrs["schema"] == "zyfa-capture" and info.attrs["model"] == "synthetic"
    with CaptureWriter(path, _meta(), IDS) as w:  # and the identity still matches
        assert w.resumed


def test_missing_schema_and_version_messages(tmp_path):
    path = tmp_path / "c.h5"
    _write(path)
    with h5py.File(path, "a") as f:
        del f.attrs["schema"]
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == (f"{path} is an HDF5 file but not a ZYFA capture: root attribute 'schema' is None, "
                            "expected 'zyfa-capture'")
    _write(path, overwrite=True)
    with h5py.File(path, "a") as f:
        del f.attrs["schema_version"]
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == (f"{path} has zyfa-capture schema version None; this reader reads version 1 (regenerate "
                            "the file with this version of zyfa, or use the matching zyfa version)")


def test_missing_root_attributes_are_all_listed(tmp_path):
    path = tmp_path / "c.h5"
    _write(path)
    with h5py.File(path, "a") as f:
        del f.attrs["created"], f.attrs["git_commit"], f.attrs["head_dim"]
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == f"{path}: root attributes missing: head_dim, created, git_commit"


def test_token_ids_missing_or_misshapen(tmp_path):
    path = tmp_path / "c.h5"
    _write(path)
    with h5py.File(path, "a") as f:
        del f["token_ids"]
        f["token_ids"] = np.zeros((1, S + 1), np.int32)
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == f"{path}: dataset token_ids has shape (1, {S + 1}), expected (1, {S})"
    with h5py.File(path, "a") as f:
        del f["token_ids"]
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == f"{path}: dataset token_ids has shape None, expected (1, {S})"


def test_token_ids_out_of_int32_range_or_not_integers_are_refused(tmp_path):
    """The file stores token ids as int32: an id past 2^31 - 1 or below 0 would wrap, a fraction would be cut; the
    writer names the problem before it creates the file."""
    path = tmp_path / "c.h5"
    for bad, msg in ((np.full((1, S), 2**31, np.int64), r"\[0, 2\^31 - 1\].*2147483648 to 2147483648"),
                     (-np.ones((1, S), np.int64), r"\[0, 2\^31 - 1\].*-1 to -1"),
                     (np.full((1, S), 1.5), "must be integers, got float64"),
                     (np.full((1, S), "a"), "must be integers, got <U1")):
        with pytest.raises(ValueError, match=msg):
            CaptureWriter(path, _meta(), bad)
        assert not path.exists()
    top = np.full((1, S), 2**31 - 1, np.int64)  # the largest id fits, and reads back unchanged
    _write(path, ids=top)
    assert torch.equal(read_token_ids(path), torch.from_numpy(top))


def test_unknown_root_dtype(tmp_path):
    path = tmp_path / "c.h5"
    _write(path)
    with h5py.File(path, "a") as f:
        f.attrs["dtype"] = "float64"
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == f"{path}: unknown dtype 'float64'"


def test_file_without_a_layers_group_has_no_layers(tmp_path):
    path = tmp_path / "c.h5"
    _write(path, recs=[], finish=False)
    with h5py.File(path, "a") as f:
        del f["layers"]
    info = open_capture(path)
    assert info.layers == {} and not info.complete and info.complete_layers == []


def test_missing_layer_attributes_are_all_listed(tmp_path):
    path = tmp_path / "c.h5"
    _write(path)
    with h5py.File(path, "a") as f:
        del f["layers/003"].attrs["window"], f["layers/003"].attrs["num_kv_heads"]
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == f"{path}:/layers/003: layer attributes missing: window, num_kv_heads"


def test_incomplete_group_is_not_validated(tmp_path):
    """A group without its flag (a crash) may hold anything: it is listed as incomplete, never read."""
    path = tmp_path / "c.h5"
    _write(path, recs=[_record(0)], finish=False)
    with h5py.File(path, "a") as f:
        g = f["layers"].create_group("003")
        g["q"] = np.zeros(3)  # nothing like a layer
    info = open_capture(path)
    assert info.layers[3] == {"complete": False, "layer": 3} and info.complete_layers == [0]
    with h5py.File(path, "a") as f:
        del f["layers/003"]
        f["layers"].create_group("003").attrs["complete"] = np.False_
    assert open_capture(path).layers[3] == {"complete": False, "layer": 3}


def test_group_name_and_layer_attribute_must_agree(tmp_path):
    path = tmp_path / "c.h5"
    _write(path)
    with h5py.File(path, "a") as f:
        f["layers/003"].attrs["layer"] = 2
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == f"{path}: group layers/003 holds layer 2"


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_dataset_shape_is_checked(tmp_path, name):
    path = tmp_path / "c.h5"
    _write(path)
    heads = 4 if name == "q" else 2
    for bad in ((1, heads, S), (2, heads, S, D), (1, heads + 1, S, D), (1, heads, S - 1, D)):
        with h5py.File(path, "a") as f:
            g = f["layers/000"]
            del g[name]
            g.create_dataset(name, data=np.zeros(bad, np.float32)).attrs["dtype"] = "float32"
        with pytest.raises(CaptureFormatError) as e:
            open_capture(path)
        assert str(e.value) == (f"{path}:/layers/000/{name}: shape {bad}, expected (1, {heads}, {S}, head_dim)")
    with h5py.File(path, "a") as f:  # any head_dim is accepted (v may differ from q/k)
        g = f["layers/000"]
        del g[name]
        g.create_dataset(name, data=np.zeros((1, heads, S, 3), np.float32)).attrs["dtype"] = "float32"
    assert open_capture(path).complete


@pytest.mark.parametrize("attr,storage", [("float16", np.float32), ("bfloat16", np.float32), ("float32", np.uint16),
                                          (None, np.float32), ("int8", np.int8)])
def test_dataset_dtype_attribute_must_match_storage(tmp_path, attr, storage):
    path = tmp_path / "c.h5"
    _write(path)
    with h5py.File(path, "a") as f:
        g = f["layers/003"]
        del g["k"]
        ds = g.create_dataset("k", data=np.zeros((1, 2, S, D), storage))
        if attr is not None:
            ds.attrs["dtype"] = attr
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == (f"{path}:/layers/003/k: dtype attribute {attr!r} does not match storage "
                            f"{np.dtype(storage)}")


@pytest.mark.parametrize("kv_of_q", [[0, 0, 1], [0, 0, 1, 2], [0, 0, 1, -1], [0, 0, 1, 1, 0]])
def test_kv_head_of_q_must_fit_the_heads(tmp_path, kv_of_q):
    path = tmp_path / "c.h5"
    _write(path)
    with h5py.File(path, "a") as f:
        f["layers/000"].attrs["kv_head_of_q"] = np.asarray(kv_of_q, np.int64)
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == f"{path}:/layers/000: kv_head_of_q {kv_of_q} inconsistent with the heads"


def test_a_dataset_without_sha256_is_read_unchecked(tmp_path):
    """Files written before the checksum existed: read without it."""
    path = tmp_path / "c.h5"
    recs = _write(path)
    with h5py.File(path, "a") as f:
        del f["layers/000/q"].attrs["sha256"]
        f["layers/000/q"][0, 0, 0, 0] = 7.0
    (b,) = read_capture(path, layers=[0])
    assert b.q[0, 0, 0, 0].item() == 7.0 and torch.equal(b.k, recs[0].k)


@pytest.mark.parametrize("name", ["k", "v"])
def test_checksum_is_checked_for_every_tensor(tmp_path, name):
    path = tmp_path / "c.h5"
    _write(path)
    with h5py.File(path, "a") as f:
        f[f"layers/003/{name}"][0, 1, S - 1, D - 1] = 0.5
    with pytest.raises(CaptureFormatError) as e:
        list(read_capture(path))
    assert str(e.value) == (f"{path}: layer 3 tensor {name} does not match the sha256 recorded when it was written "
                            "(half-written or altered); recapture it (--overwrite)")


def test_incomplete_capture_message(tmp_path):
    path = tmp_path / "c.h5"
    _write(path, finish=False)
    with pytest.raises(CaptureFormatError) as e:
        list(read_capture(path))
    assert str(e.value) == (f"{path} is an incomplete capture (complete layers: [0, 3]); rerun the capture command "
                            "that made it to resume, or pass allow_incomplete=True")
    empty = tmp_path / "e.h5"
    _write(empty, recs=[], finish=False)
    with pytest.raises(CaptureFormatError, match=re.escape("(complete layers: none)")):
        list(read_capture(empty))
    assert list(read_capture(empty, allow_incomplete=True)) == []


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        open_capture(tmp_path / "nope.h5")
    assert str(e.value) == f"no capture file at {tmp_path / 'nope.h5'}"
    with pytest.raises(FileNotFoundError):
        list(read_capture(str(tmp_path / "nope.h5")))


def test_space_message_rounds_to_a_tenth_of_a_megabyte(tmp_path):
    """MB = 10^6 bytes, one decimal: float16 q (3 heads) + k, v (2 heads), 4477 tokens, d 8: 1 550 000 bytes needed
    with the 1 MiB margin (1.55 MB -> "1.6"), 1 350 000 bytes left under the limit ("1.4")."""
    if resource.getrlimit(resource.RLIMIT_FSIZE)[1] != resource.RLIM_INFINITY:
        pytest.skip("a hard file-size limit is set")
    s = 4477
    path = tmp_path / "c.h5"
    r = _record(0, q_heads=(0, 1, 2), kv_of_q=(0, 0, 1), dtype=torch.float16, s=s)
    assert sum(t.numel() * 2 for t in (r.q, r.k, r.v)) + (1 << 20) == 1_550_000
    w = CaptureWriter(path, _meta(layers=(0,), q_heads=(0, 1, 2), dtype="float16"), np.zeros((1, s), np.int64))
    old = _limit_file_size(path.stat().st_size + 1_350_000)
    try:
        with pytest.raises(CaptureWriteError, match=re.escape("about 1.6 MB needed, 1.4 MB available")):
            w.write_layer(r)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)


def test_a_refused_layer_releases_the_file(tmp_path):
    """After 'not enough space' the writer has closed the file: another process can open it for writing (resume
    it) while this one still holds the writer, and closing the writer again is a no-op."""
    if resource.getrlimit(resource.RLIMIT_FSIZE)[1] != resource.RLIM_INFINITY:
        pytest.skip("a hard file-size limit is set")
    path = tmp_path / "c.h5"
    w = CaptureWriter(path, _meta(), IDS)
    w.write_layer(_record(0))
    old = _limit_file_size(path.stat().st_size + 1000)
    try:
        with pytest.raises(CaptureWriteError, match="not enough space to write layer 3"):
            w.write_layer(_record(3))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
    other = subprocess.run(
        [sys.executable, "-c", "import sys, h5py; h5py.File(sys.argv[1], 'a').close(); print('opened')", str(path)],
        capture_output=True, text=True, timeout=120)
    assert other.stdout.strip() == "opened", other.stderr
    w.close()
    w.finish()  # nothing left to finish: the writer gave the file up
    assert open_capture(path).complete_layers == [0]


def test_a_one_token_capture(tmp_path):
    path = tmp_path / "c.h5"
    recs = [_record(0, s=1), _record(3, s=1)]
    _write(path, recs=recs, ids=np.array([[7]]))
    with h5py.File(path, "r") as f:
        assert f["layers/000/q"].chunks == (1, 1, 1, D)
    back = list(read_capture(path))
    assert all(torch.equal(a.q, b.q) and torch.equal(a.v, b.v) for a, b in zip(recs, back, strict=True))
    assert read_token_ids(path).tolist() == [[7]]


def test_resume_drops_a_group_without_any_attribute(tmp_path):
    """A kill right after a layer's group was created leaves a group with no attributes: not complete, dropped."""
    path = tmp_path / "c.h5"
    _write(path, recs=[_record(0)], finish=False)
    with h5py.File(path, "a") as f:
        f["layers"].create_group("003")
    assert open_capture(path).complete_layers == [0]
    with CaptureWriter(path, _meta(), IDS) as w:
        assert w.resumed and w.pending_layers == [3]
    with h5py.File(path, "r") as f:
        assert sorted(f["layers"]) == ["000"]


def test_a_write_error_at_creation_names_the_file(tmp_path):
    """The temporary file cannot be created (here a folder holds its name): CaptureWriteError naming the capture,
    the system's reason, and what to do; nothing appears under the final name."""
    path = tmp_path / "c.h5"
    (tmp_path / ".c.h5.creating").mkdir()
    with pytest.raises(CaptureWriteError) as e:
        CaptureWriter(path, _meta(), IDS)
    msg = str(e.value)
    assert msg.startswith(f"could not write {path} (") and "Is a directory" in msg and "\n" not in msg
    assert msg.endswith("); is the disk full or the file-size limit reached? Layers completed before this one are "
                        "kept; free space and rerun the same command to resume")
    assert isinstance(e.value, OSError) and not path.exists()
