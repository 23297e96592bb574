"""scripts/ab_kernel_variants.py: every variant of every set resolves to a launch the wrapper accepts (CPU), so an
A/B run on the H200 does not lose device time to a variant refused at its first launch."""

from __future__ import annotations

import pytest

from tests.load_file import load_script
from zyfa.bench.cases import SHAPES
from zyfa.kernels.attention_fp8 import kernel_plan, kernel_recipe, resolve_config


@pytest.fixture(scope="module")
def ab():
    return load_script("ab_kernel_variants")


def test_every_variant_resolves(ab):
    for name in ab.SETS:
        ab.variant_set(name)
        assert ab.V, name
        for _label, shape, causal, recipe, cfg, _same in ab.V:
            d_qk, d_v = SHAPES[shape]
            resolve_config(d_qk, d_v, causal, kernel_plan(kernel_recipe(recipe)), cfg)  # raises on a refused one


def test_warp_specialize_set_times_ws_beside_the_default_and_its_plain_launch(ab):
    ab.variant_set("warp-specialize")
    ws = [v for v in ab.V if (v[4] or {}).get("WS") == 1]
    assert {(v[1], v[2], v[3]) for v in ws} == {(s, c, r) for s in ("hd128", "hd64", "mla", "hd256")
                                                for c in (False, True)
                                                for r in ("zyfa-hopper", "fa3:accum_flush_tiles=1")}
    defaults = {(v[1], v[2], v[3]) for v in ab.V if v[4] is None}
    assert {(v[1], v[2], v[3]) for v in ws} <= defaults
    with pytest.raises(SystemExit, match="unknown --set"):
        ab.variant_set("no-such-set")
