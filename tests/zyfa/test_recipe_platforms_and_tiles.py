"""``NAME@PLATFORM`` lookup, :meth:`Recipe.on`, :meth:`Recipe.tiles` and the ``head_dim_tiles`` check.

``get_recipe("NAME@PLATFORM")`` is the named recipe on another platform: a copy named ``NAME@PLATFORM`` whose
``platform`` field is that platform and whose numerics fields are the named recipe's; on the recipe's own
platform it is the recipe itself. The text after the last ``@`` is the platform. ``tiles(d)`` takes the first
``head_dim_tiles`` entry with ``d <= max d`` (inclusive), else ``block_m``/``block_n``. Expected names, tiles
and messages are written out here by hand from the docstrings, not computed by the code under test.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from zyfa.platforms import PLATFORMS
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import RECIPES, Recipe


def _numerics(r: Recipe) -> dict:
    """Every field but the name and the platform."""
    return {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name not in ("name", "platform")}


@pytest.mark.parametrize(("spec", "base", "platform"), [("ck@h200", "ck", "h200"), ("fa3@mi355x", "fa3", "mi355x"),
                                                         ("zyfa@h200", "zyfa", "h200")])
def test_name_at_another_platform_is_a_renamed_copy_on_that_platform(spec, base, platform):
    r = get_recipe(spec)
    assert (r.name, r.platform) == (spec, platform)
    assert RECIPES[base].platform != platform
    assert _numerics(r) == _numerics(RECIPES[base])
    assert RECIPES[base].on(platform) == r
    assert RECIPES[base].on(PLATFORMS[platform]) == r  # a Platform object works as its name


@pytest.mark.parametrize(("name", "platform"), [("ck", "mi355x"), ("fa3", "h200"), ("zyfa-hopper", "h200")])
def test_name_at_its_own_platform_is_the_named_recipe_itself(name, platform):
    assert get_recipe(f"{name}@{platform}") is RECIPES[name]
    assert RECIPES[name].on(platform) is RECIPES[name]


def test_a_spec_names_one_platform():
    # one '@PLATFORM' per spec (the grammar of zyfa.recipes); "ck@h200@mi355x" is refused in one line
    with pytest.raises(ValueError, match=r"^recipe spec 'ck@h200@mi355x' names more than one platform"):
        get_recipe("ck@h200@mi355x")
    r = get_recipe("ck@h200")
    assert (r.name, r.platform) == ("ck@h200", "h200")
    assert _numerics(r) == _numerics(RECIPES["ck"].replace(platform="h200"))


def test_unknown_platform_or_recipe_before_the_at_is_named_in_one_line():
    with pytest.raises(ValueError, match=r"^unknown platform 'tpu'; known platforms: h200, mi355x$"):
        get_recipe("ck@tpu")
    with pytest.raises(ValueError, match=r"^unknown recipe 'nope'; known recipes: "):
        get_recipe("nope@h200")
    with pytest.raises(ValueError, match=r"^unknown platform 'a100'; known platforms: h200, mi355x$"):
        RECIPES["ck"].on("a100")


def test_tiles_take_the_first_entry_covering_the_head_dim_inclusive():
    r = Recipe(name="t", source="s", block_m=16, block_n=16, head_dim_tiles=((64, 64, 32), (128, 32, 64)))
    got = {d: r.tiles(d) for d in (1, 63, 64, 65, 127, 128, 129, 256)}
    assert got == {1: (64, 32), 63: (64, 32), 64: (64, 32), 65: (32, 64), 127: (32, 64), 128: (32, 64),
                   129: (16, 16), 256: (16, 16)}
    assert Recipe(name="u", source="s", block_m=16, block_n=48).tiles(64) == (16, 48)  # no entries: the fields


def test_head_dim_tiles_of_ones_are_accepted():
    r = Recipe(name="t", source="s", head_dim_tiles=((1, 1, 1),))
    assert (r.tiles(1), r.tiles(2)) == ((1, 1), (128, 128))


_MSG = ("recipe 't': head_dim_tiles must be a tuple of (max head dim, block_m, block_n) int triples >= 1 in "
        "increasing head dim, got ")


@pytest.mark.parametrize("tiles", [
    ((128, 0, 128),),  # block_m 0
    ((0, 128, 128),),  # max head dim 0
    ((128, 128, -32),),  # negative block_n
    ((128, 128),),  # a pair
    ((128, 128, 128, 1),),  # four numbers
    [(128, 128, 128)],  # a list, not a tuple
    ((128, (128,), 128),),  # a tuple inside
    ((128.0, 128, 128),),  # a float
    ((128, True, 128),),  # a bool is no int here
    ((128, 128, 128), (128, 64, 64)),  # the same head dim twice
    ((128, 128, 128), (64, 64, 64)),  # decreasing
    ((64, 64, 64), (128, 64, 64), (96, 64, 64)),  # the last pair decreasing
])
def test_bad_head_dim_tiles_are_refused_with_the_entries_named(tiles):
    with pytest.raises(ValueError, match="^" + re.escape(_MSG + repr(tiles)) + "$"):
        Recipe(name="t", source="s", head_dim_tiles=tiles)
