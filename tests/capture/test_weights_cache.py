"""The weights cache on the real SmolLM2 (loaded from its GGUF file once per session): a cached load gives the same
logits bit for bit, a damaged or stale entry is not used, and a failed store leaves nothing behind."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from zyfa.capture import weights_cache
from zyfa.capture.models import MODELS, fetch_model, load_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A temporary cache holding the verified SmolLM2 GGUF file (linked), with smollm2 caching its weights."""
    real = fetch_model("smollm2")  # from the user cache (fetched there once)
    monkeypatch.setenv("ZYFA_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / real.name).symlink_to(real)
    monkeypatch.setitem(MODELS, "smollm2", replace(MODELS["smollm2"], cache_weights=True))
    return tmp_path


def _logits(lm):
    ids = lm.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        return lm.model(input_ids=ids, use_cache=False).logits


def test_a_cached_load_is_bit_identical_and_a_bad_entry_is_not_used(cache, smollm2, capsys):
    sha = MODELS["smollm2"].file_sha256
    entry = weights_cache.store(smollm2.model, smollm2.tokenizer, sha, "float32")
    assert entry == weights_cache.weights_dir(sha, "float32") and entry.parent == cache / "weights"
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name]  # no temporary folder left
    manifest = json.loads((entry / weights_cache.MANIFEST).read_text())
    assert manifest["key"] == weights_cache.weights_key(sha, "float32")
    assert "config.json" in manifest["files"] and "tokenizer.json" in manifest["files"]

    seen = []
    lm = load_model("smollm2", progress=lambda stage, done, total: seen.append(stage))
    assert lm.provenance["model_weights"] == f"cached dequantized weights {entry.name} (sha256-checked)"
    assert "verify cached weights" in seen and getattr(lm.model, "hf_quantizer", None) is None
    assert torch.equal(_logits(lm), _logits(smollm2))
    assert lm.tokenizer("def f(x):\n    return x")["input_ids"] == smollm2.tokenizer("def f(x):\n    return x")[
        "input_ids"]

    shard = next(entry.glob("model-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # same size, one bit off
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert weights_cache.lookup(sha, "float32") is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{shard.name} does not match its sha256" in err and not entry.exists()


def test_an_entry_made_by_other_versions_is_not_used(cache, capsys):
    sha = MODELS["smollm2"].file_sha256
    entry = weights_cache.weights_dir(sha, "float32")
    entry.mkdir(parents=True)
    stale = {**weights_cache.weights_key(sha, "float32"), "transformers": "0.0.1"}
    (entry / "config.json").write_text("{}")
    (entry / weights_cache.MANIFEST).write_text(json.dumps({"key": stale, "files": {"config.json": {
        "size": 2, "sha256": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"}}}))
    assert weights_cache.lookup(sha, "float32") is None and not entry.exists()
    assert "not used (made for" in capsys.readouterr().err
    assert weights_cache.lookup(sha, "bfloat16") is None  # another dtype is another entry


class _FailingTokenizer:
    def save_pretrained(self, folder):
        raise OSError(28, "No space left on device")


def test_a_failed_store_leaves_nothing(cache, smollm2):
    sha = MODELS["smollm2"].file_sha256
    with pytest.raises(OSError, match="No space left"):
        weights_cache.store(smollm2.model, _FailingTokenizer(), sha, "float32")
    assert not any((cache / "weights").iterdir())
    assert weights_cache.lookup(sha, "float32") is None
