"""Sliding-window capture through the real hook, on a tiny random Gemma-3 (CPU, seconds).

The captured window, causal flag and softmax scale must reproduce the attention module's real output: the
output is recomputed by hand in float64 from the captured q, k, v, and must not match with the window off by
one or dropped. The logits must stay bit-identical to stock sdpa, and the window must survive the HDF5 store.
"""

from __future__ import annotations

import torch
from zyfa.capture.hook import QKVRecorder, swap_attention
from zyfa.capture.pipeline import run_capture
from zyfa.capture.store import read_capture
from zyfa.capture.text import token_window

from tests.capture.tiny_model import HEAD_DIM, N_KV, N_Q, QUERY_PRE_ATTN_SCALAR, WINDOW

SEQ = 40  # five windows long: most rows see a truncated window


def _attention_by_hand(q, k, v, kv_of_q, sm_scale, causal, window):
    """float64 softmax(q k^T * scale, masked) v, one query head at a time; key j is seen from p if
    (not causal or j <= p) and (window is None or j > p - window)."""
    q, k, v = q.double(), k.double(), v.double()
    s = q.shape[2]
    p = torch.arange(s).view(-1, 1)
    j = torch.arange(s).view(1, -1)
    keep = torch.ones(s, s, dtype=torch.bool)
    if causal:
        keep &= j <= p
    if window is not None:
        keep &= j > p - window
    out = torch.empty_like(q)
    for h, kv in enumerate(kv_of_q):
        scores = (q[:, h] @ k[:, kv].transpose(-1, -2)) * sm_scale
        scores = scores.masked_fill(~keep, float("-inf"))
        out[:, h] = torch.softmax(scores, dim=-1) @ v[:, kv]
    return out


def _run(lm, ids, **recorder):
    """Stock logits, then logits, records and module outputs with the recorder swapped into every layer."""
    with torch.no_grad():
        ref = lm.model(input_ids=ids, use_cache=False).logits
    calls, outs = {}, {}
    rec = QKVRecorder(lm.model, lambda c: calls.__setitem__(c.layer, c), **recorder)

    def spy(module, query, key, value, attention_mask, **kwargs):
        out = rec(module, query, key, value, attention_mask, **kwargs)
        outs[module.layer_idx] = out[0].transpose(1, 2)  # (b, s, h, d) -> (b, h, s, d)
        return out

    with torch.no_grad(), swap_attention(lm.model, spy):
        logits = lm.model(input_ids=ids, use_cache=False).logits
    return ref, logits, calls, outs


def test_captured_window_reproduces_the_module_output(tiny_gemma3):
    win = token_window(tiny_gemma3.tokenizer, "pydoc", SEQ, 0)
    ids = torch.tensor([win.ids])
    ref, logits, calls, outs = _run(tiny_gemma3, ids)
    assert torch.equal(logits, ref)  # the hook changes nothing
    sliding, full = calls[0], calls[1]
    assert (sliding.layer_type, sliding.window, full.layer_type, full.window) == (
        "sliding_attention", WINDOW, "full_attention", None)
    assert sliding.sm_scale == full.sm_scale == QUERY_PRE_ATTN_SCALAR**-0.5 != HEAD_DIM**-0.5
    assert sliding.causal and full.causal
    assert sliding.q.shape == (1, N_Q, SEQ, HEAD_DIM) and sliding.k.shape == (1, N_KV, SEQ, HEAD_DIM)
    assert sliding.kv_head_of_q == (0, 0, 1, 1)
    for c in (sliding, full):
        real = outs[c.layer].double()
        mine = _attention_by_hand(c.q, c.k, c.v, c.kv_head_of_q, c.sm_scale, c.causal, c.window)
        assert (mine - real).abs().max().item() < 1e-5, c.layer
    # the check can fail: a window off by one, or none, does not reproduce the sliding layer
    c, real = sliding, outs[0].double()
    for wrong in (WINDOW - 1, WINDOW + 1, None):
        other = _attention_by_hand(c.q, c.k, c.v, c.kv_head_of_q, c.sm_scale, c.causal, wrong)
        assert (other - real).abs().max().item() > 1e-3, wrong
    # and the project's float64 reference, which the accuracy runner uses, agrees with the module
    from zyfa.reference.attention import attention_fp64

    k = c.k[:, list(c.kv_head_of_q)]
    v = c.v[:, list(c.kv_head_of_q)]
    ref_out, _ = attention_fp64(c.q, k, v, causal=c.causal, sm_scale=c.sm_scale, window=c.window)
    assert (ref_out.double() - real).abs().max().item() < 1e-5


def test_window_survives_the_store(tiny_gemma3, tiny_gemma3_dir, tmp_path):
    out = tmp_path / "tiny.h5"
    run_capture(str(tiny_gemma3_dir), "pydoc", SEQ, out, loaded=tiny_gemma3, progress=False)
    win = token_window(tiny_gemma3.tokenizer, "pydoc", SEQ, 0)
    _, _, calls, _ = _run(tiny_gemma3, torch.tensor([win.ids]))
    recs = list(read_capture(out))
    assert [(r.layer, r.layer_type, r.window) for r in recs] == [
        (0, "sliding_attention", WINDOW), (1, "full_attention", None)]
    for r in recs:
        c = calls[r.layer]
        assert r.sm_scale == c.sm_scale and r.causal
        assert all(torch.equal(getattr(r, n), getattr(c, n)) for n in "qkv")


def test_long_layers_run_in_query_chunks_with_the_same_pattern(tiny_gemma3):
    """A layer whose fp32 scores exceed ``chunk_above_bytes`` runs through ``chunked_attention`` (what keeps a 32K
    capture of 12 heads from materializing 48 GiB): here 3 query rows per chunk, so chunks cut through the sliding
    window; the module outputs still match the float64 attention of the recorded pattern, and the logits stock's."""
    win = token_window(tiny_gemma3.tokenizer, "pydoc", SEQ, 0)
    ids = torch.tensor([win.ids])
    ref, logits, calls, outs = _run(tiny_gemma3, ids, chunk_above_bytes=4 * N_Q * SEQ * 3)
    assert (logits - ref).abs().max().item() < 1e-4
    for c in calls.values():
        real = outs[c.layer].double()
        mine = _attention_by_hand(c.q, c.k, c.v, c.kv_head_of_q, c.sm_scale, c.causal, c.window)
        assert (mine - real).abs().max().item() < 1e-5, c.layer
    # a window ignored by the chunks would show: the sliding layer's output differs without it
    c = calls[0]
    other = _attention_by_hand(c.q, c.k, c.v, c.kv_head_of_q, c.sm_scale, c.causal, None)
    assert (other - outs[0].double()).abs().max().item() > 1e-3
