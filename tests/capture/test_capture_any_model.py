"""Any Hugging Face model directory works; a model without the attention interface is refused clearly."""

from __future__ import annotations

import pytest
import torch
from zyfa.capture.models import NoAttentionInterfaceError, load_model
from zyfa.capture.pipeline import run_capture
from zyfa.capture.store import read_capture


def _tiny_dir(tmp_path, smollm2, config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    path = tmp_path / config.model_type
    model.save_pretrained(path)
    smollm2.tokenizer.save_pretrained(path)
    return path


def test_hf_directory_capture(smollm2, tmp_path):
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=smollm2.model.config.vocab_size, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    path = _tiny_dir(tmp_path, smollm2, cfg)
    out = tmp_path / "tiny.h5"
    run_capture(str(path), "pydoc", 48, out, heads=[1, 2], progress=False)
    recs = list(read_capture(out))
    assert [r.layer for r in recs] == [0, 1]
    assert recs[0].q.shape == (1, 2, 48, 8) and recs[0].kv_heads == (0, 1)
    assert recs[0].meta["model_source"] == "path" and len(recs[0].meta["model_sha256"]) == 64
    from zyfa.capture.models import ContextTooLongError

    with pytest.raises(ContextTooLongError, match="context of 128 tokens"):
        run_capture(str(path), "pydoc", 129, tmp_path / "long.h5", progress=False)


def test_model_without_attention_interface(smollm2, tmp_path):
    from transformers import BloomConfig

    path = _tiny_dir(tmp_path, smollm2, BloomConfig(vocab_size=smollm2.model.config.vocab_size, hidden_size=16,
                                                     n_layer=1, n_head=2))
    with pytest.raises(NoAttentionInterfaceError, match="does not route its attention through"):
        load_model(str(path))
