"""One SmolLM2, loaded once per session through the real package (as tests/capture does), and a short window."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="impact tests need the 'capture' extra (transformers, gguf)")
pytest.importorskip("gguf", reason="impact tests need the 'capture' extra (transformers, gguf)")

N_TOKENS = 96


@pytest.fixture(scope="session")
def smollm2():
    from zyfa.capture.models import load_model

    return load_model("smollm2")


@pytest.fixture(scope="session")
def ids(smollm2):
    import torch
    from zyfa.capture.text import token_window

    tw = token_window(smollm2.tokenizer, "lee", N_TOKENS, 0, split="heldout")
    return torch.tensor([tw.ids], dtype=torch.long)


@pytest.fixture(scope="session")
def stock(smollm2, ids):
    """(final hidden state, fp32 logits) of the stock (sdpa) pass."""
    from zyfa.accuracy.impact.model import final_hidden, stock_logits

    h = final_hidden(smollm2.model, ids)
    return h, stock_logits(smollm2.model, h)


@pytest.fixture(scope="session")
def aiter_all(smollm2, ids, stock):
    """compare_logits of the all-layer aiter swap against stock."""
    from zyfa.accuracy.impact.model import RecipeAttention, compare_logits, final_hidden
    from zyfa.capture.hook import swap_attention

    with swap_attention(smollm2.model, RecipeAttention("aiter")):
        h = final_hidden(smollm2.model, ids)
    return compare_logits(smollm2.model, stock[1], h, ids[0])
