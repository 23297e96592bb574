"""The capture reader on files a user can meet: a dangling link in the layer index, non-finite values in V, and
a layer that stores more KV heads than query heads.

- ``open_capture`` turns a structure h5py cannot walk (here a soft link in ``/layers`` whose target is gone,
  as a hand edit or a partial repack leaves it) into one line naming the file.
- ``read_capture`` names the tensor that holds a NaN: V, not Q or K, when the NaN is in V.
- A layer that keeps KV heads no stored query head uses (a capture of query head 0 of a GQA model together
  with every KV head) reads back with one KV head per query head, in order, and no division by a zero group
  size.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from zyfa.capture.record import LayerRecord
from zyfa.capture.store import CaptureFormatError, layer_key, open_capture, read_capture
from zyfa.capture.writer import CaptureWriter

S, D = 16, 8
IDS = np.arange(3, 3 + S)[None]


def _meta(q_heads=(0, 1, 2, 3), num_q=4, num_kv=2, dtype="float32", head_dim=D):
    return {
        "model": "synthetic", "model_source": "test", "model_package": "", "model_sha256": "a" * 64,
        "transformers_version": "-", "torch_version": "2.x", "text_source": "none", "text_sha256": "b" * 64,
        "window_offset": 0, "dtype": dtype, "layers": [0], "q_heads": list(q_heads),
        "num_layers": 1, "num_q_heads": num_q, "num_kv_heads": num_kv, "head_dim": head_dim,
    }


def _write(path: Path, q, k, v, q_heads, kv_heads, kv_of_q, num_q=4, num_kv=2) -> None:
    rec = LayerRecord(
        layer=0, layer_type="full_attention", q=q, k=k, v=v, sm_scale=0.3, causal=True, window=None,
        q_heads=tuple(q_heads), kv_heads=tuple(kv_heads), kv_head_of_q=tuple(kv_of_q),
        num_q_heads=num_q, num_kv_heads=num_kv)
    meta = _meta(q_heads, num_q, num_kv, str(q.dtype).removeprefix("torch."), q.shape[-1])
    with CaptureWriter(path, meta, IDS) as w:
        w.write_layer(rec)
        w.finish()


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _gqa_file(path: Path, v=None) -> None:
    q, k = _randn(1, 4, S, D, seed=1), _randn(1, 2, S, D, seed=2)
    v = _randn(1, 2, S, D, seed=3) if v is None else v
    _write(path, q, k, v, (0, 1, 2, 3), (0, 1), (0, 0, 1, 1))


@pytest.mark.parametrize("link", ["soft", "external"])
def test_a_dangling_link_in_the_layer_index_is_one_line_naming_the_file(tmp_path, link):
    path = tmp_path / "cap.h5"
    _gqa_file(path)
    with h5py.File(path, "a") as f:
        f["layers"]["001"] = (h5py.SoftLink("/layers/gone") if link == "soft"
                              else h5py.ExternalLink(str(tmp_path / "gone.h5"), "/x"))
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:/layers/001 is a{'n' if link == 'external' else ''} {link} link to ")
    assert "\n" not in msg


def test_a_dangling_link_in_place_of_a_tensor_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "cap.h5"
    _gqa_file(path)
    with h5py.File(path, "a") as f:
        del f["layers/000/v"]
        f["layers/000/v"] = h5py.SoftLink("/nowhere")
    with pytest.raises(CaptureFormatError) as e:
        open_capture(path)
    assert str(e.value).startswith(f"{path}:/layers/000/v is a soft link to /nowhere; ")


def test_a_dataset_in_the_layer_index_is_refused_by_name(tmp_path):
    path = tmp_path / "cap.h5"
    _gqa_file(path)
    with h5py.File(path, "a") as f:
        f["layers"]["001"] = np.zeros(3)
    with pytest.raises(CaptureFormatError, match=r"cap\.h5: layers/001 is a Dataset, not a layer group$"):
        open_capture(path)


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_a_nan_is_reported_in_the_tensor_that_holds_it(tmp_path, where):
    path = tmp_path / "cap.h5"
    q, k, v = _randn(1, 4, S, D, seed=1), _randn(1, 2, S, D, seed=2), _randn(1, 2, S, D, seed=3)
    bad = {"q": q, "k": k, "v": v}[where]
    bad[0, 1, 5, 2] = float("nan")
    _write(path, q, k, v, (0, 1, 2, 3), (0, 1), (0, 0, 1, 1))
    with pytest.raises(CaptureFormatError) as e:
        list(read_capture(path))
    msg = str(e.value)
    assert f"layer 0 tensor {where} holds 1 NaN and 0 Inf values (first at batch 0, head 1, token 5)" in msg


def test_more_kv_heads_than_query_heads_read_back_as_one_kv_head_per_query_head(tmp_path):
    """Query head 0 of a 4:2 GQA model, stored with both KV heads: the reader keeps the one KV head it uses."""
    path = tmp_path / "cap.h5"
    q, k, v = _randn(1, 1, S, D, seed=4), _randn(1, 2, S, D, seed=5), _randn(1, 2, S, D, seed=6)
    _write(path, q, k, v, (0,), (0, 1), (0,))
    (rec,) = list(read_capture(path))
    assert rec.q_heads == (0,) and rec.kv_heads == (0,) and rec.kv_head_of_q == (0,)
    assert torch.equal(rec.q, q)
    assert torch.equal(rec.k, k[:, :1]) and torch.equal(rec.v, v[:, :1])


def test_more_kv_heads_than_query_heads_keep_the_used_kv_head_when_it_is_not_the_first(tmp_path):
    path = tmp_path / "cap.h5"
    q, k, v = _randn(1, 1, S, D, seed=7), _randn(1, 2, S, D, seed=8), _randn(1, 2, S, D, seed=9)
    _write(path, q, k, v, (3,), (0, 1), (1,))
    (rec,) = list(read_capture(path))
    assert rec.q_heads == (3,) and rec.kv_heads == (1,) and rec.kv_head_of_q == (0,)
    assert torch.equal(rec.k, k[:, 1:]) and torch.equal(rec.v, v[:, 1:])


@pytest.mark.parametrize("head_dim", [1, 2, 3, 6])
def test_a_bf16_capture_of_any_head_dim_reads_back_bit_exact(tmp_path, head_dim):
    """bf16 is stored as its 16-bit patterns; reading them back must reinterpret those same 2-byte units,
    whatever the head dim: a reinterpretation through a wider dtype works only where the row's bytes happen
    to divide into it (head dim a multiple of 4 for 8-byte words), and fails or scrambles the values elsewhere."""
    path = tmp_path / "cap.h5"
    q, k, v = (_randn(1, n, S, head_dim, seed=10 + n).to(torch.bfloat16) for n in (4, 2, 2))
    v[0, 1, 3, 0] = -0.0
    _write(path, q, k, v, (0, 1, 2, 3), (0, 1), (0, 0, 1, 1))
    (rec,) = list(read_capture(path))
    for got, want in ((rec.q, q), (rec.k, k), (rec.v, v)):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_read_bytes_is_the_size_of_the_stored_q_k_v(tmp_path, dtype):
    """CaptureInfo.read_bytes: what reading the layer allocates, the stored Q, K and V's element counts times their
    stored value sizes (counted here from h5py's own view of the datasets)."""
    path = tmp_path / "cap.h5"
    q, k, v = (_randn(1, n, S, D, seed=s).to(dtype) for n, s in ((4, 1), (2, 2), (2, 3)))
    _write(path, q, k, v, (0, 1, 2, 3), (0, 1), (0, 0, 1, 1))
    with h5py.File(path, "r") as f:
        g = f["layers"][layer_key(0)]
        want = sum(g[n].size * g[n].dtype.itemsize for n in "qkv")
    assert want == (4 + 2 + 2) * S * D * (4 if dtype == torch.float32 else 2)
    got = open_capture(path).read_bytes(0)
    assert type(got) is int and got == want


def test_read_bytes_counts_a_declared_shape_past_int64_exactly(tmp_path):
    """HDF5 declares dimensions up to 2^64 - 1 (a chunked dataset allocates nothing until written): the count is
    exact Python integer arithmetic, never an int64 product that wraps (to 0 here), so the memory check before a
    read refuses such a layer instead of reading it."""
    path = tmp_path / "cap.h5"
    _gqa_file(path)
    info = open_capture(path)
    huge = {n: ((1, 4, 2**60, 8), 4) for n in "qkv"}  # 2^65 values each
    assert info.read_bytes(0) == 8 * S * D * 4  # the real file: 4 + 2 + 2 heads of float32
    assert dataclasses.replace(info, datasets={0: huge}).read_bytes(0) == 3 * 2**65 * 4
