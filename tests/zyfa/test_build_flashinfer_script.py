"""scripts/build_flashinfer_fa3.py's checks before it fetches or builds anything, its pins, and the bench's peer
when FlashInfer is not there (CPU; the build itself needs network and nvcc and is run by hand, docs/real_kernels.md)."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.load_file import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("build_flashinfer_fa3")


def test_every_download_is_pinned_by_sha256(script):
    items = [script.FLASHINFER, script.CURAND, *script.TVM_FFI.values()]
    for project, filename, sha in items:
        assert re.fullmatch(r"[0-9a-f]{64}", sha), (project, filename)
        assert filename.replace("_", "-").lower().startswith(project.replace("_", "-").lower())
        assert filename.endswith(".whl")
    assert script.FLASHINFER[1] == f"flashinfer_python-{script.VERSION}-py3-none-any.whl"
    assert script.DEVICE_PYTHON in script.TVM_FFI and script.TVM_FFI["cp312"][1].count("cp312") == 2


def test_missing_import_time_dependencies_are_named_before_anything_is_fetched(script, monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("pynvml", "einops") else
                        real(name, *a))
    monkeypatch.setattr(script, "_fetch", lambda *a: pytest.fail("fetched before the dependency check"))
    with pytest.raises(SystemExit) as e:
        script.main(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    msg = str(e.value)
    assert "python3 -m pip install" in msg and "nvidia-ml-py" in msg and "einops" in msg
    assert not (tmp_path / "out").exists()  # nothing written


def test_bad_head_dims_are_refused_before_anything_is_fetched(script, monkeypatch, tmp_path):
    monkeypatch.setattr(script, "_fetch", lambda *a: pytest.fail("fetched before the check"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # every dependency "present"
    monkeypatch.setattr(script.shutil, "which", lambda name: "/usr/bin/" + name)
    for bad in ("96", "128,x", ""):
        with pytest.raises(SystemExit, match="--head-dims takes some of 64,128,256"):
            script.main(["--out", str(tmp_path / "out"), "--head-dims", bad])
    assert not (tmp_path / "out").exists()


def test_cuda_home_from_the_environment(script, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert script._cuda_home() == tmp_path


def test_bench_peer_without_flashinfer_says_why(tmp_path):
    """Without a GPU (or without the pack) the bench's FlashInfer row fails with the reason and the way to get
    it, not an import traceback."""
    import torch

    from zyfa.peers.registry import prepare

    if torch.cuda.is_available():
        pytest.skip("checks the reason given on a machine without a GPU")
    q = torch.randn(1, 2, 64, 128)
    with pytest.raises(RuntimeError, match=r"no CUDA device \(scripts/build_flashinfer_fa3.py"):
        prepare("flashinfer-fa3", q, q, q, causal=False, sm_scale=0.1)
