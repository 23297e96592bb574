"""Greedy decoding with an attention implementation in every step, and the drift of its logits along a sequence.

:func:`greedy_generate` runs the prompt's prefill and then one token per step, always with the implementation
under test as the attention of the chosen layers:

- ``cached``: the decode steps feed one token (s_q = 1) against the KV cache, through the same implementation;
- ``recompute``: where the implementation refuses that shape (a kernel that aligns causal masks top-left, say),
  each step instead runs the whole sequence so far through it, without a cache (the same tokens, quadratic cost);
- ``stock``: nothing swapped (the model's own attention, cached).

The choice is made on the first decode step: an :class:`~accuracy.impact.model.UnsupportedLayerError`, or a layer
that the fallback sent to stock attention in a decode step but not in the prefill, switches to ``recompute``.
:attr:`Generation.decode` says which ran and :attr:`Generation.ran_decode` what computed each layer.

:func:`sequence_drift` is the teacher-forced comparison along a generated sequence: the baseline's tokens are
scored by one pass of each implementation, and per generated position the KL(baseline || implementation) and
whether the two argmaxes agree are returned (does the drift grow with position?).

Exposed: ``Generation``, ``greedy_generate``, ``sequence_logits``, ``sequence_drift``.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from zyfa.accuracy.impact.model import (
    ModelAttention,
    UnsupportedLayerError,
    logits_from_hidden,
)
from zyfa.capture.hook import swap_attention

from zyfa import checks

__all__ = ["Generation", "greedy_generate", "sequence_drift", "sequence_logits"]

_DRIFT_BLOCK = 32  # positions per float64 block of sequence_drift


def _cache_of(res):
    """The KV cache of a decoder's output: ``cache`` in recent transformers, ``past_key_values`` before (5.17 on
    the H200 machine)."""
    cache = getattr(res, "cache", None)
    return cache if cache is not None else getattr(res, "past_key_values", None)


def _cache_argument(decoder) -> str:
    """The keyword a decoder's forward takes its KV cache by (``cache`` or, in older transformers,
    ``past_key_values``)."""
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"


@dataclass
class Generation:
    """Tokens generated greedily after a prompt and how they were made."""

    tokens: list[int]
    decode: str  # cached | recompute | stock
    stopped: str  # eos | stop | max_new_tokens
    ran_prefill: dict[str, list[int] | str] = field(default_factory=dict)
    ran_decode: dict[str, list[int] | str] = field(default_factory=dict)
    seconds: float = 0.0

    def decode_note(self, name: str) -> str:
        """One line for a row: what computed the prefill and the decode steps."""
        if self.decode == "stock":
            return "prefill and decode (s_q = 1, KV cache) with the model's own attention"
        if self.decode == "cached":
            return f"prefill and decode (s_q = 1, KV cache) through {name}"
        return (f"prefill through {name}; {name} refuses s_q = 1 against a cache, so every decode step re-ran the "
                f"whole sequence through it (no cache)")


def _swap(model, fn: ModelAttention | None, layers: Sequence[int] | None):
    return swap_attention(model, fn, layers=layers) if fn is not None else contextlib.nullcontext()


def _ran(fn: ModelAttention | None, dtype: str) -> dict:
    return fn.ran_summary() if fn is not None else {f"stock sdpa ({dtype})": "all"}


def _fallback_layers(ran: dict) -> set[int]:
    return {layer for what, layers in ran.items() if isinstance(layers, list) and what.startswith("stock sdpa")
            for layer in layers}


def greedy_generate(model, prompt: Sequence[int], fn: ModelAttention | None, *, max_new_tokens: int,
                    device: torch.device, layers: Sequence[int] | None = None, eos_ids: Sequence[int] = (),
                    stop: Callable[[list[int]], bool] | None = None, dtype: str = "") -> Generation:
    """Greedy decoding of up to ``max_new_tokens`` after ``prompt`` with ``fn`` (None: the model's own attention)
    as the attention of ``layers`` (None: all) in the prefill and in every decode step.

    ``stop(tokens)`` is asked after each token (e.g. a HumanEval stop sequence in the decoded text); an
    ``eos_ids`` token ends the generation and is not kept.

    Raises:
        UnsupportedLayerError, UnsupportedMaskError, ImplementationError: the implementation refuses the prefill.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    t0 = time.perf_counter()
    eos = set(int(e) for e in eos_ids)
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    decoder = model.get_decoder()
    out: list[int] = []
    mode = "stock" if fn is None else "cached"
    stopped = "max_new_tokens"
    ran_decode: dict = {}
    cache_kw = _cache_argument(decoder)  # once, not per step
    with torch.no_grad(), _swap(model, fn, layers):
        res = decoder(input_ids=ids, use_cache=True)
        ran_prefill = _ran(fn, dtype)
        cache = _cache_of(res)
        nxt = int(logits_from_hidden(model, res.last_hidden_state[0, -1:])[0].argmax())
        while True:
            if nxt in eos:
                stopped = "eos"
                break
            out.append(nxt)
            if stop is not None and stop(out):
                stopped = "stop"
                break
            if len(out) >= max_new_tokens:
                break
            step = torch.tensor([[nxt]], dtype=torch.long, device=device)
            if mode != "recompute":
                if fn is not None:
                    fn.ran = {}
                try:
                    # one s_q = 1 step: the checks that ask the device (zyfa.checks) are answered once, at its end,
                    # not in every layer; a failed one raises what it would have raised in its layer
                    with checks.deferred():
                        res = decoder(input_ids=step, use_cache=True, **{cache_kw: cache})
                    cache = _cache_of(res)
                    if fn is not None and _fallback_layers(fn.ran_summary()) - _fallback_layers(ran_prefill):
                        raise UnsupportedLayerError("decode shape sent layers to the fallback")
                    if not ran_decode:
                        ran_decode = _ran(fn, dtype)
                except UnsupportedLayerError:
                    mode, cache = "recompute", None
            if mode == "recompute":
                if fn is not None:
                    fn.ran = {}
                full = torch.tensor([list(prompt) + out], dtype=torch.long, device=device)
                res = decoder(input_ids=full, use_cache=False)
                if not ran_decode:
                    ran_decode = _ran(fn, dtype)
            nxt = int(logits_from_hidden(model, res.last_hidden_state[0, -1:])[0].argmax())
    return Generation(tokens=out, decode=mode, stopped=stopped, ran_prefill=ran_prefill, ran_decode=ran_decode,
                      seconds=time.perf_counter() - t0)


def sequence_logits(model, prompt: Sequence[int], tokens: Sequence[int], fn: ModelAttention | None, *,
                    device: torch.device, layers: Sequence[int] | None = None) -> torch.Tensor:
    """fp32 logits (len(tokens), V) predicting each of ``tokens`` after ``prompt`` (teacher-forced), one pass
    with ``fn`` as the attention."""
    seq = list(prompt) + list(tokens)
    ids = torch.tensor([seq], dtype=torch.long, device=device)
    with torch.no_grad(), _swap(model, fn, layers):
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]
    start = len(prompt) - 1
    return logits_from_hidden(model, hidden[start:start + len(tokens)])


def sequence_drift(ref_logits: torch.Tensor, test_logits: torch.Tensor) -> dict[str, list]:
    """Per position: KL(ref || test) in nats (float64) and whether the argmaxes agree, for logits (n, V)."""
    if ref_logits.shape != test_logits.shape:
        raise ValueError(f"logits of shapes {tuple(ref_logits.shape)} and {tuple(test_logits.shape)} differ")
    kl, agree = [], []
    # in blocks of positions: float64 copies of a whole (384, 152K) sequence's logits take ~2 GB, which sixteen
    # HumanEval processes sharing one GPU do not have
    for i in range(0, ref_logits.shape[0], _DRIFT_BLOCK):
        lr = torch.log_softmax(ref_logits[i:i + _DRIFT_BLOCK].double(), dim=-1)
        lt = torch.log_softmax(test_logits[i:i + _DRIFT_BLOCK].to(lr.device).double(), dim=-1)
        kl.append((lr.exp() * (lr - lt)).sum(dim=-1).clamp(min=0).cpu())
        agree.append((lr.argmax(dim=-1) == lt.argmax(dim=-1)).cpu())
    if not kl:
        return {"kl": [], "top1_agree": []}
    return {"kl": [float(x) for x in torch.cat(kl)], "top1_agree": [bool(x) for x in torch.cat(agree)]}
