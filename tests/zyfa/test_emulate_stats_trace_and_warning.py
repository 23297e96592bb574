"""What emulate() reports beside the output: ``stats['p_flushed_frac']``, the ``trace`` entries, the head-dim
warning, and P as the trace shows it for recipes whose P is not FP8.

Expected values are counted or written out here from the definitions (emulate's docstring, zyfa.recipes), not
taken from the emulator: the flushed fraction from inputs whose flushed probabilities are known in closed form,
the trace's row and key ranges by brute force over the mask, the warning's text from the supported pairs.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

import zyfa.emulator
from zyfa.emulator import UnsupportedHeadDimWarning, emulate
from zyfa.formats import round_to_bf16
from zyfa.recipes import get_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


def _qkv(s_q=64, s_k=64, d=64, d_v=None, h=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(1, h, s_q, d, generator=g),
        torch.randn(1, h, s_k, d, generator=g),
        torch.randn(1, h, s_k, d_v or d, generator=g),
    )


# ---------------------------------------------------------------------------------------------- p_flushed_frac


@pytest.mark.parametrize("name", ["bf16", "fp32"])
def test_no_fp8_probabilities_means_a_flushed_fraction_of_zero(name):
    """P in bf16/fp32 is never counted (nothing is flushed by an FP8 cast): the fraction is 0.0, not 0/0."""
    q, k, v = _qkv(s_q=16, s_k=16)
    frac = emulate(q, k, v, name).stats["p_flushed_frac"]
    assert frac == 0.0 and not math.isnan(frac)


def test_one_probability_flushed_by_a_tiny_p_scale_is_a_fraction_of_one():
    """One query, one key: its probability 1 scaled by 2^-20 is below e4m3fn's smallest subnormal (2^-9) and
    rounds to 0, so the one counted probability is flushed: the fraction is 1.0."""
    q, k, v = _qkv(s_q=1, s_k=1)
    r = get_recipe("ck").replace(name="ck-p-2^-20", p_scale="pow2", p_scale_log2=-20)
    trace: list = []
    emu = emulate(q, k, v, r, trace=trace)
    assert trace[0]["p8"][0, 0, 0, 0].item() == 0.0
    assert emu.stats["p_flushed_frac"] == 1.0


# ---------------------------------------------------------------------------------------------- trace


def _expected_trace_ranges(s_q, s_k, block_m, block_n, q_chunk, causal=False, window=None):
    """(rows, cols) per trace entry, by brute force: per chunk of q_chunk rows, per KV tile in key order, the run
    of block_m-row blocks that contain a query seeing a key of the tile (unmasked: every block, every tile)."""
    offset = s_k - s_q  # bottom-right alignment: query i sits at key position i + offset

    def sees(i, j):
        p = i + offset
        return i < s_q and (not (causal or window) or j <= p) and (window is None or j > p - window)

    s_q_pad = -(-s_q // block_m) * block_m
    out = []
    for r0 in range(0, s_q_pad, q_chunk):
        for c0 in range(0, s_k, block_n):
            c1 = min(c0 + block_n, s_k)
            blocks = [
                b0
                for b0 in range(r0, min(r0 + q_chunk, s_q_pad), block_m)
                if any(sees(i, j) for i in range(b0, b0 + block_m) for j in range(c0, c1))
            ]
            if blocks:
                out.append(((blocks[0], blocks[-1] + block_m), (c0, c1)))
    return out


@pytest.mark.parametrize("s_q,s_k,block_n", [(10, 14, 4), (12, 12, 2)])
@pytest.mark.parametrize("mask", [{}, {"causal": True}, {"causal": True, "window": 3}])
def test_trace_rows_and_cols_are_the_blocks_and_keys_of_each_tile(mask, s_q, s_k, block_n):
    """2-row blocks, 2- or 4-key tiles, 4 rows at a time: each trace entry's ``rows`` and ``cols`` are the
    (absolute) query rows and keys of one tile, and its t/p8/allowed have that shape."""
    r = get_recipe("zyfa").replace(name=f"zyfa-2x{block_n}", block_m=2, block_n=block_n)
    q, k, v = _qkv(s_q=s_q, s_k=s_k, d=16)
    trace: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsupportedHeadDimWarning)
        emulate(q, k, v, r, q_chunk=4, trace=trace, **mask)
    got = [(tr["rows"], tr["cols"]) for tr in trace]
    want = _expected_trace_ranges(s_q, s_k, 2, block_n, 4, **mask)
    assert got == want
    if mask and s_q == s_k:  # some tiles are seen only from a chunk's second block on
        assert any(rows[0] % 4 for rows, _ in want)
    for tr in trace:
        (a, z), (c0, c1) = tr["rows"], tr["cols"]
        assert tr["t"].shape[-2:] == tr["p8"].shape[-2:] == (z - a, c1 - c0)
        assert tuple(tr["allowed"].shape) == (z - a, c1 - c0)


def test_default_query_chunk_on_the_cpu_is_2048_rows():
    """emulate's docstring: q_chunk defaults to 2048 query rows on the CPU (it bounds the memory of a pass). With
    one-row blocks and one 16-key tile, 2050 queries are emulated as rows 0-2047, then 2048-2049."""
    r = get_recipe("ck").replace(name="ck-1x16", block_m=1, block_n=16, head_dim_tiles=())
    q, k, v = _qkv(s_q=2050, s_k=16, d=16)
    trace: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsupportedHeadDimWarning)
        emulate(q, k, v, r, trace=trace)
    assert [(tr["rows"], tr["cols"]) for tr in trace] == [((0, 2048), (0, 16)), ((2048, 2050), (0, 16))]


# ---------------------------------------------------------------------------------------------- P not in FP8


@pytest.mark.parametrize("p_format", ["bf16", "fp32"])
def test_fmax_scale_is_one_for_p_formats_without_an_fp8_range(p_format):
    """p_scale='fmax' multiplies P by the FP8 format's largest value (448 for e4m3fn); a bf16 or fp32 P has no
    FP8 range to fill, so P is exp2(t) rounded to its format, in (0, 1] (zyfa.recipes: 'none': P in (0, 1])."""
    r = get_recipe("ck").replace(name=f"ck-p-{p_format}", p_format=p_format)
    q, k, v = _qkv(s_q=128, s_k=256, seed=3)
    trace: list = []
    emulate(q, k, v, r, causal=True, trace=trace)
    for tr in trace:
        p = torch.exp2(tr["t"])
        assert torch.equal(tr["p8"], round_to_bf16(p) if p_format == "bf16" else p)
        assert tr["p8"].max().item() == 1.0  # the row max's probability


# ---------------------------------------------------------------------------------------------- warning

SUPPORTED = "64/64, 128/128, 256/256, 192/128, 576/512"


@pytest.mark.parametrize("d,d_v", [(40, 40), (48, 32)])
def test_unsupported_head_dims_warning_names_the_pairs_kernels_run(d, d_v):
    q, k, v = _qkv(s_q=8, s_k=8, d=d, d_v=d_v)
    with pytest.warns(UnsupportedHeadDimWarning) as rec:
        emulate(q, k, v, "zyfa")
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert msg.startswith(f"head dims {d}/{d_v} (qk/v) match no kernel this emulator models")
    assert f"(they run {SUPPORTED})" in msg
    assert msg.endswith(": emulated as the same tiling would compute them")


def _warning_location():
    q, k, v = _qkv(s_q=8, s_k=8, d=40)
    with pytest.warns(UnsupportedHeadDimWarning) as rec:
        emulate(q, k, v, "zyfa")
    return rec[0]


def test_head_dim_warning_is_not_attributed_to_the_emulator():
    """The warning points away from zyfa/emulator.py (at the code that called emulate)."""
    w = _warning_location()
    assert Path(w.filename).resolve() != Path(zyfa.emulator.__file__).resolve()


@pytest.mark.skipif(
    hasattr(emulate, "__wrapped__"),
    reason="emulate is wrapped (mutation testing's trampoline adds two frames between caller and "
    "emulate, so stacklevel cannot point here)",
)
def test_head_dim_warning_points_at_the_line_that_called_emulate():
    """stacklevel=2: the warning's location is the caller's line (here, in _warning_location), so a user sees
    which of their calls emulated an unsupported head dim."""
    w = _warning_location()
    assert w.filename == __file__
    assert "emulate(q, k, v" in Path(__file__).read_text().splitlines()[w.lineno - 1]


# ---------------------------------------------------------------------------------------------- last: the slow one


def test_flushed_fraction_is_exact_over_millions_of_probabilities():
    """aiter (P cast to e4m3fn unscaled, 256 x 128 tiles): key 0 scores 46 log2 units above every other key for
    every query, so each row's other 65922 probabilities round to 0 and key 0's does not. 255 x 65923 = 16.8
    million probabilities, more than fp32 counts exactly (2^24; a float32 count of these tiles is off by 1 or 2):
    the fraction must be the exact 65922/65923."""
    s_q, s_k = 255, 515 * 128 + 3  # odd counts in the first and last tiles, past 2^24 in all
    q = torch.zeros(1, 1, s_q, 64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, s_k, 64)
    k[..., 0] = -16.0
    k[0, 0, 0, 0] = 16.0
    v = torch.ones(1, 1, s_k, 64)
    emu = emulate(q, k, v, "aiter", sm_scale=1.0)
    assert s_q * s_k > 2**24
    assert emu.stats["p_flushed_frac"] == (s_q * (s_k - 1)) / (s_q * s_k)
    assert torch.equal(emu.out, v[:, :, :s_q])  # only key 0 survives: its V row
