"""zyfa.emulator.quantize_inputs checks Q, K and V for NaN/Inf together (one host sync on a GPU, in every layer of
every decode step) and lets zyfa.quant.quantize skip its own count; a non-finite operand is refused by quantize's
own check with its own message, as before."""

from __future__ import annotations

import pytest
import torch

from zyfa import emulator
from zyfa.quant import finite_screen, quantize
from zyfa.recipe_spec import get_recipe


def _qkv(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, h, 40, 64, generator=g).to(dtype) for h in (4, 2, 2))


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def recording(x, fmt, granularity="tensor", **kw):
        seen.append(kw.get("check_finite", True))
        return quantize(x, fmt, granularity, **kw)

    monkeypatch.setattr(emulator, "quantize", recording)
    return seen


@pytest.mark.parametrize("recipe", ["zyfa", "fa3", "zyfa:k_scale=block,scale_block_kv=16"])
def test_finite_inputs_are_checked_once_and_quantize_skips_its_count(calls, recipe):
    q, k, v = _qkv()
    qi = emulator.quantize_inputs(q, k, v, recipe)
    assert calls and not any(calls), "every quantize call told its input is finite"
    # the values are what quantize makes with its own check on
    r = get_recipe(recipe)
    kq, kd = quantize(k.float(), r.k_format, r.k_scale, block_size=r.scale_block_kv)
    assert torch.equal(qi.k_values, kq)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_non_finite_operand_is_refused_with_quantizes_message(calls, which):
    qkv = list(_qkv())
    qkv[which][0, 1, 3, 5] = float("nan")
    with pytest.raises(ValueError, match=r"^quantize: x holds 1 NaN/Inf value\(s\); FP8 scaling needs a finite amax$"):
        emulator.quantize_inputs(*qkv, "zyfa")
    assert calls == [], "refused by the screen's closer look, before quantize runs"


def test_float64_beyond_float32_range_is_refused_as_before(calls):
    q, k, v = _qkv(dtype=torch.float64)
    k[0, 0, 0, 0] = 1e39  # finite in float64, Inf once _quantize_operand makes it float32
    with pytest.raises(ValueError, match=r"quantize: x holds 1 NaN/Inf"):
        emulator.quantize_inputs(q, k, v, "zyfa")


def test_no_check_where_no_operand_is_scaled(monkeypatch):
    """A BF16 recipe scales nothing: no finiteness screen (no sync) at all, as before."""
    n = []
    monkeypatch.setattr(emulator, "finite_screen", lambda xs: n.append(len(xs)) or finite_screen(xs))
    q, k, v = _qkv()
    emulator.quantize_inputs(q, k, v, "bf16")
    assert n == []
    emulator.quantize_inputs(q, k, v, "zyfa")
    assert n == [3]  # one screen of the three operands together


def test_finite_screen():
    x = torch.randn(2, 3, 5, 8)
    assert bool(finite_screen([x, x.bfloat16(), x.double()]))
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[1, 2, 3, 4] = bad
        assert not bool(finite_screen([x, y])), bad
    assert not bool(finite_screen([x.double().fill_(1e39)]))  # Inf in float32, as quantize_inputs sees it
    # a false alarm, never a miss: finite values whose float32 sum overflows
    assert not bool(finite_screen([torch.full((4,), 3e38)]))


def test_a_false_alarm_costs_a_count_not_a_refusal(calls):
    """Finite operands whose float32 sum overflows fail the screen: the closer look counts, finds nothing, and
    quantize makes the values it makes after a passed screen."""
    q, k, v = _qkv()
    big = k * 1e37  # finite (|k| < 6, so < 6e37), but 40 * 64 * 2 of them sum past float32's 3.4e38
    assert not bool(finite_screen([big]))
    qi = emulator.quantize_inputs(q, big, v, "zyfa")
    assert calls and not any(calls), "quantize was told its input is finite"
    r = get_recipe("zyfa")
    assert torch.equal(qi.k_values, quantize(big, r.k_format, r.k_scale, block_size=r.scale_block_kv)[0])


def test_emulate_screens_its_inputs_once(monkeypatch):
    """emulate's own input check screens Q, K, V; quantize_inputs does not screen them again, except for float64
    inputs, whose float32 view only quantize's screen sees (a value beyond float32's range is refused there)."""
    n = []
    monkeypatch.setattr(emulator, "finite_screen", lambda xs: n.append(len(xs)) or finite_screen(xs))
    q, k, v = _qkv()
    emulator.emulate(q, k, v, "zyfa")
    assert n == [3]
    n.clear()
    q, k, v = _qkv(dtype=torch.float64)
    emulator.emulate(q, k, v, "zyfa")
    assert n == [3, 3]
    k[0, 0, 0, 0] = 1e39
    with pytest.raises(ValueError, match=r"quantize: x holds 1 NaN/Inf"):
        emulator.emulate(q, k, v, "zyfa")
