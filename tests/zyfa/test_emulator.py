"""The tiled emulator (zyfa.emulator.emulate): each recipe's documented behaviour and agreement with the FP64 oracle;
query chunks and tiny tiles; its stats, trace and warnings.

Where a new emulator test goes: here for emulate() as a whole; test_emulator_hopper.py for the platform's truncating
accumulator inside it; test_emulator_inputs.py for what it accepts, refuses and returns on overflow;
test_emulator_quantization.py for quantize_inputs; test_emulator_tile.py for the steps of one KV tile
(zyfa.emulator_tile); test_emulator_cuda.py for CUDA tensors (GPU).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from zyfa.reference.attention import attention_fp64

import zyfa.emulator
from zyfa.emulator import UnsupportedHeadDimWarning, emulate
from zyfa.emulator_tile import decode_e4m3fn_fast, mma
from zyfa.formats import decode_fp8, round_to_bf16, round_to_fp8, round_to_fp8_fast
from zyfa.norms import rel_l2
from zyfa.platforms import H200
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import RECIPES, Recipe

# ----------------------------------------------------------------------------------------------------------------- core

def _qkv(b=1, h=2, h_kv=None, s_q=256, s_k=None, d=64, d_v=None, std=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    h_kv, s_k, d_v = h_kv or h, s_k or s_q, d_v or d
    q = torch.randn(b, h, s_q, d, generator=g) * std
    k = torch.randn(b, h_kv, s_k, d, generator=g) * std
    v = torch.randn(b, h_kv, s_k, d_v, generator=g)
    return q, k, v


def _rel(out, ref):
    return rel_l2(out, ref)


SHAPES = {
    "mha": dict(),
    "gqa": dict(h=6, h_kv=2),
    "mqa": dict(h=4, h_kv=1),
    "odd": dict(s_q=113, s_k=203),
    "mla": dict(d=192, d_v=128, s_q=130),
    "batch2": dict(b=2, s_q=129),
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 37)])
def test_no_quantization_matches_oracle_to_fp32(shape, causal, window):
    q, k, v = _qkv(**SHAPES[shape])
    emu = emulate(q, k, v, "fp32", causal=causal, window=window)
    ref, lse_ref = attention_fp64(q, k, v, causal=causal, window=window)
    assert _rel(emu.out, ref) < 2e-6
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(emu.lse), finite)
    assert (emu.lse.double() - lse_ref)[finite].abs().max() < 1e-5


@pytest.mark.parametrize("name", [n for n in RECIPES if n != "fp32"])
def test_every_recipe_error_is_fp8_sized(name):
    q, k, v = _qkv(h=2, s_q=300, d=64)
    emu = emulate(q, k, v, name, causal=True)
    ref, _ = attention_fp64(emu.q_deq, emu.k_deq, emu.v_deq, causal=True)
    err = _rel(emu.out, ref)
    low, high = (1e-4, 1e-2) if name == "bf16" else (3e-3, 0.1)
    assert low < err < high, f"{name}: rel-L2 {err:.3e} outside [{low}, {high}]"


def test_fully_masked_rows_give_zeros_not_nan():
    q, k, v = _qkv(s_q=200, s_k=64)  # bottom-right causal: the first 136 rows see no key
    for name in ("zyfa", "ck", "aiter", "fa3", "fp32"):
        emu = emulate(q, k, v, name, causal=True)
        assert not torch.isnan(emu.out).any()
        assert torch.equal(emu.out[:, :, :136], torch.zeros_like(emu.out[:, :, :136]))
        assert torch.isneginf(emu.lse[:, :, :136]).all()
        assert torch.isfinite(emu.lse[:, :, 136:]).all()


def test_aiter_flushes_small_p_and_ck_does_not():
    # Long rows of diffuse scores put many probabilities between 2^-19 and 2^-10.
    q, k, v = _qkv(h=1, s_q=128, s_k=2048, d=64, std=2.0)
    for name in ("aiter", "ck"):
        trace: list = []
        emulate(q, k, v, name, trace=trace)
        t = torch.cat([tr["t"] for tr in trace], dim=-1)
        p8 = torch.cat([tr["p8"] for tr in trace], dim=-1)
        below = t < -10.01  # P < 2^-10 (half the e4m3fn min subnormal): rounds to 0 unscaled
        mid = (t > -18.5) & (t < -10.01)
        assert mid.sum() > 1000
        if name == "aiter":
            assert (p8[below] == 0).all()
            assert (p8[t > -9.99] > 0).all()
        else:
            assert (p8[mid] > 0).all(), "ck's x448 keeps P down to ~2^-19"
    zero_aiter = emulate(q, k, v, "aiter").stats["p_flushed_frac"]
    zero_ck = emulate(q, k, v, "ck").stats["p_flushed_frac"]
    assert zero_aiter > zero_ck + 0.2  # measured 0.90 vs 0.45 at this (very peaked) scale


def test_zyfa_row_sum_is_the_sum_of_its_rounded_p():
    q, k, v = _qkv(h=2, s_q=256, s_k=512, std=1.5)
    for name, rounded in (("zyfa", True), ("zyfa-fp32sum", False)):
        trace: list = []
        emulate(q, k, v, name, trace=trace)
        diffs = [(tr["row_sum"] - tr["p8"].sum(-1, keepdim=True)).abs().max().item() for tr in trace]
        if rounded:
            assert max(diffs) == 0.0
        else:
            assert max(diffs) > 1e-3


def test_zyfa_output_is_a_convex_combination_of_v():
    # Constant V: with the row sum taken from the rounded P the output is V itself; with fp32 sums it is not.
    q, k, _ = _qkv(h=2, s_q=256, s_k=512, std=1.5)
    v = torch.full((1, 2, 512, 64), 0.75)
    exact = emulate(q, k, v, get_recipe("zyfa").replace(name="zyfa-f32out", out_format="fp32"))
    assert (exact.out - 0.75).abs().max() < 1e-6
    biased = emulate(q, k, v, get_recipe("zyfa-fp32sum").replace(name="fp32sum-f32out", out_format="fp32"))
    assert (biased.out - 0.75).abs().max() > 1e-3


@pytest.mark.parametrize("rounding,offset", [("trunc", 0.0), ("nearest", 0.0), ("nearest", -0.5)])
def test_mad_path_equals_its_closed_form(rounding, offset):
    recipe = get_recipe("zyfa").replace(name="mad", mad_rounding=rounding, mad_offset=offset)
    q, k, v = _qkv(h=1, s_q=128, s_k=384, std=2.0)
    trace: list = []
    emulate(q, k, v, recipe, trace=trace)
    for tr in trace:
        # by hand in fp32, not through the formats helpers: n = clamp(R(8(t + e) + 56 + offset), 0, 126)
        y = ((tr["t"] + tr["e"]) * 8.0 + (56.0 + offset)).clamp(0, 126)
        n = (torch.round(y) if rounding == "nearest" else torch.trunc(y)).double()
        expected = torch.where(n >= 8, torch.exp2(torch.floor(n / 8) - 7) * (1 + (n % 8) / 8), (n % 8) * 2.0**-9)
        assert torch.equal(tr["p8"].double(), expected)


def test_per_block_exponent_puts_each_block_max_in_the_top_octave():
    q, k, v = _qkv(h=2, s_q=256, s_k=1024, std=2.0)
    trace: list = []
    emulate(q, k, v, "zyfa-exp2", trace=trace)
    for tr in trace:
        row_max = tr["p8"].amax(-1)
        has = tr["allowed"].any(-1).expand_as(row_max)
        # t_max + e in (log2(448) - 1, log2(448)]: block max in (224, 448], and RNE may land on 224 itself
        assert (row_max[has] >= 224).all() and (row_max[has] <= 448).all()
    fixed: list = []
    emulate(q, k, v, "zyfa-pow2fixed", trace=fixed)
    assert all((tr["e"] == 8).all() for tr in fixed)
    assert any((tr["e"] > 8).any() for tr in trace), "later tiles with smaller maxima get larger exponents"


def test_hopper_accumulator_model_and_flush():
    # Positive V over 4096 keys: the never-flushed FP8 accumulator (FA3 upstream) loses mass at every
    # aligned step (measured on the H200: -6.9% at K=4096 on positive data); a flush every tile restores it.
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 128, 128, generator=g) * 0.5
    k = torch.randn(1, 2, 4096, 128, generator=g) * 0.5
    v = torch.rand(1, 2, 4096, 128, generator=g) + 0.5
    base = get_recipe("fa3")
    recipes = (base, base.replace(name="fa3-flush1", accum_flush_tiles=1),
               base.replace(name="fa3-fp32", accumulator="fp32"))
    err, bias = {}, {}
    for r in recipes:
        emu = emulate(q, k, v, r)
        ref, _ = attention_fp64(emu.q_deq, emu.k_deq, emu.v_deq)
        err[r.name], bias[r.name] = _rel(emu.out, ref), ((emu.out.double() - ref).mean() / ref.mean()).item()
    assert err["fa3"] > 10 * err["fa3-flush1"]
    assert bias["fa3"] < -0.03  # systematic loss, not noise
    assert err["fa3-flush1"] < 1.5 * err["fa3-fp32"]


def test_output_rounding_modes():
    q, k, v = _qkv(s_q=64)
    ck = emulate(q, k, v, "ck").out
    assert torch.equal(round_to_bf16(ck, "trunc"), ck)
    aiter = emulate(q, k, v, "aiter").out
    assert torch.equal(round_to_bf16(aiter, "rne"), aiter)
    assert not torch.equal(round_to_bf16(emulate(q, k, v, "aiter-triton").out, "rne"),
                           emulate(q, k, v, "aiter-triton").out)


def test_lse_matches_oracle_for_fp32_sum_recipes():
    q, k, v = _qkv(h=2, s_q=200, std=1.0)
    for name in ("ck", "aiter", "triton-amd", "sage2"):
        emu = emulate(q, k, v, name, causal=True)
        _, lse_ref = attention_fp64(emu.q_deq, emu.k_deq, emu.v_deq, causal=True)
        assert (emu.lse.double() - lse_ref).abs().max() < 1e-4, name


def test_quantization_granularities_change_the_dequantized_inputs():
    # FP8 is floating point: a shared scale hurts a head only when it pushes the head into subnormals.
    q, k, v = _qkv(h=4, h_kv=2, s_q=256)
    q[:, 1] *= 2.0**16  # one head with a far larger range

    def head0_err(emu):
        return rel_l2(emu.q_deq[:, 0], q[:, 0])

    per_tensor, per_head, fa3 = (emulate(q, k, v, n) for n in ("ck", "aiter-triton", "fa3"))
    assert head0_err(per_head) < 0.03
    assert head0_err(per_tensor) > 3 * head0_err(per_head)
    assert head0_err(fa3) > 3 * head0_err(per_head)  # FA3's q descale is per kv-head group: 0 and 1 share


def test_bad_inputs_raise_clear_errors():
    q, k, v = _qkv(s_q=32)
    with pytest.raises(ValueError, match="unknown recipe 'nope'"):
        emulate(q, k, v, "nope")
    with pytest.raises(ValueError, match="q contains NaN"):
        emulate(q.clone().fill_(math.nan), k, v, "zyfa")
    with pytest.raises(ValueError, match="k contains NaN or Inf"):
        emulate(q, k.clone().fill_(math.inf), v, "zyfa")
    with pytest.raises(ValueError, match="4-D"):
        emulate(q[0], k, v, "zyfa")
    with pytest.raises(ValueError, match="head dims differ"):
        emulate(q, k[..., :32], v, "zyfa")
    with pytest.raises(ValueError, match="multiple of kv heads"):
        emulate(q[:, :1].expand(1, 3, 32, 64), k, v, "zyfa")
    with pytest.raises(TypeError, match="floating-point"):
        emulate(q.to(torch.int32), k, v, "zyfa")


def test_recipe_validation():
    with pytest.raises(ValueError, match="p_scale='bogus'"):
        Recipe(name="x", source="", p_scale="bogus")
    with pytest.raises(ValueError, match="mad_fp8"):
        Recipe(name="x", source="", exp_method="mad_fp8", p_format="e5m2")
    with pytest.raises(ValueError, match="power-of-two"):
        Recipe(name="x", source="", exp_method="mad_fp8", p_scale="fmax")
    for r in RECIPES.values():
        assert r.source, f"{r.name} cites no source"


@pytest.mark.gpu
def test_emulator_runs_unchanged_on_cuda():
    q, k, v = _qkv(h=2, s_q=300, d=128)
    for name in ("zyfa", "ck", "fa3", "aiter-triton"):
        cpu = emulate(q, k, v, name, causal=True)
        gpu = emulate(q.cuda(), k.cuda(), v.cuda(), name, causal=True)
        ref, _ = attention_fp64(cpu.q_deq, cpu.k_deq, cpu.v_deq, causal=True)
        e_cpu, e_gpu = _rel(cpu.out, ref), _rel(gpu.out.cpu(), ref)
        assert abs(e_cpu - e_gpu) < 0.01 * e_cpu, name


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz", "e5m2"])
def test_fast_p_cast_is_bit_identical_to_ours(fmt):
    g = torch.Generator().manual_seed(1)
    x = torch.exp2(torch.empty(200_000).uniform_(-30, 20, generator=g)) * torch.randn(200_000, generator=g).sign()
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1e30, -1e30])])
    fast, ours = round_to_fp8_fast(x, fmt), round_to_fp8(x, fmt, saturate=True)
    assert torch.equal(fast.view(torch.int32), ours.view(torch.int32))


def test_fast_decode_is_bit_identical_to_ours():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    fast, ours = decode_e4m3fn_fast(codes), decode_fp8(codes, "e4m3fn")
    assert torch.equal(torch.isnan(fast), torch.isnan(ours))
    finite = ~torch.isnan(ours)
    assert torch.equal(fast[finite].view(torch.int32), ours[finite].view(torch.int32))


def test_hopper_accumulator_aligns_each_step_to_its_largest_term():
    # One k=32 step: a product of 2^20 next to ones keeps 13 bits below 2^20, so the ones (2^0 < 2^7) vanish.
    a = torch.ones(1, 32)
    b = torch.ones(32, 1)
    a[0, 0] = 2.0**10
    b[0, 0] = 2.0**10
    assert mma(a, b, None, 13).item() == 2.0**20
    assert mma(a, b, None, None).item() == 2.0**20 + 31
    # the incoming accumulator is aligned too: 2^20 + 2^6 loses its 2^6 against a 2^20 step
    acc = torch.tensor([[2.0**6]])
    assert mma(a, b, acc, 13).item() == 2.0**20
    assert mma(a, b, acc, 14).item() == 2.0**20 + 64
    # small integer operands with no large term are exact
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-8, 8, (4, 32), generator=g).float()
    y = torch.randint(-8, 8, (32, 3), generator=g).float()
    assert torch.equal(mma(x, y, None, 13), x @ y)


def test_flushed_fraction_is_a_fraction_on_multi_head_inputs():
    q, k, v = _qkv(b=2, h=4, h_kv=2, s_q=256, s_k=1024, std=2.0)
    frac = emulate(q, k, v, "aiter").stats["p_flushed_frac"]
    per_head = [emulate(q[i:i + 1, j:j + 1], k[i:i + 1, j // 2:j // 2 + 1], v[i:i + 1, j // 2:j // 2 + 1],
                        "aiter").stats["p_flushed_frac"] for i in range(2) for j in range(4)]
    assert 0 < frac < 1
    assert abs(frac - sum(per_head) / len(per_head)) < 2e-3  # per-head runs quantize with their own amax


@pytest.mark.parametrize("recipe", ["fa3", "zyfa", "aiter"])
@pytest.mark.parametrize("mask", [{"causal": True}, {"causal": True, "window": 200}])
def test_masked_row_blocks_skip_tiles_like_the_kernel(recipe, mask):
    # A kernel program (block_m rows) never touches a KV tile it cannot see, so the emulated result must not
    # depend on how many query rows are processed at once. Before the skip, the Hopper accumulator model
    # truncated the accumulator of rows that saw nothing of a tile once more (fa3 differed by 1 bf16 ulp).
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 600, 64, generator=g) for _ in range(3))
    v = v.abs() * 4  # positive V: the accumulator's truncation is visible
    one_block = emulate(q, k, v, recipe, q_chunk=128, **mask)
    whole = emulate(q, k, v, recipe, q_chunk=1024, **mask)
    assert torch.equal(one_block.out, whole.out)
    assert torch.equal(one_block.lse, whole.lse)
    assert one_block.stats == whole.stats


def test_flush_every_n_tiles_counts_from_key_0_whatever_the_query_chunk():
    """accum_flush_tiles=2 under a sliding window: the flush follows the kernel's tile index (start_n // BLOCK_N),
    so the result cannot depend on how many query rows are emulated at once (it did when tiles were counted from
    each chunk's first visible tile)."""
    r = get_recipe("zyfa-hopper").replace(name="flush2", block_m=16, block_n=32, accum_flush_tiles=2)
    coarse = dataclasses.replace(H200, accum_bits=8)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 1, 192, 64, generator=g) for _ in range(3))
    v = v.abs() * 4
    chunked = emulate(q, k, v, r, causal=True, window=50, q_chunk=16, platform=coarse)
    whole = emulate(q, k, v, r, causal=True, window=50, q_chunk=1024, platform=coarse)
    assert torch.equal(chunked.out, whole.out)


def test_rowsum_on_the_matrix_unit_is_the_rounded_sum_with_the_accumulators_truncation():
    """rowsum='rounded_mma' (P8 · ones, fresh every tile): with a true fp32 accumulator it is exactly the
    rounded sum; with the Hopper accumulator each tile's sum is truncated like P·V, so it can only be smaller,
    by at most 2^-13 of the largest term per term; peaked rows (P terms below 2^-13 of their step's largest)
    show it."""
    from zyfa.kernels.attention_fp8 import recipe_from_spec

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 256, 64, generator=g) for _ in range(3))
    k = k * 2.0  # peaked rows: P spans e4m3's whole range, so the smallest terms fall below the kept bits
    base = emulate(q, k, v, get_recipe("zyfa"))
    mma = emulate(q, k, v, recipe_from_spec("zyfa:rowsum=rounded_mma"))
    assert torch.equal(base.out, mma.out) and torch.equal(base.lse, mma.lse)

    trace_r, trace_m = [], []
    hop_r = emulate(q, k, v, get_recipe("zyfa-hopper"), trace=trace_r)
    hop_m = emulate(q, k, v, recipe_from_spec("zyfa-hopper:rowsum=rounded_mma"), trace=trace_m)
    for tr, tm in zip(trace_r, trace_m, strict=True):
        assert torch.equal(tr["p8"], tm["p8"])
        exact, trunc = tr["row_sum"], tm["row_sum"]
        assert torch.all(trunc <= exact)
        bound = tr["p8"].shape[-1] * 2.0**-13 * tr["p8"].amax(-1, keepdim=True)
        assert torch.all(exact - trunc <= bound)
    assert not torch.equal(hop_r.lse, hop_m.lse)
    ref, _ = attention_fp64(hop_r.q_deq, hop_r.k_deq, hop_r.v_deq)
    e_r, e_m = (rel_l2(o, ref) for o in (hop_r.out, hop_m.out))
    assert abs(e_m / e_r - 1) < 0.03, (e_r, e_m)


def test_rowsum_on_the_matrix_unit_is_a_valid_recipe_field():
    from zyfa.kernels.attention_fp8 import kernel_plan, recipe_from_spec

    assert kernel_plan("zyfa-hopper:rowsum=rounded_mma").rowsum_rounded == 2
    with pytest.raises(ValueError, match="rounded_mma.*tile_amax"):
        recipe_from_spec("aiter-triton:rowsum=rounded_mma")


# ------------------------------------------------------------------------------------------------------------- KV order

def _cols(trace):
    return [t["cols"][0] for t in trace]


@pytest.mark.parametrize("causal", [False, True])
def test_reverse_kv_order_visits_the_last_tile_first_with_the_same_attention(causal):
    """kv_order=reverse (FA3's and FlashInfer's mainloops) visits KV tiles last to first; with an fp32 accumulator
    the result is the same attention up to fp32 rounding, and as close to the oracle as the forward order."""
    q, k, v = _qkv(s_q=300, d=64, seed=4)
    res, traces = {}, {}
    for order in ("forward", "reverse"):
        trace = traces[order] = []
        r = get_recipe("fa3").replace(name=f"fa3-{order}", kv_order=order, accumulator="fp32", head_dim_tiles=())
        em = emulate(q, k, v, r, causal=causal, trace=trace)
        cols = _cols(trace)
        res[order] = em
        if order == "forward":
            assert cols == sorted(cols) and cols[0] == 0
        else:
            # per chunk of query rows, the tiles it sees from the last to the first
            assert cols[0] == max(cols) and cols[-1] == 0 and cols != sorted(cols)
            assert sorted(cols) == sorted(_cols(traces["forward"]))
    ref = attention_fp64(res["forward"].q_deq, res["forward"].k_deq, res["forward"].v_deq, causal=causal)[0]
    e_f, e_r = _rel(res["forward"].out, ref), _rel(res["reverse"].out, ref)
    assert e_r == pytest.approx(e_f, rel=0.1)  # P is rounded against another running max: as accurate
    assert torch.allclose(res["reverse"].lse, res["forward"].lse, atol=1e-5)
    # with P unrounded too, the two orders compute the same attention up to fp32 rounding
    outs = [emulate(q, k, v, get_recipe("fa3").replace(name=o, kv_order=o, accumulator="fp32", p_format="fp32",
                                                         p_scale="none", out_format="fp32", head_dim_tiles=()),
                    causal=causal).out
            for o in ("forward", "reverse")]
    assert _rel(outs[1], outs[0].double()) < 1e-6


def test_kv_order_moves_an_unflushed_hopper_accumulator_when_a_sink_dominates():
    """With the Hopper FP8 accumulator never flushed and one key dominating every row (an attention sink at key
    0), the order decides how large the running sum is when the sink arrives: the two orders' errors differ."""
    q, k, v = _qkv(s_q=512, d=64, seed=5)
    k[:, :, 0] = q.mean(dim=2) * 6.0  # key 0 aligned with every query: a sink
    errs = {}
    for order in ("forward", "reverse"):
        r = get_recipe("fa3").replace(name=f"fa3-{order}", kv_order=order, platform="h200")
        em = emulate(q, k, v, r)
        ref = attention_fp64(em.q_deq, em.k_deq, em.v_deq)[0]
        errs[order] = _rel(em.out, ref)
    assert abs(errs["reverse"] / errs["forward"] - 1) > 0.01, errs


def test_kv_order_is_checked_and_the_triton_kernel_visits_forward():
    from zyfa.kernels.attention_fp8 import kernel_recipe

    with pytest.raises(ValueError, match="kv_order"):
        get_recipe("fa3").replace(kv_order="sideways")
    r = kernel_recipe("fa3:kv_order=reverse")
    assert r.kv_order == "forward" and r.head_dim_tiles == ()
    assert kernel_recipe("zyfa-hopper") is not None and kernel_recipe("zyfa-hopper").kv_order == "forward"


# ------------------------------------------------------------------------------------------ query chunks and tiny tiles
# emulate()'s row and tile bookkeeping: query chunks, per-row descales, 1x1 tiles, windows without ``causal``.
#
# The expected values come from the FP64 oracle (reference/attention.py) on inputs built so that the recipe's only
# rounding left is fp32 arithmetic: per-token (or per-block) FP8 descales that are exact powers of two, different
# from block to block, values exactly representable in e4m3fn, and P kept in fp32. A row that picks up another
# row's descale, a KV tile that is skipped or visited twice, or a chunk that loses keys then shows as an error of
# order one, far above the fp32 tolerance (1e-5 of each output channel's scale).

D = 16




def _operand(g, s: int, block: int, amax_channel: int, zero_channel: int | None) -> np.ndarray:
    """(1, 1, s, D): block i of ``block`` tokens is 2^e_i times e4m3fn-exact values (halves up to 1), with its
    amax 448·2^e_i in ``amax_channel``; so its descale amax/448 = 2^e_i is exact and so is every value.
    ``zero_channel`` is zero throughout (the other operand's amax channel then adds nothing to any score)."""
    x = g.integers(-2, 3, (s, D)).astype(np.float64) / 2
    x[:, amax_channel] = 0.0
    if zero_channel is not None:
        x[:, zero_channel] = 0.0
    for i, b0 in enumerate(range(0, s, block)):
        x[b0, amax_channel] = 448.0
        x[b0 : b0 + block] *= 2.0 ** ((-1, 1, 0, -2, 2)[(i + int(g.integers(5))) % 5])
    return x[None, None]


def _exact_inputs(s_q: int, s_k: int, block_q: int, block_kv: int, seed: int = 0):
    g = np.random.default_rng(seed)
    q = _operand(g, s_q, block_q, amax_channel=0, zero_channel=1)
    k = _operand(g, s_k, block_kv, amax_channel=1, zero_channel=0)
    v = _operand(g, s_k, block_kv, amax_channel=0, zero_channel=None)
    return [torch.from_numpy(x).float() for x in (q, k, v)]


def _fp32_p_blockscale(block_m: int, block_n: int, block_q: int, block_kv: int):
    """ck-blockscale (per-block Q, K, V descales, V's applied per tile, P x 2^8) with P and the output in fp32."""
    return get_recipe("ck-blockscale").replace(
        name=f"blockscale-fp32p-{block_m}x{block_n}",
        p_format="fp32",
        out_format="fp32",
        head_dim_tiles=(),  # the small tiles under test, not CK's per-head-dim ones
        block_m=block_m,
        block_n=block_n,
        scale_block_q=block_q,
        scale_block_kv=block_kv,
    )


def _assert_matches_oracle(q, k, v, recipe, **kw):
    emu = emulate(q, k, v, recipe, **kw)
    # the premise: the per-block quantization is exact, so the oracle sees what the kernel saw
    for deq, x in zip((emu.q_deq, emu.k_deq, emu.v_deq), (q, k, v), strict=True):
        assert torch.equal(deq.expand_as(x), x)
    mask = {key: kw[key] for key in ("causal", "window") if key in kw}
    ref, ref_lse = attention_fp64(q, k, v, **mask)
    scale = v.double().abs().amax(dim=2, keepdim=True).clamp(min=1.0)  # each output channel's scale
    err = ((emu.out.double() - ref).abs() / scale).max().item()
    assert err < 1e-5, f"{recipe.name} {kw}: output off by {err:.3e} of its channel's scale"
    assert torch.equal(torch.isneginf(emu.lse), torch.isneginf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert ((emu.lse.double() - ref_lse)[fin].abs() < 1e-5).all()
    return emu


MASKS = ("none", "causal", "window", "causal+window")


def _mask(name: str, window: int) -> dict:
    return {
        "none": {},
        "causal": {"causal": True},
        "window": {"window": window},
        "causal+window": {"causal": True, "window": window},
    }[name]


@pytest.mark.filterwarnings("ignore:head dims")
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("s_q,s_k", [(24, 40), (40, 24), (24, 10)])
@pytest.mark.parametrize("q_chunk", [None, 4, 8])
def test_query_chunks_keep_every_row_its_own_descale_and_keys(mask, s_q, s_k, q_chunk):
    """Rows emulated in chunks of 4 or 8 (block_m 4) against the oracle: each chunk must use its own rows' Q
    descales (per 4-row block, all different) and see every key its rows see, also without a mask; with more
    queries than keys, whole chunks see no key at all under a causal mask (zeros, lse -inf)."""
    q, k, v = _exact_inputs(s_q, s_k, block_q=4, block_kv=8)
    _assert_matches_oracle(q, k, v, _fp32_p_blockscale(4, 8, 4, 8), q_chunk=q_chunk, **_mask(mask, 6))


@pytest.mark.filterwarnings("ignore:head dims")
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("s_q,s_k", [(2, 2), (2, 3), (3, 2)])
@pytest.mark.parametrize("block_m", [1, 4])
@pytest.mark.parametrize("q_chunk", [None, 1])
def test_one_key_tiles_and_per_token_descales(mask, s_q, s_k, block_m, q_chunk):
    """block_n = 1 (a tile per key) and a descale per token for Q, K and V, on two or three queries and keys:
    no key is skipped (key 0 included), each tile uses its own key's K and V descale and each row its own Q
    descale, whether the rows are padded to a 4-row block or are blocks of one."""
    q, k, v = _exact_inputs(s_q, s_k, block_q=1, block_kv=1, seed=s_q * 10 + s_k)
    _assert_matches_oracle(q, k, v, _fp32_p_blockscale(block_m, 1, 1, 1), q_chunk=q_chunk, **_mask(mask, 2))


@pytest.mark.filterwarnings("ignore:head dims")
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", ["ck-blockscale", "sage2", "aiter-triton", "zyfa", "fa3"])
@pytest.mark.parametrize("mask", MASKS)
def test_results_do_not_depend_on_q_chunk(name, mask):
    """The named recipe as it is (FP8 P, its output rounding) on 16-row blocks: 150 queries emulated one block at
    a time give bit-identical outputs, LSEs and stats to one pass, for every mask (a kernel program owns block_m
    rows; how many the emulator takes at once must not matter)."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 150, 32, generator=g)
    k, v = (torch.randn(1, 1, 130, 32, generator=g) for _ in range(2))
    mask = _mask(mask, 50)
    r = get_recipe(name).replace(name=f"{name}-16", block_m=16, scale_block_q=16)
    whole = emulate(q, k, v, r, **mask)
    part = emulate(q, k, v, r, q_chunk=16, **mask)
    assert torch.equal(part.out, whole.out)
    assert torch.equal(part.lse, whole.lse)
    assert part.stats == whole.stats


@pytest.mark.filterwarnings("ignore:head dims")
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", ["fa3", "zyfa-hopper", "sage2", "zyfa", "aiter-triton"])
def test_a_window_alone_is_the_window_with_the_causal_bound(name):
    """``window`` implies the causal bound (emulate's docstring: query at p sees p - window < j <= p), so
    ``causal=False`` with a window is bit for bit ``causal=True`` with it, in fp32 output too. On the Hopper
    accumulator recipes this needs the row blocks that see none of a tile to skip it, as the kernels do."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, 300, 64, generator=g) for _ in range(3))
    v = v.abs() * 4  # positive V: an extra truncation of the Hopper accumulator is visible
    r = get_recipe(name).replace(name=f"{name}-fp32out", out_format="fp32")
    alone = emulate(q, k, v, r, window=100)
    both = emulate(q, k, v, r, causal=True, window=100)
    assert torch.equal(alone.out, both.out) and torch.equal(alone.lse, both.lse)
    ref, _ = attention_fp64(alone.q_deq, alone.k_deq, alone.v_deq, causal=True, window=100)
    assert rel_l2(alone.out, ref) < 0.05


# ---------------------------------------------------------------------------------------------- stats trace and warning
# What emulate() reports beside the output: ``stats['p_flushed_frac']``, the ``trace`` entries, the head-dim
# warning, and P as the trace shows it for recipes whose P is not FP8.
#
# Expected values are counted or written out here from the definitions (emulate's docstring, zyfa.recipes), not
# taken from the emulator: the flushed fraction from inputs whose flushed probabilities are known in closed form,
# the trace's row and key ranges by brute force over the mask, the warning's text from the supported pairs.

def _qkv_trace(s_q=64, s_k=64, d=64, d_v=None, h=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(1, h, s_q, d, generator=g),
        torch.randn(1, h, s_k, d, generator=g),
        torch.randn(1, h, s_k, d_v or d, generator=g),
    )


# ------------------------------------------------------------------------------------------------------- p_flushed_frac


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", ["bf16", "fp32"])
def test_no_fp8_probabilities_means_a_flushed_fraction_of_zero(name):
    """P in bf16/fp32 is never counted (nothing is flushed by an FP8 cast): the fraction is 0.0, not 0/0."""
    q, k, v = _qkv_trace(s_q=16, s_k=16)
    frac = emulate(q, k, v, name).stats["p_flushed_frac"]
    assert frac == 0.0 and not math.isnan(frac)


@pytest.mark.usefixtures("one_thread")
def test_one_probability_flushed_by_a_tiny_p_scale_is_a_fraction_of_one():
    """One query, one key: its probability 1 scaled by 2^-20 is below e4m3fn's smallest subnormal (2^-9) and
    rounds to 0, so the one counted probability is flushed: the fraction is 1.0."""
    q, k, v = _qkv_trace(s_q=1, s_k=1)
    r = get_recipe("ck").replace(name="ck-p-2^-20", p_scale="pow2", p_scale_log2=-20)
    trace: list = []
    emu = emulate(q, k, v, r, trace=trace)
    assert trace[0]["p8"][0, 0, 0, 0].item() == 0.0
    assert emu.stats["p_flushed_frac"] == 1.0


# ---------------------------------------------------------------------------------------------------------------- trace


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


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("s_q,s_k,block_n", [(10, 14, 4), (12, 12, 2)])
@pytest.mark.parametrize("mask", [{}, {"causal": True}, {"causal": True, "window": 3}])
def test_trace_rows_and_cols_are_the_blocks_and_keys_of_each_tile(mask, s_q, s_k, block_n):
    """2-row blocks, 2- or 4-key tiles, 4 rows at a time: each trace entry's ``rows`` and ``cols`` are the
    (absolute) query rows and keys of one tile, and its t/p8/allowed have that shape."""
    r = get_recipe("zyfa").replace(name=f"zyfa-2x{block_n}", block_m=2, block_n=block_n)
    q, k, v = _qkv_trace(s_q=s_q, s_k=s_k, d=16)
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


@pytest.mark.usefixtures("one_thread")
def test_default_query_chunk_on_the_cpu_is_2048_rows():
    """emulate's docstring: q_chunk defaults to 2048 query rows on the CPU (it bounds the memory of a pass). With
    one-row blocks and one 16-key tile, 2050 queries are emulated as rows 0-2047, then 2048-2049."""
    r = get_recipe("ck").replace(name="ck-1x16", block_m=1, block_n=16, head_dim_tiles=())
    q, k, v = _qkv_trace(s_q=2050, s_k=16, d=16)
    trace: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsupportedHeadDimWarning)
        emulate(q, k, v, r, trace=trace)
    assert [(tr["rows"], tr["cols"]) for tr in trace] == [((0, 2048), (0, 16)), ((2048, 2050), (0, 16))]


# --------------------------------------------------------------------------------------------------------- P not in FP8


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("p_format", ["bf16", "fp32"])
def test_fmax_scale_is_one_for_p_formats_without_an_fp8_range(p_format):
    """p_scale='fmax' multiplies P by the FP8 format's largest value (448 for e4m3fn); a bf16 or fp32 P has no
    FP8 range to fill, so P is exp2(t) rounded to its format, in (0, 1] (zyfa.recipes: 'none': P in (0, 1])."""
    r = get_recipe("ck").replace(name=f"ck-p-{p_format}", p_format=p_format)
    q, k, v = _qkv_trace(s_q=128, s_k=256, seed=3)
    trace: list = []
    emulate(q, k, v, r, causal=True, trace=trace)
    for tr in trace:
        p = torch.exp2(tr["t"])
        assert torch.equal(tr["p8"], round_to_bf16(p) if p_format == "bf16" else p)
        assert tr["p8"].max().item() == 1.0  # the row max's probability


# -------------------------------------------------------------------------------------------------------------- warning

SUPPORTED = "64/64, 128/128, 256/256, 192/128, 576/512"


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("d,d_v", [(40, 40), (48, 32)])
def test_unsupported_head_dims_warning_names_the_pairs_kernels_run(d, d_v):
    q, k, v = _qkv_trace(s_q=8, s_k=8, d=d, d_v=d_v)
    with pytest.warns(UnsupportedHeadDimWarning) as rec:
        emulate(q, k, v, "zyfa")
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert msg.startswith(f"head dims {d}/{d_v} (qk/v) match no kernel this emulator models")
    assert f"(they run {SUPPORTED})" in msg
    assert msg.endswith(": emulated as the same tiling would compute them")


def _warning_location():
    q, k, v = _qkv_trace(s_q=8, s_k=8, d=40)
    with pytest.warns(UnsupportedHeadDimWarning) as rec:
        emulate(q, k, v, "zyfa")
    return rec[0]


@pytest.mark.usefixtures("one_thread")
def test_head_dim_warning_is_not_attributed_to_the_emulator():
    """The warning points away from zyfa/emulator.py (at the code that called emulate)."""
    w = _warning_location()
    assert Path(w.filename).resolve() != Path(zyfa.emulator.__file__).resolve()


@pytest.mark.usefixtures("one_thread")
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


# --------------------------------------------------------------------------------------------------- last: the slow one


@pytest.mark.usefixtures("one_thread")
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
