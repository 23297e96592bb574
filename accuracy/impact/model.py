"""Any attention implementation as a model's attention, and the comparison of a model's logits against the stock
ones.

- :class:`RecipeAttention`: a recipe's emulator (CPU or CUDA) as a transformers attention function.
- :class:`ModelAttention`: any implementation of the registry (:mod:`accuracy.implementations.registry`:
``triton:<recipe>``, ``cute:<recipe>``,
  cuDNN FP8, FA3 through FlashInfer, SDPA, a user's plug-in) or a recipe's emulator, with a record of what ran in
  each layer. A layer the implementation refuses (a sliding window, a head dim) raises
  :class:`UnsupportedLayerError` unless ``fallback="stock"`` is asked for; then that layer runs the model's own
  attention and the record says so, with the reason. Nothing falls back silently.
- :func:`model_attention`: a name (a built-in implementation, a recipe spec, ``stock``) -> the function to swap in.

Exposed: ``RecipeAttention``, ``ModelAttention``, ``model_attention``, ``UnsupportedMaskError``,
``UnsupportedLayerError``, ``STOCK``, ``final_hidden``, ``logits_from_hidden``, ``stock_logits``, ``compare_logits``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from zyfa.accuracy.impact.rows import BLOCK_TOKENS
from zyfa.accuracy.implementations.base import Implementation, call_implementation, unsupported_reason
from zyfa.accuracy.implementations.names import STOCK, attention_kind  # STOCK: the model's own attention
from zyfa.accuracy.implementations.registry import get_implementation
from zyfa.accuracy.inputs.attention_input import AttentionInput
from zyfa.capture.hook import attention_pattern

from zyfa.emulator import emulate
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import Recipe


class UnsupportedMaskError(ValueError):
    """The model passed an attention mask that causal/sliding-window emulation cannot express."""


class UnsupportedLayerError(ValueError):
    """An implementation refuses a layer's shape (a sliding window, a head dim) and no fallback was asked for."""




# ------------------------------------------------------------------------------------------------- adaptor

class RecipeAttention:
    """A transformers attention function that runs a recipe's emulator (for ``zyfa.capture.hook.swap_attention``).

    Args:
        recipe: a :class:`zyfa.recipes.Recipe` or its name.
        on_emulation: called after each layer as ``on_emulation(layer, q, k, v, emulation, sm_scale,
            window)`` with the layer's original q, k, v (b, h, s, d): for operator error on the same pass.
        on_layer: called with the layer index after each layer (progress).

    Attributes:
        p_flushed: layer -> fraction of unmasked probabilities the recipe rounded to 0 (last call).
    """

    def __init__(self, recipe: Recipe | str, *,
                 on_emulation: Callable[..., None] | None = None,
                 on_layer: Callable[[int], None] | None = None):
        self.recipe = get_recipe(recipe)
        self.on_emulation = on_emulation
        self.on_layer = on_layer
        self._p_flushed: dict[int, torch.Tensor] = {}  # on the device until read: no host sync per layer
        self._patterns: dict[tuple, torch.Tensor] = {}

    @property
    def p_flushed(self) -> dict[int, float]:
        """Layer -> the fraction of unmasked probabilities the recipe rounded to 0 in its last call (read back
        now)."""
        return {layer: float(t) for layer, t in self._p_flushed.items()}

    def _keep_p_flushed(self, layer: int, emu) -> None:
        if emu.p_flushed is not None:
            self._p_flushed[layer] = emu.p_flushed

    def expected_mask(self, s_q: int, s_k: int, window: int | None, device) -> torch.Tensor:
        """The bool (s_q, s_k) pattern of causal (bottom-right) + optional window attention; cached per shape."""
        key = (s_q, s_k, window, str(device))
        pat = self._patterns.get(key)
        if pat is None:
            pat = attention_pattern(s_q, s_k, True, window, device=device)
            self._patterns[key] = pat
        return pat

    def check_mask(self, mask: torch.Tensor, s_q: int, s_k: int, window: int | None, layer: int) -> None:
        """Raise UnsupportedMaskError unless ``mask`` is exactly the causal(/window) pattern."""
        if mask.dim() != 4 or tuple(mask.shape[-2:]) != (s_q, s_k):
            raise UnsupportedMaskError(
                f"layer {layer}: attention mask of shape {tuple(mask.shape)} is not (b, 1|h, {s_q}, {s_k})")
        flags = []  # answered in one host sync below (this runs in every layer of every decode step)
        if mask.dtype == torch.bool:
            allowed = mask
        elif mask.is_floating_point():  # additive mask: 0 = attend, a huge negative value = masked
            allowed = mask == 0
            flags.append(((mask > torch.finfo(mask.dtype).min / 2) & ~allowed).any())  # a finite bias where masked
        else:
            raise UnsupportedMaskError(f"layer {layer}: attention mask dtype {mask.dtype} is not bool or float")
        want = self.expected_mask(s_q, s_k, window, mask.device)
        flags.append((allowed != want.expand_as(allowed)).any())
        *biased, differs = torch.stack(flags).tolist()
        if any(biased):
            raise UnsupportedMaskError(
                f"layer {layer}: the additive attention mask has finite biases (ALiBi or similar); "
                "only causal and sliding-window masks can be emulated")
        if differs:
            what = "causal" + (f" + sliding window {window}" if window else "")
            raise UnsupportedMaskError(
                f"layer {layer}: the attention mask is not the plain {what} pattern (padding or packed "
                f"sequences?); the emulator expresses only causal and sliding-window attention, so run one "
                f"unpadded sequence at a time")

    def layer_call(self, module, query, key, attention_mask, *, scaling, sliding_window, dropout, softcap,
                   is_causal, what: str = "emulated") -> tuple[int, int | None, float]:
        """Check one layer's call (mask, softcap, causality, dropout): (layer index, window, softmax scale)."""
        layer = int(getattr(module, "layer_idx", -1))
        if softcap is not None:
            raise UnsupportedMaskError(f"layer {layer}: attention logit softcapping is not {what}")
        if is_causal is False or not getattr(module, "is_causal", True):
            raise UnsupportedMaskError(f"layer {layer}: non-causal attention is not supported (decoders only)")
        if dropout and module.training:
            raise ValueError(f"layer {layer}: attention dropout in training mode is not {what}")
        window = int(sliding_window) if sliding_window else None
        if attention_mask is not None:
            self.check_mask(attention_mask, query.shape[2], key.shape[2], window, layer)
        return layer, window, float(scaling if scaling is not None else module.scaling)

    def __call__(self, module, query, key, value, attention_mask, *, scaling=None, sliding_window=None,
                 dropout=0.0, softcap=None, is_causal=None, **kwargs):
        layer, window, sm_scale = self.layer_call(module, query, key, attention_mask, scaling=scaling,
                                                  sliding_window=sliding_window, dropout=dropout, softcap=softcap,
                                                  is_causal=is_causal)
        with torch.no_grad():
            emu = emulate(query, key, value, self.recipe, causal=True, sm_scale=sm_scale, window=window)
        self._keep_p_flushed(layer, emu)
        if self.on_emulation is not None:
            self.on_emulation(layer, query, key, value, emu, sm_scale, window)
        if self.on_layer is not None:
            self.on_layer(layer)
        out = emu.out.to(query.dtype).transpose(1, 2).contiguous()
        return out, None


class ModelAttention(RecipeAttention):
    """Any implementation (a registry :class:`~accuracy.implementations.base.Implementation`, or a recipe's
    emulator)
    as a transformers attention function, for ``zyfa.capture.hook.swap_attention``.

    Args:
        impl: an Implementation (built-in or plug-in), a :class:`~zyfa.recipes.Recipe` or a recipe spec (the
            emulator, ``NAME@PLATFORM`` included).
        fallback: ``None`` (a layer the implementation refuses raises :class:`UnsupportedLayerError`) or
            ``"stock"`` (that layer runs the model's own sdpa attention; :attr:`ran` records it with the reason).
        on_output: called after each layer as ``on_output(layer, q, k, v, out, sm_scale, window)`` with the
            layer's q, k, v (b, h, s, d) and the implementation's output (b, h, s_q, d_v): for operator error.
        on_layer: called with the layer index after each layer (progress).

    Attributes:
        name: what runs (the implementation's name, or ``emulator:<recipe>``).
        ran: layer -> what computed it in the last pass (``name``, or ``stock sdpa (fallback: <reason>)``).
        p_flushed: layer -> the emulator's fraction of probabilities rounded to 0 (emulator only).
    """

    def __init__(self, impl, *, fallback: str | None = None, on_output: Callable[..., None] | None = None,
                 on_layer: Callable[[int], None] | None = None):
        if fallback not in (None, STOCK):
            raise ValueError(f"fallback must be None or {STOCK!r}, not {fallback!r}")

        self.impl = impl if isinstance(impl, Implementation) else None
        super().__init__(get_recipe("fp32") if self.impl is not None else get_recipe(impl), on_layer=on_layer)
        self.name = self.impl.name if self.impl is not None else f"emulator:{self.recipe.name}"
        self.fallback = fallback
        self.on_output = on_output
        self.ran: dict[int, str] = {}

    def __call__(self, module, query, key, value, attention_mask, *, scaling=None, sliding_window=None,
                 dropout=0.0, softcap=None, is_causal=None, **kwargs):
        layer, window, sm_scale = self.layer_call(module, query, key, attention_mask, scaling=scaling,
                                                  sliding_window=sliding_window, dropout=dropout, softcap=softcap,
                                                  is_causal=is_causal, what="supported")
        with torch.no_grad():
            if self.impl is None:
                emu = emulate(query, key, value, self.recipe, causal=True, sm_scale=sm_scale, window=window)
                self._keep_p_flushed(layer, emu)
                out, what = emu.out, self.name
            else:
                # contiguous (b, h, s, d) copies: the model's are transposed views, which kernels may refuse
                x = AttentionInput(f"layer{layer}", query.contiguous(), key.contiguous(), value.contiguous(),
                                   causal=True, window=window, sm_scale=sm_scale)
                reason = unsupported_reason(self.impl, x)
                if reason is not None and self.fallback is None:
                    raise UnsupportedLayerError(f"{self.impl.name} refuses layer {layer}: {reason}")
                if reason is not None:
                    # lazy: transformers is optional (and heavy)
                    from transformers.integrations.sdpa_attention import sdpa_attention_forward

                    self.ran[layer] = f"stock sdpa (fallback: {reason})"
                    res = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                                 sliding_window=sliding_window, dropout=0.0, **kwargs)
                    if self.on_layer is not None:
                        self.on_layer(layer)
                    return res
                out, what = call_implementation(self.impl, x).out, self.impl.name
        self.ran[layer] = what
        if self.on_output is not None:
            self.on_output(layer, query, key, value, out, sm_scale, window)
        if self.on_layer is not None:
            self.on_layer(layer)
        return out.to(query.dtype).transpose(1, 2).contiguous(), None

    def ran_summary(self) -> dict[str, list[int]]:
        """What ran -> the layers it computed, in the last pass."""
        out: dict[str, list[int]] = {}
        for layer, what in sorted(self.ran.items()):
            out.setdefault(what, []).append(layer)
        return out


def model_attention(name: str, *, fallback: str | None = None, plugins=(), **kw) -> ModelAttention | None:
    """The attention function for ``name``: ``stock`` -> None (the model's own attention, nothing swapped); a
    built-in implementation (:func:`zyfa.accuracy.implementations.registry.builtin_names`; ``triton:SPEC``,
    ``cute:SPEC``: our kernel under any recipe spec it honours) or a plug-in among ``plugins`` (loaded
    :class:`~accuracy.implementations.base.Implementation`,
    by name) -> that kernel; anything else is a recipe spec (:mod:`zyfa.recipes`) run by the emulator. ValueError
    (the spec grammar's one line) for an unknown one."""
    if name == STOCK:
        return None
    for p in plugins:
        if p.name == name:
            return ModelAttention(p, fallback=fallback, **kw)
    if attention_kind(name) == "kernel":
        return ModelAttention(get_implementation(name), fallback=fallback, **kw)
    return ModelAttention(get_recipe(name), fallback=fallback, **kw)


# ------------------------------------------------------------------------------------------------- logits

def final_hidden(model, ids: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden state (after the final norm), (s, hidden), for one sequence ``ids`` (1, s)."""
    with torch.no_grad():
        out = model.get_decoder()(input_ids=ids, use_cache=False)
    return out.last_hidden_state[0]


def logits_from_hidden(model, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head (and Gemma's final logit softcap, where configured) applied to hidden states."""
    with torch.no_grad():
        logits = model.get_output_embeddings()(hidden)
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
    return logits.float()


def _chunk_rows(vocab: int) -> int:
    return max(16, (1 << 24) // max(vocab, 1))


def stock_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits (s, V) of the stock pass, kept for reuse across recipes (s·V·4 bytes)."""
    vocab = model.get_output_embeddings().weight.shape[0]
    step = _chunk_rows(vocab)
    return torch.cat([logits_from_hidden(model, hidden[i:i + step]) for i in range(0, hidden.shape[0], step)])


def compare_logits(model, ref_logits: torch.Tensor, hidden: torch.Tensor, ids: torch.Tensor,
                   *, block_tokens: int = BLOCK_TOKENS) -> dict[str, Any]:
    """Next-token NLL of both passes and KL(ref || test) per position, in float64.

    Args:
        ref_logits: (s, V) fp32 logits of the reference (stock) pass.
        hidden: (s, hidden) final hidden state of the pass under test (None: compare ref with itself).
        ids: (s,) token ids; position t predicts ids[t + 1], so positions 0..s-2 are scored.
    Returns:
        dict with nll_ref, nll_test (nats/token), kl (np.ndarray per position), top1_agree, blocks.
    """
    ids = ids.reshape(-1)
    n = ids.shape[0] - 1
    if n < 1:
        raise ValueError("need at least 2 tokens")
    step = _chunk_rows(ref_logits.shape[1])
    kl = np.empty(n, dtype=np.float64)
    nll_ref = nll_test = 0.0
    agree = 0
    for i in range(0, n, step):
        j = min(i + step, n)
        lr = torch.log_softmax(ref_logits[i:j].double(), dim=-1)
        test = ref_logits[i:j] if hidden is None else logits_from_hidden(model, hidden[i:j])
        lt = torch.log_softmax(test.double(), dim=-1)
        kl[i:j] = (lr.exp() * (lr - lt)).sum(dim=-1).clamp(min=0).cpu().numpy()
        tgt = ids[i + 1:j + 1].view(-1, 1).to(lr.device)
        nll_ref -= float(lr.gather(1, tgt).sum())
        nll_test -= float(lt.gather(1, tgt).sum())
        agree += int((lr.argmax(dim=-1) == lt.argmax(dim=-1)).sum())
        del lr, lt, test
    blocks = [float(kl[b:b + block_tokens].mean()) for b in range(0, n, block_tokens)]
    return {"nll_ref": nll_ref / n, "nll_test": nll_test / n, "kl": kl, "top1_agree": agree / n,
            "kl_blocks": blocks, "n_scored": n}
