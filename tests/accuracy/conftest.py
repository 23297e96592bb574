"""Fixtures of the accuracy tests: a tiny capture file written through capture.store's own writer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from zyfa.capture.record import LayerRecord
from zyfa.capture.writer import CaptureWriter

N_Q, N_KV, SEQ, D = 6, 2, 96, 64


def write_tiny_capture(path: Path, layers=(0, 1, 2)) -> Path:
    """Layers of GQA 6:2 attention, head dim 64, 96 tokens, bf16; layer 1 is a sliding-window layer."""
    gen = torch.Generator().manual_seed(7)
    meta = {
        "model": "test/TinyModel", "model_source": "test", "model_package": "none", "model_sha256": "0" * 64,
        "transformers_version": "none", "torch_version": torch.__version__, "text_source": "test",
        "text_sha256": "1" * 64, "dtype": "bfloat16", "layers": list(layers), "q_heads": list(range(N_Q)),
        "num_layers": len(layers), "num_q_heads": N_Q, "num_kv_heads": N_KV, "head_dim": D,
        "window_offset": 0,
    }
    with CaptureWriter(path, meta, torch.arange(SEQ)[None]) as w:
        for layer in layers:
            q, k, v = (torch.randn(1, n, SEQ, D, generator=gen).to(torch.bfloat16) for n in (N_Q, N_KV, N_KV))
            w.write_layer(LayerRecord(
                layer=layer, layer_type="sliding" if layer == 1 else "full", q=q, k=k, v=v, sm_scale=D**-0.5,
                causal=True, window=32 if layer == 1 else None, q_heads=tuple(range(N_Q)),
                kv_heads=tuple(range(N_KV)), kv_head_of_q=tuple(h // (N_Q // N_KV) for h in range(N_Q)),
                num_q_heads=N_Q, num_kv_heads=N_KV))
        w.finish()
    return path


@pytest.fixture
def tiny_capture(tmp_path):
    """Factory: tiny_capture(layers=(0, 1, 2)) -> path of a fresh capture file under tmp_path."""
    def make(layers=(0, 1, 2), name="tiny.h5"):
        return write_tiny_capture(tmp_path / name, layers)
    return make
