"""Capture from the real SmolLM2 package: logits unchanged, bit-exact round trip, resume, bad input."""

from __future__ import annotations

import argparse

import h5py
import numpy as np
import pytest
import torch
from zyfa.capture.hook import QKVRecorder, swap_attention
from zyfa.capture.models import ContextTooLongError
from zyfa.capture.pipeline import run_capture
from zyfa.capture.store import open_capture, read_capture, read_token_ids

N_TOKENS, LAYERS, HEADS = 96, [0, 29], [0, 4]  # as in conftest.py's capture_file


def _logits(lm, ids):
    with torch.no_grad():
        return lm.model(input_ids=ids, use_cache=False).logits


def test_logits_with_hook_identical_to_stock_sdpa(smollm2, window):
    ids = torch.tensor([window.ids])
    assert smollm2.model.config._attn_implementation == "sdpa"
    ref = _logits(smollm2, ids)
    calls = []
    with swap_attention(smollm2.model, QKVRecorder(smollm2.model, calls.append)):
        out = _logits(smollm2, ids)
    assert smollm2.model.config._attn_implementation == "sdpa"  # restored
    assert (out - ref).abs().max().item() == 0.0
    assert [c.layer for c in calls] == list(range(30))
    c = calls[0]
    assert c.q.shape == (1, 9, N_TOKENS, 64) and c.k.shape == (1, 3, N_TOKENS, 64)
    assert (c.sm_scale, c.causal, c.window, c.layer_type) == (0.125, True, None, "full_attention")


def test_swap_any_function_into_selected_layers(smollm2, window):
    """The mechanism an FP8 emulator will use: a foreign attention function in some layers only."""
    ids = torch.tensor([window.ids])
    seen = []

    def fp64_attention(module, query, key, value, attention_mask, *, scaling, **kwargs):
        seen.append(module.layer_idx)
        g = query.shape[1] // key.shape[1]
        k = key.double().repeat_interleave(g, dim=1)
        v = value.double().repeat_interleave(g, dim=1)
        s = query.double() @ k.transpose(-1, -2) * scaling
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.softmax(s, dim=-1) @ v
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    ref = _logits(smollm2, ids)
    with swap_attention(smollm2.model, fp64_attention, layers=[3, 7]) as swapped:
        assert swapped == [3, 7]
        out = _logits(smollm2, ids)
    assert seen == [3, 7]
    diff = (out - ref).abs().max().item()
    assert 0 < diff < 1e-2, diff  # a different but correct attention: close, not identical
    assert (_logits(smollm2, ids) - ref).abs().max().item() == 0.0  # swap undone
    with pytest.raises(ValueError, match=r"layers \[30\] do not exist"), \
            swap_attention(smollm2.model, fp64_attention, layers=[30]):
        pass


def test_round_trip_is_bit_exact(smollm2, window, capture_file):
    ids = torch.tensor([window.ids])
    calls = {}
    rec = QKVRecorder(smollm2.model, lambda c: calls.__setitem__(c.layer, c), layers=LAYERS, heads=HEADS)
    with torch.no_grad(), swap_attention(smollm2.model, rec):
        smollm2.model(input_ids=ids, use_cache=False)
    recs = list(read_capture(capture_file))
    assert [r.layer for r in recs] == LAYERS
    for r in recs:
        c = calls[r.layer]
        for n in "qkv":
            a, b = getattr(c, n), getattr(r, n)
            assert b.dtype == torch.float32 and torch.equal(a.view(torch.int32), b.view(torch.int32)), n
        assert r.q_heads == (0, 4) and r.kv_heads == (0, 1)
        assert (r.sm_scale, r.causal, r.window) == (0.125, True, None)
    assert torch.equal(read_token_ids(capture_file), ids)
    meta = open_capture(capture_file).attrs
    assert meta["model_sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert meta["seq_len"] == N_TOKENS and meta["complete"] and meta["text_source"] == "lee"


def _datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def test_interrupted_capture_resumes_to_same_data(smollm2, capture_file, tmp_path):
    path = tmp_path / "part.h5"
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_capture("smollm2", "lee", N_TOKENS, path, layers=LAYERS, heads=HEADS, loaded=smollm2,
                    progress=False, _fail_after_layers=1)
    info = open_capture(path)
    assert not info.complete and info.complete_layers == [0]
    res = run_capture("smollm2", "lee", N_TOKENS, path, layers=LAYERS, heads=HEADS, loaded=smollm2,
                      progress=False)
    assert res.layers_skipped == [0] and res.layers_written == [29]
    a, b = _datasets(capture_file), _datasets(path)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name].view(np.uint8), b[name].view(np.uint8))
    assert open_capture(path).complete


def test_context_too_long_and_bad_layers(smollm2, tmp_path):
    out = tmp_path / "x.h5"
    with pytest.raises(ContextTooLongError, match="8193 tokens is longer than smollm2's context of 8192"):
        run_capture("smollm2", "lee", 8193, out, loaded=smollm2, progress=False)
    with pytest.raises(ValueError, match=r"layers \[30\] do not exist"):
        run_capture("smollm2", "lee", 64, out, layers=[30], loaded=smollm2, progress=False)
    with pytest.raises(ValueError, match=r"heads \[9\] do not exist"):
        run_capture("smollm2", "lee", 64, out, heads=[9], loaded=smollm2, progress=False)
    assert not out.exists()


def test_cli_reports_bad_input(capsys, tmp_path):
    from zyfa.capture import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    rc = cli.main(parser.parse_args(["--model", "llama-9000", "--out", str(tmp_path / "x.h5"), "--no-progress"]))
    err = capsys.readouterr().err
    assert rc == 2 and "unknown model 'llama-9000'" in err and "smollm2" in err and "qwen25coder" in err
    assert cli.main(parser.parse_args(["--list"])) == 0
    assert "gemma3" in capsys.readouterr().out
