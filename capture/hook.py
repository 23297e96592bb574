"""Swap an attention function into a transformers model, per layer; the Q/K/V capture function.

transformers 5.x models call ``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, ...)``
with q, k, v **after** projection, QK-norm and RoPE, in (batch, heads, seq, head_dim) layout, K/V with only
the model's KV heads (GQA/MQA not expanded), the softmax scale as ``scaling=`` and, on sliding-window layers,
``sliding_window=``. We register one dispatcher name, ``"zyfa_swap"``, in that interface and, with sdpa's mask
builder, in ``ALL_MASK_ATTENTION_FUNCTIONS`` (an unregistered name silently gets ``attention_mask=None`` in
every layer, which drops sliding windows). The dispatcher looks for a function attached to the attention
module; layers without one run stock ``sdpa_attention_forward``. So a swap changes nothing but the chosen
layers, and a function that records and then delegates to sdpa leaves the logits bit-identical to stock sdpa.

An attention function has transformers' signature::

    fn(module, query, key, value, attention_mask, *, scaling, dropout=0.0, sliding_window=None, **kw)
        -> (attn_output (b, s, h, d), attn_weights or None)

with sdpa's mask: None (plain causal, use ``is_causal``) or a bool tensor (b, 1, s_q, s_k), True = attend.
For example, an FP8 emulator in every layer (perplexity with a recipe swapped in)::

    def fp8_attention(module, q, k, v, mask, *, scaling, sliding_window=None, **kw):
        emu = emulate(q, k, v, recipe, causal=module.is_causal, sm_scale=scaling, window=sliding_window)
        return emu.out.to(q.dtype).transpose(1, 2).contiguous(), None

    with swap_attention(lm.model, fp8_attention):            # or layers=[0, 5]
        logits = lm.model(input_ids=ids, use_cache=False).logits

Exposed: ``swap_attention`` (context manager, any callable, all or selected layers), ``attention_modules``,
``layer_type_of``, ``QKVRecorder``, ``StopForward``, ``SWAP_NAME`` (the records are
``zyfa.capture.record.LayerRecord``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch
from zyfa.capture.record import LayerRecord

SWAP_NAME = "zyfa_swap"
_ATTR = "_zyfa_attention_fn"
_REGISTERED = False


class StopForward(Exception):  # noqa: N818 (control flow, not an error)
    """Raised by a recorder after the last layer it needs, to skip the rest of the forward pass."""


CHUNK_ABOVE_BYTES = 8 << 30  # fp32 scores of one layer above which the recorder computes attention in chunks


def _scaling(module, kwargs) -> float:
    return float(kwargs["scaling"] if kwargs.get("scaling") is not None else module.scaling)


def _scores_bytes(query: torch.Tensor, key: torch.Tensor) -> int:
    return 4 * query.shape[0] * query.shape[1] * query.shape[2] * key.shape[2]


def chunked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, scaling: float,
                      causal: bool, window: int | None,
                      max_bytes: int = CHUNK_ABOVE_BYTES) -> tuple[torch.Tensor, None]:
    """Attention of a long prefill in query chunks, returned as transformers' sdpa returns it ((b, s_q, h, d), None).

    query (b, h, s_q, d), key/value (b, h_kv, s_k, d) with h a multiple of h_kv (GQA); query i sees key j when
    j <= i + s_k - s_q (causal, aligned at the end) and j > that - window (sliding window). Each chunk's fp32
    scores stay under ``max_bytes``: what stock sdpa's math path would hold for the whole layer is never built.
    """
    b, h, s_q, _ = query.shape
    s_k = key.shape[2]
    rep = h // key.shape[1]
    key = key.repeat_interleave(rep, dim=1) if rep > 1 else key
    value = value.repeat_interleave(rep, dim=1) if rep > 1 else value
    rows = max(1, int(max_bytes) // (4 * b * h * s_k))
    out = query.new_empty((b, s_q, h, value.shape[-1]))
    for c0 in range(0, s_q, rows):
        c1 = min(s_q, c0 + rows)
        allowed = attention_pattern(s_q, s_k, causal, window, rows=range(c0, c1), device=query.device)
        o = torch.nn.functional.scaled_dot_product_attention(
            query[:, :, c0:c1], key, value, attn_mask=allowed, scale=scaling)
        out[:, c0:c1] = o.transpose(1, 2)
    return out, None


def attention_pattern(s_q: int, s_k: int, causal: bool, window: int | None, *, rows: range | None = None,
                      device=None) -> torch.Tensor:
    """The bool (len(rows), s_k) pattern a recorded layer states, for query ``rows`` (default all s_q): query i
    sees key j when j <= i + s_k - s_q (causal, aligned at the end) and j > that - window (sliding window)."""
    rows = range(s_q) if rows is None else rows
    i = torch.arange(rows.start, rows.stop, device=device).view(-1, 1) + (s_k - s_q)
    j = torch.arange(s_k, device=device).view(1, -1)
    want = torch.ones((len(rows), s_k), dtype=torch.bool, device=device)
    if causal:
        want &= j <= i
    if window:
        want &= j > i - window
    return want


def _sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


def _dispatch(module, query, key, value, attention_mask, **kwargs):
    fn = getattr(module, _ATTR, None)
    if fn is None:
        return _sdpa()(module, query, key, value, attention_mask, **kwargs)
    return fn(module, query, key, value, attention_mask, **kwargs)


def register() -> None:
    """Register the dispatcher and its (sdpa) mask builder with transformers, once per process."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(SWAP_NAME, _dispatch)
    # a copy of sdpa's: without it the masks (sliding window, padding) are silently dropped
    ALL_MASK_ATTENTION_FUNCTIONS.register(SWAP_NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    _REGISTERED = True


def attention_modules(model) -> dict[int, torch.nn.Module]:
    """layer index -> attention module (the modules that call the AttentionInterface)."""
    found = {}
    for m in model.modules():
        idx = getattr(m, "layer_idx", None)
        if idx is not None and type(m).__name__.endswith("Attention") and hasattr(m, "scaling"):
            found.setdefault(int(idx), m)
    return dict(sorted(found.items()))


def layer_type_of(model, module, sliding_window) -> str:
    """"sliding_attention" or "full_attention" (or whatever the config calls it)."""
    lt = getattr(module, "layer_type", None)
    types = getattr(model.config if model is not None else None, "layer_types", None)
    if lt is None and types is not None and module.layer_idx < len(types):
        lt = types[module.layer_idx]
    if lt is None:
        lt = "sliding_attention" if sliding_window else "full_attention"
    return str(lt)


@contextlib.contextmanager
def swap_attention(model, fn: Callable, layers: Iterable[int] | None = None) -> Iterator[list[int]]:
    """Run ``fn`` as the attention of the chosen layers (all by default) inside the ``with`` block.

    Other layers run stock sdpa. On exit the model's previous attention implementation and any previous
    swap are restored, so swaps nest. Yields the list of swapped layer indices.

    Raises: ValueError if the model has no AttentionInterface-based attention or a layer does not exist.
    """
    register()
    mods = attention_modules(model)
    if not mods:
        from zyfa.capture.models import NoAttentionInterfaceError

        raise NoAttentionInterfaceError(
            f"{type(model).__name__} has no attention modules that use transformers' AttentionInterface")
    chosen = sorted(mods) if layers is None else sorted(set(int(i) for i in layers))
    missing = [i for i in chosen if i not in mods]
    if missing:
        raise ValueError(f"layers {missing} do not exist; the model has layers 0..{max(mods)}")
    prev_impl = model.config._attn_implementation
    prev_fns = {i: getattr(mods[i], _ATTR, None) for i in chosen}
    for i in chosen:
        setattr(mods[i], _ATTR, fn)
    try:
        if prev_impl != SWAP_NAME:
            model.set_attn_implementation(SWAP_NAME)
        yield chosen
    finally:
        for i, f in prev_fns.items():
            if f is None:
                with contextlib.suppress(AttributeError):
                    delattr(mods[i], _ATTR)
            else:
                setattr(mods[i], _ATTR, f)
        if prev_impl != SWAP_NAME:
            model.set_attn_implementation(prev_impl)


def select_heads(num_q_heads: int, num_kv_heads: int, heads: Iterable[int] | None):
    """(q_heads, kv_heads, kv_head_of_q) for a selection of query heads (None: all)."""
    q_heads = tuple(range(num_q_heads)) if heads is None else tuple(sorted(set(int(h) for h in heads)))
    bad = [h for h in q_heads if not 0 <= h < num_q_heads]
    if bad:
        raise ValueError(f"heads {bad} do not exist; the model has query heads 0..{num_q_heads - 1}")
    group = num_q_heads // num_kv_heads
    kv_heads = tuple(sorted({h // group for h in q_heads}))
    kv_head_of_q = tuple(kv_heads.index(h // group) for h in q_heads)
    return q_heads, kv_heads, kv_head_of_q


def _mask_matches(mask: torch.Tensor, s_q: int, s_k: int, causal: bool, window: int | None) -> bool:
    return bool((mask.to(torch.bool) == attention_pattern(s_q, s_k, causal, window, device=mask.device)).all())


class QKVRecorder:
    """An attention function that hands each layer's q, k, v to ``on_call`` and then runs stock sdpa.

    Args:
        model: the model (for layer types).
        on_call: called with a ``LayerRecord`` per recorded layer, as soon as the layer runs (so a writer
            can store it and memory holds one layer at a time).
        layers: layers to record (None: all).
        heads: query heads to record (None: all); the KV heads they use are recorded with them.
        stop_after_last: raise ``StopForward`` once the last recorded layer is done (skips the rest).
        on_layer: called with the layer index after every layer this function is swapped into (progress).
        check_mask_up_to: for sequences up to this length, check that a tensor mask is exactly the recorded
            causal/window pattern (a padded or packed batch would not be described by those attributes).
        chunk_above_bytes: a layer whose fp32 score matrix (batch x query heads x s_q x s_k) would be larger runs
            through :func:`chunked_attention` (the causal/window pattern the record states, in query chunks)
            instead of stock sdpa, whose fp32 math path materializes it (48 GiB for 12 heads at 32K tokens).
    """

    def __init__(self, model, on_call: Callable[[LayerRecord], None], *, layers: Iterable[int] | None = None,
                 heads: Iterable[int] | None = None, stop_after_last: bool = False,
                 on_layer: Callable[[int], None] | None = None, check_mask_up_to: int = 4096,
                 chunk_above_bytes: int = CHUNK_ABOVE_BYTES):
        self.model = model
        self.on_call = on_call
        self.layers = None if layers is None else set(int(i) for i in layers)
        self.heads = None if heads is None else tuple(heads)
        self.stop_after_last = stop_after_last
        self.on_layer = on_layer
        self.check_mask_up_to = check_mask_up_to
        self.chunk_above_bytes = int(chunk_above_bytes)

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        idx = int(module.layer_idx)
        if self.layers is None or idx in self.layers:
            self.on_call(self._record(module, query, key, value, attention_mask, kwargs))
        if self.on_layer is not None:
            self.on_layer(idx)
        if self.stop_after_last and self.layers is not None and idx >= max(self.layers):
            raise StopForward(idx)
        if _scores_bytes(query, key) > self.chunk_above_bytes and kwargs.get("softcap") is None:
            window = kwargs.get("sliding_window")
            return chunked_attention(query, key, value, scaling=_scaling(module, kwargs), causal=self._causal(
                module, kwargs), window=int(window) if window else None, max_bytes=self.chunk_above_bytes)
        return _sdpa()(module, query, key, value, attention_mask, **kwargs)

    @staticmethod
    def _causal(module, kwargs) -> bool:
        causal = kwargs.get("is_causal")
        return bool(getattr(module, "is_causal", True) if causal is None else causal)

    def _record(self, module, query, key, value, attention_mask, kwargs) -> LayerRecord:
        window = kwargs.get("sliding_window")
        window = int(window) if window else None
        causal = self._causal(module, kwargs)
        s_q, s_k = query.shape[2], key.shape[2]
        if attention_mask is not None and max(s_q, s_k) <= self.check_mask_up_to:
            m = attention_mask
            if m.dtype != torch.bool:  # additive float mask
                m = m == 0
            if m.shape[0] != 1 or not _mask_matches(m[0, 0], s_q, s_k, causal, window):
                raise ValueError(
                    f"layer {module.layer_idx}: the attention mask is not the plain causal/sliding-window "
                    "pattern (padding or packed sequences?); capture one unpadded sequence at a time")
        q_heads, kv_heads, kv_of_q = select_heads(query.shape[1], key.shape[1], self.heads)

        def take(t, idx):
            t = t.detach()
            if len(idx) != t.shape[1]:
                t = t[:, list(idx)]
            return t.to("cpu").contiguous().clone()

        return LayerRecord(
            layer=int(module.layer_idx),
            layer_type=layer_type_of(self.model, module, window),
            q=take(query, q_heads), k=take(key, kv_heads), v=take(value, kv_heads),
            sm_scale=_scaling(module, kwargs),
            causal=causal, window=window,
            q_heads=q_heads, kv_heads=kv_heads, kv_head_of_q=kv_of_q,
            num_q_heads=int(query.shape[1]), num_kv_heads=int(key.shape[1]),
        )
