"""SmolLM2 through the real package, and a tiny random-weight Llama for the attention path (fast, any device)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="long-context tests need the 'capture' extra (transformers, gguf)")
pytest.importorskip("gguf", reason="long-context tests need the 'capture' extra (transformers, gguf)")


@pytest.fixture(scope="session")
def smollm2():
    from zyfa.capture.models import load_model

    return load_model("smollm2")


def tiny_llama(*, heads=4, kv_heads=2, head_dim=64, layers=2, window=None, seed=0):
    """A randomly initialised transformers Llama (or Mistral, with a sliding window), eval mode, fp32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    kw = dict(vocab_size=128, hidden_size=heads * head_dim, intermediate_size=128, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
              max_position_embeddings=1024, attn_implementation="sdpa")
    if window is not None:
        model = MistralForCausalLM(MistralConfig(sliding_window=window, **kw))
    else:
        model = LlamaForCausalLM(LlamaConfig(**kw))
    return model.eval()
