"""CPU tests of the FP8 attention wrapper's validation: every bad input gets a clear error before Triton loads.

No GPU and no Triton needed: the wrapper checks types, shapes, head dims, strides, descales and recipe fields
before the device check, so these run on the CPU CI machine with CPU tensors.
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.kernels.fresh_import import imports_heavy
from zyfa.kernels.attention_fp8 import (
    MAD_FUSED_DRIFT,
    MAD_FUSED_DRIFT0,
    attention_fp8,
    attention_fp8_quantized,
    default_config,
    default_mad_cvt,
    fused_mad_is_exact,
    k32_key_order,
    kernel_plan,
    mad_code_bound,
    mad_codes_bounded,
    mad_cvt_for_descales,
    mad_m_safe,
    prepare_vt,
    recipe_from_spec,
    resolve_config,
)
from zyfa.kernels.tuning import REMOVED_SWITCHES, vt_key_order_for
from zyfa.recipes import RECIPES

FP8 = torch.float8_e4m3fn


def qkv(b=1, h=2, h_kv=2, s_q=16, s_k=16, d_qk=64, d_v=64, dtype=FP8):
    q = torch.randn(b, h, s_q, d_qk).to(dtype)
    k = torch.randn(b, h_kv, s_k, d_qk).to(dtype)
    v = torch.randn(b, h_kv, s_k, d_v).to(dtype)
    return q, k, v


def test_package_import_does_not_import_triton():
    assert not imports_heavy("zyfa.kernels.attention_fp8", "triton")


def test_cpu_tensors_refused_after_all_other_checks():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="CUDA GPU"):
        attention_fp8(q, k, v, q_descale=1.0, k_descale=1.0, v_descale=1.0)


def test_float_inputs_need_quantizing():
    q, k, v = qkv(dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        attention_fp8(q, k, v)
    with pytest.raises(TypeError, match="quantize the inputs"):
        attention_fp8(q, k, v, q_descale=0.1, k_descale=0.1, v_descale=0.1)


def test_e5m2_refused():
    q, k, v = qkv(dtype=torch.float8_e5m2)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        attention_fp8(q, k, v, q_descale=1.0, k_descale=1.0, v_descale=1.0)


@pytest.mark.parametrize("d_qk,d_v", [(32, 32), (96, 96), (128, 192), (512, 512), (80, 64)])
def test_unsupported_head_dims(d_qk, d_v):
    q, k, v = qkv(d_qk=d_qk, d_v=d_v)
    with pytest.raises(ValueError, match="unsupported head dims"):
        attention_fp8(q, k, v)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_non_contiguous_last_dim(which):
    q, k, v = qkv()
    t = {"q": q, "k": k, "v": v}
    x = t[which]
    t[which] = torch.empty(x.shape[0], x.shape[1], x.shape[3], x.shape[2], dtype=FP8).transpose(-1, -2)
    with pytest.raises(ValueError, match="contiguous last dim"):
        attention_fp8(t["q"], t["k"], t["v"])


def test_mismatched_shapes():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="batch mismatch"):
        attention_fp8(q, torch.cat([k, k]), torch.cat([v, v]))
    with pytest.raises(ValueError, match="share batch, heads and seq"):
        attention_fp8(q, k, v[:, :, :8])
    q3, k3, v3 = qkv(h=3, h_kv=2)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention_fp8(q3, k3, v3)
    with pytest.raises(ValueError, match="4-D"):
        attention_fp8(q[0], k, v)
    qa, ka, va = qkv()
    with pytest.raises(ValueError, match="head dims differ"):
        attention_fp8(qa, torch.randn(1, 2, 16, 128).to(FP8), torch.randn(1, 2, 16, 64).to(FP8))
    with pytest.raises(TypeError, match="torch.Tensor"):
        attention_fp8([1, 2], k, v)


def test_bad_descales():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="positive"):
        attention_fp8(q, k, v, q_descale=0.0)
    with pytest.raises(ValueError, match="positive"):
        attention_fp8(q, k, v, k_descale=torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="shape"):
        attention_fp8(q, k, v, v_descale=torch.ones(3, 3))
    with pytest.raises(TypeError, match="floating-point"):
        attention_fp8(q, k, v, q_descale=torch.ones(1, 2, dtype=torch.int32))
    with pytest.raises(TypeError):
        attention_fp8(q, k, v, q_descale="1")


def test_bad_scalars():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="window"):
        attention_fp8(q, k, v, window=0)
    for bad in (-1.0, 0.0, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ValueError, match="sm_scale") as err:
            attention_fp8(q, k, v, sm_scale=bad)
        assert "\n" not in str(err.value)
        with pytest.raises(ValueError, match="sm_scale"):  # the quantizing entry point checks it first too
            attention_fp8_quantized(q.float(), k.float(), v.float(), sm_scale=bad)
    with pytest.raises(TypeError, match="causal"):
        attention_fp8(q, k, v, causal="yes")


@pytest.mark.parametrize("spec,field", [
    ("sage2", "q_format"), ("zyfa:v_scale=none", "v_scale"),
    ("aiter-triton", "p_scale"), ("zyfa:k_scale=block,scale_block_kv=64", "scale_block_kv"),
    ("zyfa:k_scale=block,scale_block_kv=192", "scale_block_kv"),
    ("triton-amd", "log2e_folded"), ("cudnn-fp8", "out_format"), ("bf16", "q_format"), ("fp32", "q_format"),
    ("zyfa:exp_method=exp2_bittrick", "exp_method"), ("zyfa:v_descale=tile", "v_descale"),
    ("ck:exp_method=mad_fp8", "p_scale"), ("zyfa:block_n=256", "block_n"),
    ("zyfa:log2e_folded=false", "log2e_folded"), ("zyfa-tilescale:block_m=256", "block_m"),
])
def test_unsupported_recipe_fields_are_named(spec, field):
    with pytest.raises(ValueError, match=field):
        kernel_plan(spec)
    q, k, v = qkv()
    with pytest.raises(ValueError, match=field):
        attention_fp8(q, k, v, recipe=spec)


@pytest.mark.parametrize("name", ["zyfa", "zyfa-exp2", "zyfa-fp32sum", "zyfa-noscale", "zyfa-pow2fixed",
                                  "zyfa-tilescale", "ck", "aiter", "fa3"])
def test_supported_recipes_map(name):
    plan = kernel_plan(name)
    r = RECIPES[name]
    assert plan.block_n == r.block_n
    assert plan.exp_mad == (r.exp_method == "mad_fp8")
    assert plan.rowsum_rounded == (r.rowsum == "rounded")
    if r.accumulator == "matrix_unit":
        assert not plan.qk_k32 and plan.flush == r.accum_flush_tiles
    else:
        assert plan.qk_k32 and plan.pv_mode == 1


def test_recipe_spec_overrides():
    r = recipe_from_spec("zyfa:accumulator=matrix_unit,accum_flush_tiles=4")
    assert r.accumulator == "matrix_unit" and r.accum_flush_tiles == 4 and r.name.startswith("zyfa:")
    assert kernel_plan(r).pv_mode == 3
    with pytest.raises(ValueError, match="bad recipe override"):
        recipe_from_spec("zyfa:nonsense=1")
    with pytest.raises(ValueError, match="unknown recipe"):
        recipe_from_spec("nope")


def test_recipe_spec_head_dim_tiles():
    """head_dim_tiles as D:MxN entries joined by '|' (commas separate overrides); 'none' clears them."""
    r = recipe_from_spec("fa3:head_dim_tiles=64:192x128|128:128x192|256:128x128")
    assert r.head_dim_tiles == ((64, 192, 128), (128, 128, 192), (256, 128, 128))
    assert [r.tiles(d) for d in (64, 96, 128, 192, 256)] == [(192, 128), (128, 192), (128, 192), (128, 128),
                                                             (128, 128)]
    assert recipe_from_spec("fa3:head_dim_tiles=none").tiles(128) == (128, 128)  # fa3's own block_m x block_n
    for bad in ("64x192x128", "64:192", "a:1x2", "64:192x128,128", "64:192x128|"):
        with pytest.raises(ValueError, match="head_dim_tiles|bad recipe override"):
            recipe_from_spec(f"fa3:head_dim_tiles={bad}")
    with pytest.raises(ValueError, match="increasing head dim"):  # the Recipe's own check still applies
        recipe_from_spec("fa3:head_dim_tiles=128:128x128|64:192x128")


def test_quantized_helper_validates_first():
    q, k, v = qkv(dtype=torch.float32, d_qk=96, d_v=96)
    with pytest.raises(ValueError, match="unsupported head dims"):
        attention_fp8_quantized(q, k, v)
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(ValueError, match="CUDA GPU"):
        attention_fp8_quantized(q, k, v)


def test_prepare_vt_pads_and_transposes():
    v = torch.randn(1, 2, 37, 64).to(FP8)
    vt = prepare_vt(v, permute_k32=False)
    assert vt.shape == (1, 2, 64, 48) and vt.is_contiguous() and vt.zyfa_k32_permuted is False
    assert torch.equal(vt[..., :37].float(), v.transpose(-1, -2).float())
    assert torch.all(vt[..., 37:].float() == 0)


def test_prepare_vt_reorders_keys_within_each_32_key_step():
    """The default Vt (P_PERM=1) pads to 32 keys and reorders them inside each 32-key block only, so every
    wgmma k-step sums the same products; P·V is unchanged when P's columns take the same order."""
    v = torch.randn(2, 3, 70, 64)
    vt = prepare_vt(v.to(FP8))
    assert vt.shape == (2, 3, 64, 96) and vt.zyfa_k32_permuted is True
    order = k32_key_order(96)
    assert sorted(order.tolist()) == list(range(96))
    assert torch.equal(order // 32, torch.arange(96) // 32)  # never leaves its 32-key block
    assert order[:8].tolist() == [0, 1, 8, 9, 2, 3, 10, 11]  # thread 0's accumulator pairs, packed as 4 bytes
    plain = prepare_vt(v.to(FP8), permute_k32=False)
    assert torch.equal(vt[..., : plain.shape[-1]].float(), torch.cat(
        [plain, torch.zeros(2, 3, 64, 96 - plain.shape[-1]).to(FP8)], -1)[..., order].float()[..., : plain.shape[-1]])
    p = torch.rand(5, 96, dtype=torch.float64)
    vd = torch.randn(96, 4, dtype=torch.float64)
    assert torch.allclose(p[:, order] @ vd[order], p @ vd)


def test_launch_refuses_a_vt_in_the_other_key_order():
    """A Vt made for the other P_PERM would pair P with the wrong keys: refused before anything runs."""
    from zyfa.kernels.attention_fp8 import launch

    q, k, v = qkv(d_qk=128, d_v=128)
    plan = kernel_plan("zyfa-hopper")
    d = torch.ones(1, 2)
    with pytest.raises(ValueError, match="permute_k32=True"):
        launch(q, k, prepare_vt(v, permute_k32=False), d, d, d, plan=plan, seq_k=16, causal=False,
               sm_scale=0.1, window=None)
    with pytest.raises(ValueError, match="permute_k32=False"):
        launch(q, k, prepare_vt(v), d, d, d, plan=plan, seq_k=16, causal=False, sm_scale=0.1, window=None,
               config={"P_PERM": 0})


def test_default_config_mad_form_and_register_caps():
    """The zyfa family runs the fused MAD (MAD_T=0); a MAD whose row max sits on a rounding tie keeps the exact
    t (MAD_T=1); the hand-pipelined QK loop stays off; hd128 causal and d 64 causal get the register cap (168: three
    programs per SM; 128 at d 64: four), and so do the exp2 recipes at d 64 non-causal."""
    hop = kernel_plan("zyfa-hopper")
    assert fused_mad_is_exact(hop) and fused_mad_is_exact(kernel_plan("zyfa"))
    assert default_config(128, 128, False, hop)["MAD_T"] == 0
    on_tie = kernel_plan("zyfa-hopper:mad_offset=0")  # trunc, offset 0: the max's code is a magic-number tie
    assert not fused_mad_is_exact(on_tie) and default_config(128, 128, False, on_tie)["MAD_T"] == 1
    assert not fused_mad_is_exact(kernel_plan("zyfa-exp2"))
    for d_qk, d_v in ((64, 64), (128, 128), (192, 128), (256, 256)):
        for causal in (False, True):
            cfg = default_config(d_qk, d_v, causal, hop)
            assert cfg["P_PERM"] == 1 and not set(cfg) & set(REMOVED_SWITCHES)
            assert cfg.get("PV_MODE", hop.pv_mode) == (2 if d_qk == 256 else 4)  # same per-tile flush
            capped = (d_qk == 64 or d_qk == 128) and causal
            assert cfg["BLOCK_M"] == (128 if d_qk == 256 or (d_qk == 64 and not causal) else 64), (d_qk, causal)
            assert cfg["num_stages"] == (3 if d_qk in (64, 256) else 2), (d_qk, causal)
            assert (cfg.get("maxnreg") is not None) == capped, (d_qk, causal, cfg)
            if capped:  # four programs per SM at d 64 causal, three at hd128 causal
                assert cfg["maxnreg"] == (128 if d_qk == 64 else 168), (d_qk, cfg)
    assert "maxnreg" not in default_config(128, 128, True, kernel_plan("zyfa"))  # k=32 flush: no cap
    fa3_64 = default_config(64, 64, False, kernel_plan("fa3"))  # exp2: the form measured before the MAD's changes
    assert fa3_64["BLOCK_M"] == 64 and fa3_64["num_stages"] == 2 and fa3_64["maxnreg"] == 168
    for d_qk, d_v in ((64, 64), (128, 128), (192, 128), (256, 256)):  # V beside K only at d 256 (measured there)
        for r in ("zyfa-hopper", "fa3", "zyfa", "zyfa-exp2"):
            early = d_qk == 256 and not kernel_plan(r).qk_k32  # never for the fp32-accumulation recipes
            assert default_config(d_qk, d_v, False, kernel_plan(r)).get("VT_EARLY", 0) == early, (d_qk, r)
    with pytest.raises(ValueError, match="VT_EARLY=2"):
        resolve_config(128, 128, False, hop, {"VT_EARLY": 2})
    # switches removed after they lost their A/B: an override naming one is refused, not silently ignored
    for key, value in (("PIPELINE_QK", 1), ("EXP2_SUM", 0), ("PIPELINE_QK", 0), ("WS", 1), ("WS", 0)):
        with pytest.raises(ValueError, match=rf"^{key} was removed from the kernel: .*; docs/KERNEL.md$"):
            resolve_config(128, 128, False, kernel_plan("zyfa-exp2"), {key: value})
    for r, cfg in (("zyfa-exp2", {"VT_EARLY": 1}), ("zyfa", {"VT_EARLY": 1}),
                   ("zyfa-hopper", {"VT_EARLY": 1, "PV_MODE": 1})):
        with pytest.raises(ValueError, match="VT_EARLY=1 is not supported with the fp32 accumulation"):
            resolve_config(256, 256, False, kernel_plan(r), cfg)
    for r in ("fa3", "fa3:accum_flush_tiles=1", "aiter:accumulator=matrix_unit,accum_flush_tiles=1"):
        c64 = default_config(64, 64, True, kernel_plan(r))  # d 64 causal: four programs per SM for every recipe
        assert (c64["BLOCK_M"], c64["num_warps"], c64["num_stages"], c64["maxnreg"]) == (64, 4, 3, 128), (r, c64)


def test_mad_conversion_defaults_and_refusals():
    """The fused MAD drops the clamp at 126 where the program's bound allows (6); exact t on a bounded recipe drops
    it (4); a recipe whose codes can pass 126.5 keeps it (3); MAD_CVT=4 and 6 are refused wherever their bound is
    not rigorous."""
    hop = kernel_plan("zyfa-hopper")
    assert mad_codes_bounded(hop) and abs(mad_code_bound(hop) - 126.021) < 1e-3
    assert default_config(128, 128, False, hop)["MAD_CVT"] == 6  # fused MAD: the clamp only where unguarded
    assert 176000 < mad_m_safe(hop) < 178000
    assert resolve_config(128, 128, False, hop, {"MAD_T": 1})[1] == 4
    assert resolve_config(128, 128, False, hop, {"MAD_CVT": 3})[1] == 3
    assert default_config(128, 128, False, kernel_plan("fa3"))["MAD_CVT"] == 0  # exp2: unused
    assert mad_m_safe(kernel_plan("fa3")) == 0.0
    high = kernel_plan("zyfa-hopper:mad_rounding=nearest,mad_offset=0.5")  # x reaches 126.96
    assert not mad_codes_bounded(high) and default_mad_cvt(high, 1) == 3
    assert mad_m_safe(high) == 0.0 and default_mad_cvt(high, 0) == 3
    with pytest.raises(ValueError, match="MAD_CVT=6.*126.959"):
        resolve_config(128, 128, False, high, {"MAD_CVT": 6})
    # the guard needs one score scale per program: per-row Q or per-tile K descales keep the clamp
    assert mad_cvt_for_descales(6, 0, False) == 6 and mad_cvt_for_descales(6, 2, False) == 6
    assert mad_cvt_for_descales(6, 1, False) == 3 and mad_cvt_for_descales(6, 0, True) == 3
    assert mad_cvt_for_descales(3, 1, True) == 3 and mad_cvt_for_descales(4, 1, False) == 4
    with pytest.raises(ValueError, match="MAD_CVT=4.*MAD_T=1"):
        resolve_config(128, 128, False, hop, {"MAD_CVT": 4})  # fused t: bound not rigorous
    with pytest.raises(ValueError, match="MAD_CVT=4.*126.959"):
        resolve_config(128, 128, False, high, {"MAD_T": 1, "MAD_CVT": 4})
    with pytest.raises(ValueError, match="MAD_CVT=7"):
        resolve_config(128, 128, False, hop, {"MAD_CVT": 7})
    with pytest.raises(ValueError, match="DEBUG"):
        resolve_config(128, 128, False, hop, {"DEBUG": 1})
    assert resolve_config(256, 256, False, hop)[0]["PV_MODE"] == 2
    mma = kernel_plan("zyfa-hopper:rowsum=rounded_mma")
    assert default_config(256, 256, False, mma)["num_stages"] == 2  # the ones tile: 3 stages exceed 227 KB
    assert default_config(256, 256, False, hop)["num_stages"] == 3
    for cvt in (1, 2, 5):  # F2I and the packed clamp, removed after they lost their A/B
        with pytest.raises(ValueError, match=rf"^MAD_CVT={cvt} was removed from the kernel: "):
            resolve_config(128, 128, False, hop, {"MAD_CVT": cvt})
    assert resolve_config(128, 128, False, hop, {"MAD_CVT": 0, "MAD_T": 1}) == (
        {**default_config(128, 128, False, hop), "MAD_CVT": 0, "MAD_T": 1}, 0, hop.mad_bias)


@pytest.mark.parametrize("spec", ["zyfa", "zyfa-tilescale", "zyfa-pow2fixed", "zyfa-noscale"])
def test_mad_code_bound_holds_for_the_emulators_exponents(spec):
    """Over a dense grid of tile maxima t_max <= 0 and scores t <= t_max, the exponent the emulator picks keeps
    x = 8·(t + e) + bias below the bound, so RNE(x) never passes 126 (what MAD_CVT=4 relies on)."""
    import math

    r = recipe_from_spec(spec)
    plan = kernel_plan(r)
    t_max = -torch.linspace(0, 80, 200001, dtype=torch.float32)
    if r.p_scale == "pow2_block":
        e = torch.floor(torch.tensor(math.log2(448.0), dtype=torch.float32) - t_max).clamp(max=r.p_block_max_log2)
    else:
        e = torch.full_like(t_max, plan.e_fixed)
    x = torch.addcmul(torch.tensor(plan.mad_bias), t_max + e, torch.tensor(8.0))  # t = t_max: the largest x
    assert x.max().item() <= mad_code_bound(plan) + 1e-4
    assert torch.round(x).max().item() <= 126


def test_bench_render_summarises_the_committed_h200_run(tmp_path):
    """`zyfa bench --render` rewrites the Markdown from a bench JSON without a GPU; its summary row for hd128
    non-causal is zyfa-hopper against the same run's cuDNN BF16 and FP8 rows."""
    import json
    import shutil
    from pathlib import Path

    from zyfa.bench.table import render

    src = Path(__file__).resolve().parents[2] / "reports" / "bench" / "bench.json"
    dst = tmp_path / "bench_x.json"
    shutil.copy(src, dst)

    md = Path(render(str(dst))).read_text()
    rows = json.loads(Path(src).read_text())["rows"]

    def tf(impl, recipe, causal=False, key="tflops"):
        return next(r[key] for r in rows if r["input"] == "gaussian" and r["s"] == 32768 and r["d_qk"] == 128
                    and r["causal"] == causal and r["impl"] == impl and r["recipe"] == recipe)

    # ours with V's transpose (the headline); the ratios are the medians of the per-repeat ratios
    ours = tf("triton-fp8", "zyfa-hopper", key="tflops_incl_transpose")
    vs = tf("triton-fp8", "zyfa-hopper", key="vs_incl_transpose")
    lines = md.splitlines()
    header = next(x for x in lines if x.startswith("| shape | s | mask |"))
    line = next(x for x in lines if x.startswith("| hd128 | 32768 | non-causal |"))
    def split(row):
        return [c.strip() for c in row.strip("|").split("|")]

    cell = dict(zip(split(header), split(line), strict=True))
    assert cell["zyfa-hopper"] == f"{ours:.0f}"
    assert cell["× cuDNN BF16"].startswith(f"{vs['sdpa-bf16:cudnn']['median']:.2f} [")
    assert cell["× cuDNN FP8"].startswith(f"{vs['cudnn-fp8']['median']:.2f} [")
    assert vs["cudnn-fp8"]["n"] == 5 and vs["cudnn-fp8"]["min"] <= vs["cudnn-fp8"]["median"] <= vs["cudnn-fp8"]["max"]
    assert md.index("## Where we land") < md.index("## Every row")
    bad = tmp_path / "x.json"
    bad.write_text("[]")
    with pytest.raises(ValueError, match="not a zyfa bench file"):
        render(str(bad))
    with pytest.raises(FileNotFoundError, match="missing.json"):
        render(str(tmp_path / "missing.json"))


def test_prepare_vt_copy_argument_is_checked():
    """copy='triton' is for a CUDA tensor of one byte per element and a power-of-two head dim: anything else is
    one clear error naming what is wrong, before any kernel is imported; an unknown copy mode is refused too."""
    v = torch.randn(1, 2, 40, 64).to(FP8)
    with pytest.raises(ValueError, match="copy='triton' needs a CUDA tensor"):
        prepare_vt(v, copy="triton")
    with pytest.raises(ValueError, match="copy must be 'auto', 'torch' or 'triton', got 'numpy'"):
        prepare_vt(v, copy="numpy")
    # on a CPU tensor 'auto' is the torch copy: the same bytes as copy='torch'
    assert torch.equal(prepare_vt(v).view(torch.uint8), prepare_vt(v, copy="torch").view(torch.uint8))


def test_dv_split_is_the_default_at_head_dim_256_only_and_is_checked():
    """O's columns in two halves (DV_SPLIT 2) at d 256, where it removes most spills; not at d_v 128 (slower
    there, measured); never with the every-N-tiles flush (PV_MODE 3), which a user override of PV_MODE 3 drops
    it for; values other than 1 and 2, and halves under 32 columns, are refused."""
    hop = kernel_plan("zyfa-hopper")
    assert default_config(256, 256, False, hop)["DV_SPLIT"] == 2
    assert default_config(256, 256, True, kernel_plan("fa3"))["DV_SPLIT"] == 2
    assert default_config(128, 128, False, hop).get("DV_SPLIT", 1) == 1
    assert default_config(192, 128, True, hop).get("DV_SPLIT", 1) == 1
    every2 = kernel_plan("zyfa-hopper:accum_flush_tiles=2")
    assert every2.pv_mode == 3 and default_config(256, 256, False, every2).get("DV_SPLIT", 1) == 1
    assert resolve_config(256, 256, False, hop, {"PV_MODE": 3})[0]["DV_SPLIT"] == 1
    with pytest.raises(ValueError, match="DV_SPLIT=2 cannot be combined with PV_MODE 3"):
        resolve_config(256, 256, False, hop, {"PV_MODE": 3, "DV_SPLIT": 2})
    with pytest.raises(ValueError, match="DV_SPLIT=3: expected 1"):
        resolve_config(128, 128, False, hop, {"DV_SPLIT": 3})
    with pytest.raises(ValueError, match="DV_SPLIT=2 needs d_v >= 64"):
        resolve_config(32, 32, False, hop, {"DV_SPLIT": 2})
    assert resolve_config(128, 128, False, hop, {"DV_SPLIT": 2})[0]["DV_SPLIT"] == 2


def test_the_key_order_of_vt_is_the_one_the_launch_resolves_to():
    """attention_fp8 prepares Vt in the key order ``vt_key_order_for(config)`` names before the launch resolves
    its config, and the launch refuses a Vt of another order: the two must agree for every override."""
    hop = kernel_plan("zyfa-hopper")
    for config in (None, {}, {"P_PERM": 0}, {"P_PERM": 1}, {"BLOCK_M": 64}):
        for d_qk, causal in ((64, True), (128, False), (256, True)):
            cfg = resolve_config(d_qk, d_qk, causal, hop, config)[0]
            assert vt_key_order_for(config) == bool(cfg["P_PERM"]), (config, d_qk, causal)


def test_triton_v_transpose_in_the_cpu_interpreter_gives_the_torch_copys_bytes():
    """The Triton copy of V's transpose run by Triton's CPU interpreter (TRITON_INTERPRET=1, in a fresh process so
    the kernel is built for it) against the torch copy: the same bytes for both key orders, tails and head dims."""
    import os
    import subprocess
    from pathlib import Path

    pytest.importorskip("triton", reason="triton is not installed here (the GPU image has it; the GPU test "
                                         "test_triton_v_transpose_gives_the_torch_copys_bytes runs the copy there)")
    code = (
        "import torch\n"
        "from zyfa.kernels.attention_fp8 import prepare_vt\n"
        "torch.manual_seed(0)\n"
        "for shape in [(1, 2, 100, 64), (2, 1, 64, 128), (1, 1, 7, 16), (1, 3, 130, 256)]:\n"
        "    v = (torch.randn(shape) * 50).to(torch.float8_e4m3fn)\n"
        "    for perm in (True, False):\n"
        "        a = prepare_vt(v, permute_k32=perm, copy='torch')\n"
        "        t = prepare_vt(v, permute_k32=perm, copy='triton')\n"
        "        assert t.zyfa_k32_permuted is perm and a.shape == t.shape, shape\n"
        "        assert torch.equal(a.view(torch.uint8), t.view(torch.uint8)), (shape, perm)\n"
        "print('same bytes')\n")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "same bytes" in r.stdout, r.stderr[-2000:]


@pytest.mark.parametrize("spec", ["zyfa-hopper", "zyfa", "zyfa-pow2fixed"])
def test_fused_mad_drift_stays_within_the_guards_bound(spec):
    """The kernel's fused-MAD arithmetic at a row max, replayed in fp32 (the FFMA as an exact product and sum
    rounded once): over row maxima |m| up to mad_m_safe, running maxima above the tile's by 0-12 (so t_max + e
    sweeps up to log2(448), the largest code), and score scales c from 2^-12 to 2^4, the code sits at most
    MAD_FUSED_DRIFT·|m| + MAD_FUSED_DRIFT0 above the exact bound, so RNE never passes 126 where MAD_CVT 6 leaves
    the clamp out."""
    import math

    plan = kernel_plan(spec)
    m_safe = mad_m_safe(plan)
    assert m_safe > 0
    f32 = torch.float32
    gen = torch.Generator().manual_seed(0)
    n = 400_000
    m_abs = torch.exp(torch.rand(n, generator=gen, dtype=torch.float64) * math.log(m_safe))
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
    c = torch.exp2(torch.rand(n, generator=gen, dtype=torch.float64) * 16 - 12).to(f32)
    s_max = (sign * m_abs / c.double()).to(f32)  # the tile's raw score maximum
    m_tile = s_max * c  # fp32 product, as tl.max(s, 1) * c
    gap = (torch.rand(n, generator=gen, dtype=torch.float64) * 12).to(f32)
    gap[: n // 4] = 0.0  # the tile holds the running max
    m_use = torch.maximum(m_tile, m_tile + gap)
    if plan.p_scale == 3:
        t_max = m_tile - m_use
        e = torch.minimum(torch.floor(torch.tensor(math.log2(448.0), dtype=f32) - t_max), torch.tensor(plan.e_cap))
    else:
        e = torch.full_like(m_use, plan.e_fixed)
    row_bias = torch.tensor(plan.mad_bias, dtype=f32) + 8.0 * (e - m_use)
    big_c = (c * 8.0) * 0.0078125
    big_b = row_bias * 0.0078125
    y = (s_max.double() * big_c.double() + big_b.double()).to(f32)  # one FFMA: exact product, one rounding
    x = 128.0 * y.double()
    over = x - mad_code_bound(plan)  # how far past the recipe's exact bound the kernel's code can go
    assert (over <= MAD_FUSED_DRIFT * m_use.double().abs() + MAD_FUSED_DRIFT0).all()
    assert x.max().item() < 126.5  # RNE(x) <= 126 without the clamp
    assert x.max().item() > mad_code_bound(plan) - 0.01  # the sweep reached the largest codes


def test_the_guard_takes_the_unclamped_loops_on_every_committed_capture():
    """The kernel's per-program bound DQK·448²·c (c = sm_scale·log2e·qd·kd, the descales `quantize_for_kernel`
    gives zyfa-hopper) stays under mad_m_safe on every layer of the committed captures in datasets/, so real model
    inputs run without the clamp at 126 (445 to 60 632 against 177K when this was written)."""
    import glob
    import math
    from pathlib import Path

    from zyfa.capture.store import read_capture

    from zyfa.kernels.attention_fp8 import quantize_for_kernel

    r = recipe_from_spec("zyfa-hopper")
    m_safe = mad_m_safe(kernel_plan(r))
    files = sorted(glob.glob(str(Path(__file__).resolve().parents[2] / "datasets" / "*.h5")))
    assert files
    bounds = []
    for f in files:
        for rec in read_capture(f):
            _q8, _k8, _v8, qd, kd, _vd = quantize_for_kernel(rec.q.float(), rec.k.float(), rec.v.float(), r)
            kd_q = kd.repeat_interleave(qd.shape[1] // kd.shape[1], 1)  # the KV head each query head uses
            c = rec.sm_scale * math.log2(math.e) * qd * kd_q
            bounds.append(float((rec.q.shape[-1] * 448.0**2 * c).max()))
    assert len(bounds) >= 8 and max(bounds) <= m_safe, (bounds, m_safe)
