"""The recipe-spec grammar of zyfa.recipes: ``[triton:]NAME[:FIELD=VALUE,...][@PLATFORM]``, canonical names, lists."""

from __future__ import annotations

import pytest

from zyfa.recipe_spec import (
    TRITON_KERNEL_FIELDS,
    SpecError,
    SpecParts,
    get_recipe,
    overridable_fields,
    parse_recipes,
    split_spec,
    split_spec_list,
)
from zyfa.recipes import RECIPES


@pytest.mark.parametrize("spec, name", [
    ("zyfa", "zyfa"),
    (" zyfa ", "zyfa"),
    ("zyfa@mi355x", "zyfa"),  # its own platform: the recipe itself
    ("zyfa@h200", "zyfa@h200"),
    ("zyfa+block@h200", "zyfa+block@h200"),
    ("zyfa:accum_flush_tiles=1", "zyfa:accum_flush_tiles=1"),
    ("zyfa:accum_flush_tiles=01", "zyfa:accum_flush_tiles=1"),  # values as the grammar writes them
    ("zyfa: accumulator = matrix_unit , accum_flush_tiles=1", "zyfa:accumulator=matrix_unit,accum_flush_tiles=1"),
    ("zyfa:accum_flush_tiles=1@h200", "zyfa:accum_flush_tiles=1@h200"),
    ("zyfa@h200:accum_flush_tiles=1", "zyfa:accum_flush_tiles=1@h200"),  # legacy order, read the same
    ("zyfa:k_smoothing=1", "zyfa:k_smoothing=true"),
    ("zyfa:mad_offset=0.125", "zyfa:mad_offset=0.125"),
    ("fa3:head_dim_tiles=64:192x128|128:128x192", "fa3:head_dim_tiles=64:192x128|128:128x192"),
    ("fa3:head_dim_tiles=none", "fa3:head_dim_tiles=none"),
    ("triton:fa3", "triton:fa3"),  # the kernel's fa3 differs from fa3 (tiles, KV order)
    ("triton:zyfa", "zyfa"),  # the kernel computes zyfa as it is: the same name
    ("triton:zyfa@h200", "zyfa@h200"),
    ("triton:fa3:accum_flush_tiles=1", "triton:fa3:accum_flush_tiles=1"),
    ("triton-amd:p_scale=tile_amax,accumulator=hopper_fp8,accum_flush_tiles=1@h200",  # an old spec a user types,
     "triton-amd:p_scale=tile_amax,accumulator=matrix_unit,accum_flush_tiles=1@h200"),  # read under today's name
])
def test_a_spec_names_its_recipe_by_the_canonical_spec(spec, name):
    assert get_recipe(spec).name == name


def test_the_fields_are_set_and_only_they():
    r = get_recipe("zyfa:accumulator=matrix_unit,accum_flush_tiles=3,k_smoothing=true@h200")
    assert r.replace(name="zyfa") == RECIPES["zyfa"].replace(accumulator="matrix_unit", accum_flush_tiles=3,
                                                              k_smoothing=True, platform="h200")
    assert get_recipe("fa3:head_dim_tiles=64:192x128|128:128x192").head_dim_tiles == ((64, 192, 128),
                                                                                    (128, 128, 192))
    assert get_recipe("fa3:head_dim_tiles=none").head_dim_tiles == ()
    k = get_recipe("triton:fa3")
    assert k.replace(name="fa3") == RECIPES["fa3"].replace(**TRITON_KERNEL_FIELDS)
    assert get_recipe("zyfa") is RECIPES["zyfa"] and get_recipe(RECIPES["ck"]) is RECIPES["ck"]


def test_split_spec_gives_the_parts_and_the_canonical_text():
    p = split_spec("triton:zyfa@h200:accum_flush_tiles=2")
    assert p == SpecParts("triton", "zyfa", (("accum_flush_tiles", 2),), "h200")
    assert p.text() == "triton:zyfa:accum_flush_tiles=2@h200" and p.recipe_spec() == "zyfa:accum_flush_tiles=2"
    assert split_spec("ck").text() == "ck" and split_spec("ck@mi355x").text() == "ck@mi355x"  # as given


@pytest.mark.parametrize("spec, message", [
    ("nosuchrecipe", "unknown recipe 'nosuchrecipe'; known recipes: zyfa, "),
    ("triton:nosuchrecipe", "unknown recipe 'nosuchrecipe'; known recipes: zyfa, "),
    ("sdpa-bf16:cudnn", "unknown recipe 'sdpa-bf16'"),  # an implementation name, not a recipe spec
    ("zyfa:nosuchfield=1", "bad recipe override 'nosuchfield=1' in 'zyfa:nosuchfield=1': no field 'nosuchfield'; "
                           "fields: q_format, k_format, "),
    ("zyfa:accum_flush_tiles=maybe", "accum_flush_tiles takes an integer, not 'maybe'; fields: q_format, "),
    ("zyfa:accum_flush_tiles=1.0", "accum_flush_tiles takes an integer, not '1.0'"),
    ("zyfa:mad_offset=x", "mad_offset takes a number, not 'x'"),
    ("zyfa:k_smoothing=yes", "k_smoothing takes true or false (or 1, 0), not 'yes'"),
    ("zyfa:accumulator=", "accumulator takes a non-empty value"),
    ("zyfa:accumulator=foo", "accumulator='foo' is not one of ('fp32', 'matrix_unit')"),  # the Recipe's own check
    ("zyfa:accum_flush_tiles=-1", "accum_flush_tiles must be >= 0"),
    ("zyfa:name=x", "'name' may not be overridden"),
    ("zyfa:status=verified", "'status' may not be overridden"),
    ("zyfa:accum_flush_tiles", "not field=value"),
    ("zyfa:accum_flush_tiles=1,accum_flush_tiles=2", "accum_flush_tiles is set twice"),
    ("fa3:head_dim_tiles=64:192", "head_dim_tiles entry '64:192' is not D:MxN"),
    ("zyfa@h100", "unknown platform 'h100'; known platforms: h200, mi355x"),
    ("ck@h200@mi355x", "names more than one platform"),
    ("zyfa@", "unknown platform ''"),
])
def test_a_bad_spec_is_one_line_naming_the_problem(spec, message):
    with pytest.raises(SpecError) as e:
        get_recipe(spec)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_overridable_fields_are_the_numerics_fields():
    fields = overridable_fields()
    assert "accum_flush_tiles" in fields and "platform" in fields and "head_dim_tiles" in fields
    assert not {"name", "source", "status", "status_note", "tags"} & set(fields)


@pytest.mark.parametrize("text, specs", [
    ("zyfa,ck", ["zyfa", "ck"]),
    ("zyfa:accumulator=matrix_unit,accum_flush_tiles=1,ck", ["zyfa:accumulator=matrix_unit,accum_flush_tiles=1", "ck"]),
    ("fa3:head_dim_tiles=64:192x128|128:128x192,kv_order=reverse,zyfa@h200",
     ["fa3:head_dim_tiles=64:192x128|128:128x192,kv_order=reverse", "zyfa@h200"]),
    ("a:x=1,y=2@h200;b@h200", ["a:x=1,y=2@h200", "b@h200"]),  # ';' where a spec holds commas
    (" zyfa , ,ck,", ["zyfa", "ck"]),
    ("", []),
])
def test_split_spec_list_keeps_overrides_with_their_spec(text, specs):
    assert split_spec_list(text) == specs


def test_parse_recipes_takes_specs_with_overrides():
    got = parse_recipes("zyfa:accumulator=matrix_unit,accum_flush_tiles=1,fa3@mi355x")
    assert [r.name for r in got] == ["zyfa:accumulator=matrix_unit,accum_flush_tiles=1", "fa3@mi355x"]


def test_old_accumulator_name_is_read_as_matrix_unit():
    """``hopper_fp8`` (the accumulator's old name) still parses, in a spec and in a Recipe, and is recorded as
    ``matrix_unit``: the same recipe, the same canonical name, the same numerics fields."""
    old, new = get_recipe("fa3:accumulator=hopper_fp8@mi355x"), get_recipe("fa3:accumulator=matrix_unit@mi355x")
    assert old == new and old.name == "fa3:accumulator=matrix_unit@mi355x" and old.accumulator == "matrix_unit"
    assert RECIPES["zyfa"].replace(accumulator="hopper_fp8").accumulator == "matrix_unit"
    assert "hopper_fp8" not in RECIPES["zyfa"].replace(accumulator="hopper_fp8").short_str()
