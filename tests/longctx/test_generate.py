"""Greedy decoding with an implementation in every step: the cached s_q = 1 path, the recompute path for an
implementation that refuses that shape, what ran where, and the drift along a sequence."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from zyfa.accuracy.impact.model import ModelAttention, model_attention
from zyfa.accuracy.implementations.registry import get_implementation
from zyfa.accuracy.longctx.generate import greedy_generate, sequence_drift, sequence_logits

from tests.longctx.conftest import tiny_llama

CPU = torch.device("cpu")
PROMPT = [5, 17, 3, 99, 42, 8, 61, 23, 77, 2, 40, 11]


def _square_only() -> ModelAttention:
    """sdpa-fp32 that refuses s_q != s_k, as kernels aligning causal masks top-left do."""
    impl = dataclasses.replace(get_implementation("sdpa-fp32"), name="square-only",
                               limits=lambda x: "s_q != s_k" if x.q.shape[2] != x.k.shape[2] else None)
    return ModelAttention(impl)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(layers=2)


def test_cached_decode_runs_the_implementation_at_s_q_1(model):
    seen = []
    fn = model_attention("sdpa-fp32", on_output=lambda layer, q, k, v, out, sm, w: seen.append(q.shape[2]))
    g = greedy_generate(model, PROMPT, fn, max_new_tokens=6, device=CPU)
    assert g.decode == "cached" and len(g.tokens) == 6 and g.stopped == "max_new_tokens"
    assert g.ran_prefill == {"sdpa-fp32": [0, 1]} and g.ran_decode == {"sdpa-fp32": [0, 1]}
    assert seen[:2] == [len(PROMPT)] * 2 and set(seen[2:]) == {1}  # prefill, then one query per step
    stock = greedy_generate(model, PROMPT, None, max_new_tokens=6, device=CPU)
    assert stock.decode == "stock" and stock.tokens == g.tokens  # fp32 both: the same tokens
    ref = model.generate(torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False)[0, len(PROMPT):].tolist()
    assert stock.tokens == ref  # the hand-written loop is transformers' greedy decoding


@pytest.mark.parametrize("fallback", [None, "stock"])
def test_an_implementation_refusing_s_q_1_recomputes_every_step(model, fallback):
    fn = _square_only()
    fn.fallback = fallback
    seen = []
    fn.on_output = lambda layer, q, k, v, out, sm, w: seen.append(q.shape[2])
    g = greedy_generate(model, PROMPT, fn, max_new_tokens=5, device=CPU)
    assert g.decode == "recompute"
    assert g.ran_decode == {"square-only": [0, 1]}  # the implementation itself ran every decode step
    assert 1 not in seen and max(seen) == len(PROMPT) + 4
    stock = greedy_generate(model, PROMPT, None, max_new_tokens=5, device=CPU)
    assert g.tokens == stock.tokens
    assert "re-ran the whole sequence" in g.decode_note("square-only")


def test_eos_and_stop_end_the_generation(model):
    first = greedy_generate(model, PROMPT, None, max_new_tokens=4, device=CPU).tokens
    g = greedy_generate(model, PROMPT, None, max_new_tokens=4, device=CPU, eos_ids=[first[1]])
    assert g.tokens == first[:1] and g.stopped == "eos"
    g = greedy_generate(model, PROMPT, None, max_new_tokens=4, device=CPU, stop=lambda t: len(t) == 2)
    assert g.tokens == first[:2] and g.stopped == "stop"
    with pytest.raises(ValueError, match="at least 1"):
        greedy_generate(model, PROMPT, None, max_new_tokens=0, device=CPU)


def test_drift_is_zero_against_itself_and_positive_under_fp8(model):
    toks = greedy_generate(model, PROMPT, None, max_new_tokens=6, device=CPU).tokens
    ref = sequence_logits(model, PROMPT, toks, None, device=CPU)
    assert ref.argmax(-1).tolist() == toks  # teacher-forced on its own greedy tokens: the same argmaxes
    same = sequence_drift(ref, ref)
    assert max(same["kl"]) < 1e-12 and all(same["top1_agree"])
    fp8 = sequence_drift(ref, sequence_logits(model, PROMPT, toks, model_attention("zyfa"), device=CPU))
    assert len(fp8["kl"]) == 6 and min(fp8["kl"]) > 0
    with pytest.raises(ValueError, match="differ"):
        sequence_drift(ref, ref[:3])


def test_drift_in_blocks_equals_the_whole_sequence_at_once():
    # 70 positions cross two block boundaries (blocks of 32); the reference is the unblocked float64 formula
    g = torch.Generator().manual_seed(3)
    ref, test = torch.randn(70, 50, generator=g), torch.randn(70, 50, generator=g) * 2
    d = sequence_drift(ref, test)
    lr, lt = torch.log_softmax(ref.double(), -1), torch.log_softmax(test.double(), -1)
    whole = (lr.exp() * (lr - lt)).sum(-1)
    assert len(d["kl"]) == 70 and torch.allclose(torch.tensor(d["kl"], dtype=torch.float64), whole, rtol=0, atol=0)
    assert d["top1_agree"] == (lr.argmax(-1) == lt.argmax(-1)).tolist()
    assert sequence_drift(ref[:0], test[:0]) == {"kl": [], "top1_agree": []}


def _reads(monkeypatch):
    reads = []
    for name in ("__bool__", "__int__", "__float__", "tolist", "item"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _r=real: reads.append(1) or _r(t, *a))
    return reads


@pytest.mark.parametrize("name", ["sdpa-fp32", "bf16", "zyfa"])
def test_a_decode_step_answers_its_checks_once(monkeypatch, name):
    """Through a real implementation (sdpa-fp32, its output screened in every layer) or the emulator (its inputs
    screened, its flushed-P fraction kept on the device), a decode step reads the device back twice whatever the
    layer count: its checks, answered together (zyfa.checks), and the next token."""
    model = tiny_llama(layers=4)
    fn = model_attention(name)
    greedy_generate(model, PROMPT, fn, max_new_tokens=2, device=CPU)
    reads = _reads(monkeypatch)
    greedy_generate(model, PROMPT, fn, max_new_tokens=1, device=CPU)
    one = len(reads)
    greedy_generate(model, PROMPT, fn, max_new_tokens=4, device=CPU)
    monkeypatch.undo()
    assert (len(reads) - 2 * one) / 3 == 2  # the second run's reads beyond its prefill's, per step


def test_a_kernel_failing_in_a_decode_step_is_named_as_in_its_layer():
    """A kernel whose output turns NaN in decode steps only: the error, raised when the step's checks are answered,
    is the one its layer's call would have raised at once."""
    from zyfa.accuracy.implementations.base import Implementation, ImplementationError, ImplResult

    def fn(x, _ctx):
        out = torch.nn.functional.scaled_dot_product_attention(
            x.q, x.k.repeat_interleave(x.q.shape[1] // x.k.shape[1], 1),
            x.v.repeat_interleave(x.q.shape[1] // x.v.shape[1], 1), is_causal=x.q.shape[2] > 1)
        return ImplResult(out * float("nan") if x.q.shape[2] == 1 else out)

    impl = Implementation(name="nan-at-decode", fn=fn, quantizes="none", description="test")
    model = tiny_llama(heads=4, kv_heads=2, head_dim=64, layers=3)
    with pytest.raises(ImplementationError) as caught:
        greedy_generate(model, PROMPT, ModelAttention(impl), max_new_tokens=3, device=CPU)
    assert str(caught.value) == "kernel 'nan-at-decode' returned 256 non-finite output value(s) (256 NaN) of 256"
