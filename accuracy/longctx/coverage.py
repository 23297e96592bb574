"""Equal coverage: implementations compared on a model run on the same layers.

A kernel that refuses some layers (cuDNN FP8 and FlashInfer's FA3 refuse Gemma 3's sliding-window layers) would,
with a stock fallback, be compared on 3 FP8 layers against another kernel's 18. :func:`equal_coverage` probes each
implementation once with one forward pass of the run's longest sequence (a layer's refusal can depend on the
length: a sliding window binds only beyond its width), with the stock fallback on, and returns the layers that
every member runs. The run then swaps only those layers for every member; the others run the model's own
attention for all members alike. Recipes run by the emulator and ``stock`` take every layer and are not probed.

A probe that fails (the kernel raises, :class:`~zyfa.accuracy.implementations.base.ImplementationError`, where it
refuses nothing: a kernel that runs the conformance probes' small inputs and breaks at the run's longest sequence)
does not stop the run: that implementation is named in :attr:`Coverage.failed` (and in every row's note), the layers
it refused before it failed count as refusals, and its rows are scored, or fail, batch by batch like any other's.

:meth:`Coverage.layers_by_impl` is what a row records: for one implementation, what ran -> layers.

Exposed: ``Coverage``, ``equal_coverage``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from zyfa.accuracy.impact.model import STOCK, ModelAttention
from zyfa.accuracy.implementations.base import ImplementationError
from zyfa.capture.hook import attention_modules, swap_attention

__all__ = ["Coverage", "equal_coverage"]


@dataclass
class Coverage:
    """The layers every compared implementation runs (``layers``) and those fixed to the model's own attention
    for all of them, with who refused each (``fixed``: layer -> reason); ``failed``: implementation -> the error
    that stopped its probe (its refusals after that point unknown)."""

    layers: list[int]
    fixed: dict[int, str] = field(default_factory=dict)
    probe_len: int = 0
    failed: dict[str, str] = field(default_factory=dict)

    def layers_by_impl(self, name: str, dtype: str = "") -> dict[str, list[int]]:
        """What computed which layers for implementation ``name`` under this coverage."""
        stock = f"stock sdpa ({dtype})"
        out: dict[str, list[int]] = {}
        if self.layers:
            out[stock if name == STOCK else name] = list(self.layers)
        if self.fixed:
            out[stock] = sorted(set(out.get(stock, [])) | set(self.fixed))
        return out

    def note(self) -> str:
        """One line for a row: which layers were fixed, and why (and whose probe failed)."""
        if not self.fixed:
            line = f"equal: every implementation runs all {len(self.layers)} swapped layers"
        else:
            why = "; ".join(f"layer {k}: {v}" for k, v in sorted(self.fixed.items())[:3])
            more = f" (and {len(self.fixed) - 3} more)" if len(self.fixed) > 3 else ""
            line = (f"equal: layers {_ranges(self.layers)} run each implementation; layers "
                    f"{_ranges(sorted(self.fixed))} run the model's own attention for every implementation "
                    f"({why}{more})")
        if self.failed:
            line += ("; " + "; ".join(f"{name} failed its probe at {self.probe_len} tokens ({why[:200]})"
                                      for name, why in sorted(self.failed.items()))
                     + ": only the layers it refused before failing count")
        return line


def _ranges(xs: Sequence[int]) -> str:
    out, i = [], 0
    xs = list(xs)
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out) or "none"


def equal_coverage(model, fns: dict[str, ModelAttention | None], *, probe_len: int, device: torch.device,
                   layers: Sequence[int] | None = None) -> Coverage:
    """The layers (among ``layers``, None: all) that every implementation in ``fns`` (name -> attention function,
    None for stock) runs on a ``probe_len``-token sequence; one probing pass per real implementation."""
    chosen = sorted(attention_modules(model)) if layers is None else sorted(int(x) for x in layers)
    refused: dict[int, list[str]] = {}
    failed: dict[str, str] = {}
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = (torch.arange(max(1, int(probe_len)), device=device) * 7919 % max(1, vocab - 1) + 1).view(1, -1)
    for name, fn in fns.items():
        if fn is None or fn.impl is None:
            continue
        saved, fn.fallback, fn.ran = fn.fallback, STOCK, {}
        try:
            with torch.no_grad(), swap_attention(model, fn, layers=chosen):
                model.get_decoder()(input_ids=ids, use_cache=False)
        except ImplementationError as e:  # a kernel that breaks here must not stop the others' run
            failed[name] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        finally:
            fn.fallback = saved
        for layer, what in fn.ran.items():
            if what.startswith("stock sdpa (fallback: "):
                refused.setdefault(layer, []).append(f"{name} refuses ({what[len('stock sdpa (fallback: '):-1]})")
        fn.ran = {}
    return Coverage(layers=[x for x in chosen if x not in refused],
                    fixed={k: ", ".join(v) for k, v in sorted(refused.items())}, probe_len=int(probe_len),
                    failed=failed)
