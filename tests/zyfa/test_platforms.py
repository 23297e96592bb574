"""The platform axis (zyfa.platforms): the fitted Hopper accumulator on small GEMMs against an independent
float64 implementation of the rule, exhaustively over e4m3fn operands; every recipe on every platform; the
platform recorded in result rows; the ``--platform`` flag; FA3's head-dim tiles (224 keys, lengths that are no
multiple of it)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from zyfa.accuracy.inputs.attention_input import GaussianSpec, make_gaussian
from zyfa.accuracy.operator.runner import run_accuracy
from zyfa.reference.attention import attention_fp64

from zyfa.cli import main
from zyfa.emulator import emulate
from zyfa.formats import round_to_fp8
from zyfa.platforms import PLATFORM_NAMES, PLATFORMS, get_platform, stepwise_mma, truncating_mma
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import RECIPES


def _e4m3fn_values() -> np.ndarray:
    """Every finite e4m3fn value (both zeros once), as float64."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy().astype(np.float64)
    return np.unique(codes[np.isfinite(codes)])


def _rule(a: np.ndarray, b: np.ndarray, acc: np.ndarray | None, bits: int) -> np.ndarray:
    """The fitted rule on one k step (docs/PLATFORMS.md), written from its description with exact float64 integer
    arithmetic on the operands a, b (..., 32) (e4m3fn values) and the accumulator (...): scale every term to an
    integer count of 2^-18 (e4m3fn products are multiples of 2^-18, accumulators here too); E = the largest of
    the non-zero products' exponents ea + eb (an operand's exponent: floor(log2|x|), -6 if subnormal) and the
    accumulator's floor(log2|acc|); drop every term's bits below 2^(E - bits) toward zero; sum; drop the sum's
    bits below ``bits`` bits under its own leading bit (or E's, the larger), toward zero."""
    unit = 2.0**-18

    def exponent(x):  # floor(log2|x|) of integers or values (exact: |x| < 2^53), 0 where x == 0
        out = np.zeros(np.shape(x))
        nz = x != 0
        out[nz] = np.floor(np.log2(np.abs(x[nz])))
        return out

    def drop(ints, e):  # drop the bits below 2^e (in units) toward zero; no term has bits below one unit
        q = 2.0 ** np.maximum(e, 0)
        return np.sign(ints) * np.floor(np.abs(ints) / q) * q

    prods = a * b
    ints = np.rint(prods / unit)  # exact: every term is an integer multiple of 2^-18
    assert np.array_equal(ints * unit, prods)
    op_exp = np.maximum(exponent(a), -6) + np.maximum(exponent(b), -6) + 18  # in units
    e = np.where(ints != 0, op_exp, -np.inf).max(-1)
    if acc is not None:
        acc_ints = np.rint(acc / unit)
        assert np.array_equal(acc_ints * unit, acc)
        e = np.where(acc_ints != 0, np.maximum(e, exponent(acc_ints)), e)
    e = np.where(np.isinf(e), 0, e)  # nothing non-zero: the sum is 0 whatever e is
    total = drop(ints, e[..., None] - bits).sum(-1) + (0 if acc is None else drop(acc_ints, e - bits))
    return drop(total, np.maximum(exponent(total), e) - bits) * unit


def test_single_step_every_pair_of_e4m3fn_values_matches_the_rule():
    """Lane 0 takes every product x·y of two e4m3fn values (both signs); the other 31 lanes hold fixed
    products, and the incoming accumulator is absent, small, or large: the model's sum is the rule's, for
    13 kept bits (the H200 fit) and 6."""
    vals = _e4m3fn_values()
    x, y = (g.ravel() for g in np.meshgrid(vals, vals, indexing="ij"))
    rng = np.random.default_rng(0)
    rest_a = round_to_fp8(torch.from_numpy(rng.normal(size=31) * 4), "e4m3fn").numpy().astype(np.float64)
    rest_b = round_to_fp8(torch.from_numpy(rng.normal(size=31)), "e4m3fn").numpy().astype(np.float64)
    a = np.concatenate([x[:, None], np.broadcast_to(rest_a, (x.size, 31))], axis=1)[:, None, :]  # (N, 1, 32)
    b = np.concatenate([y[:, None], np.broadcast_to(rest_b, (y.size, 31))], axis=1)[:, :, None]  # (N, 32, 1)
    a_ops, b_ops = a[:, 0, :][:, None, :], b[:, :, 0][:, None, :]  # (N, 1, 32): the operands of each output
    for bits in (13, 6):
        for acc_val in (None, 0.75, -3.0e4):
            acc = None if acc_val is None else np.full((x.size, 1, 1), acc_val)
            got = truncating_mma(torch.from_numpy(a).float(), torch.from_numpy(b).float(),
                                 None if acc is None else torch.from_numpy(acc).float(), bits)
            want = _rule(a_ops, b_ops, None if acc is None else acc[..., 0], bits)
            np.testing.assert_array_equal(got.numpy()[..., 0].astype(np.float64), want,
                                          err_msg=f"bits {bits}, accumulator {acc_val}")


@pytest.mark.parametrize("seed", range(6))
def test_chains_and_flushed_steps_match_the_rule_on_signed_gemms(seed):
    """Random signed 5x96x7 FP8 GEMMs (three k steps, with and without an incoming accumulator): the chain
    (truncating_mma) and the per-step flush (stepwise_mma) against the rule applied step by step."""
    g = torch.Generator().manual_seed(seed)
    a = round_to_fp8(torch.randn(5, 96, generator=g) * 20, "e4m3fn")
    b = round_to_fp8(torch.randn(96, 7, generator=g) * 3, "e4m3fn")
    acc0 = round_to_fp8(torch.randn(5, 7, generator=g) * 50, "e4m3fn")
    an, bn = a.double().numpy(), b.double().numpy()
    for acc in (None, acc0):
        c = None if acc is None else acc.double().numpy()
        for k0 in range(0, 96, 32):
            c = _rule(an[:, None, k0:k0 + 32], bn.T[None, :, k0:k0 + 32], c, 13)
        got = truncating_mma(a, b, acc, 13)
        np.testing.assert_array_equal(got.double().numpy(), c)
    steps = np.zeros((5, 7), dtype=np.float32)  # each step's result is exact in fp32; added in fp32, in k order
    for k0 in range(0, 96, 32):
        steps = steps + _rule(an[:, None, k0:k0 + 32], bn.T[None, :, k0:k0 + 32], None, 13).astype(np.float32)
    np.testing.assert_array_equal(stepwise_mma(a, b, 13).numpy(), steps)
    assert not torch.equal(truncating_mma(a, b, None, 13), a @ b)  # the model is not a plain matmul here


def test_platform_registry():
    h200, mi = get_platform("h200"), get_platform("mi355x")
    assert set(PLATFORM_NAMES) == {"h200", "mi355x"} and get_platform(h200) is h200
    assert h200.truncates("qk", fp8=True) and h200.truncates("pv", fp8=True)
    assert not h200.truncates("qk", fp8=False) and not h200.truncates("pv", fp8=False)  # BF16: taken as fp32
    assert not any(mi.truncates(g, f) for g in ("qk", "pv") for f in (True, False))
    assert h200.status == "modelled" and mi.status == "assumed" and "not published" in mi.unknown
    assert h200.accum_bits == 13 and mi.accum_bits is None  # the H200 fit; nothing truncates on the MI355X
    with pytest.raises(ValueError, match=r"^unknown platform 'a100'; known platforms: h200, mi355x$"):
        get_platform("a100")
    with pytest.raises(ValueError, match="gemm must be 'qk' or 'pv', got 'qv'"):
        h200.truncates("qv", True)


def test_default_platforms():
    """AMD peers and ZYFA on the MI355X, NVIDIA peers (and the BF16 baseline) on the H200."""
    for r in RECIPES.values():
        want = "h200" if {"nvidia", "hopper", "baseline"} & set(r.tags) else "mi355x"
        assert r.platform == want, r.name


def _small(seq=96, d=64, causal=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, seq, d, generator=g) * s for s in (1.5, 1.5, 1.0)]


@pytest.mark.parametrize("platform", PLATFORM_NAMES)
def test_every_recipe_runs_on_every_platform(platform):
    q, k, v = _small()
    for r in RECIPES.values():
        em = emulate(q, k, v, r, causal=True, platform=platform)
        assert em.platform == platform
        assert torch.isfinite(em.out).all(), r.name


def test_the_platform_changes_fp8_recipes_only_where_it_truncates():
    """zyfa-hopper on the MI355X is zyfa bit for bit (the tensor-core accumulator there is fp32); on the H200
    both GEMMs truncate, so its fp32 output differs; a BF16 recipe is the same on both (BF16 sums in fp32)."""
    q, k, v = _small(seq=200, d=128)
    base = emulate(q, k, v, "zyfa", causal=True)
    assert torch.equal(emulate(q, k, v, "zyfa-hopper", causal=True, platform="mi355x").out, base.out)
    f32 = {p: emulate(q, k, v, get_recipe("zyfa-hopper").replace(out_format="fp32"), platform=p).out
           for p in PLATFORM_NAMES}
    assert not torch.equal(f32["h200"], f32["mi355x"])
    bf = {p: emulate(q, k, v, get_recipe("bf16").replace(out_format="fp32"), platform=p).out for p in PLATFORM_NAMES}
    assert torch.equal(bf["h200"], bf["mi355x"])


def test_qk_truncation_is_modelled_on_h200():
    """The trace's log2 probabilities on the H200 are those of the truncated Q8·K8ᵀ (one tile, no mask)."""
    q, k, v = _small(seq=64, d=128)
    r = get_recipe("zyfa-hopper")
    trace: list = []
    emulate(q, k, v, r, trace=trace)
    from zyfa.emulator import quantize_inputs

    qi = quantize_inputs(q, k, v, r)
    s = truncating_mma(qi.q_values, qi.k_values.transpose(-1, -2), None, 13)
    scale = torch.tensor(math.log2(math.e) / math.sqrt(128), dtype=torch.float32)
    x = s * ((scale * qi.q_descale) * qi.k_descale)  # the emulator's order of the fp32 scale products
    t = x - x.amax(-1, keepdim=True)
    torch.testing.assert_close(trace[0]["t"][..., :64, :], t, rtol=0, atol=0)
    plain = qi.q_values @ qi.k_values.transpose(-1, -2)
    assert not torch.equal(s, plain)


def test_recipe_on_platform_names_and_errors():
    r = get_recipe("ck@h200")
    assert r.name == "ck@h200" and r.platform == "h200" and get_recipe("ck").on("mi355x") is RECIPES["ck"]
    assert get_recipe("fa3").on("h200") is RECIPES["fa3"]
    with pytest.raises(ValueError, match="unknown platform 'tpu'"):
        get_recipe("ck@tpu")
    with pytest.raises(ValueError, match="platform"):
        RECIPES["ck"].replace(platform="a100")


def test_rows_record_the_platform():
    inp = make_gaussian(GaussianSpec(heads_q=1, heads_kv=1, seq=64, head_dim=64, causal=True))
    rows = run_accuracy(inp, ["zyfa", "zyfa@h200", "fa3"], progress=False)
    assert [(r["recipe"], r["platform"]) for r in rows] == [("zyfa", "mi355x"), ("zyfa@h200", "h200"),
                                                            ("fa3", "h200")]


def test_accuracy_platform_flag(capsys, tmp_path):
    small = ["accuracy", "--seq", "64", "--head-dim", "64", "--heads", "1", "--device", "cpu", "--no-progress"]
    out = tmp_path / "r.jsonl"
    assert main([*small, "--recipes", "ck,fa3", "--platform", "h200", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| ck@h200 " in text and "| fa3 " in text and "--platform h200" in text
    assert main([*small, "--recipes", "ck", "--platform", "a100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["zyfa accuracy: error: unknown platform 'a100'; known platforms: h200, mi355x"]


def test_fa3_tiles_follow_tile_size_h():
    """FA3's FP8 tiles by head dim (hopper/tile_size.h, the element_size == 1 branch)."""
    fa3 = RECIPES["fa3"]
    assert [fa3.tiles(d) for d in (64, 96, 128, 192, 256, 576)] == [
        (192, 160), (192, 128), (128, 224), (128, 160), (128, 128), (128, 128)]
    assert RECIPES["zyfa"].tiles(128) == (128, 128)
    with pytest.raises(ValueError, match="head_dim_tiles"):
        fa3.replace(head_dim_tiles=((128, 128, 224), (64, 192, 160)))  # not increasing
    with pytest.raises(ValueError, match="block_n % 32"):
        fa3.replace(head_dim_tiles=((128, 128, 200),))


@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(causal=True, window=300)])
def test_a_224_key_tile_over_lengths_that_are_no_multiple_of_it(mask):
    """Tiles of 224 keys over 500 keys (two whole tiles and 52): the trace's tiles are 224 wide from key 0,
    and with fp32 P and output the emulation is the FP64 attention to fp32 precision (a tile bug would not)."""
    q, k, v = _small(seq=500, d=128, seed=1)
    r = get_recipe("fp32").replace(name="fp32-224", head_dim_tiles=((128, 128, 224),))
    trace: list = []
    em = emulate(q, k, v, r, trace=trace, **mask)
    cols = sorted({t["cols"] for t in trace})
    assert cols[0][0] == 0 and all(c1 - c0 == 224 or c1 == 500 for c0, c1 in cols)
    assert all(c0 % 224 == 0 for c0, _ in cols) and (448, 500) in cols
    ref, _ = attention_fp64(q.double(), k.double(), v.double(), **mask)
    torch.testing.assert_close(em.out.double(), ref, rtol=0, atol=2e-5)
    fa3 = emulate(q, k, v, "fa3", trace=(tr := []), **mask)  # the named recipe at hd128: 224-key tiles
    assert {c1 - c0 for c0, c1 in (t["cols"] for t in tr)} <= {224, 52} and torch.isfinite(fa3.out).all()
    assert PLATFORMS["h200"].accum_bits == 13


def test_study_platform_flag_refuses_an_unknown_platform_in_one_line(capsys, tmp_path):
    assert main(["study", "--platform", "a100", "--quick", "--captures", "none", "--device", "cpu",
                 "--out", str(tmp_path / "s")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert err == ["zyfa study: error: unknown platform 'a100'; known platforms: h200, mi355x"]
