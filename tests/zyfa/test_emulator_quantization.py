"""quantize_inputs: every quantizer of the emulator (INT8, FP8 per channel, unit descales, head_kv for K and V),
against element values and descales known by construction.

Each operand is built group by group (head, block, channel, tensor) as exact codes times a power-of-two scale:
INT8 groups as (n + f)·s with integer codes n, |f| <= 0.4 and one element at exactly 127·s; FP8 groups as
e4m3fn values c times s with one c = 448. The documented descale (amax / 127, amax / 448; 1 where the group is
all zero) is then s exactly, and the element values are the codes n or c, written down here, not computed by the
code under test. Groups whose amax is at most 1, all-zero groups and subnormal groups are included on purpose.
The unit descales of unscaled formats must follow the inputs' device and stay float32 whatever torch's default
dtype is (the meta device stands in for a GPU on a CPU-only machine).
"""

from __future__ import annotations

import re

import pytest
import torch

from zyfa.emulator import emulate, quantize_inputs
from zyfa.recipe_spec import get_recipe

pytestmark = pytest.mark.filterwarnings("ignore:head dims")

_INT8 = get_recipe("sage2").replace(name="int8-test", k_smoothing=False)
_E4M3_CODES = torch.tensor([448.0, -3.5, 0.75, 1.25, -26.0, 2.0**-6, 2.0**-9, 0.0, -448.0, 96.0])


def _int8_group(shape, s, seed):
    """(x, codes): x = (n + f)·s with codes n in [-126, 126], |f| <= 0.4, and x[0] = 127·s (the amax)."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randint(-126, 127, shape, generator=g).float()
    f = (torch.rand(shape, generator=g) - 0.5) * 0.8
    n.view(-1)[0] = 127.0
    f.view(-1)[0] = 0.0
    return (n + f) * s, n * (s != 0)


def _int8_operand(scales, shape_per_group, dim, seed=0):
    """Groups stacked along ``dim`` (1: heads, 2: token blocks), group i with scale scales[i] (0: all zeros)."""
    parts = [_int8_group(shape_per_group, s, seed + i) for i, s in enumerate(scales)]
    return torch.cat([p[0] for p in parts], dim), torch.cat([p[1] for p in parts], dim)


def test_int8_per_head_descale_is_the_head_amax_over_127():
    scales = [1.0, 2.0**-3, 2.0**-8, 0.0]  # 2^-8: amax 127/256 < 1; 0: an all-zero head
    q, q_codes = _int8_operand(scales, (1, 1, 6, 8), dim=1)
    k, k_codes = _int8_operand(scales[::-1], (1, 1, 6, 8), dim=1, seed=10)
    qi = quantize_inputs(q, k, k.clone(), _INT8.replace(q_scale="head", k_scale="head"))
    want = torch.tensor([1.0, 2.0**-3, 2.0**-8, 1.0]).reshape(1, 4, 1, 1)
    assert torch.equal(qi.q_descale, want)
    assert torch.equal(qi.k_descale, want.flip(1))
    assert torch.equal(qi.q_values, q_codes) and torch.equal(qi.k_values, k_codes)
    q_deq, k_deq, _ = qi.dequantized()
    assert torch.equal(q_deq, q_codes * want) and torch.equal(k_deq, k_codes * want.flip(1))


def test_int8_per_tensor_descale_is_one_4d_scalar():
    q, q_codes = _int8_operand([2.0**-8], (1, 2, 6, 8), dim=1)  # amax 127/256 < 1
    k = torch.zeros(1, 2, 6, 8)  # all zero: descale 1, codes 0
    qi = quantize_inputs(q, k, k.clone(), _INT8.replace(q_scale="tensor", k_scale="tensor"))
    assert qi.q_descale.shape == (1, 1, 1, 1) and qi.q_descale.item() == 2.0**-8
    assert qi.k_descale.shape == (1, 1, 1, 1) and qi.k_descale.item() == 1.0
    assert torch.equal(qi.q_values, q_codes) and torch.equal(qi.k_values, k)
    emu = emulate(q, q, torch.ones(1, 2, 6, 64), _INT8.replace(q_scale="tensor", k_scale="tensor"))
    assert torch.equal(emu.q_deq, q_codes * 2.0**-8)


def test_int8_per_block_descale_is_each_blocks_amax_over_127():
    scales = [2.0**-2, 0.0, 2.0**-9]  # three blocks of 4 tokens: one all zero, one with amax < 1
    q, codes = _int8_operand(scales, (1, 1, 4, 8), dim=2)
    qi = quantize_inputs(
        q, q, q.clone(), _INT8.replace(q_scale="block", k_scale="block", scale_block_q=4, scale_block_kv=4)
    )
    want = torch.tensor([2.0**-2] * 4 + [1.0] * 4 + [2.0**-9] * 4).reshape(1, 1, 12, 1)
    assert torch.equal(qi.q_descale, want) and torch.equal(qi.k_descale, want)
    assert torch.equal(qi.q_values, codes) and torch.equal(qi.k_values, codes)


def test_int8_codes_saturate_at_plus_minus_127_when_the_descale_underflows():
    """A subnormal amax: 190·2^-149 / 127 rounds to the fp32 subnormal 2^-149, so 190·2^-149 would be code 190;
    the documented clamp keeps every code within ±127."""
    tiny = 2.0**-149
    q = torch.tensor([190.0, -190.0, 95.0, 0.0, -3.0, 127.0, -128.0, 1.0]).reshape(1, 1, 1, 8) * tiny
    assert q[0, 0, 0, 0].item() == 190 * tiny  # subnormals are kept, not flushed
    qi = quantize_inputs(q, q, q.clone(), _INT8.replace(q_scale="tensor", k_scale="tensor"))
    assert qi.q_descale.item() == tiny
    assert qi.q_values.flatten().tolist() == [127.0, -127.0, 95.0, 0.0, -3.0, 127.0, -127.0, 1.0]


def test_int8_without_a_descale_granularity_it_supports_is_refused():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="^" + re.escape("int8 quantization does not support granularity 'none'")):
        quantize_inputs(q, q, q, _INT8.replace(q_scale="none"))


def _fp8_channels(scales, s=6, seed=0):
    """(1, 1, s, len(scales)): channel j = e4m3fn values times scales[j], its first element 448·scales[j]."""
    g = torch.Generator().manual_seed(seed)
    codes = _E4M3_CODES[torch.randint(0, len(_E4M3_CODES), (s, len(scales)), generator=g)]
    codes[0] = 448.0
    sc = torch.tensor(scales)
    return (codes * sc).reshape(1, 1, s, -1), (codes * (sc != 0)).reshape(1, 1, s, -1)


def test_fp8_per_channel_descale_is_each_channels_amax_over_448():
    scales = [1.0, 2.0**-9, 0.0, 2.0**-12]  # 2^-9, 2^-12: amax below 1; 0: an all-zero channel
    v, codes = _fp8_channels(scales)
    q = torch.randn(1, 1, 6, 8)
    qi = quantize_inputs(q, q, v, get_recipe("ck").replace(name="v-channel", v_scale="channel"))
    want = torch.tensor([1.0, 2.0**-9, 1.0, 2.0**-12]).reshape(1, 1, 1, 4)
    assert torch.equal(qi.v_descale, want)
    assert torch.equal(qi.v_values, codes)


@pytest.mark.parametrize("recipe", ["fp32", "bf16", "ck-none"])
def test_unscaled_operands_keep_their_shapes_with_one_kv_head(recipe):
    """Unit descales are (1, 1, 1, 1) and the zero K mean too: the dequantized inputs have the inputs' shapes
    (MQA: one kv head under four query heads)."""
    r = (
        get_recipe("ck").replace(name="ck-none", q_scale="none", k_scale="none", v_scale="none")
        if recipe == "ck-none"
        else get_recipe(recipe)
    )
    g = torch.Generator().manual_seed(1)
    codes = _E4M3_CODES[torch.randint(0, len(_E4M3_CODES), (3, 4, 6, 8), generator=g)]  # e4m3fn, bf16: exact
    q, k, v = codes[0:1], codes[1:2, :1], codes[2:3, :1]
    qi = quantize_inputs(q, k, v, r)
    for d in (qi.q_descale, qi.k_descale, qi.v_descale, qi.k_mean):
        assert d.shape == (1, 1, 1, 1) and d.flatten().tolist() == [1.0 if d is not qi.k_mean else 0.0]
    q_deq, k_deq, v_deq = qi.dequantized()
    assert torch.equal(q_deq, q) and torch.equal(k_deq, k) and torch.equal(v_deq, v)
    emu = emulate(q, k, v, r)
    assert emu.q_deq.shape == q.shape and emu.k_deq.shape == k.shape and emu.v_deq.shape == v.shape


def test_k_and_v_per_kv_head_group_is_per_head():
    """head_kv for K and V: each kv head is its own group (FA3's descale shape (batch, num_heads_k))."""
    k, k_codes = _int8_operand([2.0**-1, 2.0**-6], (1, 1, 6, 8), dim=1)
    v, v_codes = _fp8_channels([2.0**-3] * 8)
    v = torch.cat([v, v * 2.0**-5], dim=1)  # two kv heads: amax 448/8 and 448/256
    r = get_recipe("ck").replace(name="kv-head-kv", k_format="int8", k_scale="head_kv", v_scale="head_kv")
    qi = quantize_inputs(torch.randn(1, 4, 6, 8), k, v, r)
    assert torch.equal(qi.k_descale, torch.tensor([2.0**-1, 2.0**-6]).reshape(1, 2, 1, 1))
    assert torch.equal(qi.v_descale, torch.tensor([2.0**-3, 2.0**-8]).reshape(1, 2, 1, 1))
    assert torch.equal(qi.k_values, k_codes) and torch.equal(qi.v_values, torch.cat([v_codes, v_codes], dim=1))


_UNSCALED = {
    "fp32": get_recipe("fp32"),
    "bf16": get_recipe("bf16"),
    "ck-none": get_recipe("ck").replace(name="ck-none", q_scale="none", k_scale="none", v_scale="none"),
}


@pytest.mark.parametrize("recipe", list(_UNSCALED))
def test_descales_and_k_mean_live_on_the_inputs_device(recipe):
    q = torch.empty(1, 2, 6, 8, device="meta")
    qi = quantize_inputs(q, q, q, _UNSCALED[recipe])
    for name in ("q_values", "k_values", "v_values", "q_descale", "k_descale", "v_descale", "k_mean"):
        assert getattr(qi, name).device.type == "meta", name


@pytest.fixture
def _default_float64():
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("recipe", list(_UNSCALED))
def test_descales_stay_float32_under_a_float64_default_dtype(recipe, _default_float64):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 6, 64, generator=g, dtype=torch.float32)
    qi = quantize_inputs(q, q, q, _UNSCALED[recipe])
    for name in ("q_values", "k_values", "v_values", "q_descale", "k_descale", "v_descale", "k_mean"):
        assert getattr(qi, name).dtype == torch.float32, name
    emu = emulate(q, q, q, _UNSCALED[recipe])
    assert all(x.dtype == torch.float32 for x in (emu.out, emu.lse, emu.q_deq, emu.k_deq, emu.v_deq))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [*_UNSCALED, "int8-test"])
def test_unscaled_and_int8_recipes_run_on_cuda_like_on_cpu(recipe):
    """The same quantizers on a GPU: descales on the device, and the emulation equal to the CPU's to fp32 sums."""
    r = _INT8 if recipe == "int8-test" else _UNSCALED[recipe]
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 130, 64, generator=g) for _ in range(3))
    qi = quantize_inputs(q.cuda(), k.cuda(), v.cuda(), r)
    assert all(getattr(qi, n).is_cuda for n in ("q_descale", "k_descale", "v_descale", "k_mean"))
    cpu, gpu = emulate(q, k, v, r, causal=True), emulate(q.cuda(), k.cuda(), v.cuda(), r, causal=True)
    assert torch.equal(cpu.q_deq, gpu.q_deq.cpu()) and torch.equal(cpu.v_deq, gpu.v_deq.cpu())
    scale = cpu.out.abs().amax(-1, keepdim=True)
    assert ((cpu.out - gpu.out.cpu()).abs() <= 2e-2 * scale).all()


@pytest.mark.parametrize("which", ["int8", "channel"])
def test_a_group_whose_descale_underflows_keeps_finite_codes(which):
    x = torch.tensor([50.0, 0.0, -20.0, 3.0]).reshape(1, 1, 4, 1) * 2.0**-149  # amax 50·2^-149: /127 -> 0
    if which == "int8":
        qi = quantize_inputs(x, x, x, _INT8.replace(q_scale="tensor", k_scale="tensor"))
        values, descale = qi.q_values, qi.q_descale
    else:
        qi = quantize_inputs(
            torch.ones(1, 1, 4, 8),
            torch.ones(1, 1, 4, 8),
            x * 4.0,
            get_recipe("ck").replace(name="v-channel", v_scale="channel"),
        )
        values, descale = qi.v_values, qi.v_descale
    assert (descale > 0).all()  # zyfa.quant.quantize's convention: 1.0 where amax / max underflows
    assert torch.isfinite(values).all()
