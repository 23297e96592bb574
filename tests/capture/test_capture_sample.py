"""The shipped sample in datasets/: present, valid, complete, small, with a card each."""

from __future__ import annotations

from pathlib import Path

import pytest
from zyfa.capture.sample import SAMPLES
from zyfa.capture.store import open_capture, read_capture

DATASETS = Path(__file__).resolve().parents[2] / "datasets"


@pytest.mark.parametrize("spec", SAMPLES, ids=[s.name for s in SAMPLES])
def test_sample_file_is_valid(spec):
    path = DATASETS / f"{spec.name}.h5"
    info = open_capture(path)
    assert info.complete and info.complete_layers == list(spec.layers)
    assert info.attrs["seq_len"] == spec.tokens and info.attrs["model"] == spec.model
    assert info.attrs["text_source"] == spec.text
    for rec in read_capture(path):
        assert rec.q_heads == spec.heads and rec.q.shape[2] == spec.tokens
        assert rec.q.dtype == rec.k.dtype == rec.v.dtype
        assert rec.q.isfinite().all() and rec.k.isfinite().all() and rec.v.isfinite().all()
    card = (DATASETS / f"{spec.name}.md").read_text()
    assert info.attrs["model_sha256"] in card and info.attrs["text_sha256"] in card
    assert "python3 -m zyfa.capture.sample" in card


def test_sample_is_small():
    total = sum((DATASETS / f"{s.name}.h5").stat().st_size for s in SAMPLES)
    assert total <= 27e6, f"{total / 1e6:.1f} MB"  # 22.5 MB of three models, and at most 4 MB of head dim 128
