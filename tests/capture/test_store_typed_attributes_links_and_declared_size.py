"""The capture reader checks what a file declares before it believes it (issue 32), on real HDF5 files.

- Attributes are typed, never coerced: ``causal = "False"``, ``window = 2.5``, a string ``sm_scale``, a string
  ``batch``: one line naming the file, the layer (or root) and the attribute.
- Soft links, external links, external raw storage and virtual datasets are refused, naming the path: a
  capture cannot make the tool read another layer's data or another file.
- A layer that declares a huge shape (chunked, so the file is small) is refused from its declared size,
  before any data is read (``zyfa accuracy`` exits 2 with one line naming the file and the layer).
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from zyfa.accuracy.inputs.attention_input import capture_inputs
from zyfa.capture.record import LayerRecord
from zyfa.capture.store import CaptureFormatError, open_capture, read_capture
from zyfa.capture.writer import CaptureWriter

from zyfa.cli import main

S, D = 16, 8


def _capture(path, layers=(0, 1)):
    meta = {"model": "synthetic", "model_source": "test", "model_package": "", "model_sha256": "a" * 64,
            "transformers_version": "-", "torch_version": "2.x", "text_source": "none", "text_sha256": "b" * 64,
            "window_offset": 0, "dtype": "float32", "layers": list(layers), "q_heads": [0, 1], "num_layers": 2,
            "num_q_heads": 2, "num_kv_heads": 1, "head_dim": D}
    with CaptureWriter(path, meta, np.arange(S)[None]) as w:
        for i in layers:
            g = torch.Generator().manual_seed(i)
            q, k, v = (torch.randn(1, h, S, D, generator=g) for h in (2, 1, 1))
            w.write_layer(LayerRecord(layer=i, layer_type="full_attention", q=q, k=k, v=v, sm_scale=0.3,
                                      causal=True, window=None, q_heads=(0, 1), kv_heads=(0,), kv_head_of_q=(0, 0),
                                      num_q_heads=2, num_kv_heads=1))
        w.finish()
    return path


def _one_line(capsys, *words):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("where, name, value, words", [
    ("layers/000", "causal", "False", ["attribute 'causal' must be true/false (or 0/1)", "'False'"]),
    ("layers/000", "causal", 2, ["attribute 'causal' must be true/false"]),
    ("layers/001", "window", 2.5, ["attribute 'window' must be an integer >= 1", "2.5"]),
    ("layers/000", "window", -3, ["attribute 'window' must be an integer >= 1 (or -1 for no window)"]),
    ("layers/000", "sm_scale", "0.3", ["attribute 'sm_scale' must be a finite number > 0", "'0.3'"]),
    ("layers/000", "sm_scale", float("nan"), ["attribute 'sm_scale' must be a finite number > 0"]),
    ("layers/000", "sm_scale", -0.5, ["attribute 'sm_scale' must be a finite number > 0"]),
    ("layers/001", "num_q_heads", 2.0, ["attribute 'num_q_heads' must be an integer >= 1"]),
    ("layers/001", "layer", 1.5, ["attribute 'layer' must be an integer, got 1.5 (float)"]),
    ("layers/000", "window", 0, ["attribute 'window' must be an integer >= 1 (or -1 for no window), got 0"]),
    ("layers/000", "sm_scale", 0.0, ["attribute 'sm_scale' must be a finite number > 0, got 0.0"]),
    ("layers/001", "q_heads", [0, 1.5], ["attribute 'q_heads' must be a list of integers, got [0.0, 1.5] (list)"]),
    ("", "batch", "1", ["(root): attribute 'batch' must be an integer >= 1", "'1'"]),
    ("", "num_kv_heads", "1", ["(root): attribute 'num_kv_heads' must be an integer >= 1"]),
])
def test_wrongly_typed_attribute_is_one_line_naming_file_layer_and_attribute(tmp_path, capsys, where, name, value,
                                                                            words):
    path = _capture(tmp_path / "cap.h5")
    with h5py.File(path, "a") as f:
        (f[where] if where else f).attrs[name] = value
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value).startswith(f"{path}:/{where}: " if where else f"{path} (root): ") and "\n" not in str(e.value)
    assert main(["accuracy", "--inputs", str(path), "--recipes", "fp32", "--device", "cpu", "--no-progress"]) == 2
    _one_line(capsys, str(path), *words)


def test_the_smallest_window_is_read(tmp_path):
    """window 1 (each query sees only its own key) is a window, not a refusal: the bound is >= 1."""
    path = _capture(tmp_path / "cap.h5")
    with h5py.File(path, "a") as f:
        f["layers/001"].attrs["window"] = 1
    info = open_capture(path)
    assert [r.window for r in read_capture(path)] == [None, 1] and info.path == path


def test_real_bools_and_0_1_are_read(tmp_path):
    path = _capture(tmp_path / "cap.h5")
    with h5py.File(path, "a") as f:
        f["layers/000"].attrs["causal"] = np.int64(0)
        f["layers/001"].attrs["causal"] = np.True_
        f["layers/001"].attrs["window"] = np.int32(4)
    recs = list(read_capture(path))
    assert [(r.causal, r.window) for r in recs] == [(False, None), (True, 4)]
    assert type(recs[1].window) is int and type(recs[0].causal) is bool


@pytest.mark.parametrize("kind", ["soft", "external"])
def test_linked_datasets_are_refused_naming_the_path(tmp_path, capsys, kind):
    path = _capture(tmp_path / "cap.h5")
    other = _capture(tmp_path / "other.h5")
    with h5py.File(path, "a") as f:
        if kind == "soft":  # k of layer 1 is layer 0's k
            del f["layers/001/k"]
            f["layers/001/k"] = h5py.SoftLink("/layers/000/k")
            expect = f"{path}:/layers/001/k is a soft link to /layers/000/k"
        else:  # q of layer 0 is another file's q
            del f["layers/000/q"]
            f["layers/000/q"] = h5py.ExternalLink(str(other), "/layers/000/q")
            expect = f"{path}:/layers/000/q is an external link to {other}:/layers/000/q"
    with pytest.raises(CaptureFormatError) as e:
        list(read_capture(path))
    # the whole sentence: which member, what it points to, and what a capture must be
    assert str(e.value) == f"{expect}; a capture's datasets must be stored in it, not linked"
    assert main(["accuracy", "--inputs", str(path), "--recipes", "fp32", "--device", "cpu", "--no-progress"]) == 2
    _one_line(capsys, expect)


@pytest.mark.parametrize("name", ["token_ids", "layers"])
@pytest.mark.parametrize("kind", ["external", "dangling"])
def test_the_roots_token_ids_or_layers_linked_are_refused(tmp_path, name, kind):
    """The root's own members are checked as the layers' are: a token_ids or a whole layers group from another
    file, or a link that leads nowhere, is refused, naming it."""
    path = _capture(tmp_path / "cap.h5")
    other = _capture(tmp_path / "other.h5")
    with h5py.File(path, "a") as f:
        del f[name]
        if kind == "external":
            f[name] = h5py.ExternalLink(str(other), f"/{name}")
            what = f"an external link to {other}:/{name}"
        else:  # ``name in f`` is False for a dangling link: only the link itself shows it
            f[name] = h5py.SoftLink("/nowhere")
            what = "a soft link to /nowhere"
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == f"{path}:/{name} is {what}; a capture's datasets must be stored in it, not linked"


def test_a_corrupted_layer_header_is_one_line_naming_the_file(tmp_path):
    """Bytes of a layer group's object header overwritten (a damaged disk or copy): HDF5 cannot open the group, and
    the reader says so in one line naming the file, with HDF5's own reason."""
    path = _capture(tmp_path / "cap.h5")
    with h5py.File(path, "r") as f:
        addr = h5py.h5o.get_info(f["layers/001"].id).addr
    data = bytearray(path.read_bytes())
    data[addr:addr + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value).startswith(f"{path}: unreadable structure (truncated or corrupted?): ")
    assert "object header" in str(e.value) and "\n" not in str(e.value)


def test_a_whole_layer_linked_is_refused(tmp_path):
    path = _capture(tmp_path / "cap.h5")
    other = _capture(tmp_path / "other.h5")
    with h5py.File(path, "a") as f:
        del f["layers/001"]
        f["layers/001"] = h5py.ExternalLink(str(other), "/layers/001")
    with pytest.raises(CaptureFormatError, match=r"/layers/001 is an external link to .*other\.h5:/layers/001"):
        open_capture(path)


def test_external_storage_and_virtual_datasets_are_refused(tmp_path):
    path = _capture(tmp_path / "cap.h5")
    raw = tmp_path / "raw.bin"
    with h5py.File(path, "a") as f:
        q = f["layers/000/q"]
        data, attrs = q[()], dict(q.attrs)
        del f["layers/000/q"]
        # two external files, each holding half of the data
        half = data.nbytes // 2
        data.tofile(raw)
        raw2 = tmp_path / "raw2.bin"
        raw2.write_bytes(raw.read_bytes()[half:])
        ds = f["layers/000"].create_dataset("q", shape=data.shape, dtype=data.dtype,
                                            external=[(str(raw), 0, half), (str(raw2), 0, data.nbytes - half)])
        ds.attrs.update(attrs)
    with h5py.File(path, "r") as f:
        assert np.array_equal(f["layers/000/q"][()], data)  # a working external dataset
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == (f"{path}:/layers/000/q keeps its data in external file(s) {raw}, {raw2}; a capture's "
                            "datasets must be stored in it")

    path2 = _capture(tmp_path / "cap2.h5")
    other = _capture(tmp_path / "other.h5")
    with h5py.File(path2, "a") as f:
        k = f["layers/001/k"]
        shape, dtype, attrs = k.shape, k.dtype, dict(k.attrs)
        del f["layers/001/k"]
        layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
        layout[...] = h5py.VirtualSource(str(other), "/layers/001/k", shape=shape)
        f["layers/001"].create_virtual_dataset("k", layout).attrs.update(attrs)
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path2)
    assert str(e.value) == (f"{path2}:/layers/001/k is a virtual dataset (its data lives in other datasets or files); "
                            "a capture's datasets must be stored in it")


def test_a_group_where_a_dataset_belongs_is_refused_naming_it(tmp_path):
    path = _capture(tmp_path / "cap.h5")
    with h5py.File(path, "a") as f:
        del f["layers/001/v"]
        f["layers/001"].create_group("v")
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value) == f"{path}:/layers/001/v is a Group, not a dataset"


def test_a_huge_declared_shape_is_refused_before_any_data_is_read(tmp_path, capsys):
    """q of shape (1, 2, 16, 2^36) float32 (8 TiB), chunked so the file stays small: refused from its size."""
    path = _capture(tmp_path / "cap.h5")
    with h5py.File(path, "a") as f:
        for n, h in (("q", 2), ("k", 1), ("v", 1)):
            attrs = dict(f[f"layers/000/{n}"].attrs)
            del f[f"layers/000/{n}"]
            ds = f["layers/000"].create_dataset(n, shape=(1, h, S, 2**36), dtype=np.float32, chunks=(1, 1, 1, 4096))
            attrs.pop("sha256", None)
            ds.attrs.update(attrs)
    assert path.stat().st_size < 1 << 20
    with pytest.raises(ValueError, match=rf"{path}: layer 0 declares q \(1, 2, 16, 68719476736\).*reading it needs "
                                         r"about \d+\.\d GiB, but the host has"):
        capture_inputs(path)
    assert main(["accuracy", "--inputs", str(path), "--recipes", "fp32", "--device", "cpu", "--no-progress"]) == 2
    _one_line(capsys, f"{path}: layer 0 declares", "GiB")
    # the run's own need is checked by the Gaussian inputs' rule too, on the selected heads and tokens
    assert [i.name for i in capture_inputs(path, layers=[1], max_tokens=8)] == ["synthetic-L1-full_attention-s8"]
