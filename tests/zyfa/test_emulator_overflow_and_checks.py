"""The emulator never hides an overflow as masked rows, and refuses inputs it cannot model with one clear error.

Expected values come from the FP64 oracle (reference/attention.py): a row it gives a finite output must not come
back from the emulator as a zero row with lse -inf; rows it masks fully must.
"""

from __future__ import annotations

import math

import pytest
import torch

from accuracy.inputs import AttentionInput, content_hash
from accuracy.metrics import compute_metrics
from accuracy.runner import run_accuracy
from reference.attention import attention_fp64
from zyfa.emulator import UnsupportedHeadDimWarning, emulate
from zyfa.kernels.attention_fp8 import recipe_from_spec
from zyfa.recipes import RECIPES, get_recipe

RECIPE_NAMES = ["zyfa", "ck", "aiter", "aiter-triton", "triton-amd", "fa3", "sage2", "bf16", "fp32"]


def _qkv(h=2, h_kv=2, s_q=64, s_k=64, d=64, d_v=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, h, s_q, d, generator=g), torch.randn(1, h_kv, s_k, d, generator=g),
            torch.randn(1, h_kv, s_k, d_v or d, generator=g))


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_score_overflow_is_nan_not_masked(recipe):
    q, k, v = _qkv()
    q, k = q * 1e19, k * 1e19  # finite inputs whose scores overflow fp32
    ref_out, ref_lse = attention_fp64(q, k, v)
    assert torch.isfinite(ref_out).all() and torch.isfinite(ref_lse).all()  # the oracle sees no masked row
    em = emulate(q, k, v, recipe)
    zero_rows = (em.out == 0).all(-1) & torch.isneginf(em.lse)
    assert not zero_rows.any(), "an overflow came back as fully masked rows"
    assert torch.isnan(em.out).any()
    m = compute_metrics(em.out, ref_out)  # without lse: the NaN is still flagged
    assert m["has_nan"] and math.isnan(m["rel_l2"])


def test_runner_row_flags_overflow():
    q, k, v = _qkv()
    q, k = (q * 1e19).bfloat16(), (k * 1e19).bfloat16()
    v = v.bfloat16()
    inp = AttentionInput("overflow", q, k, v, causal=False, window=None, sm_scale=None,
                         meta={"source": "test", "content_hash": content_hash(q, k, v)})
    rows = run_accuracy([inp], ["zyfa", "fp32"], progress=False)
    assert all(r["has_nan"] for r in rows)


def test_fully_masked_rows_stay_zero_and_neg_inf():
    q, k, v = _qkv(s_q=64, s_k=16)  # causal, bottom-right: the first 48 query rows see no key
    ref_out, ref_lse = attention_fp64(q, k, v, causal=True)
    masked = torch.isneginf(ref_lse)
    assert int(masked[0, 0].sum()) == 48
    for recipe in ("zyfa", "ck", "fa3"):
        em = emulate(q, k, v, recipe, causal=True)
        assert torch.equal(torch.isneginf(em.lse), masked)
        assert (em.out[masked] == 0).all()
        assert torch.isfinite(em.out[~masked]).all()


def test_zero_output_rows_are_counted_without_lse():
    ref = torch.randn(1, 2, 8, 16, dtype=torch.float64)
    out = ref.clone()
    out[0, 1, 3] = 0.0
    m = compute_metrics(out, ref)
    assert m["n_zero_out_rows"] == 1 and not m["has_nan"]
    assert compute_metrics(ref, ref)["n_zero_out_rows"] == 0


@pytest.mark.parametrize("sm_scale", [math.inf, -math.inf, math.nan, 0.0, -0.5, True, "0.1"])
def test_bad_sm_scale_is_refused(sm_scale):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="sm_scale"):
        emulate(q, k, v, "zyfa", sm_scale=sm_scale)


@pytest.mark.parametrize("spec, field", [
    ("zyfa:mad_offset=nan", "mad_offset"), ("zyfa:mad_offset=inf", "mad_offset"),
    ("zyfa:mad_offset=-inf", "mad_offset"), ("fa3:accum_flush_tiles=-1", "accum_flush_tiles"),
    ("zyfa:p_block_max_log2=1000", "p_block_max_log2"), ("fa3:p_scale_log2=-500", "p_scale_log2"),
])
def test_bad_numeric_override_is_refused(spec, field):
    with pytest.raises(ValueError, match=field):
        recipe_from_spec(spec)


@pytest.mark.parametrize("field, value", [("mad_offset", "0.1"), ("block_n", 64.0), ("k_smoothing", 1),
                                          ("p_scale_log2", True)])
def test_wrongly_typed_recipe_field_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        get_recipe("zyfa").replace(name="x", **{field: value})


def test_every_named_recipe_passes_the_checks():
    for r in RECIPES.values():
        assert r.replace(name=r.name + "-copy").name.endswith("-copy")


@pytest.mark.parametrize("shapes, words", [
    (dict(h_kv=0), "empty dimension"), (dict(d=0), "empty dimension"), (dict(s_k=0), "empty dimension"),
    (dict(h=3, h_kv=2), "multiple of kv heads"),
])
def test_degenerate_shapes_are_value_errors(shapes, words):
    q, k, v = _qkv(**shapes)
    with pytest.raises(ValueError, match=words):
        emulate(q, k, v, "zyfa")


@pytest.mark.parametrize("window", [2.5, True, 0, -3, "8"])
def test_window_refused_like_the_reference(window):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="window") as ours:
        emulate(q, k, v, "zyfa", causal=True, window=window)
    with pytest.raises(ValueError, match="window"):
        attention_fp64(q, k, v, causal=True, window=window)
    assert "int >= 1" in str(ours.value)


def test_head_dims_no_kernel_runs_are_emulated_with_a_warning():
    q, k, v = _qkv(d=40)
    with pytest.warns(UnsupportedHeadDimWarning, match="40/40"):
        em = emulate(q, k, v, "zyfa")
    ref_out, _ = attention_fp64(q, k, v)
    assert compute_metrics(em.out, ref_out)["rel_l2"] < 0.1  # still an honest emulation of the arithmetic


def test_supported_head_dims_do_not_warn(recwarn):
    for d, d_v in ((64, 64), (192, 128)):
        q, k, v = _qkv(d=d, d_v=d_v, s_q=16, s_k=16)
        emulate(q, k, v, "zyfa")
    assert not [w for w in recwarn if issubclass(w.category, UnsupportedHeadDimWarning)]
