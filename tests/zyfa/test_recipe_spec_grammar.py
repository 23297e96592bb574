"""The recipe-spec grammar of zyfa.recipes: ``[triton:|cute:]NAME[:FIELD=VALUE,...][@PLATFORM]``, canonical names,
lists."""

from __future__ import annotations

import pytest

from zyfa.recipe_spec import (
    TRITON_KERNEL_FIELDS,
    SpecError,
    SpecParts,
    format_field_value,
    get_recipe,
    names_old_accumulator,
    overridable_fields,
    parse_field_value,
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
    ("cute:zyfa-hopper", "zyfa-hopper"),  # the CuTe kernel computes the same kernel version as the Triton one
    ("cute:fa3", "cute:fa3"),
    ("cute:zyfa-hopper:q_scale=head", "zyfa-hopper:q_scale=head"),
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
    assert get_recipe("cute:fa3").replace(name="triton:fa3") == k  # one kernel version of a recipe for both
    assert get_recipe("zyfa") is RECIPES["zyfa"] and get_recipe(RECIPES["ck"]) is RECIPES["ck"]


def test_split_spec_gives_the_parts_and_the_canonical_text():
    p = split_spec("triton:zyfa@h200:accum_flush_tiles=2")
    assert p == SpecParts("triton", "zyfa", (("accum_flush_tiles", 2),), "h200")
    assert p.text() == "triton:zyfa:accum_flush_tiles=2@h200" and p.recipe_spec() == "zyfa:accum_flush_tiles=2"
    assert split_spec("ck").text() == "ck" and split_spec("ck@mi355x").text() == "ck@mi355x"  # as given


@pytest.mark.parametrize("spec, message", [
    ("nosuchrecipe", "unknown recipe 'nosuchrecipe'; known recipes: zyfa, "),
    ("triton:nosuchrecipe", "unknown recipe 'nosuchrecipe'; known recipes: zyfa, "),
    ("cute:nosuchrecipe", "unknown recipe 'nosuchrecipe'; known recipes: zyfa, "),
    ("cuda:zyfa", "unknown recipe 'cuda'"),  # not a namespace
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


@pytest.mark.parametrize("text, value", [("true", True), ("TRUE", True), ("1", True), ("false", False),
                                         ("False", False), ("0", False)])
def test_a_bool_field_reads_true_false_1_0_and_is_written_true_or_false(text, value):
    assert parse_field_value("k_smoothing", text) is value
    assert format_field_value("k_smoothing", value) == ("true" if value else "false")
    assert get_recipe(f"zyfa:k_smoothing={text}").name == f"zyfa:k_smoothing={'true' if value else 'false'}"


@pytest.mark.parametrize("spec, message", [
    (3, "unknown recipe 3: a recipe spec is a string"),
    ("@h200", "unknown recipe ''; known recipes: "),  # no name before the platform
    (":accum_flush_tiles=1", "unknown recipe ''; known recipes: "),
    ("zyfa:accum_flush_tiles", "bad recipe override 'accum_flush_tiles' in 'zyfa:accum_flush_tiles': not field=value; "
                               "fields: q_format, "),
    ("zyfa:accum_flush_tiles=1=2", "accum_flush_tiles takes an integer, not '1=2'"),  # the first '=' splits
])
def test_a_bad_spec_message_in_full(spec, message):
    with pytest.raises(SpecError) as e:
        get_recipe(spec)
    assert str(e.value).startswith(message) or f": {message}" in str(e.value), str(e.value)


def test_unknown_recipe_and_bad_tiles_messages_end_with_the_grammar():
    with pytest.raises(SpecError) as e:
        get_recipe("nosuchrecipe")
    assert str(e.value).endswith(", ".join(RECIPES) + " (a spec is [triton|cute:]NAME[:field=value,...][@PLATFORM])")
    with pytest.raises(SpecError) as e:
        get_recipe("fa3:head_dim_tiles=64:192")
    assert ("head_dim_tiles entry '64:192' is not D:MxN (max head dim, block_m, block_n; entries joined by '|', "
            "e.g. 64:192x128|128:128x192, or none); fields: q_format, ") in str(e.value)


def test_split_spec_without_namespace_platform_or_overrides_leaves_them_empty():
    assert split_spec("zyfa") == SpecParts(None, "zyfa", (), None)
    assert split_spec("zyfa").namespace is None


@pytest.mark.parametrize("text, old", [
    ("fa3:accumulator=hopper_fp8@h200", True),
    ("zyfa:accumulator=hopper_fp8", True),
    ("fa3:accumulator=matrix_unit@h200", False),
    ("zyfa", False),
])
def test_names_old_accumulator_finds_the_old_name_in_a_stored_spec(text, old):
    assert names_old_accumulator(text) is old


@pytest.mark.parametrize("text, specs", [
    # an override piece whose value names the platform stays with its spec
    ("zyfa:accumulator=matrix_unit,accum_flush_tiles=1@h200,ck",
     ["zyfa:accumulator=matrix_unit,accum_flush_tiles=1@h200", "ck"]),
    # an override piece whose value holds ':' (head_dim_tiles) stays with its spec
    ("zyfa:accum_flush_tiles=1,head_dim_tiles=64:128x64,ck",
     ["zyfa:accum_flush_tiles=1,head_dim_tiles=64:128x64", "ck"]),
    # a piece with ':' or '@' before its '=' is a spec of its own
    ("zyfa,zyfa:accum_flush_tiles=2", ["zyfa", "zyfa:accum_flush_tiles=2"]),
    ("zyfa,ck@h200=1", ["zyfa", "ck@h200=1"]),
    # only the part before the first '=' decides
    ("zyfa:accum_flush_tiles=1,head_dim_tiles=64:1x1=2", ["zyfa:accum_flush_tiles=1,head_dim_tiles=64:1x1=2"]),
    ("fa3:accum_flush_tiles=1,kv_order=reverse@h200=1", ["fa3:accum_flush_tiles=1,kv_order=reverse@h200=1"]),
])
def test_split_spec_list_reads_the_part_before_a_pieces_first_equals_sign(text, specs):
    assert split_spec_list(text) == specs


def test_parse_recipes_keeps_a_platform_after_an_override_with_its_spec():
    got = parse_recipes("zyfa:accumulator=matrix_unit,accum_flush_tiles=1@h200,ck")
    assert [r.name for r in got] == ["zyfa:accumulator=matrix_unit,accum_flush_tiles=1@h200", "ck"]
    assert got[0].platform == "h200"


@pytest.mark.parametrize("text, message", [
    ("zyfa,ck@h200=1", "unknown platform 'h200=1'"),  # the bad piece named as it was typed
    ("zyfa:accum_flush_tiles=1,head_dim_tiles=64:1x1=2", "head_dim_tiles entry '64:1x1=2' is not D:MxN"),
])
def test_parse_recipes_names_the_bad_piece(text, message):
    with pytest.raises(SpecError) as e:
        parse_recipes(text)
    assert message in str(e.value)
