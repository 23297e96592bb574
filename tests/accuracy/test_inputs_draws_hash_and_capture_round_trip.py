"""make_gaussian against the documented draw order, AttentionInput.to, content_hash against hashlib,
and the capture round trip: tensors and provenance written through capture.store come back through capture_inputs.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch
import zyfa.accuracy.inputs.attention_input as attention_input
import zyfa.accuracy.io.device as device_module
from zyfa.accuracy.inputs.attention_input import (
    AttentionInput,
    GaussianSpec,
    capture_inputs,
    check_capture_memory,
    content_hash,
    make_gaussian,
)
from zyfa.capture.record import LayerRecord
from zyfa.capture.store import open_capture
from zyfa.capture.version import git_label
from zyfa.capture.writer import CaptureWriter


def _draws(spec: GaussianSpec):
    """The docstring's recipe, step by step: q, k, v bulk draws std*N(0,1) from one generator seeded with the spec's
    seed, then per tensor in the order q, k, v a Bernoulli(outlier_frac) mask and std*outlier_scale*N(0,1) values,
    added where the tensor is named in outlier_tensors."""
    gen = torch.Generator().manual_seed(spec.seed)
    d_v = spec.head_dim_v or spec.head_dim
    shapes = {"q": (spec.batch, spec.heads_q, spec.seq, spec.head_dim),
              "k": (spec.batch, spec.heads_kv, spec.seq, spec.head_dim),
              "v": (spec.batch, spec.heads_kv, spec.seq, d_v)}
    x = {t: torch.randn(s, generator=gen) * spec.std for t, s in shapes.items()}
    counts = {}
    if spec.outlier_frac > 0:
        for t in "qkv":
            mask = torch.rand(shapes[t], generator=gen) < spec.outlier_frac
            extra = torch.randn(shapes[t], generator=gen) * (spec.std * spec.outlier_scale)
            if t in spec.outlier_tensors:
                x[t] = x[t] + mask * extra
                counts[t] = int(mask.sum())
    return x, counts


def _sha16(*tensors, mask: str | None = None) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    if mask is not None:
        h.update(mask.encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("spec", [
    GaussianSpec(batch=2, heads_q=4, heads_kv=2, seq=16, head_dim=64, std=2.5, dtype="fp32", seed=3),
    GaussianSpec(heads_q=2, heads_kv=1, seq=24, head_dim=192, head_dim_v=128, std=0.5, outlier_frac=0.25,
                 outlier_scale=6.0, outlier_tensors="kv", dtype="fp32", seed=11),
    GaussianSpec(heads_q=1, heads_kv=1, seq=32, head_dim=64, outlier_frac=1.0, outlier_scale=3.0,
                 outlier_tensors="q", dtype="fp32", seed=0),
])
def test_gaussian_values_follow_the_documented_draw_order(spec):
    x, counts = _draws(spec)
    got = make_gaussian(spec)
    for t in "qkv":
        assert torch.allclose(getattr(got, t), x[t], rtol=1e-6, atol=1e-6), t
        assert getattr(got, t).dtype == torch.float32
    assert got.meta.get("outlier_counts") == (counts or None)
    assert got.meta["spec"] == dataclasses.asdict(spec)
    assert got.meta["source"] == "gaussian"
    assert got.name == spec.name
    assert got.causal is False and got.window is None and got.sm_scale is None


def test_bf16_values_are_the_fp32_draws_rounded():
    spec = GaussianSpec(heads_q=2, heads_kv=2, seq=8, head_dim=64, std=3.0, outlier_frac=0.5, seed=4)
    x, _ = _draws(spec)
    got = make_gaussian(spec)
    for t in "qkv":
        assert getattr(got, t).dtype == torch.bfloat16
        assert torch.equal(getattr(got, t), x[t].to(torch.bfloat16)), t
    assert set(got.meta["outlier_counts"]) == {"q", "k"}


def _make_under_default_dtype(spec, dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return make_gaussian(spec)
    finally:
        torch.set_default_dtype(before)


def test_gaussian_bulk_draws_do_not_follow_the_global_default_dtype():
    """Values are drawn in fp32 even where a program set float64 as torch's default dtype: the same spec gives the
    same input everywhere (the fp32 and float64 normal samplers consume the generator differently)."""
    spec = GaussianSpec(heads_q=2, heads_kv=1, seq=8, head_dim=64, std=1.5, dtype="fp32", seed=6)
    x, _ = _draws(spec)
    got = _make_under_default_dtype(spec, torch.float64)
    for t in "qkv":
        assert getattr(got, t).dtype == torch.float32
        assert torch.equal(getattr(got, t), x[t]), t


def test_gaussian_outlier_draws_do_not_follow_the_global_default_dtype():
    spec = GaussianSpec(heads_q=1, heads_kv=1, seq=8, head_dim=64, outlier_frac=0.1, dtype="fp32", seed=6)
    assert torch.equal(_make_under_default_dtype(spec, torch.float64).q, make_gaussian(spec).q)


def test_an_entry_whose_uniform_draw_equals_outlier_frac_is_not_an_outlier():
    """Bernoulli(p) as U < p with U uniform on [0, 1): P(U < p) = p exactly. Set p to one of the uniform values this
    seed draws for Q, and that entry must stay without an outlier (U <= p would make it one)."""
    base = GaussianSpec(heads_q=1, heads_kv=1, seq=4, head_dim=64, outlier_frac=0.5, dtype="fp32", seed=2)
    gen = torch.Generator().manual_seed(base.seed)
    for s in ((1, 1, 4, 64),) * 3:  # the bulk draws of q, k, v come first
        torch.randn(s, generator=gen)
    u = torch.rand((1, 1, 4, 64), generator=gen)  # q's outlier mask draws
    p = float(u.flatten()[10])
    spec = dataclasses.replace(base, outlier_frac=p)
    got = make_gaussian(spec)
    assert got.meta["outlier_counts"]["q"] == int((u < p).sum())
    x, _ = _draws(spec)
    assert torch.equal(got.q, x["q"])
    assert float(got.q.flatten()[10]) == float(torch.randn((1, 1, 4, 64), generator=torch.Generator().manual_seed(2))
                                               .flatten()[10])


def test_gaussian_mask_fields_and_hash():
    spec = GaussianSpec(heads_q=2, heads_kv=1, seq=16, head_dim=64, causal=True, window=5, seed=2)
    got = make_gaussian(spec)
    assert got.causal is True and got.window == 5
    assert got.meta["content_hash"] == _sha16(got.q, got.k, got.v, mask="mask:causal=True,window=5")
    assert "outlier_counts" not in got.meta


# -------------------------------------------------------------------------------------------------- content_hash


def test_content_hash_is_sha256_of_dtype_shape_bytes_and_mask():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, generator=gen)
    b = torch.randn(4, generator=gen).to(torch.bfloat16)
    assert content_hash(a, b) == _sha16(a, b)
    assert content_hash(a, b, causal=True) == _sha16(a, b, mask="mask:causal=True,window=None")
    assert content_hash(a, b, window=7) == _sha16(a, b, mask="mask:causal=False,window=7")
    assert content_hash(a, b, causal=1, window=3) == _sha16(a, b, mask="mask:causal=True,window=3")
    assert len(content_hash(a)) == 16
    # a transposed view hashes as its contiguous copy, and the shape is part of the identity
    assert content_hash(a.t()) == content_hash(a.t().contiguous()) == _sha16(a.t())
    assert content_hash(a.reshape(3, 2)) != content_hash(a)
    assert content_hash(a.double()) != content_hash(a)


def test_content_hash_of_a_tensor_that_requires_grad():
    a = torch.ones(3, requires_grad=True)
    assert content_hash(a) == _sha16(a.detach())


# ---------------------------------------------------------------------------------------------- AttentionInput.to


def test_to_the_current_device_returns_the_same_object():
    x = make_gaussian(GaussianSpec(heads_q=1, heads_kv=1, seq=4, head_dim=64))
    assert x.to("cpu") is x
    assert x.to(torch.device("cpu")) is x


def test_to_another_device_moves_q_k_v_and_keeps_everything_else():
    x = make_gaussian(GaussianSpec(heads_q=2, heads_kv=1, seq=4, head_dim=64, causal=True, window=2))
    x.sm_scale = 0.25
    y = x.to("meta")
    assert y is not x
    for t in "qkv":
        moved = getattr(y, t)
        assert moved.device.type == "meta"
        assert moved.shape == getattr(x, t).shape and moved.dtype == getattr(x, t).dtype
        assert getattr(x, t).device.type == "cpu"  # the original is untouched
    assert (y.name, y.causal, y.window, y.sm_scale, y.meta) == (x.name, x.causal, x.window, 0.25, x.meta)
    assert y.to(torch.device("meta")) is y


# ------------------------------------------------------------------------------------------ capture round trip


N_Q, N_KV, SEQ, D = 4, 2, 12, 64


def _write(path, *, model="org/Sub/Model", layer_type="full", captured_heads=tuple(range(N_Q)), causal=False,
           window=None, sm_scale=0.3, layers=(0, 3), finish=True, extra=None):
    gen = torch.Generator().manual_seed(1)
    nq = len(captured_heads)
    meta = {
        "model": model, "model_source": "local", "model_package": "pkg", "model_sha256": "a" * 64,
        "transformers_version": "none", "torch_version": torch.__version__, "text_source": "txt",
        "text_sha256": "b" * 64, "dtype": "bfloat16", "layers": list(layers), "q_heads": list(captured_heads),
        "num_layers": 4, "num_q_heads": N_Q, "num_kv_heads": N_KV, "head_dim": D, "window_offset": 0,
        **(extra or {}),
    }
    written = {}
    group = N_Q // N_KV
    kv_heads = tuple(sorted({h // group for h in captured_heads}))
    with CaptureWriter(path, meta, torch.arange(SEQ)[None]) as w:
        for layer in layers:
            q, k, v = (torch.randn(1, n, SEQ, D, generator=gen).to(torch.bfloat16)
                       for n in (nq, len(kv_heads), len(kv_heads)))
            written[layer] = (q, k, v)
            w.write_layer(LayerRecord(
                layer=layer, layer_type=layer_type, q=q, k=k, v=v, sm_scale=sm_scale, causal=causal,
                window=window, q_heads=tuple(captured_heads), kv_heads=kv_heads,
                kv_head_of_q=tuple(kv_heads.index(h // group) for h in captured_heads),
                num_q_heads=N_Q, num_kv_heads=N_KV))
        if finish:
            w.finish()
    return path, written


def test_capture_round_trip_tensors_and_provenance(tmp_path):
    path, written = _write(tmp_path / "cap.h5", causal=True, window=5, sm_scale=0.3)
    inputs = capture_inputs(path)
    assert [x.meta["layer"] for x in inputs] == [0, 3]
    file_hash = hashlib.sha256(path.read_bytes()).hexdigest()
    for x, layer in zip(inputs, (0, 3), strict=True):
        q, k, v = written[layer]
        assert torch.equal(x.q, q) and torch.equal(x.k, k) and torch.equal(x.v, v)
        assert x.q.is_contiguous() and x.k.is_contiguous() and x.v.is_contiguous()
        assert x.causal is True and x.window == 5
        assert x.sm_scale == pytest.approx(0.3) and isinstance(x.sm_scale, float)
        assert x.name == f"Model-L{layer}-full-s{SEQ}"
        m = x.meta
        assert m["source"] == "capture" and m["file"] == "cap.h5" and m["file_sha256"] == file_hash
        assert (m["model"], m["model_source"], m["model_package"], m["model_sha256"]) == (
            "org/Sub/Model", "local", "pkg", "a" * 64)
        assert (m["text_source"], m["text_sha256"], m["dtype"], m["transformers_version"]) == (
            "txt", "b" * 64, "bfloat16", "none")
        assert int(m["seq_len"]) == SEQ and isinstance(m["created"], str)
        assert m["git_commit"] == git_label()  # capture.version's one format
        assert "torch_version" not in m and "num_q_heads" not in m  # only the listed provenance keys
        assert m["layer"] == layer and isinstance(m["layer"], int)
        assert m["layer_type"] == "full" and m["q_heads"] == [0, 1, 2, 3] and m["kv_heads"] == [0, 1]
        assert m["max_tokens"] is None
        assert m["content_hash"] == _sha16(q, k, v, mask="mask:causal=True,window=5")


def test_capture_names_without_layer_type_from_a_trailing_slash_model(tmp_path):
    path, _ = _write(tmp_path / "a.h5", model="org/Model/", layer_type="", layers=(2,))
    (x,) = capture_inputs(path)
    assert x.name == f"Model-L2-s{SEQ}"
    assert x.meta["layer_type"] == "" and x.causal is False and x.window is None
    assert x.meta["content_hash"] == _sha16(x.q, x.k, x.v)


def test_capture_name_keeps_trailing_letters_of_the_model(tmp_path):
    """Only trailing slashes are stripped from the model id: "acme/TinyX/" is TinyX."""
    path, _ = _write(tmp_path / "x.h5", model="acme/TinyX/", layers=(0,))
    assert capture_inputs(path)[0].name == f"TinyX-L0-full-s{SEQ}"


def test_capture_name_falls_back_to_the_file_stem(tmp_path):
    path, _ = _write(tmp_path / "my_run.h5", model="", layers=(1,))
    assert capture_inputs(path)[0].name == f"my_run-L1-full-s{SEQ}"


def test_a_capture_of_some_heads_says_which(tmp_path):
    path, written = _write(tmp_path / "some.h5", captured_heads=(2, 3), layers=(0,))
    (x,) = capture_inputs(path)
    assert x.name == f"Model-L0-full-h2.3-s{SEQ}"
    assert x.meta["q_heads"] == [2, 3] and x.meta["kv_heads"] == [1]
    assert torch.equal(x.q, written[0][0])


def test_max_tokens_keeps_a_prefix_and_is_recorded(tmp_path):
    path, written = _write(tmp_path / "cap.h5", causal=True, layers=(0,))
    (x,) = capture_inputs(path, max_tokens=5)
    q, k, v = written[0]
    assert torch.equal(x.q, q[:, :, :5]) and torch.equal(x.k, k[:, :, :5]) and torch.equal(x.v, v[:, :, :5])
    assert x.q.is_contiguous()
    assert x.meta["max_tokens"] == 5 and x.name == "Model-L0-full-s5"
    assert x.meta["content_hash"] == _sha16(q[:, :, :5], k[:, :, :5], v[:, :, :5], mask="mask:causal=True,window=None")
    (one,) = capture_inputs(path, max_tokens=1)
    assert one.q.shape == (1, N_Q, 1, D)
    (all_,) = capture_inputs(path, max_tokens=SEQ + 100)
    assert all_.q.shape[2] == SEQ


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "4"])
def test_max_tokens_must_be_a_positive_int(tmp_path, bad):
    path, _ = _write(tmp_path / "cap.h5", layers=(0,))
    with pytest.raises(ValueError) as err:
        capture_inputs(path, max_tokens=bad)
    assert str(err.value) == f"max_tokens must be an int >= 1, got {bad!r}"


def test_missing_capture_file_is_named(tmp_path):
    missing = tmp_path / "nowhere" / "cap.h5"
    with pytest.raises(FileNotFoundError) as err:
        capture_inputs(missing)
    assert str(err.value) == f"capture file not found: {missing}"
    with pytest.raises(FileNotFoundError):
        capture_inputs(tmp_path)  # a directory is not a capture file


def test_a_capture_with_no_layers_is_an_error(tmp_path):
    path, _ = _write(tmp_path / "empty.h5", layers=())
    with pytest.raises(ValueError) as err:
        capture_inputs(path)
    assert str(err.value) == f"{path}: the capture holds no complete layers"


def test_attention_input_from_capture_is_a_valid_attention_input(tmp_path):
    path, _ = _write(tmp_path / "cap.h5", layers=(0,))
    (x,) = capture_inputs(path, heads=[1])
    assert isinstance(x, AttentionInput)
    assert x.shape == {"batch": 1, "heads_q": 1, "heads_kv": 1, "seq_q": SEQ, "seq_k": SEQ, "head_dim": D,
                       "head_dim_v": D}
    assert x.name == f"Model-L0-full-h1-s{SEQ}"


@pytest.mark.gpu
def test_content_hash_of_gpu_tensors_equals_the_cpu_hash():
    """content_hash moves tensors to the CPU first: an input's identity does not depend on where it lives."""
    a = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert content_hash(a.cuda(), causal=True) == content_hash(a, causal=True) == _sha16(a, mask="mask:causal=True,"
                                                                                          "window=None")
    x = make_gaussian(GaussianSpec(heads_q=2, heads_kv=1, seq=16, head_dim=64, seed=1))
    y = x.to("cuda")
    assert y.q.is_cuda and content_hash(y.q, y.k, y.v) == x.meta["content_hash"]


# ------------------------------------------------------------------------ memory check before a capture is read
# Free memory is the one collaborator set here (the host's for the read, the device's for the run, each patched
# where it is looked up), so the refusals and their messages are exact.

BIG = 2**40  # declared tokens: HDF5 declares such a dimension without storing it


def _declared_big(info, layer):
    """``info`` with ``layer`` declared at BIG tokens (bf16, 2 bytes a value), as open_capture would read it."""
    shapes = {"q": (1, N_Q, BIG, D), "k": (1, N_KV, BIG, D), "v": (1, N_KV, BIG, D)}
    return dataclasses.replace(info, datasets={**info.datasets, layer: {n: (s, 2) for n, s in shapes.items()}})


def _host_free(monkeypatch, host, device=2**62):
    monkeypatch.setattr(attention_input, "available_bytes", lambda dev: host)
    monkeypatch.setattr(device_module, "available_bytes", lambda dev: device)


def test_a_layer_too_big_to_read_is_refused_in_one_line(tmp_path, monkeypatch):
    path, _ = _write(tmp_path / "cap.h5")
    info = _declared_big(open_capture(path), 3)
    _host_free(monkeypatch, 8 * 2**30)
    with pytest.raises(ValueError) as e:
        check_capture_memory(info, layers=[3, 0])
    need = 3 * (N_Q + 2 * N_KV) * BIG * D * 2  # three copies of the stored bytes
    assert str(e.value) == (
        f"{path}: layer 3 declares q (1, {N_Q}, {BIG}, {D}), k (1, {N_KV}, {BIG}, {D}), v (1, {N_KV}, {BIG}, {D}): "
        f"reading it needs about {need / 2**30:.1f} GiB, but the host has 8.0 GiB free (use another capture, or "
        "fewer --layers)")
    check_capture_memory(info, layers=[0])  # only the layers asked for are checked
    _host_free(monkeypatch, None)  # free memory unknown: the read is not refused
    check_capture_memory(open_capture(path))


def test_a_read_needing_exactly_the_free_memory_is_accepted(tmp_path, monkeypatch):
    path, _ = _write(tmp_path / "cap.h5")
    info = open_capture(path)
    _host_free(monkeypatch, 3 * info.read_bytes(0))
    check_capture_memory(info, layers=[0])
    _host_free(monkeypatch, 3 * info.read_bytes(0) - 1)
    with pytest.raises(ValueError, match=r"layer 0 declares .* but the host has"):
        check_capture_memory(info, layers=[0])


def test_the_run_check_counts_the_selected_layers_heads_and_tokens_on_the_device(tmp_path, monkeypatch):
    path, _ = _write(tmp_path / "cap.h5")
    _host_free(monkeypatch, 2**62, device=2**10)  # the read fits; the run (tens of kB) does not fit in 1 kiB
    with pytest.raises(ValueError) as e:
        capture_inputs(path, layers=[3], heads=[0], max_tokens=5, device="meta")
    assert str(e.value).startswith(f"{path}: layer 3 (batch 1, heads 1/1, seq 5/5, head dim {D}/{D}) needs about ")
    assert "but meta has 0.0 GiB free" in str(e.value)
