"""cuDNN's FP8 graph is built once per shape and reused (zyfa.peers.cudnn_fp8): a reused graph on new data gives
bit for bit the output of a graph built fresh for that data, a new shape builds a new graph, and the cache keeps at
most GRAPH_CACHE_SIZE of them. Needs an H100/H200 and the cuDNN frontend."""

from __future__ import annotations

import math

import pytest
import torch

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


def test_the_cache_keeps_at_most_its_size():
    for s in range(64, 64 + cudnn_fp8.GRAPH_CACHE_SIZE + 3):
        _run(s, 0)
    assert cudnn_fp8.cached_graphs() == cudnn_fp8.GRAPH_CACHE_SIZE
