"""Equal coverage: a layer one implementation refuses is fixed to stock attention for every implementation."""

from __future__ import annotations

import dataclasses

import torch
from zyfa.accuracy.impact.model import ModelAttention, model_attention
from zyfa.accuracy.implementations.registry import get_implementation
from zyfa.accuracy.longctx.coverage import equal_coverage
from zyfa.accuracy.longctx.generate import greedy_generate

from tests.longctx.conftest import tiny_llama

CPU = torch.device("cpu")


def _refusing(layer: int) -> ModelAttention:
    impl = dataclasses.replace(get_implementation("sdpa-fp32"), name=f"no-layer-{layer}",
                               limits=lambda x: "test refusal" if x.name == f"layer{layer}" else None)
    return ModelAttention(impl)


def test_refused_layers_are_fixed_for_every_member():
    model = tiny_llama(layers=3)
    fns = {"stock": None, "zyfa": model_attention("zyfa"), "sdpa-fp32": model_attention("sdpa-fp32"),
           "no-layer-1": _refusing(1)}
    cov = equal_coverage(model, fns, probe_len=24, device=CPU)
    assert cov.layers == [0, 2] and list(cov.fixed) == [1] and "no-layer-1 refuses (test refusal)" in cov.fixed[1]
    assert cov.layers_by_impl("zyfa", "fp32") == {"zyfa": [0, 2], "stock sdpa (fp32)": [1]}
    assert cov.layers_by_impl("stock", "fp32") == {"stock sdpa (fp32)": [0, 1, 2]}
    assert "layers 0,2 run each implementation; layers 1 run the model's own" in cov.note()
    assert fns["no-layer-1"].fallback is None  # the probe's fallback is not left behind
    # under that coverage the refusing implementation runs without a fallback: it is never asked for layer 1
    g = greedy_generate(model, [3, 4, 5, 6], fns["no-layer-1"], max_new_tokens=2, device=CPU, layers=cov.layers)
    assert g.ran_prefill == {"no-layer-1": [0, 2]}


def test_nothing_refused_keeps_every_layer():
    model = tiny_llama(layers=2)
    cov = equal_coverage(model, {"a": model_attention("sdpa-fp32"), "b": None}, probe_len=8, device=CPU)
    assert cov.layers == [0, 1] and cov.fixed == {} and cov.note().startswith("equal: every implementation")


def _breaks_past(n_keys: int, name: str = "breaks") -> ModelAttention:
    """sdpa-fp32 that raises (a kernel fault, not a refusal) on more than ``n_keys`` keys."""
    base = get_implementation("sdpa-fp32")

    def fn(x, context):
        if x.k.shape[2] > n_keys:
            raise RuntimeError(f"no launch past {n_keys} keys")
        return base.fn(x, context)

    return ModelAttention(dataclasses.replace(base, name=name, fn=fn))


def test_a_probe_that_fails_is_named_and_the_others_keep_their_coverage():
    """A kernel that runs short inputs and raises at the probe's length (the run's longest) does not stop the run:
    it is named in ``failed`` and in the rows' note, and every layer stays swapped for the others; a layer another
    member refuses is still fixed for all."""
    model = tiny_llama(layers=3)
    fns = {"zyfa": model_attention("zyfa"), "breaks": _breaks_past(16), "no-layer-2": _refusing(2)}
    cov = equal_coverage(model, fns, probe_len=24, device=CPU)
    assert cov.layers == [0, 1] and list(cov.fixed) == [2]
    assert list(cov.failed) == ["breaks"] and "no launch past 16 keys" in cov.failed["breaks"]
    assert "breaks failed its probe at 24 tokens (" in cov.note() and "no launch past 16 keys" in cov.note()
    assert fns["breaks"].fallback is None and fns["breaks"].ran == {}  # nothing of the probe left behind
    # below its limit the same implementation runs the covered layers
    g = greedy_generate(model, [3, 4, 5, 6], fns["breaks"], max_new_tokens=2, device=CPU, layers=cov.layers)
    assert g.ran_prefill == {"breaks": [0, 1]}
    # nothing failed, nothing refused: the note is the plain one
    assert equal_coverage(model, {"zyfa": model_attention("zyfa")}, probe_len=24, device=CPU).failed == {}
