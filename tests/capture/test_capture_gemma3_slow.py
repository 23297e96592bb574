"""Gemma-3 (slow: a 253 MB model): the sliding-window mask survives the hook, and logits stay identical."""

from __future__ import annotations

import pytest
import torch
from zyfa.capture.hook import QKVRecorder, swap_attention

pytestmark = pytest.mark.slow


def test_gemma3_sliding_window_capture():
    from zyfa.capture.models import load_model
    from zyfa.capture.text import token_window

    lm = load_model("gemma3")
    win = token_window(lm.tokenizer, "lee", 600, 0)  # longer than the 512 window: a real mask on local layers
    assert win.n_prefix == 1 and win.ids[0] == lm.tokenizer.bos_token_id
    ids = torch.tensor([win.ids])
    with torch.no_grad():
        ref = lm.model(input_ids=ids, use_cache=False).logits
        calls = []
        with swap_attention(lm.model, QKVRecorder(lm.model, calls.append, layers=[0, 5])):
            out = lm.model(input_ids=ids, use_cache=False).logits
    assert (out - ref).abs().max().item() == 0.0
    sliding, full = calls
    assert (sliding.layer_type, sliding.window, full.layer_type, full.window) == (
        "sliding_attention", 512, "full_attention", None)
    assert sliding.sm_scale == full.sm_scale == 256**-0.5 and sliding.k.shape == (1, 1, 600, 256)
