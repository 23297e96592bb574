"""cuDNN's FP8 graph is built once per shape and reused (zyfa.peers.cudnn_fp8): a reused graph on new data gives
bit for bit the output of a graph built fresh for that data, a new shape builds a new graph, lengths in one bucket of
SEQ_BUCKET share the padded graph, which gives the exact-length graph's output bit for bit, and the cache keeps at
most GRAPH_CACHE_SIZE of them. Needs an H100/H200 and the cuDNN frontend."""

from __future__ import annotations

import math

import pytest
import torch

from zyfa.norms import rel_l2
from zyfa.peers import cudnn_fp8

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cudnn_fp8():
    ok, why = cudnn_fp8.check()  # (True, "") where it runs
    if not ok:
        pytest.skip(f"cudnn-fp8: {why}")
    cudnn_fp8.clear_graph_cache()
    yield
    cudnn_fp8.clear_graph_cache()


def _qkv(s: int, seed: int, d: int = 128):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(1, n, s, d, generator=g, device="cuda") * (1 + 4 * (i == 1))
                 for i, n in enumerate((12, 2, 2)))  # GQA 6:1, K larger (as the hd128 model's)


def _run(s: int, seed: int, causal: bool = True):
    q, k, v = _qkv(s, seed)
    p = cudnn_fp8.prepare(q, k, v, causal=causal, sm_scale=1 / math.sqrt(128))
    p.call()
    torch.cuda.synchronize()
    return p.output().clone(), p.lse().clone(), p.details["scale_o"]


def test_a_reused_graph_gives_a_fresh_graphs_output_bit_for_bit():
    a = _run(256, 0)
    assert cudnn_fp8.cached_graphs() == 1
    b = _run(256, 1)  # the same shape, other data: the graph is reused
    assert cudnn_fp8.cached_graphs() == 1
    cudnn_fp8.clear_graph_cache()
    fresh = _run(256, 1)
    assert cudnn_fp8.cached_graphs() == 1
    for x, y in zip(b[:2], fresh[:2], strict=True):
        assert torch.equal(x, y)
    assert b[2] == fresh[2]
    again = _run(256, 0)  # the first data once more, through the graph built for the second
    assert torch.equal(again[0], a[0]) and torch.equal(again[1], a[1])
    _run(257, 0)  # another length: another graph
    _run(256, 0, causal=False)  # another mask: another graph
    assert cudnn_fp8.cached_graphs() == 3


def test_output_is_valid_right_after_prepare():
    """prepare() leaves the output of a launch at the chosen FP8 scale: output() before any call() is the one after."""
    q, k, v = _qkv(300, 3)
    p = cudnn_fp8.prepare(q, k, v, causal=True, sm_scale=1 / math.sqrt(128))
    torch.cuda.synchronize()
    first = p.output().clone()
    p.call()
    torch.cuda.synchronize()
    assert torch.equal(first, p.output())
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(6, 1), v.repeat_interleave(6, 1),
                                                           is_causal=True)
    assert rel_l2(first, ref) < 0.2


def test_the_cache_keeps_at_most_its_size():
    for i in range(1, cudnn_fp8.GRAPH_CACHE_SIZE + 4):
        _run(i * cudnn_fp8.SEQ_BUCKET, 0)  # multiples: each its own unpadded graph
    assert cudnn_fp8.cached_graphs() == cudnn_fp8.GRAPH_CACHE_SIZE


@pytest.mark.parametrize("causal", [True, False])
def test_lengths_in_one_bucket_share_a_padded_graph_that_gives_the_exact_graphs_bits(causal, monkeypatch):
    lengths = (129, 150, 191)  # one bucket: the graph of 192
    padded = {s: _run(s, s, causal) for s in lengths}
    assert cudnn_fp8.cached_graphs() == 1
    cudnn_fp8.clear_graph_cache()
    monkeypatch.setattr(cudnn_fp8, "SEQ_BUCKET", 1)  # every length its own exact graph
    for s in lengths:
        exact = _run(s, s, causal)
        assert exact[0].shape == (1, 12, s, 128)
        assert torch.equal(padded[s][0], exact[0]), s
        assert torch.equal(padded[s][1], exact[1]), s
        assert padded[s][2] == exact[2], s  # the output scale: amax(O) over the true rows only
    assert cudnn_fp8.cached_graphs() == len(lengths)
