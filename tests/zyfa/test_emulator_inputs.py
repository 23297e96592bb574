"""What emulate() accepts and refuses, and what it returns where the arithmetic overflows: input checks, bad overrides,
overflowing rows by mask.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from zyfa.accuracy.inputs.attention_input import AttentionInput, content_hash
from zyfa.accuracy.operator.runner import run_accuracy
from zyfa.accuracy.scoring.metrics import compute_metrics
from zyfa.reference.attention import attention_fp64

from zyfa.emulator import UnsupportedHeadDimWarning, emulate, validate_qkv
from zyfa.kernels.attention_fp8 import recipe_from_spec
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import RECIPES

# --------------------------------------------------------------------------------------------------------- input checks

def _qkv_small(b=1, h=2, h_kv=2, s_q=8, s_k=8, d=64, d_v=64):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(b, h, s_q, d, generator=g),
        torch.randn(b, h_kv, s_k, d, generator=g),
        torch.randn(b, h_kv, s_k, d_v, generator=g),
    )


def _raises(exc, message, q, k, v, **kw):
    with pytest.raises(exc, match="^" + re.escape(message) + "$"):
        emulate(q, k, v, "zyfa", **kw)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_non_tensor_operand_is_named_with_its_type(which):
    args = list(_qkv_small())
    args[which] = args[which].tolist()
    _raises(TypeError, f"{'qkv'[which]} must be a torch.Tensor, got list", *args)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_operand_that_is_not_4d_is_named_with_its_shape(which):
    args = list(_qkv_small())
    args[which] = args[which][0]
    shape = tuple(args[which].shape)
    _raises(ValueError, f"{'qkv'[which]} must be 4-D (batch, heads, seq, head_dim), got shape {shape}", *args)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_integer_operand_is_named_with_its_dtype(which):
    args = list(_qkv_small())
    args[which] = args[which].to(torch.int32)
    _raises(TypeError, f"{'qkv'[which]} must be a floating-point tensor, got torch.int32", *args)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_empty_operand_is_named_with_its_shape(which):
    args = list(_qkv_small())
    x = args[which]
    args[which] = x[:, :, :0] if which == 0 else x[..., :0]  # q: no queries; k or v: no channels
    shape = tuple(args[which].shape)
    _raises(
        ValueError,
        f"{'qkv'[which]} has an empty dimension: shape {shape} (batch, heads, seq and head_dim must be >= 1)",
        *args,
    )


@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_operand_is_named(which, bad):
    args = [x.clone() for x in _qkv_small()]
    args[which][0, 1, 3, 5] = bad
    _raises(ValueError, f"{'qkv'[which]} contains NaN or Inf", *args)


def test_operands_on_two_devices_are_refused_naming_each_device():
    q, k, v = _qkv_small()
    _raises(ValueError, "q, k, v must be on one device, got cpu, meta, cpu", q, k.to("meta"), v)


def test_batch_mismatch_of_k_alone_or_v_alone_names_all_three_batches():
    q, k, v = _qkv_small()  # batch 1, 2 heads: a message quoting a head count for a batch is wrong
    _raises(ValueError, "batch mismatch: q 1, k 3, v 1", q, k.expand(3, -1, -1, -1), v)
    _raises(ValueError, "batch mismatch: q 1, k 1, v 3", q, k, v.expand(3, -1, -1, -1))


def test_k_and_v_differing_in_heads_alone_or_seq_alone_are_refused_with_both_shapes():
    q, k, v = _qkv_small(h=4, h_kv=2, s_k=16)
    _raises(ValueError, "k and v must share heads and seq: k (1, 2, 16, 64), v (1, 2, 12, 64)", q, k, v[:, :, :12])
    _raises(ValueError, "k and v must share heads and seq: k (1, 2, 16, 64), v (1, 1, 16, 64)", q, k, v[:, :1])


def test_query_heads_not_a_multiple_of_kv_heads_names_both_counts():
    q, k, v = _qkv_small(h=3, h_kv=2, s_k=16)  # seq 16 != 2 kv heads: the message must quote the heads
    _raises(ValueError, "q heads (3) must be a multiple of kv heads (2)", q, k, v)


def test_window_of_one_key_is_accepted_and_each_query_sees_only_its_own_key():
    """window=1 is the smallest valid window (HF: query p sees p - 1 < j <= p): the output is V's row itself."""
    q, k, v = _qkv_small(s_q=8, s_k=8)
    validate_qkv(q, k, v, window=1)
    emu = emulate(q, k, v, "fp32", causal=True, window=1)
    ref, _ = attention_fp64(q, k, v, causal=True, window=1)
    assert torch.equal(ref, v.double())
    assert torch.equal(emu.out, v)
    with pytest.raises(ValueError, match=re.escape("window must be an int >= 1 or None, got 0")):
        validate_qkv(q, k, v, window=0)


# -------------------------------------------------------------------------------------------------- overflow and checks
# The emulator never hides an overflow as masked rows, and refuses inputs it cannot model with one clear error.
#
# Expected values come from the FP64 oracle (reference/attention.py): a row it gives a finite output must not come
# back from the emulator as a zero row with lse -inf; rows it masks fully must.

RECIPE_NAMES = ["zyfa", "ck", "aiter", "aiter-triton", "triton-amd", "fa3", "sage2", "bf16", "fp32"]


def _qkv_overflow(h=2, h_kv=2, s_q=64, s_k=64, d=64, d_v=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, h, s_q, d, generator=g), torch.randn(1, h_kv, s_k, d, generator=g),
            torch.randn(1, h_kv, s_k, d_v or d, generator=g))


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_score_overflow_is_nan_not_masked(recipe):
    q, k, v = _qkv_overflow()
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
    q, k, v = _qkv_overflow()
    q, k = (q * 1e19).bfloat16(), (k * 1e19).bfloat16()
    v = v.bfloat16()
    inp = AttentionInput("overflow", q, k, v, causal=False, window=None, sm_scale=None,
                         meta={"source": "test", "content_hash": content_hash(q, k, v)})
    rows = run_accuracy([inp], ["zyfa", "fp32"], progress=False)
    assert all(r["has_nan"] for r in rows)


def test_fully_masked_rows_stay_zero_and_neg_inf():
    q, k, v = _qkv_overflow(s_q=64, s_k=16)  # causal, bottom-right: the first 48 query rows see no key
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
    q, k, v = _qkv_overflow()
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
    q, k, v = _qkv_overflow(**shapes)
    with pytest.raises(ValueError, match=words):
        emulate(q, k, v, "zyfa")


@pytest.mark.parametrize("window", [2.5, True, 0, -3, "8"])
def test_window_refused_like_the_reference(window):
    q, k, v = _qkv_overflow()
    with pytest.raises(ValueError, match="window") as ours:
        emulate(q, k, v, "zyfa", causal=True, window=window)
    with pytest.raises(ValueError, match="window"):
        attention_fp64(q, k, v, causal=True, window=window)
    assert "int >= 1" in str(ours.value)


def test_head_dims_no_kernel_runs_are_emulated_with_a_warning():
    q, k, v = _qkv_overflow(d=40)
    with pytest.warns(UnsupportedHeadDimWarning, match="40/40"):
        em = emulate(q, k, v, "zyfa")
    ref_out, _ = attention_fp64(q, k, v)
    assert compute_metrics(em.out, ref_out)["rel_l2"] < 0.1  # still an honest emulation of the arithmetic


def test_supported_head_dims_do_not_warn(recwarn):
    for d, d_v in ((64, 64), (192, 128)):
        q, k, v = _qkv_overflow(d=d, d_v=d_v, s_q=16, s_k=16)
        emulate(q, k, v, "zyfa")
    assert not [w for w in recwarn if issubclass(w.category, UnsupportedHeadDimWarning)]


# ------------------------------------------------------------------------------------------------ overflow rows by mask
# Which rows count as 'seeing a key' when the scores overflow, for every mask and query/key count.
#
# emulate() gives NaN for a row that sees keys but whose row sum is not a positive number (overflowed scores),
# and zeros with lse -inf only for a row that sees no key (emulate's comments; tests/zyfa/
# test_emulator_inputs.py covers the plain square case). The rows that see keys are decided here from
# the FP64 oracle (reference/attention.py): its lse is finite exactly there.

def _overflowing(s_q: int, s_k: int, seed: int = 0):
    """q row i equals k row (i mod s_k) scaled up: its score with that key overflows fp32 (|k|^2·1e38)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 1, s_k, 64, generator=g) * 1e19
    q = k[:, :, torch.arange(s_q) % s_k].clone()
    v = torch.randn(1, 1, s_k, 64, generator=g)
    return q, k, v


CASES = [  # (s_q, s_k, mask)
    (32, 32, {"causal": True}),  # row 0 sees key 0 only
    (32, 32, {"causal": True, "window": 4}),
    (40, 8, {}),  # more queries than keys, no mask: every row sees every key
    (40, 8, {"causal": True}),  # the first 32 rows see no key
    (40, 8, {"window": 3}),  # a window alone is causal too
    (16, 1, {}),  # a single key
    (16, 1, {"causal": True}),
]


@pytest.mark.parametrize("name", ["zyfa", "ck", "fa3"])
@pytest.mark.parametrize("s_q,s_k,mask", CASES)
def test_overflowed_rows_are_nan_and_unseeing_rows_are_masked(name, s_q, s_k, mask):
    q, k, v = _overflowing(s_q, s_k)
    ref_out, ref_lse = attention_fp64(q, k, v, **mask)
    sees = torch.isfinite(ref_lse)[0, 0]  # the oracle (float64) has no overflow here
    assert torch.isfinite(ref_out).all() and sees.any()
    em = emulate(q, k, v, name, **mask)
    out, lse = em.out[0, 0], em.lse[0, 0]
    assert torch.isnan(out[sees]).all(-1).all(), "a row that sees keys came back as a number or a masked row"
    assert torch.isnan(lse[sees]).all()
    assert (out[~sees] == 0).all() and torch.isneginf(lse[~sees]).all()


@pytest.mark.parametrize("mask", [{"causal": True}, {"window": 3}, {"causal": True, "window": 3}])
def test_rows_that_see_no_key_stay_zero_without_overflow(mask):
    """40 queries, 8 keys, bottom-right aligned: the first 32 rows see no key under any of these masks."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(1, 2, 40, 64, generator=g),
        torch.randn(1, 2, 8, 64, generator=g),
        torch.randn(1, 2, 8, 64, generator=g),
    )
    em = emulate(q, k, v, "zyfa", **mask)
    _, ref_lse = attention_fp64(q, k, v, **mask)
    masked = torch.isneginf(ref_lse)
    assert int(masked[0, 0].sum()) == 32
    assert torch.equal(torch.isneginf(em.lse), masked)
    assert (em.out[masked] == 0).all() and torch.isfinite(em.out).all()
