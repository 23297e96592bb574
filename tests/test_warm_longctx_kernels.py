"""scripts/warm_longctx_kernels.py compiles, before a long-context run, the Triton variants each registry model
launches: every model has its attention geometry there (the 1.5B's head dim 128 was missing, so its kernels
compiled one after another inside the timed grid), and ``--models`` keeps a plan's models only."""

from __future__ import annotations

import pytest
from zyfa.capture.models import MODELS

from tests.load_file import load_script

warm = load_script("warm_longctx_kernels")


def test_every_registry_model_has_its_geometry():
    by_model = {}
    for name, h, h_kv, d, window in warm.GEOMETRIES:
        by_model.setdefault(warm.model_of(name), []).append((h, h_kv, d, window))
    assert set(by_model) == set(MODELS)
    for model, geos in by_model.items():
        spec = MODELS[model]
        assert all(d == spec.head_dim and h == spec.heads_q for h, _, d, _ in geos), model
    assert by_model["qwen25coder-1.5b"] == [(12, 2, 128, None)]
    assert warm.model_of("gemma3-local") == "gemma3" and warm.model_of("qwen25coder-1.5b") == "qwen25coder-1.5b"


def test_models_keep_their_geometries_only():
    todo = warm.tasks(["fa3", "fa3:k_smoothing=true"], ["qwen25coder-1.5b"])
    assert todo == [("fa3", "qwen25coder-1.5b", 12, 2, 128, None),
                    ("fa3:k_smoothing=true", "qwen25coder-1.5b", 12, 2, 128, None)]
    assert [t[1] for t in warm.tasks(["zyfa"], ["gemma3"])] == ["gemma3", "gemma3-local"]
    assert len(warm.tasks(["zyfa", "ck"])) == 2 * len(warm.GEOMETRIES)  # no --models: every geometry
    with pytest.raises(ValueError, match="no geometry for 'llama'"):
        warm.tasks(["zyfa"], ["llama"])
