"""The recipe adaptor inside a real model (SmolLM2, a short held-out window): fidelity, effect, locality."""

from __future__ import annotations

import torch
from zyfa.accuracy.impact.model import (
    RecipeAttention,
    compare_logits,
    final_hidden,
    logits_from_hidden,
    stock_logits,
)
from zyfa.capture.hook import swap_attention


def test_head_matches_model_logits(smollm2, ids, stock):
    with torch.no_grad():
        full = smollm2.model(ids, use_cache=False).logits[0]
    assert torch.equal(stock[1], full.float())
    # a 5-row matmul may block differently from a 96-row one: equal to fp32 rounding
    assert torch.allclose(logits_from_hidden(smollm2.model, stock[0][:5]), full[:5].float(), rtol=0, atol=1e-4)


def test_compare_with_itself_is_zero(smollm2, ids, stock):
    c = compare_logits(smollm2.model, stock[1], None, ids[0])
    assert c["kl"].max() == 0.0
    assert c["nll_ref"] == c["nll_test"]
    assert c["top1_agree"] == 1.0
    assert c["n_scored"] == ids.shape[1] - 1
    assert 1.0 < c["nll_ref"] < 8.0  # a sane language model on news text


def test_fp32_recipe_reproduces_stock_logits(smollm2, ids, stock):
    calls = []
    fn = RecipeAttention("fp32", on_layer=calls.append)
    with swap_attention(smollm2.model, fn):
        h = final_hidden(smollm2.model, ids)
    assert calls == list(range(30))  # every layer ran the emulator
    logits = stock_logits(smollm2.model, h)
    ref = stock[1]
    rel = float((logits - ref).abs().max() / ref.abs().max())
    assert rel < 1e-3, rel
    c = compare_logits(smollm2.model, ref, h, ids[0])
    assert c["kl"].mean() < 1e-6
    assert c["top1_agree"] == 1.0
    assert abs(c["nll_test"] - c["nll_ref"]) < 1e-4
    # the swap is undone on exit: stock attention again, bit for bit
    assert torch.equal(final_hidden(smollm2.model, ids), stock[0])


def test_fp8_recipe_changes_logits(aiter_all):
    assert aiter_all["kl"].mean() > 1e-5  # far above the fp32 control's ~1e-11
    assert aiter_all["top1_agree"] < 1.0 or aiter_all["kl"].max() > 1e-4


def test_one_layer_swap_changes_only_from_that_layer_on(smollm2, ids, stock, aiter_all):
    dec = smollm2.model.get_decoder()
    with torch.no_grad():
        ref = dec(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states
        with swap_attention(smollm2.model, RecipeAttention("aiter"), layers=[29]):
            out = dec(input_ids=ids, use_cache=False, output_hidden_states=True)
    hs = out.hidden_states
    for i in range(30):  # the inputs of layers 0..29 are untouched
        assert torch.equal(hs[i], ref[i]), i
    assert not torch.equal(out.last_hidden_state, stock[0])
    one = compare_logits(smollm2.model, stock[1], out.last_hidden_state[0], ids[0])
    assert 0 < one["kl"].mean() < aiter_all["kl"].mean()


def test_output_layout_and_dtype():
    from types import SimpleNamespace

    torch.manual_seed(0)
    q = torch.randn(1, 4, 40, 16, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 40, 16, dtype=torch.bfloat16)
    v = torch.randn(1, 2, 40, 16, dtype=torch.bfloat16)
    mod = SimpleNamespace(layer_idx=3, is_causal=True, scaling=0.25, training=False)
    out, w = RecipeAttention("fp32")(mod, q, k, v, None, scaling=0.25)
    assert w is None and out.shape == (1, 40, 4, 16) and out.dtype == torch.bfloat16
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(2, 1),
                                                           v.float().repeat_interleave(2, 1), is_causal=True,
                                                           scale=0.25)
    assert torch.allclose(out.float(), ref.transpose(1, 2).to(torch.bfloat16).float(), atol=1e-2)
