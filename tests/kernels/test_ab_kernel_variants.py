"""scripts/ab_kernel_variants.py: every variant of every set resolves to a launch the wrapper accepts (CPU), so an
A/B run on the H200 does not lose device time to a variant refused at its first launch."""

from __future__ import annotations

import pytest

from tests.load_file import load_script
from zyfa.bench.cases import SHAPES
from zyfa.kernels.attention_fp8 import kernel_plan, kernel_recipe, resolve_config
from zyfa.kernels.cute_plan import check_head_dims, cute_config, cute_plan
from zyfa.recipe_spec import split_spec
from zyfa.timing import Sample


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


def test_per_round_ratio_is_taken_within_each_round(ab):
    """The per-round column pairs the two rows' samples by round (zyfa.timing.ratio_summary), so a round where
    both ran slow cancels out: here a is 10% faster in every round although its times span 0.9-1.1 ms."""
    a, b = ab._sample_name("a", "hd128", True, "r"), ab._sample_name("b", "hd128", True, "r")
    times = [1.0, 1.1, 0.9, 1.05, 0.95]
    samples = [Sample(a, i, 0, ms, None) for i, ms in enumerate(times)]
    samples += [Sample(b, i, 1, ms * 1.1, None) for i, ms in enumerate(times)]
    assert ab._per_round(samples, a, b) == "1.10 [1.10-1.10]"
    assert ab._per_round(samples, b, a) == "0.91 [0.91-0.91]"
    assert ab._per_round(samples, a, ab._sample_name("c", "hd128", True, "r")) == "-"
