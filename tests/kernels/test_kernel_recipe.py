"""The recipe as our Triton kernel computes it (CPU: no kernel launch)."""

from __future__ import annotations

from zyfa.kernels.attention_fp8 import kernel_recipe
from zyfa.recipe_spec import get_recipe


def test_fa3_head_dim_tiles_become_the_kernels_fixed_tiles():
    fa3 = get_recipe("fa3")
    assert fa3.tiles(128) == (128, 224) and fa3.tiles(64) == (192, 160)  # FA3's hopper/tile_size.h
    ours = kernel_recipe("fa3")
    assert ours.tiles(128) == ours.tiles(64) == (fa3.block_m, fa3.block_n) == (128, 128)
    # FA3's mainloop visits the KV tiles last to first; our kernel visits them from key 0
    assert fa3.kv_order == "reverse" and ours.kv_order == "forward"
    assert ours.replace(head_dim_tiles=fa3.head_dim_tiles, kv_order=fa3.kv_order) == fa3  # nothing else changes


def test_recipes_without_head_dim_tiles_pass_through():
    assert kernel_recipe("zyfa-hopper") is get_recipe("zyfa-hopper")
    assert kernel_recipe("zyfa:rowsum=fp32") == get_recipe("zyfa").replace(name="zyfa:rowsum=fp32", rowsum="fp32")
