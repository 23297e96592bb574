"""Every kind of implementation as a model's attention (tiny random Llama/Mistral): emulator, registry built-ins,
plug-ins, fallbacks that are recorded and refusals that are not silent. GPU kinds are ``gpu`` tests."""

from __future__ import annotations

import pytest
import torch
from zyfa.accuracy.impact.model import ModelAttention, UnsupportedLayerError, model_attention
from zyfa.accuracy.implementations.base import Implementation, ImplResult
from zyfa.accuracy.implementations.plugins import load_plugin
from zyfa.accuracy.implementations.registry import get_implementation
from zyfa.capture.hook import swap_attention

from tests.longctx.conftest import tiny_llama
from zyfa.norms import rel_l2

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _hidden(model, ids, fn=None, layers=None):
    ctx = swap_attention(model, fn, layers=layers) if fn is not None else torch.no_grad()
    with torch.no_grad(), ctx:
        return model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 128, (2, 80), generator=torch.Generator().manual_seed(1))


def test_fp32_paths_reproduce_stock(llama, ids):
    ref = _hidden(llama, ids)
    for name in ("sdpa-fp32", "fp32"):  # a registry built-in, the emulator
        fn = model_attention(name)
        assert rel_l2(_hidden(llama, ids, fn), ref) < 1e-5
        assert fn.ran_summary() == {fn.name: [0, 1]}


def test_fp8_emulator_changes_the_output_by_fp8_error(llama, ids):
    ref = _hidden(llama, ids)
    fn = model_attention("zyfa")
    assert fn.name == "emulator:zyfa"
    assert 1e-4 < rel_l2(_hidden(llama, ids, fn), ref) < 0.2


def test_plugin_runs_in_the_model_and_only_in_chosen_layers(llama, ids):
    impl = load_plugin(f"{ROOT}/examples/fp8_torch_attention.py:attention", recipe="zyfa")
    seen = []
    fn = ModelAttention(impl, on_output=lambda layer, q, k, v, out, s, w: seen.append((layer, tuple(out.shape))))
    _hidden(llama, ids, fn, layers=[1])
    assert seen == [(1, (2, 4, 80, 64))]
    assert fn.ran_summary() == {impl.name: [1]}
    # the plug-in returns its output; a wrong shape is the plug-in's error, named
    bad = Implementation(name="plugin:bad", fn=lambda x, c: ImplResult(x.q[..., :3]), plugin=True)
    with pytest.raises(Exception, match="returned shape"):
        _hidden(llama, ids, ModelAttention(bad))


def _no_window_kernel():
    impl = get_implementation("sdpa-fp32")
    return Implementation(name="nowindow", fn=impl.fn, recipe="fp32", quantizes="none",
                          limits=lambda x: "sliding window not supported" if x.window else None)


def test_refused_layer_is_an_error_unless_fallback_and_then_recorded():
    model = tiny_llama(window=16)
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(2))
    with pytest.raises(UnsupportedLayerError, match="nowindow refuses layer 0: sliding window"):
        _hidden(model, ids, ModelAttention(_no_window_kernel()))
    fn = ModelAttention(_no_window_kernel(), fallback="stock")
    out = _hidden(model, ids, fn)
    assert fn.ran_summary() == {"stock sdpa (fallback: sliding window not supported)": [0, 1]}
    assert rel_l2(out, _hidden(model, ids)) < 1e-6
    # a kernel that takes the window computes it, bottom-right aligned as the model's mask
    fn = model_attention("sdpa-fp32")
    assert rel_l2(_hidden(model, ids, fn), _hidden(model, ids)) < 1e-5
    assert fn.ran_summary() == {"sdpa-fp32": [0, 1]}


def test_unknown_name_is_one_line():
    # neither a built-in nor a recipe: the spec grammar's line, as every command gives it (zyfa.recipes)
    with pytest.raises(ValueError, match=r"^unknown recipe 'no-such-kernel'; known recipes: zyfa, .*@PLATFORM\]\)$"):
        model_attention("no-such-kernel")


GPU_KINDS = ["triton:zyfa-hopper", "triton:zyfa", "triton:fa3", "cudnn-fp8", "flashinfer-fa3", "sdpa-bf16:cudnn",
             "zyfa-hopper"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_KINDS)
def test_gpu_implementations_in_the_model(name):
    fn = model_attention(name)
    if fn.impl is not None:
        ok, why = fn.impl.available()
        if not ok:
            pytest.skip(why)
    model = tiny_llama(heads=4, kv_heads=2, head_dim=64).to("cuda")
    ids = torch.randint(0, 128, (2, 256), generator=torch.Generator().manual_seed(3)).cuda()
    ref = _hidden(model, ids)
    out = _hidden(model, ids, fn)
    assert fn.ran_summary() == {fn.name: [0, 1]}  # the kernel itself ran in every layer: no silent fallback
    assert 1e-5 < rel_l2(out, ref) < 0.2
