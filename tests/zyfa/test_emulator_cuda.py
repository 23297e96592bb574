"""emulate() on CUDA tensors (gpu marker: runs on the H200, skipped elsewhere): every tensor it creates lives on
the input's device, its results come back there, and they agree with the same emulation on the CPU.

The CPU run is the expectation here: the arithmetic is the same fp32 arithmetic, so the two may differ only by
the last-bit differences of exp2 and matmul between devices, which move a few FP8 roundings (a rel-L2 far below
1%). Covers the default ``q_chunk`` on a GPU (its own formula), every mask, and the row sum on the matrix unit.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from zyfa.emulator import UnsupportedHeadDimWarning, emulate
from zyfa.norms import rel_l2
from zyfa.recipe_spec import get_recipe

pytestmark = pytest.mark.gpu

RECIPES = {
    "zyfa": get_recipe("zyfa"),
    "ck-blockscale": get_recipe("ck-blockscale"),  # per-block Q/K/V descales
    "fa3": get_recipe("fa3"),  # Hopper accumulator, never flushed
    "sage2": get_recipe("sage2"),  # INT8 Q/K, K smoothing, flush every tile
    "aiter-triton": get_recipe("aiter-triton"),  # tile amax
    "bf16": get_recipe("bf16"),
    "zyfa-rowsum-mma": get_recipe("zyfa").replace(name="zyfa-rowsum-mma", rowsum="rounded_mma"),
    "zyfa-hopper-rowsum-mma": get_recipe("zyfa-hopper").replace(name="zyfa-hopper-rowsum-mma", rowsum="rounded_mma"),
}
MASKS = {"none": {}, "causal": {"causal": True}, "window": {"causal": True, "window": 100}}


def _qkv():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 300, 128, generator=g)
    k, v = (torch.randn(1, 1, 260, 128, generator=g) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("name", list(RECIPES))
def test_cuda_emulation_stays_on_the_device_and_agrees_with_the_cpu(name, mask):
    q, k, v = _qkv()
    r = RECIPES[name]
    cpu = emulate(q, k, v, r, **MASKS[mask])
    gpu = emulate(q.cuda(), k.cuda(), v.cuda(), r, **MASKS[mask])  # default q_chunk: the GPU formula
    for x in (gpu.out, gpu.lse, gpu.q_deq, gpu.k_deq, gpu.v_deq):
        assert x.device.type == "cuda" and x.dtype == torch.float32
    assert gpu.out.shape == cpu.out.shape and gpu.lse.shape == cpu.lse.shape
    rel = rel_l2(gpu.out.cpu(), cpu.out)
    assert rel < 1e-2, f"{name} {mask}: CUDA and CPU outputs differ by rel-L2 {rel:.3e}"
    assert torch.equal(torch.isneginf(gpu.lse.cpu()), torch.isneginf(cpu.lse))
    fin = torch.isfinite(cpu.lse)
    assert (gpu.lse.cpu()[fin] - cpu.lse[fin]).abs().max().item() < 1e-3
    assert abs(gpu.stats["p_flushed_frac"] - cpu.stats["p_flushed_frac"]) < 1e-3
    assert isinstance(gpu.stats["p_flushed_frac"], float)


def test_default_query_chunk_on_a_gpu_holds_about_2_to_the_24_scores():
    """emulate's docstring: on a GPU the default chunk is as many rows as keep a (chunk, block_n) tile of all heads
    near 2^24 elements, at least 2048: max(2048, 2^24 // (b·h·block_n)), over 4096 rows for 1 x 2 heads and any
    block_n up to 2048, so 4096 queries are one pass: the trace has one entry per KV tile, all rows (a 2048-row
    chunk, the CPU's default, would split them)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 4096, 128, generator=g).cuda()
    k, v = (torch.randn(1, 2, 256, 128, generator=g).cuda() for _ in range(2))
    trace: list = []
    emulate(q, k, v, "aiter-triton", trace=trace)
    assert {tr["rows"] for tr in trace} == {(0, 4096)}
    assert len(trace) == len({tr["cols"] for tr in trace}) > 1


def test_default_query_chunk_on_a_gpu_follows_the_formula_where_it_splits():
    """With one-row blocks, 16-key tiles and 2 x 256 heads, 2^24 // (b·h·block_n) = 2048 rows: 2050 queries are
    rows 0-2047, then 2048-2049 (a floor of 2049 rows, or a chunk of 2^25 elements, would cut them otherwise)."""
    r = get_recipe("ck").replace(name="ck-1x16", block_m=1, block_n=16, head_dim_tiles=())
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 256, 2050, 16, generator=g).cuda()
    k, v = (torch.randn(2, 256, 16, 16, generator=g).cuda() for _ in range(2))
    trace: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsupportedHeadDimWarning)
        emulate(q, k, v, r, trace=trace)
    assert [(tr["rows"], tr["cols"]) for tr in trace] == [((0, 2048), (0, 16)), ((2048, 2050), (0, 16))]
