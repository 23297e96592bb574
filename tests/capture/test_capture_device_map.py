"""``zyfa capture --device-map``: a model placed through accelerate's device_map captures the same Q/K/V as the
plain path (on CPU: a single-device map and a per-module map), and a bad map is one line, exit 2."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from zyfa.capture.models import parse_device_map
from zyfa.capture.pipeline import run_capture

pytest.importorskip("accelerate", reason="--device-map needs accelerate")


def _tensors(path) -> dict[str, np.ndarray]:
    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return found


def test_parse_device_map():
    assert parse_device_map(None) is None
    assert parse_device_map("auto") == "auto"
    assert parse_device_map("cpu") == {"": "cpu"}
    assert parse_device_map("1") == {"": 1}
    assert parse_device_map('{"model.layers.0": 0, "": "cpu"}') == {"model.layers.0": 0, "": "cpu"}
    for bad, said in (("nowhere", "is not a device"), ("{nope", "not a JSON object"), ("[1]", "is not a device"),
                      ('{"a": true}', "must be a GPU index"), ("missing.json", "cannot read")):
        with pytest.raises(ValueError, match=said):
            parse_device_map(bad)


def test_device_map_captures_the_same_tensors(tiny_gemma3_dir, tmp_path):
    model = str(tiny_gemma3_dir)
    plain, one, per = tmp_path / "plain.h5", tmp_path / "one.h5", tmp_path / "per.h5"
    run_capture(model, "pydoc", 48, plain, progress=False)
    run_capture(model, "pydoc", 48, one, progress=False, device_map=parse_device_map("cpu"))
    per_module = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    run_capture(model, "pydoc", 48, per, progress=False, device_map=per_module)
    a = _tensors(plain)
    assert a, "the capture holds datasets"
    for other in (one, per):
        b = _tensors(other)
        assert sorted(b) == sorted(a)
        for k in a:
            assert np.array_equal(a[k], b[k]), k


def test_bad_device_map_is_one_line(tmp_path, capsys):
    from zyfa.cli import main

    assert main(["capture", "--model", "smollm2", "--out", str(tmp_path / "x.h5"), "--device-map", "gpu9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device-map" in err[0]
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.slow
def test_smollm2_device_map_equals_plain(capture_file, tmp_path):
    from tests.capture.conftest import HEADS, LAYERS, N_TOKENS

    out = tmp_path / "mapped.h5"
    run_capture("smollm2", "lee", N_TOKENS, out, layers=LAYERS, heads=HEADS, progress=False,
                device_map=parse_device_map("cpu"))
    a, b = _tensors(capture_file), _tensors(out)
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
