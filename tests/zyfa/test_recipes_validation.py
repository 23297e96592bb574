"""Recipe validation, ids and lookup: every check of ``Recipe`` refuses exactly the bad values, with one line that
names the recipe, the field and the bad value; ``short_str``, ``get_recipe`` and ``parse_recipes`` as documented.

Expected strings are written out here by hand from the documented choices, not computed by the code under test.
"""

from __future__ import annotations

import re

import pytest

from zyfa.recipe_spec import get_recipe, parse_recipes
from zyfa.recipes import RECIPES, Recipe

# the documented choices of every categorical field (zyfa/recipes.py's Recipe docstring), written out by hand
CHOICES = {
    "q_format": ("e4m3fn", "e4m3fnuz", "e5m2", "bf16", "fp32", "int8"),
    "k_format": ("e4m3fn", "e4m3fnuz", "e5m2", "bf16", "fp32", "int8"),
    "v_format": ("e4m3fn", "e4m3fnuz", "e5m2", "bf16", "fp32"),
    "q_scale": ("tensor", "head", "head_kv", "block", "none"),  # "channel": V only (tested below)
    "k_scale": ("tensor", "head", "head_kv", "block", "none"),
    "v_scale": ("tensor", "head", "head_kv", "channel", "none"),  # "block" needs v_descale="tile" (below)
    "exp_method": ("exp2", "exp2_bittrick", "mad_fp8"),
    "mad_rounding": ("nearest", "trunc"),
    "p_format": ("e4m3fn", "e4m3fnuz", "e5m2", "bf16", "fp32"),
    "p_scale": ("none", "fmax", "pow2", "pow2_block", "tile_amax"),
    "p_scale_granularity": ("row", "tile"),
    "rowsum": ("fp32", "rounded", "rounded_mma"),
    "v_descale": ("end", "tile"),
    "accumulator": ("fp32", "matrix_unit"),
    "reciprocal": ("div", "rcp"),
    "out_format": ("bf16_rne", "bf16_trunc", "fp32", "e4m3fn"),
    "status": ("verified", "from source", "assumed", "modelled"),
}


def _make(**fields) -> Recipe:
    return Recipe(name="t", source="test", **fields)


def _refused(match: str, **fields) -> str:
    """The ValueError message for a recipe built from ``fields``: one line, starting with the recipe's name."""
    with pytest.raises(ValueError, match=match) as e:
        _make(**fields)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("recipe 't': "), msg
    return msg


# ---------------------------------------------------------------------------------------------- categorical fields

@pytest.mark.parametrize("name", list(CHOICES))
def test_every_documented_choice_is_accepted(name):
    for value in CHOICES[name]:
        extra = {"status_note": "why"} if name == "status" else {}
        if name == "exp_method" and value == "mad_fp8":
            extra = {"p_format": "e4m3fn", "p_scale": "none"}
        r = _make(**{name: value}, **extra)
        assert getattr(r, name) == value


@pytest.mark.parametrize("name", list(CHOICES))
def test_an_unknown_choice_names_the_field_and_the_value(name):
    msg = _refused(re.escape(f"{name}='bogus' is not one of ("), **{name: "bogus"})
    for value in CHOICES[name]:  # the message lists what is allowed
        assert repr(value) in msg, (name, value)


def test_choice_check_is_exact_not_a_substring_or_case_match():
    for name, bad in (("q_format", "e4m3"), ("p_scale", "POW2"), ("out_format", "bf16"), ("rowsum", "fp32 ")):
        _refused(re.escape(f"{name}={bad!r} is not one of"), **{name: bad})


# ---------------------------------------------------------------------------------------------- status

@pytest.mark.parametrize("status", ["verified", "assumed", "modelled"])
def test_status_other_than_from_source_needs_a_status_note(status):
    for note in ("", "   ", "\t\n"):  # empty or blank: refused
        msg = _refused(re.escape(f"status={status!r} needs a status_note"), status=status, status_note=note)
        assert "status_note" in msg
    assert _make(status=status, status_note="kernel X on GPU Y").status == status


def test_from_source_needs_no_status_note():
    assert _make(status="from source").status_note == ""


# ---------------------------------------------------------------------------------------------- MAD

@pytest.mark.parametrize("p_format", ["e4m3fnuz", "e5m2", "bf16", "fp32"])
def test_mad_needs_e4m3fn_p(p_format):
    msg = _refused(re.escape(f"p_format must be 'e4m3fn', not {p_format!r}"), exp_method="mad_fp8",
                   p_format=p_format, p_scale="none")
    assert "exp_method='mad_fp8'" in msg


def test_mad_takes_power_of_two_p_scales_only():
    for p_scale in ("none", "pow2", "pow2_block"):
        assert _make(exp_method="mad_fp8", p_scale=p_scale).p_scale == p_scale
    for p_scale in ("fmax", "tile_amax"):
        _refused(re.escape(f"folds only power-of-two P scales into its bias, not p_scale={p_scale!r}"),
                 exp_method="mad_fp8", p_scale=p_scale)
    for method in ("exp2", "exp2_bittrick"):  # other exponentials take any P format and scale
        for p_scale in ("fmax", "tile_amax"):
            assert _make(exp_method=method, p_format="e5m2", p_scale=p_scale).p_scale == p_scale


# ---------------------------------------------------------------------------------------------- descale layouts

@pytest.mark.parametrize("name", ["q_scale", "k_scale"])
def test_per_channel_descales_for_q_or_k_are_refused(name):
    _refused("per-channel descales are supported for V only", **{name: "channel"})


@pytest.mark.parametrize("name", ["q_scale", "k_scale"])
def test_per_channel_refusal_names_the_field_and_the_value(name):
    _refused(re.escape(f"{name}='channel'"), **{name: "channel"})


def test_per_block_v_descales_need_tile_descale_and_whole_tiles():
    ok = _make(v_scale="block", v_descale="tile", scale_block_kv=128, block_n=64)
    assert (ok.v_scale, ok.scale_block_kv, ok.block_n) == ("block", 128, 64)
    assert _make(v_scale="block", v_descale="tile", scale_block_kv=64, block_n=64).v_scale == "block"
    expect = "per-block V descales need v_descale='tile' and scale_block_kv a multiple of block_n"
    _refused(re.escape(expect), v_scale="block", v_descale="end")
    for kv, bn in ((96, 64), (64, 128), (129, 128)):  # not a multiple of block_n
        _refused(re.escape(expect), v_scale="block", v_descale="tile", scale_block_kv=kv, block_n=bn)
    # other V layouts take any combination
    assert _make(v_scale="tensor", v_descale="tile", scale_block_kv=96, block_n=64).v_scale == "tensor"
    assert _make(v_scale="head", v_descale="end", scale_block_kv=96, block_n=64).v_scale == "head"


def test_per_block_v_refusal_names_the_bad_values():
    _refused(r"scale_block_kv=96.*block_n=64|block_n=64.*scale_block_kv=96", v_scale="block", v_descale="tile",
             scale_block_kv=96, block_n=64)


@pytest.mark.parametrize("rowsum", ["rounded", "rounded_mma"])
def test_tile_amax_with_a_rounded_row_sum_is_refused(rowsum):
    _refused(re.escape(f"rowsum={rowsum!r} with tile_amax scaling is not modelled"), p_scale="tile_amax",
             rowsum=rowsum)
    assert _make(p_scale="pow2", rowsum=rowsum).rowsum == rowsum  # rounded sums with other scales are fine


def test_tile_amax_with_fp32_row_sum_is_accepted():
    assert _make(p_scale="tile_amax", rowsum="fp32").p_scale == "tile_amax"


# ---------------------------------------------------------------------------------------------- numbers

@pytest.mark.parametrize("value", [0, 1, -3, 0.0625, -0.5, 1e30])
def test_mad_offset_takes_finite_numbers(value):
    assert _make(mad_offset=value).mad_offset == value


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), True, False, "0.5", None])
def test_mad_offset_refuses_non_numbers_and_non_finite(value):
    _refused(re.escape(f"mad_offset must be a finite number, got {value!r}"), mad_offset=value)


# field -> (lowest allowed, highest allowed or None), from the field documentation
RANGES = {
    "block_m": (1, None), "block_n": (1, None), "scale_block_q": (1, None), "scale_block_kv": (1, None),
    "p_scale_log2": (-126, 127), "p_block_max_log2": (-126, 127),
    "accum_flush_tiles": (0, None),
}


@pytest.mark.parametrize("name", list(RANGES))
def test_integer_fields_accept_their_bounds(name):
    lo, hi = RANGES[name]
    for value in (lo, lo + 1, 4096 if hi is None else hi, 100_000 if hi is None else hi - 1):
        assert getattr(_make(**{name: value}), name) == value


@pytest.mark.parametrize("name", list(RANGES))
def test_integer_fields_refuse_values_out_of_range(name):
    lo, hi = RANGES[name]
    bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    msg = _refused(re.escape(f"{name} must be {bound}, got {lo - 1}"), **{name: lo - 1})
    assert msg == f"recipe 't': {name} must be {bound}, got {lo - 1}"
    _refused(re.escape(f"{name} must be {bound}, got {lo - 1000}"), **{name: lo - 1000})
    if hi is not None:
        msg = _refused(re.escape(f"{name} must be {bound}, got {hi + 1}"), **{name: hi + 1})
        assert msg == f"recipe 't': {name} must be {bound}, got {hi + 1}"


@pytest.mark.parametrize("name", list(RANGES))
@pytest.mark.parametrize("value", [64.0, True, "64", None, 2.5])
def test_integer_fields_refuse_other_types(name, value):
    msg = _refused(re.escape(f"{name} must be an int, got {value!r}"), **{name: value})
    assert msg == f"recipe 't': {name} must be an int, got {value!r}"


@pytest.mark.parametrize("name", ["k_smoothing", "log2e_folded"])
def test_boolean_fields_refuse_other_values(name):
    for value in (True, False):
        assert getattr(_make(**{name: value}), name) is value
    for value in (1, 0, "yes", None):
        msg = _refused(re.escape(f"{name} must be True or False, got {value!r}"), **{name: value})
        assert msg == f"recipe 't': {name} must be True or False, got {value!r}"


def test_hopper_accumulator_needs_block_n_a_multiple_of_32():
    for bn in (32, 64, 96, 128):
        assert _make(accumulator="matrix_unit", block_n=bn).block_n == bn
    for bn in (16, 48, 100, 1):
        _refused(re.escape("matrix_unit accumulation needs block_n % 32 == 0"), accumulator="matrix_unit", block_n=bn)
    for bn in (16, 48, 1):  # true fp32 accumulation takes any tile width
        assert _make(accumulator="fp32", block_n=bn).block_n == bn


def test_the_name_in_messages_is_the_recipes_own():
    with pytest.raises(ValueError, match=re.escape("recipe 'my-ck': block_n must be >= 1, got 0")):
        RECIPES["ck"].replace(name="my-ck", block_n=0)
    with pytest.raises(ValueError, match=re.escape("recipe 'x': p_format='e3m4' is not one of")):
        RECIPES["zyfa"].replace(name="x", p_format="e3m4")


def test_every_named_recipe_is_valid_and_survives_a_rebuild():
    for name, r in RECIPES.items():
        assert r.name == name
        assert r.replace() == r  # __post_init__ accepts it again


# ---------------------------------------------------------------------------------------------- short_str

def test_short_str_of_the_defaults():
    assert _make().short_str() == "defaults"
    # descriptive fields never count
    assert _make(tags=("a",), status="assumed", status_note="n").short_str() == "defaults"
    assert Recipe(name="other", source="elsewhere").short_str() == "defaults"


def test_short_str_lists_changed_fields_in_declaration_order():
    assert _make(block_n=64).short_str() == "block_n=64"
    got = _make(out_format="fp32", block_n=64, q_format="e5m2").short_str()
    assert got == "q_format=e5m2,block_n=64,out_format=fp32"
    assert _make(k_smoothing=True, mad_offset=0.0625, accum_flush_tiles=2).short_str() == (
        "k_smoothing=True,mad_offset=0.0625,accum_flush_tiles=2")
    assert _make(log2e_folded=False).short_str() == "log2e_folded=False"


def test_short_str_of_named_recipes():
    assert RECIPES["zyfa"].short_str() == (
        "exp_method=mad_fp8,mad_offset=0.0625,mad_rounding=trunc,p_scale=pow2_block,rowsum=rounded")
    # the bf16 baseline: its numerics fields in declaration order (fields after p_format, such as a platform, may
    # follow)
    assert RECIPES["bf16"].short_str().startswith(
        "q_format=bf16,k_format=bf16,v_format=bf16,q_scale=none,k_scale=none,v_scale=none,p_format=bf16")
    ids = [r.short_str() for r in RECIPES.values()]
    assert len(set(ids)) == len(ids)  # every named recipe has its own numerics


# ---------------------------------------------------------------------------------------------- lookup

def test_get_recipe_by_name_and_pass_through():
    assert get_recipe("ck") is RECIPES["ck"]
    custom = RECIPES["ck"].replace(name="ck-custom", block_n=64)
    assert get_recipe(custom) is custom
    assert get_recipe(_make()) == _make()


def test_unknown_recipe_lists_the_known_names():
    with pytest.raises(ValueError) as e:
        get_recipe("zyfaa")
    msg = str(e.value)
    assert msg.startswith("unknown recipe 'zyfaa'; known recipes: " + ", ".join(RECIPES))
    assert "zyfa, zyfa-exp2," in msg and ", bf16, fp32" in msg and "\n" not in msg
    assert e.value.__cause__ is None and (e.value.__context__ is None or e.value.__suppress_context__)


def test_parse_recipes_names_spaces_and_empty_items():
    assert parse_recipes("zyfa") == [RECIPES["zyfa"]]
    assert parse_recipes(" ck , zyfa,, fa3 ,") == [RECIPES["ck"], RECIPES["zyfa"], RECIPES["fa3"]]
    assert parse_recipes("ck,ck") == [RECIPES["ck"], RECIPES["ck"]]


def test_parse_recipes_all():
    assert parse_recipes("all") == list(RECIPES.values())
    assert parse_recipes(" all ,") == list(RECIPES.values())
    with pytest.raises(ValueError, match="unknown recipe 'all'"):  # "all" only alone
        parse_recipes("all,zyfa")


@pytest.mark.parametrize("spec", ["", " ", ",", " , ,"])
def test_parse_recipes_refuses_an_empty_list(spec):
    with pytest.raises(ValueError) as e:
        parse_recipes(spec)
    assert str(e.value) == "no recipe given"


def test_parse_recipes_unknown_name():
    with pytest.raises(ValueError, match=re.escape("unknown recipe 'nope'; known recipes: zyfa, ")):
        parse_recipes("zyfa,nope")
