"""CPU tests of the CuTe kernel's wrapper: every refusal is one clear line, before cutlass is imported (no DSL and
no GPU needed)."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch

from tests.kernels import test_cute_kernel_gpu
from tests.kernels.fresh_import import imports_heavy
from tests.kernels.test_wrapper_validation import FP8, qkv
from zyfa.kernels.attention_cute import (
    CUTE_RECIPE,
    attention_cute,
    attention_cute_quantized,
    compile_for,
    cute_plan,
)
from zyfa.kernels.cute_plan import CUTE_FIRST_FORM, check_form, cute_config, persistent_item, persistent_pass_item


def test_import_does_not_import_cutlass():
    assert not imports_heavy("zyfa.kernels.attention_cute", "cutlass")


def test_target_recipe_is_accepted():
    plan = cute_plan(CUTE_RECIPE)
    assert (plan.exp_mad, plan.p_scale, plan.rowsum_rounded, plan.pv_mode, plan.out_mode) == (True, 3, 1, 4, 0)
    # technique 3's row sum on the tensor core (P8·ones) is the one other row sum it takes
    assert cute_plan(f"{CUTE_RECIPE}:rowsum=rounded_mma").rowsum_rounded == 2


@pytest.mark.parametrize("spec,field", [
    ("zyfa", "accumulator"),
    ("fa3", "exp_method"),
    ("zyfa-exp2", "exp_method"),
    ("zyfa-hopper:accum_flush_tiles=0", "accum_flush_tiles"),
    ("zyfa-hopper:accum_flush_tiles=2", "accum_flush_tiles"),
    ("zyfa-hopper:rowsum=fp32", "rowsum"),
    ("zyfa-hopper:p_scale_granularity=tile", "p_scale_granularity"),
    ("zyfa-hopper:q_scale=block", "q_scale"),
    ("zyfa-hopper:v_scale=channel", "v_scale"),
    ("zyfa-hopper:block_n=64", "block_n"),
    ("zyfa-hopper:out_format=fp32", "out_format"),
    ("zyfa-hopper:reciprocal=rcp", "reciprocal"),
    ("zyfa-hopper:k_smoothing=true", "k_smoothing"),
    ("zyfa-hopper:mad_offset=0", "mad_offset"),
])
def test_unsupported_recipes_refused_naming_the_field(spec, field):
    with pytest.raises(ValueError, match=f"CuTe FP8 kernel does not support {field}=") as e:
        cute_plan(spec)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=f"does not support {field}="):  # the same line from the compile entry
        compile_for(b=1, h=2, h_kv=2, s_q=128, s_k=128, d_qk=128, d_v=128, causal=False, recipe=spec)


def test_recipe_the_triton_kernel_refuses_gets_its_line():
    with pytest.raises(ValueError, match="Triton FP8 kernel does not support q_format"):
        cute_plan("zyfa-hopper:q_format=e5m2")


@pytest.mark.parametrize("d_qk,d_v", [(256, 128), (128, 64), (64, 128)])
def test_head_dims_not_supported(d_qk, d_v):
    q, k, v = qkv(d_qk=d_qk, d_v=d_v)
    with pytest.raises(ValueError, match="CuTe FP8 kernel supports head dims"):
        attention_cute(q, k, v)
    with pytest.raises(ValueError, match="CuTe FP8 kernel supports head dims"):
        compile_for(b=1, h=2, h_kv=2, s_q=16, s_k=16, d_qk=d_qk, d_v=d_v, causal=False)


def test_cpu_tensors_refused():
    q, k, v = qkv(d_qk=128, d_v=128)
    with pytest.raises(ValueError, match="CUDA GPU"):
        attention_cute(q, k, v, q_descale=1.0, k_descale=1.0, v_descale=1.0)
    with pytest.raises(ValueError, match="CUDA GPU"):
        attention_cute_quantized(*qkv(d_qk=128, d_v=128, dtype=torch.float32), causal=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e5m2])
def test_wrong_dtype(dtype):
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        attention_cute(*qkv(d_qk=128, d_v=128, dtype=dtype))


def test_bad_inputs_and_descales():
    q, k, v = qkv(d_qk=128, d_v=128)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention_cute(*qkv(h=3, h_kv=2, d_qk=128, d_v=128))
    with pytest.raises(ValueError, match="q_descale must be a positive"):
        attention_cute(q, k, v, q_descale=-1.0)
    with pytest.raises(ValueError, match="k_descale must be one scalar or of shape"):
        attention_cute(q, k, v, k_descale=torch.ones(1, 2, 16))  # per-key descales: not this kernel's
    with pytest.raises(ValueError, match="sm_scale"):
        attention_cute(q, k, v, sm_scale=0.0)
    with pytest.raises(TypeError, match="causal must be a bool"):
        attention_cute(q, k, v, causal=1)
    qt = torch.randn(1, 2, 128, 128).to(FP8).transpose(-1, -2)
    kt = torch.randn(1, 2, 128, 128).to(FP8)
    with pytest.raises(ValueError, match="contiguous last dim"):
        attention_cute(qt, kt, kt)


@pytest.mark.parametrize("kwargs,match", [
    ({"s_q": 0}, "s_q must be a positive int"),
    ({"h": 3, "h_kv": 2}, "multiple of kv heads"),
    ({"causal": 1}, "causal must be a bool"),
    ({"sms": 0}, "sms must be a positive int"),
    ({"sms": True}, "sms must be a positive int"),
])
def test_compile_for_refuses_bad_shapes(kwargs, match):
    args = {"b": 1, "h": 2, "h_kv": 2, "s_q": 128, "s_k": 128, "d_qk": 128, "d_v": 128, "causal": False, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        compile_for(**args)


def test_forms_default_and_first():
    """The default form leaves the clamp out where the guard allows and splits the mask off (zyfa-hopper has the
    margin: mad_m_safe 177K); the first form is all switches off; a form without a margin is refused."""
    plan = cute_plan(CUTE_RECIPE)
    assert cute_config(plan) == {"MAD_CVT": 6, "MASK_SPLIT": 1, "BOOKKEEPING": 1, "PV_OVERLAP": 0, "PV_BLOCK": 64,
                                 "EPILOGUE": 1, "PERSISTENT": 0}
    assert cute_config(plan, CUTE_FIRST_FORM) == {"MAD_CVT": 3, "MASK_SPLIT": 0, "BOOKKEEPING": 0, "PV_OVERLAP": 0,
                                                  "PV_BLOCK": 64, "EPILOGUE": 0, "PERSISTENT": 0}
    assert cute_config(plan, {"PERSISTENT": 1})["PERSISTENT"] == 1
    assert cute_config(plan, {"PV_OVERLAP": 1})["PV_OVERLAP"] == 1
    assert cute_config(plan, {"PV_OVERLAP": 2}, causal=True, d_v=128)["PV_OVERLAP"] == 2
    assert cute_config(plan, {"MAD_CVT": 3})["MASK_SPLIT"] == 1


@pytest.mark.parametrize("causal,d_v,overlap", [(False, 64, 0), (False, 128, 0), (True, 64, 1), (True, 128, 1),
                                                (True, 256, 0), (False, 256, 0)])
def test_pv_overlap_is_the_causal_default_up_to_d_v_128(causal, d_v, overlap):
    """PV_OVERLAP 1 is the default where it passed its rule (causal, d_v <= PV_WHOLE_MAX, where it is allowed at all);
    an override still wins; a causal form without d_v is refused (its default depends on it)."""
    plan = cute_plan(CUTE_RECIPE)
    cfg = cute_config(plan, causal=causal, d_v=d_v)
    assert cfg["PV_OVERLAP"] == overlap
    assert {k: v for k, v in cfg.items() if k != "PV_OVERLAP"} == {k: v for k, v in cute_config(plan).items()
                                                                    if k != "PV_OVERLAP"}
    assert cute_config(plan, {"PV_OVERLAP": 0}, causal=causal, d_v=d_v)["PV_OVERLAP"] == 0
    check_form(cfg, d_v)  # the default is always a form the head dims allow
    with pytest.raises(ValueError, match="depends on d_v"):
        cute_config(plan, causal=True)


@pytest.mark.parametrize("config,match", [
    ({"MAD_CVT": 4}, "MAD_CVT=4"),
    ({"MAD_CVT": True}, "MAD_CVT=True"),
    ({"MASK_SPLIT": 2}, "MASK_SPLIT=2: expected 0 or 1"),
    ({"BOOKKEEPING": None}, "BOOKKEEPING=None: expected 0 or 1"),
    ({"PV_OVERLAP": True}, "PV_OVERLAP=True: expected 0, 1 or 2"),
    ({"PV_OVERLAP": 3}, "PV_OVERLAP=3: expected 0, 1 or 2"),
    ({"PERSISTENT": 2}, "PERSISTENT=2: expected 0 or 1"),
    ({"BLOCK_M": 64}, "no switch 'BLOCK_M'"),
])
def test_bad_forms_refused(config, match):
    with pytest.raises(ValueError, match=match):
        cute_config(cute_plan(CUTE_RECIPE), config)
    q, k, v = qkv()
    with pytest.raises(ValueError, match=match):  # before anything is compiled or launched
        attention_cute(q.to(FP8), k.to(FP8), v.to(FP8), config=config)


@pytest.mark.parametrize("config,match", [({"PV_OVERLAP": 1}, "PV_OVERLAP=1 needs d_v <= 128"),
                                          ({"PV_OVERLAP": 2}, "PV_OVERLAP=2 needs d_v <= 128"),
                                          ({"PV_BLOCK": 48}, r"PV_BLOCK=48: expected one of \(32, 64\)"),
                                          ({"PV_BLOCK": True}, "PV_BLOCK=True")])
def test_forms_refused_at_hd256(config, match):
    """P·V runs in column blocks above d_v 128: the overlapped loop is refused there, and a block the kernel has no
    form for anywhere; one line, before cutlass is imported, from the compile entry and from the call."""
    with pytest.raises(ValueError, match=match) as e:
        compile_for(b=1, h=2, h_kv=2, s_q=16, s_k=16, d_qk=256, d_v=256, causal=False, config=config)
    assert "\n" not in str(e.value)
    q, k, v = qkv(d_qk=256, d_v=256)
    with pytest.raises(ValueError, match=match):
        attention_cute(q, k, v, config=config)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_blocks_m,n_heads,sms", [(256, 16, 132), (17, 16, 132), (9, 16, 132), (3, 4, 5),
                                                    (1, 1, 132), (64, 32, 114)])
def test_persistent_order_takes_every_item_once(n_blocks_m, n_heads, sms, causal):
    """PERSISTENT: the passes of min(sms, items) CTAs take each (row block, head) exactly once, the causal order
    the heaviest row blocks first."""
    n_items = n_blocks_m * n_heads
    n_ctas = min(sms, n_items)
    taken = [persistent_item(g, causal=causal, n_blocks_m=n_blocks_m, n_heads=n_heads)
             for it in range(-(-n_items // n_ctas)) for cta in range(n_ctas)
             if (g := persistent_pass_item(cta, it, n_ctas)) < n_items]
    assert sorted(taken) == [(mb, bh) for mb in range(n_blocks_m) for bh in range(n_heads)]
    if causal:  # the g-th item has the most KV tiles of those after it
        order = [persistent_item(g, causal=True, n_blocks_m=n_blocks_m, n_heads=n_heads)[0] for g in range(n_items)]
        assert order == sorted(order, reverse=True)


def test_persistent_causal_work_evens_out():
    """The serpentine over the longest-first order at the bench's causal shape (32K keys: 256 row blocks, 16 heads,
    132 SMs; row block mb visits mb + 1 KV tiles): the busiest CTA has within 0.2% of the mean work, where handing
    the same order out round robin (every pass from CTA 0) leaves it 3% above."""
    n_blocks_m, n_heads, n_ctas = 256, 16, 132
    n_items = n_blocks_m * n_heads

    def busiest(index) -> float:
        work = [0] * n_ctas
        for it in range(-(-n_items // n_ctas)):
            for cta in range(n_ctas):
                if (g := index(cta, it)) < n_items:
                    work[cta] += persistent_item(g, causal=True, n_blocks_m=n_blocks_m, n_heads=n_heads)[0] + 1
        return max(work) / (sum(work) / n_ctas)

    assert busiest(lambda cta, it: persistent_pass_item(cta, it, n_ctas)) < 1.002
    assert busiest(lambda cta, it: it * n_ctas + cta) > 1.03


def test_the_gpu_smoke_child_calls_the_wrapper_as_it_is():
    """The GPU tests' smoke child (test_cute_kernel_gpu._SMOKE, run only on a GPU) calls the wrappers with keywords
    they take: a wrong one failed every CuTe GPU test of a device session (attention_cute_quantized has no config)."""
    wrappers = {"attention_cute": attention_cute, "attention_cute_quantized": attention_cute_quantized}
    calls = [n for n in ast.walk(ast.parse(test_cute_kernel_gpu._SMOKE)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id.startswith("attention_cute")]
    assert calls
    for c in calls:
        params = inspect.signature(wrappers[c.func.id]).parameters
        assert all(k.arg in params for k in c.keywords), (c.func.id, [k.arg for k in c.keywords])
