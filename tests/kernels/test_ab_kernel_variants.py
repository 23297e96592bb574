"""scripts/ab_kernel_variants.py: every variant of every set resolves to a launch the wrapper accepts (CPU), so an
A/B run on the H200 does not lose device time to a variant refused at its first launch."""

from __future__ import annotations

import pytest

from tests.load_file import load_script
from zyfa.bench.cases import SHAPES
from zyfa.kernels.attention_fp8 import kernel_plan, kernel_recipe, resolve_config
from zyfa.kernels.cute_plan import check_head_dims, cute_config, cute_plan
from zyfa.recipe_spec import split_spec


@pytest.fixture(scope="module")
def ab():
    return load_script("ab_kernel_variants")


def test_every_variant_resolves(ab):
    for name in ab.SETS:
        ab.variant_set(name)
        assert ab.V, name
        for _label, shape, causal, recipe, cfg, _same in ab.V:
            d_qk, d_v = SHAPES[shape]
            if split_spec(recipe).namespace == "cute":  # the CuTe kernel: its form, at a head dim it takes
                check_head_dims(d_qk, d_v)
                cute_config(cute_plan(recipe), cfg)
            else:
                resolve_config(d_qk, d_v, causal, kernel_plan(kernel_recipe(recipe)), cfg)  # raises on a refused one


def test_an_unknown_set_is_refused(ab):
    """Including the warp-specialize set of the removed WS switch (docs/KERNEL.md, "Tried and not kept")."""
    for name in ("no-such-set", "warp-specialize"):
        with pytest.raises(SystemExit, match="unknown --set"):
            ab.variant_set(name)
