"""The Hopper FP8 accumulator model inside emulate(): on the per-tile P·V path (V descaled per tile) and with a
flush into fp32 every N KV tiles, against the accumulation written out here in float64.

The accumulator model, as docs/PLATFORMS.md documents it (fitted bit for bit on the H200): at each k = 32 step the
32 exact products (each at the sum of its operands' exponents) and the incoming accumulator are aligned to the
largest exponent among them and truncated toward zero to the platform's ``accum_bits`` bits below it, summed
exactly, and the sum truncated toward zero to as many bits below its own leading bit. Its input P is the
emulator's own rounded P (from the trace): what is checked here is the accumulation of a P given, the one step these
tests are about. V is exactly representable in e4m3fn with amax 448, so its descale is 1 and V8 = V.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from tests.zyfa.hopper_rule import hopper_mma
from zyfa.emulator import emulate
from zyfa.platforms import H200
from zyfa.recipes import get_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs(s_k: int, seed: int):
    """4 queries, s_k keys, d 64. Key 0 holds every row's largest score by far (so after tile 0 the running max
    never moves and every rescale is 1). V: positive integers 1..15 (e4m3fn-exact) with one 448 (descale 1)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 4, 64, generator=g) * 0.3
    k = torch.randn(1, 1, s_k, 64, generator=g) * 0.3
    q[..., 0] = 2.0
    k[..., 0] = torch.rand(s_k, generator=g) * 1.5 - 1.0
    k[0, 0, 0, 0] = 3.0
    v = torch.randint(1, 16, (1, 1, s_k, 64), generator=g).float()
    v[0, 0, s_k // 2, 0] = 448.0
    return q, k, v


def _fixed_p_scale_hopper(**fields):
    """zyfa-hopper (Hopper FP8 accumulator, P in e4m3fn) with FA3's P arithmetic: fp32 exp2, a fixed P scale
    2^8, the row sum from the unrounded scaled P; per-tensor descales; fp32 output."""
    return get_recipe("zyfa-hopper").replace(
        exp_method="exp2", p_scale="pow2", p_scale_log2=8, rowsum="fp32", out_format="fp32", **fields
    )


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float((np.abs(a - b) / np.abs(b)).max())


def test_per_tile_pv_product_is_truncated_by_the_accumulator_model():
    """v_descale='tile' puts each tile's P·V through the matrix unit on its own: with the Hopper accumulator at
    3 bits that one k = 32 step truncates; the output is that truncated product (times V's descale 1) over the
    fp32 row sum of P·2^8, not the exact product."""
    r = _fixed_p_scale_hopper(
        name="hopper-vtile-3bits",
        v_descale="tile",
        reciprocal="div",
        block_m=4,
        block_n=32,
    )
    q, k, v = _inputs(32, seed=1)
    trace: list = []
    emu = emulate(q, k, v, r, sm_scale=1.0, trace=trace, platform=dataclasses.replace(H200, accum_bits=3))
    assert len(trace) == 1 and emu.v_deq.abs().max().item() == 448.0
    p8 = trace[0]["p8"][0, 0].double().numpy()
    t = trace[0]["t"][0, 0].double().numpy()
    v8 = v[0, 0].double().numpy()
    l = np.exp2(t + 8).sum(-1, keepdims=True)  # fp32 row sum of P scaled by 2^8
    want = hopper_mma(p8, v8, None, 3) / l
    got = emu.out[0, 0].double().numpy()
    assert _rel(got, want) < 2e-6
    assert _rel(p8 @ v8 / l, want) > 1e-2  # the exact product is far from it: the case discriminates


@pytest.mark.parametrize("flush", [2, 3])
def test_flush_every_n_tiles_follows_the_tile_index_from_key_0(flush):
    """accum_flush_tiles=N: after KV tiles N-1, 2N-1, ... (counted from key 0) the tensor-core accumulator is
    added into the fp32 one and restarts from zero; what is left is added at the end. 7 tiles of 32 keys, an
    8-bit accumulator, P·2^8 with rescales of exactly 1 after tile 0: the output is that schedule's sum over the
    fp32 row sum, and another schedule (flushing after tiles 1, 4 or never) gives a different one."""
    r = _fixed_p_scale_hopper(
        name=f"hopper-flush{flush}",
        accum_flush_tiles=flush,
        reciprocal="div",
        block_m=4,
        block_n=32,
    )
    q, k, v = _inputs(7 * 32, seed=2)
    trace: list = []
    emu = emulate(q, k, v, r, sm_scale=1.0, trace=trace, platform=dataclasses.replace(H200, accum_bits=8))
    assert len(trace) == 7 and emu.v_deq.abs().max().item() == 448.0
    ts = [tr["t"][0, 0].double().numpy() for tr in trace]
    assert (ts[0][:, 0] == 0).all() and all((t < 0).all() for t in ts[1:])  # the running max stays at key 0
    p8s = [tr["p8"][0, 0].double().numpy() for tr in trace]
    v8 = v[0, 0].double().numpy()
    l = sum(np.exp2(t + 8).sum(-1, keepdims=True) for t in ts)

    def schedule(flush_after) -> np.ndarray:
        acc, c = np.zeros((4, 64)), None
        for i, p8 in enumerate(p8s):
            c = hopper_mma(p8, v8[32 * i : 32 * (i + 1)], c, 8)
            if flush_after(i):
                acc, c = acc + c, None
        return (acc if c is None else acc + c) / l

    want = schedule(lambda i: (i + 1) % flush == 0)
    got = emu.out[0, 0].double().numpy()
    assert _rel(got, want) < 2e-6
    for other in (lambda i: (i - 1) % 3 == 0, lambda i: False):
        assert _rel(schedule(other), want) > 1e-4
    assert math.isfinite(float(emu.lse.max()))
