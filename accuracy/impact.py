"""What FP8 attention does to the model: perplexity and next-token KL with a recipe's emulator swapped in.

Operator error (accuracy.runner) is a proxy; this module measures the model itself. Every attention layer
of a real model (or one layer at a time) runs a recipe's tiled emulator instead of the model's own
attention, through capture.hook.swap_attention, on held-out text windows (``capture.text.token_window``,
``split="heldout"``: the odd slices of the token stream, never the capture windows). Against the stock
model (transformers' ``sdpa``, run once per window and reused) we report:

* ``delta_ppl`` = ppl_recipe - ppl_stock and ``ppl_ratio`` = ppl_recipe / ppl_stock (perplexity of the
  window's own next tokens, positions 0..s-2);
* ``kl_mean``: mean over positions of KL(stock || recipe) of the next-token distributions, in nats/token
  (computed in float64 from the fp32 logits), plus its p99 and max, and the top-1 agreement;
* confidence intervals over windows (scipy bootstrap, accuracy.metrics.bootstrap_ci) and, because windows
  are few, also over 256-token blocks of all windows pooled (blocks are not independent: a rough guide);
* per-layer sensitivity: one layer swapped at a time; that layer sees exactly the stock q/k/v, so the
  recipe's operator error there (rel-L2 against reference.attention_fp64 of the original q/k/v, and of the
  dequantized ones: the kernel's own error) comes from the same forward pass; Spearman's rho between
  per-layer operator error and per-layer KL says whether operator error predicts the damage.

The adaptor (:class:`RecipeAttention`) is a transformers attention function: ``fn(module, query, key,
value, attention_mask, *, scaling, sliding_window=None, **kw) -> ((b, s, h, d) output, None)``. It runs
``emulate(q, k, v, recipe, causal=True, sm_scale=scaling, window=sliding_window)`` and returns the output in
the model's dtype. It expresses only causal and causal+sliding-window attention: a tensor mask must be
exactly that pattern (padding or packed-sequence masks raise :class:`UnsupportedMaskError`); the expected
pattern is built once per (s_q, s_k, window) and each mask costs one ``torch.equal``.

Results files: one JSONL row per measurement, appended and flushed (``--resume`` skips the rows already in
``--out``), so concurrent runs write one file each and the report merges them (:func:`load_rows`, then
:func:`prepare_rows`: a measurement found twice counts once, the latest by date; the ``p_flushed_mean`` of
rows written before the emulator fix of commit 2f53d66 is corrected at load time, with a note, see
:func:`correct_p_flushed`). :func:`drop_rows` (``zyfa impact --drop-rows model:recipe:window``) removes
rows, keeping them in ``<file>.dropped``, so that a ``--resume`` run measures them again.

Exposed: ``RecipeAttention``, ``UnsupportedMaskError``, ``final_hidden``, ``logits_from_hidden``,
``compare_logits``, ``run_impact``, ``load_rows``, ``prepare_rows``, ``correct_p_flushed``, ``drop_rows``,
``parse_drop_spec``, ``summarize``, ``section_blocks``, ``render_markdown``, ``write_markdown``,
``add_arguments``, ``main``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accuracy.blocks import blocks_markdown as _blocks_markdown
from zyfa.emulator import emulate
from zyfa.recipes import Recipe, get_recipe

__all__ = [
    "RecipeAttention",
    "UnsupportedMaskError",
    "add_arguments",
    "compare_logits",
    "correct_p_flushed",
    "drop_rows",
    "final_hidden",
    "load_rows",
    "logits_from_hidden",
    "main",
    "parse_drop_spec",
    "prepare_rows",
    "render_markdown",
    "run_impact",
    "section_blocks",
    "summarize",
    "write_markdown",
]

DEFAULT_RECIPES = "zyfa,zyfa-exp2,ck,aiter,fa3,bf16,fp32"
DEFAULT_LAYER_RECIPES = "zyfa,ck,aiter"
BLOCK_TOKENS = 256  # tokens per block for the pooled block CI and the per-block KL in the rows


class UnsupportedMaskError(ValueError):
    """The model passed an attention mask that causal/sliding-window emulation cannot express."""


# ------------------------------------------------------------------------------------------------- adaptor

class RecipeAttention:
    """A transformers attention function that runs a recipe's emulator (for ``capture.hook.swap_attention``).

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
        self.p_flushed: dict[int, float] = {}
        self._patterns: dict[tuple, torch.Tensor] = {}

    def expected_mask(self, s_q: int, s_k: int, window: int | None, device) -> torch.Tensor:
        """The bool (s_q, s_k) pattern of causal (bottom-right) + optional window attention; cached per shape."""
        key = (s_q, s_k, window, str(device))
        pat = self._patterns.get(key)
        if pat is None:
            i = torch.arange(s_q, device=device).view(-1, 1) + (s_k - s_q)
            j = torch.arange(s_k, device=device).view(1, -1)
            pat = j <= i
            if window is not None:
                pat = pat & (j > i - window)
            self._patterns[key] = pat
        return pat

    def check_mask(self, mask: torch.Tensor, s_q: int, s_k: int, window: int | None, layer: int) -> None:
        """Raise UnsupportedMaskError unless ``mask`` is exactly the causal(/window) pattern."""
        if mask.dim() != 4 or tuple(mask.shape[-2:]) != (s_q, s_k):
            raise UnsupportedMaskError(
                f"layer {layer}: attention mask of shape {tuple(mask.shape)} is not (b, 1|h, {s_q}, {s_k})")
        if mask.dtype == torch.bool:
            allowed = mask
        elif mask.is_floating_point():  # additive mask: 0 = attend, a huge negative value = masked
            allowed = mask == 0
            masked_vals = mask.masked_select(~allowed)
            if masked_vals.numel() and bool((masked_vals > torch.finfo(mask.dtype).min / 2).any()):
                raise UnsupportedMaskError(
                    f"layer {layer}: the additive attention mask has finite biases (ALiBi or similar); "
                    "only causal and sliding-window masks can be emulated")
        else:
            raise UnsupportedMaskError(f"layer {layer}: attention mask dtype {mask.dtype} is not bool or float")
        want = self.expected_mask(s_q, s_k, window, mask.device)
        if not torch.equal(allowed, want.expand_as(allowed)):
            what = "causal" + (f" + sliding window {window}" if window else "")
            raise UnsupportedMaskError(
                f"layer {layer}: the attention mask is not the plain {what} pattern (padding or packed "
                f"sequences?); the emulator expresses only causal and sliding-window attention, so run one "
                f"unpadded sequence at a time")

    def __call__(self, module, query, key, value, attention_mask, *, scaling=None, sliding_window=None,
                 dropout=0.0, softcap=None, is_causal=None, **kwargs):
        layer = int(getattr(module, "layer_idx", -1))
        if softcap is not None:
            raise UnsupportedMaskError(f"layer {layer}: attention logit softcapping is not emulated")
        if is_causal is False or not getattr(module, "is_causal", True):
            raise UnsupportedMaskError(f"layer {layer}: non-causal attention is not supported (decoders only)")
        if dropout and module.training:
            raise ValueError(f"layer {layer}: attention dropout in training mode is not emulated")
        window = int(sliding_window) if sliding_window else None
        s_q, s_k = query.shape[2], key.shape[2]
        if attention_mask is not None:
            self.check_mask(attention_mask, s_q, s_k, window, layer)
        sm_scale = float(scaling if scaling is not None else module.scaling)
        with torch.no_grad():
            emu = emulate(query, key, value, self.recipe, causal=True, sm_scale=sm_scale, window=window)
        self.p_flushed[layer] = float(emu.stats.get("p_flushed_frac", 0.0))
        if self.on_emulation is not None:
            self.on_emulation(layer, query, key, value, emu, sm_scale, window)
        if self.on_layer is not None:
            self.on_layer(layer)
        out = emu.out.to(query.dtype).transpose(1, 2).contiguous()
        return out, None


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
        kl[i:j] = (lr.exp() * (lr - lt)).sum(dim=-1).clamp(min=0).numpy()
        tgt = ids[i + 1:j + 1].view(-1, 1)
        nll_ref -= float(lr.gather(1, tgt).sum())
        nll_test -= float(lt.gather(1, tgt).sum())
        agree += int((lr.argmax(dim=-1) == lt.argmax(dim=-1)).sum())
        del lr, lt, test
    blocks = [float(kl[b:b + block_tokens].mean()) for b in range(0, n, block_tokens)]
    return {"nll_ref": nll_ref / n, "nll_test": nll_test / n, "kl": kl, "top1_agree": agree / n,
            "kl_blocks": blocks, "n_scored": n}


# ------------------------------------------------------------------------------------------------- runs

def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ids_hash(ids: Iterable[int]) -> str:
    """sha256 of the token ids as comma-separated decimal text."""
    return _sha256(",".join(str(int(i)) for i in ids).encode())


def _rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    diff = out.double() - ref.double()
    den = float(torch.linalg.vector_norm(ref.double()))
    return float(torch.linalg.vector_norm(diff)) / den if den > 0 else math.nan


def _window_row(cmp: dict[str, Any]) -> dict[str, Any]:
    kl = cmp["kl"]
    ppl_ref, ppl_test = math.exp(cmp["nll_ref"]), math.exp(cmp["nll_test"])
    return {
        "nll_stock": cmp["nll_ref"], "nll_recipe": cmp["nll_test"],
        "ppl_stock": ppl_ref, "ppl_recipe": ppl_test,
        "delta_ppl": ppl_test - ppl_ref, "ppl_ratio": ppl_test / ppl_ref,
        "kl_mean": float(kl.mean()), "kl_p99": float(np.quantile(kl, 0.99)), "kl_max": float(kl.max()),
        "top1_agree": cmp["top1_agree"], "kl_blocks": cmp["kl_blocks"], "n_scored": cmp["n_scored"],
    }


class _JsonlSink:
    """Appends rows to a JSONL file, one flushed line each (a stopped run leaves usable rows)."""

    def __init__(self, path: Path, *, resume: bool):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.done: set[tuple] = set()
        if resume and path.exists():
            for row in read_rows(path):
                self.done.add(_row_key(row))
        elif path.exists():
            path.unlink()

    def write(self, row: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, default=_json_default) + "\n")
        self.done.add(_row_key(row))


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serializable: {type(x)}")


def _row_key(row: dict[str, Any]) -> tuple:
    return (row.get("kind"), row.get("model"), row.get("recipe"), row.get("window"), row.get("layer"),
            row.get("n_tokens"), row.get("text"))


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a results JSONL file (a partial last line from a killed run is skipped)."""
    rows = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _provenance(extra: dict[str, Any]) -> dict[str, Any]:
    try:
        from accuracy.provenance import provenance
    except ImportError:  # pragma: no cover - the module exists in this tree
        import datetime as dt
        import platform

        rec = {"python": platform.python_version(), "torch": torch.__version__,
               "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        rec.update(extra)
        return rec
    return provenance(extra)


def run_impact(models: list[str], recipes: list[str], *, n_tokens: int = 2048, windows: int = 2,
               text: str = "lee", per_layer: Iterable[str] = (), layer_recipes: list[str] | None = None,
               layer_windows: int = 1, layers: list[int] | None = None, out: str | Path,
               resume: bool = False, progress: bool = True,
               on_model_done: Callable[[], None] | None = None) -> Path:
    """Run the measurement and append rows to ``out`` (JSONL); returns the path.

    Rows: ``kind="impact_window"`` per (model, recipe, window), all layers swapped;
    ``kind="impact_layer"`` per (model, recipe, window, layer), one layer swapped, with operator error.
    """
    from tqdm import tqdm

    from capture.hook import attention_modules, swap_attention
    from capture.models import load_model
    from capture.text import load_text, num_windows, token_window

    recipes = [get_recipe(r).name for r in recipes]
    layer_recipes = [get_recipe(r).name for r in (layer_recipes or DEFAULT_LAYER_RECIPES.split(","))]
    per_layer = set(per_layer)
    out = Path(out)
    sink = _JsonlSink(out, resume=resume)
    text_sha = load_text(text).sha256
    import datetime as dt

    from accuracy.study import _flush_count_factor

    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    # the emulator's p_flushed_frac is a fraction (commit 2f53d66): checked once, recorded in every row
    checked = {"p_flushed_checked": True} if _flush_count_factor() == 1.0 else {}

    for model_name in models:
        t_load = time.perf_counter()
        loaded = load_model(model_name)
        model = loaded.model
        n_layers = len(attention_modules(model))
        sweep_layers = sorted(layers) if layers is not None else list(range(n_layers))
        avail = num_windows(loaded.tokenizer, text, n_tokens, "heldout")
        if windows > avail:
            raise ValueError(f"text {text!r} has only {avail} held-out windows of {n_tokens} tokens")
        do_sweep = model_name in per_layer
        total = windows * (1 + len(recipes)) * n_layers
        if do_sweep:
            total += min(layer_windows, windows) * (1 + len(sweep_layers) * len(layer_recipes)) * n_layers
        bar = tqdm(total=total, desc=model_name, unit="layer", disable=not progress, dynamic_ncols=True,
                   file=sys.stderr)
        tqdm.write(f"[impact] {model_name}: loaded in {time.perf_counter() - t_load:.1f} s, {n_layers} layers, "
                   f"{windows} held-out window(s) of {n_tokens} tokens", file=sys.stderr)

        def tick(_layer: int, bar=bar) -> None:
            bar.update(1)

        for w in range(windows):
            tw = token_window(loaded.tokenizer, text, n_tokens, w, split="heldout")
            ids = torch.tensor([tw.ids], dtype=torch.long)
            base = {"model": model_name, "window": w, "split": "heldout", "text": text, "n_tokens": n_tokens,
                    "token_offset": tw.offset}
            prov = {**loaded.provenance, "text_sha256": text_sha, "token_ids_sha256": ids_hash(tw.ids),
                    "transformers": _version("transformers"), "run_started_utc": started}
            todo = [r for r in recipes if ("impact_window", model_name, r, w, None, n_tokens, text) not in sink.done]
            sweep_here = do_sweep and w < layer_windows
            sweep_todo = [(lay, r) for lay in sweep_layers for r in layer_recipes
                          if ("impact_layer", model_name, r, w, lay, n_tokens, text) not in sink.done]
            if not todo and not (sweep_here and sweep_todo):
                bar.update(n_layers * (1 + len(recipes)) + (n_layers * (1 + len(sweep_layers) * len(layer_recipes))
                                                            if sweep_here else 0))
                continue

            t0 = time.perf_counter()
            h_stock = final_hidden(model, ids)
            ref_logits = stock_logits(model, h_stock)
            t_stock = time.perf_counter() - t0
            bar.update(n_layers)

            for r in recipes:
                if r not in todo:
                    bar.update(n_layers)
                    continue
                t0 = time.perf_counter()
                fn = RecipeAttention(r, on_layer=tick)
                with swap_attention(model, fn):
                    h = final_hidden(model, ids)
                cmp = compare_logits(model, ref_logits, h, ids[0])
                row = {"kind": "impact_window", **base, "recipe": r, "layer": None, **_window_row(cmp),
                       "p_flushed_mean": float(np.mean(list(fn.p_flushed.values()))) if fn.p_flushed else 0.0,
                       **checked, "seconds": time.perf_counter() - t0, "seconds_stock": t_stock,
                       "provenance": _provenance(prov)}
                sink.write(row)
                tqdm.write(f"[impact] {model_name} w{w} {r:10s} ppl {row['ppl_stock']:.4f} -> {row['ppl_recipe']:.4f} "
                           f"(x{row['ppl_ratio']:.5f})  KL {row['kl_mean']:.3e} nats/token  "
                           f"top1 {row['top1_agree']:.4f}  {row['seconds']:.0f} s", file=sys.stderr)

            if sweep_here:
                bar.update(n_layers)  # the stock pass the sweep shares
                _sweep(model, ids, ref_logits, sweep_layers, layer_recipes, sweep_todo, n_layers,
                       {**base, **checked}, prov, sink, bar, swap_attention)
        bar.close()
        if on_model_done is not None:
            on_model_done()
        del loaded, model
    return out


def _sweep(model, ids, ref_logits, sweep_layers, layer_recipes, todo, n_layers, base, prov, sink, bar,
           swap_attention) -> None:
    """One layer swapped at a time; operator error of that layer from the same pass."""
    from tqdm import tqdm

    from reference.attention import attention_fp64

    todo = set(todo)
    ref_orig: dict[int, torch.Tensor] = {}  # layer -> fp64 reference of its stock q/k/v (same for every recipe)
    # recipe-outer: a stopped sweep leaves every layer of the first recipes (what the correlation needs)
    for r in layer_recipes:
        for lay in sweep_layers:
            if (lay, r) not in todo:
                bar.update(n_layers)
                continue
            op: dict[str, Any] = {}

            def on_emulation(layer, q, k, v, emu, sm_scale, window, op=op):
                if layer not in ref_orig:
                    ref_orig[layer] = attention_fp64(q, k, v, causal=True, sm_scale=sm_scale, window=window)[0]
                ref_deq = attention_fp64(emu.q_deq, emu.k_deq, emu.v_deq, causal=True, sm_scale=sm_scale,
                                         window=window)[0]
                op.update(op_rel_l2=_rel_l2(emu.out, ref_orig[layer]), op_rel_l2_deq=_rel_l2(emu.out, ref_deq),
                          q_amax=float(q.abs().max()), k_amax=float(k.abs().max()), v_amax=float(v.abs().max()),
                          window_size=window)

            def tick(_layer: int) -> None:
                bar.update(1)

            t0 = time.perf_counter()
            fn = RecipeAttention(r, on_emulation=on_emulation)
            with swap_attention(model, fn, layers=[lay]):
                h = final_hidden(model, ids)
            bar.update(n_layers)
            cmp = compare_logits(model, ref_logits, h, ids[0])
            row = {"kind": "impact_layer", **base, "recipe": r, "layer": lay, **_window_row(cmp), **op,
                   "p_flushed_mean": fn.p_flushed.get(lay, 0.0), "seconds": time.perf_counter() - t0,
                   "provenance": _provenance(prov)}
            row.pop("kl_blocks", None)
            sink.write(row)
            tqdm.write(f"[impact] {base['model']} layer {lay:2d} {r:8s} KL {row['kl_mean']:.3e}  "
                       f"op rel-L2 {op.get('op_rel_l2', math.nan):.3e}  {row['seconds']:.0f} s", file=sys.stderr)


def _version(pkg: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001
        return None


# ------------------------------------------------------------------------------------------------- rows

# The emulator's ``p_flushed_frac`` counted the unmasked probabilities once per tile instead of once per
# (batch, head) until commit 2f53d66 ("Emulator: p_flushed_frac counts the mask once per batch-head",
# 2026-11-29T23:54:38Z), so rows written by a process started before it carry ``p_flushed_mean`` inflated by
# batch x query heads (batch is 1 here). A process keeps the code it started with, so what counts is when the
# writing process started, not the commit recorded in a row (HEAD when the row was written): rows carry
# ``run_started_utc`` since this was added; for older rows the start is bounded from above by the earliest
# (row date - its seconds - seconds_stock) of the rows of the same file and command line. The last rows of
# such processes were committed in 6df17ed (2026-11-30T00:10:00Z); later rows are never corrected (a guard
# against a later process with the same command line). Rows written by this module since then carry
# ``p_flushed_checked``. Checked against re-measurements after the fix: old value / heads equals the new one
# (window 0 of SmolLM2 and Qwen: ck, aiter and zyfa-exp2 agree to 6 digits, e.g. SmolLM2 aiter 0.797723).
P_FLUSHED_FIX = ("2f53d66", "2026-11-29T23:54:38Z")
P_FLUSHED_LAST_INFLATED_UTC = "2026-11-30T00:10:00Z"
# Changes to the numerics of named recipes since the first impact rows: (commit, UTC, what, which recipes).
# Rows of those recipes written by a process started before the change measure the recipe as it was then:
# the report flags them (numbers unchanged) until they are measured again (the later row wins) or dropped.
RECIPE_CHANGES: tuple[tuple[str, str, str, Callable[[Recipe], bool]], ...] = (
    ("fdfa291", "2026-11-29T23:28:48Z", "ZYFA's MAD offset 0 -> 1/16 code, in every mad_fp8 recipe",
     lambda r: r.exp_method == "mad_fp8"),
    ("fdfa291", "2026-11-29T23:28:48Z", "the Hopper FP8 accumulator model fitted on the H200",
     lambda r: r.accumulator == "hopper_fp8"),
    ("435c315", "2026-11-30T00:21:18Z", "the Hopper accumulator model: row blocks skip the KV tiles they "
     "cannot see, one truncation fewer", lambda r: r.accumulator == "hopper_fp8"),
)


def _date(row: dict[str, Any]) -> str:
    return str((row.get("provenance") or {}).get("date_utc") or "")


def _process_key(row: dict[str, Any]) -> tuple:
    """Rows of one writing process: same file, and the run's start time or else the same command line."""
    p = row.get("provenance") or {}
    return (row.get("_file"), p.get("run_started_utc") or tuple(p.get("argv") or ()))


def _process_starts(rows: list[dict[str, Any]]) -> dict[tuple, str]:
    """Process key -> its start: ``run_started_utc``, else an upper bound (the earliest row date less the
    row's own seconds and the stock pass's)."""
    import datetime as dt

    fmt = "%Y-%m-%dT%H:%M:%SZ"
    starts: dict[tuple, str] = {}
    for r in rows:
        p = r.get("provenance") or {}
        d = p.get("run_started_utc")
        if not d and _date(r):
            try:
                t = dt.datetime.strptime(_date(r), fmt)
                back = float(r.get("seconds") or 0) + float(r.get("seconds_stock") or 0)
                d = (t - dt.timedelta(seconds=back)).strftime(fmt)
            except (ValueError, TypeError):
                d = _date(r)
        k = _process_key(r)
        if d and (k not in starts or d < starts[k]):
            starts[k] = d
    return starts


def correct_p_flushed(rows: list[dict[str, Any]]) -> list[str]:
    """Divide the inflated ``p_flushed_mean`` of pre-fix rows by batch x query heads, in place; returns notes.

    Each corrected row keeps ``p_flushed_mean_raw`` and says why in ``p_flushed_mean_note``; a value that is
    still not a fraction afterwards becomes NaN (raw value kept). Rows already corrected are left alone.
    """
    starts = _process_starts(rows)
    fixed: dict[str, list] = defaultdict(list)
    bad = []
    for r in rows:
        v = r.get("p_flushed_mean")
        if not isinstance(v, (int, float)) or "p_flushed_mean_raw" in r:
            continue
        p = r.get("provenance") or {}
        pre = (not r.get("p_flushed_checked") and starts.get(_process_key(r), "9") < P_FLUSHED_FIX[1]
               and _date(r) < P_FLUSHED_LAST_INFLATED_UTC)
        if pre and v > 0:
            heads = p.get("num_q_heads")
            r["p_flushed_mean_raw"] = v
            if isinstance(heads, int) and heads > 0:
                r["p_flushed_mean"] = v / heads
                r["p_flushed_mean_note"] = (f"divided by batch x query heads = 1 x {heads}: written by a process "
                                            f"started before commit {P_FLUSHED_FIX[0]}")
                fixed[r.get("model")].append((heads, _date(r)))
            else:
                r["p_flushed_mean"] = math.nan
                r["p_flushed_mean_note"] = "pre-fix row without num_q_heads in its provenance: not a fraction"
                bad.append(r)
        if isinstance(r.get("p_flushed_mean"), (int, float)) and r["p_flushed_mean"] > 1:
            r.setdefault("p_flushed_mean_raw", r["p_flushed_mean"])
            r["p_flushed_mean"] = math.nan
            r["p_flushed_mean_note"] = "not a fraction (> 1): shown as nan"
            bad.append(r)
    notes = []
    if fixed:
        n = sum(len(v) for v in fixed.values())
        dates = sorted(d for v in fixed.values() for _, d in v)
        per = ", ".join(f"{m} ÷{v[0][0]}" for m, v in sorted(fixed.items(), key=lambda kv: str(kv[0])))
        notes.append(
            f"P flushed: {n} rows (written {dates[0]} to {dates[-1]} by processes started before commit "
            f"{P_FLUSHED_FIX[0]}, which made the emulator count the unmasked probabilities once per batch-head) "
            f"recorded `p_flushed_mean` inflated by batch x query heads; it is divided here at load time ({per}; "
            "each row keeps `p_flushed_mean_raw` and a `p_flushed_mean_note`; the result files are unchanged).")
    if bad:
        notes.append(f"P flushed: {len(bad)} rows hold a value that is not a fraction; shown as nan "
                     f"({', '.join(sorted({_label(r) for r in bad})[:12])}).")
    return notes


def _label(row: dict[str, Any]) -> str:
    s = f"{row.get('model')}/{row.get('recipe')}/w{row.get('window')}"
    return s if row.get("layer") is None else f"{s}/layer {row['layer']}"


def stale_rows(rows: list[dict[str, Any]]) -> list[tuple[tuple, list[dict[str, Any]]]]:
    """[(change, rows)]: rows of recipes whose numerics changed (:data:`RECIPE_CHANGES`) after their process
    started (a row appears under each change it predates)."""
    starts = _process_starts(rows)
    found: dict[tuple, list] = defaultdict(list)
    for r in rows:
        try:
            recipe = get_recipe(r.get("recipe"))
        except ValueError:
            continue
        start = starts.get(_process_key(r), "9")
        for c in RECIPE_CHANGES:
            if c[3](recipe) and start < c[1]:
                found[c].append(r)
    return [(c, found[c]) for c in RECIPE_CHANGES if c in found]


def _labels(rows: list[dict[str, Any]]) -> str:
    """``model/recipe/wN`` of window rows; one ``model/recipe/wN per-layer sweep (k layers)`` per sweep."""
    win = sorted({_label(r) for r in rows if r.get("layer") is None})
    sweeps: dict[str, int] = defaultdict(int)
    for r in rows:
        if r.get("layer") is not None:
            sweeps[f"{r.get('model')}/{r.get('recipe')}/w{r.get('window')}"] += 1
    return ", ".join([*win, *(f"{k} per-layer sweep ({n} layers)" for k, n in sorted(sweeps.items()))])


def dedup_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(kept, superseded): one row per measurement key, the latest by date (then the later one in ``rows``)."""
    best: dict[tuple, tuple] = {}
    for i, r in enumerate(rows):
        k = _row_key(r)
        cand = (_date(r), i)
        if k not in best or cand >= best[k][0]:
            best[k] = (cand, r)
    keep_ids = {id(v[1]) for v in best.values()}
    return [r for r in rows if id(r) in keep_ids], [r for r in rows if id(r) not in keep_ids]


def prepare_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows a report shows and the notes it must carry: p_flushed corrected, repeated measurements merged
    (the latest kept), rows measured before a change to their recipe flagged."""
    rows = [r for r in rows if r.get("kind") in ("impact_window", "impact_layer")]
    notes = correct_p_flushed(rows)
    rows, old = dedup_rows(rows)
    if old:
        files = sorted({str(r.get("_file")) for r in old if r.get("_file")})
        notes.append(f"{len(old)} rows were measured again later (same model, recipe, window, layer, tokens and "
                     "text): the latest by date is shown"
                     + (f" (superseded rows from {', '.join(files)})" if files else "") + ".")
    for (commit, _when, what, _), stale in stale_rows(rows):
        notes.append(f"Measured before a recipe change: {_labels(stale)} were written by a process started before "
                     f"commit {commit} ({what}), so they measure the recipe as it was then (numbers shown as "
                     "recorded); measure them again (the later row is used) and drop these (`zyfa impact "
                     "--drop-rows`).")
    return rows, notes


def file_sha256(path: str | Path) -> str:
    return _sha256(Path(path).read_bytes())


def load_rows(paths: Iterable[str | Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, files) of several results files, e.g. one per concurrent process; each row tagged with ``_file``.

    ``files``: one dict per file (``label``, ``path``, ``sha256``, ``rows``). Pass the rows to
    :func:`section_blocks` or :func:`render_markdown`, which correct and merge them (:func:`prepare_rows`).
    """
    paths = [Path(p) for p in paths]
    names = [p.name for p in paths]
    rows, files = [], []
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"impact results not found: {p}")
        label = p.name if names.count(p.name) == 1 else str(p)
        got = read_rows(p)
        for r in got:
            r["_file"] = label
        rows += got
        files.append({"label": label, "path": str(p), "sha256": file_sha256(p), "rows": len(got)})
    return rows, files


# ------------------------------------------------------------------------------------------------- drop rows

def parse_drop_spec(spec: str) -> list[tuple[str, str, str, str]]:
    """``model:recipe:window[:layer],...`` -> patterns; ``*`` matches anything; layer: a number, ``none`` (the
    all-layer rows only) or ``*`` (the default: all-layer and per-layer rows)."""
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) not in (3, 4) or not all(parts):
            raise ValueError(f"--drop-rows: {item!r} is not model:recipe:window[:layer]")
        model, recipe, window = parts[:3]
        layer = parts[3] if len(parts) == 4 else "*"
        if window != "*" and not window.isdigit():
            raise ValueError(f"--drop-rows: window {window!r} in {item!r} is not a number or *")
        if layer not in ("*", "none") and not layer.isdigit():
            raise ValueError(f"--drop-rows: layer {layer!r} in {item!r} is not a number, none or *")
        if recipe != "*":
            recipe = get_recipe(recipe).name
        out.append((model, recipe, window, layer))
    if not out:
        raise ValueError("--drop-rows names no row")
    return out


def _drop_match(row: dict[str, Any], pat: tuple[str, str, str, str]) -> bool:
    model, recipe, window, layer = pat
    if row.get("kind") not in ("impact_window", "impact_layer"):
        return False
    lay = row.get("layer")
    return ((model == "*" or row.get("model") == model) and (recipe == "*" or row.get("recipe") == recipe)
            and (window == "*" or str(row.get("window")) == window)
            and (layer == "*" or (layer == "none" and lay is None) or (lay is not None and str(lay) == layer)))


def drop_rows(path: str | Path, patterns: list[tuple[str, str, str, str]] | str, *,
              reason: str | None = None) -> tuple[int, Path]:
    """Remove the rows matching ``patterns`` from a results JSONL file; returns (count, sidecar).

    The removed rows are appended, each with a ``dropped`` record (when, which spec, why, which commit), to
    ``<file>.dropped`` next to it (not a ``*.jsonl``, so globs over results files do not pick it up); every
    other line stays byte for byte. A later ``zyfa impact --resume`` with the same file measures exactly the
    dropped rows again. Do not drop from a file that a running ``zyfa impact`` appends to: the file is
    replaced atomically, and a change during the drop is detected and refused.
    """
    import datetime as dt
    import os

    path = Path(path)
    spec = patterns if isinstance(patterns, str) else ",".join(":".join(p) for p in patterns)
    if isinstance(patterns, str):
        patterns = parse_drop_spec(patterns)
    before = path.stat()
    data = path.read_bytes()
    keep, dropped = [], []
    for line in data.decode("utf-8").splitlines(keepends=True):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and any(_drop_match(row, p) for p in patterns):
            dropped.append(row)
        else:
            keep.append(line if line.endswith("\n") else line + "\n")
    sidecar = path.with_name(path.name + ".dropped")
    if not dropped:
        return 0, sidecar
    try:
        from accuracy.provenance import git_state

        commit = git_state()[0]
    except Exception:  # noqa: BLE001
        commit = None
    record = {"utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "spec": spec, "from": path.name, "git_commit": commit,
              "reason": reason}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(keep), encoding="utf-8")
    now = path.stat()
    if (now.st_size, now.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        tmp.unlink()
        raise RuntimeError(f"{path} changed while dropping rows (is a zyfa impact run writing to it?); nothing "
                           "was dropped")
    with sidecar.open("a", encoding="utf-8") as f:
        for row in dropped:
            f.write(json.dumps({**row, "dropped": record}, default=_json_default) + "\n")
    os.replace(tmp, path)
    return len(dropped), sidecar


# ------------------------------------------------------------------------------------------------- report

def _ci(values, *, seed: int = 0):
    from accuracy.metrics import bootstrap_ci

    return bootstrap_ci(np.asarray(values, dtype=np.float64), seed=seed)


def _fmt(x: float, spec: str) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _fmt_ci(ci, spec: str) -> str:
    if ci.low == ci.high or math.isnan(ci.low) or math.isnan(ci.high):
        return _fmt(ci.estimate, spec)
    return f"{_fmt(ci.estimate, spec)} [{_fmt(ci.low, spec)}, {_fmt(ci.high, spec)}]"


def _slug(s: str) -> str:
    import re

    return re.sub(r"[^a-z0-9]+", "-", str(s).lower()).strip("-")


def summarize(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """All-layer rows aggregated per (model, n_tokens, text) and recipe, recipes by mean KL (prepared rows).

    Each entry: recipe, windows (sorted window indices), rows, and the CIs over windows (``accuracy.metrics.CI``)
    ``ppl_ratio``, ``delta_ppl``, ``kl``; ``kl_blocks`` (pooled 256-token blocks, or None); means ``kl_p99``,
    ``top1``, ``p_flushed`` (NaN where a row has none).
    """
    groups: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("kind") == "impact_window":
            groups[(r["model"], r.get("n_tokens"), r.get("text"))][r["recipe"]].append(r)
    out = {}
    for g, per_recipe in groups.items():
        entries = []
        for rc, rs in per_recipe.items():
            rs = sorted(rs, key=lambda r: r["window"])
            blocks = [b for r in rs for b in r.get("kl_blocks") or []]
            pf = [float(r["p_flushed_mean"]) if isinstance(r.get("p_flushed_mean"), (int, float)) else math.nan
                  for r in rs]
            entries.append({
                "recipe": rc, "windows": [r["window"] for r in rs], "rows": rs,
                "ppl_ratio": _ci([r["ppl_ratio"] for r in rs]), "delta_ppl": _ci([r["delta_ppl"] for r in rs]),
                "kl": _ci([r["kl_mean"] for r in rs]), "kl_blocks": _ci(blocks) if blocks else None,
                "kl_p99": float(np.mean([r["kl_p99"] for r in rs])),
                "top1": float(np.mean([r["top1_agree"] for r in rs])), "p_flushed": float(np.mean(pf)),
            })
        entries.sort(key=lambda e: (e["kl"].estimate if math.isfinite(e["kl"].estimate) else math.inf, e["recipe"]))
        out[g] = entries
    return dict(sorted(out.items(), key=lambda kv: tuple(str(x) for x in kv[0])))


def group_title(key: tuple, keys: Iterable[tuple]) -> str:
    """The model's name, plus its tokens and text when the model was measured in several configurations."""
    model, n_tokens, text = key
    several = sum(1 for k in keys if k[0] == model) > 1
    return f"{model}, {n_tokens} tokens of {text}" if several else str(model)


INTRO = (
    "Every attention layer of each model runs a recipe's tiled emulator (CPU, `zyfa.emulator.emulate`) "
    "instead of the model's own attention (transformers `sdpa`, fp32), on held-out windows of the {texts} text "
    "({tokens} tokens each; the odd slices of the token stream, disjoint from the capture windows). "
    "Δppl = ppl(recipe) − ppl(stock) over each window's own next tokens; KL = mean over positions of "
    "KL(stock ‖ recipe) of the next-token distributions, in nats/token (float64 from fp32 logits); top-1 = "
    "fraction of positions whose argmax is unchanged; P flushed = fraction of the unmasked probabilities the "
    "recipe rounds to 0, mean over layers. Brackets: 95% bootstrap CI over windows (scipy; with 2–3 windows this "
    "is rough; none with 1 window); the last column pools {block}-token blocks of all windows (correlated, so "
    "optimistic). Recipes are sorted by mean KL. `fp32` (no quantization) is the control: its KL shows the "
    "emulator's own summation-order noise.")

IMPACT_HEADER = ["recipe", "windows", "ppl ratio", "Δppl", "KL (nats/token)", "KL p99", "top-1 agree",
                 "P flushed", "KL, block CI"]


def section_blocks(rows: list[dict[str, Any]], *, command: str | None = None, files: list[dict] | None = None,
                   level: int = 2, key_prefix: str = "t-impact") -> list[tuple]:
    """The impact section as blocks, rendered by :func:`render_markdown` here and by ``accuracy.report``:
    ("h", level, text), ("p", text), ("code", text), ("table", key, header, rows, prose?)."""
    from scipy import stats

    rows, notes = prepare_rows(rows)
    win = [r for r in rows if r.get("kind") == "impact_window"]
    lay = [r for r in rows if r.get("kind") == "impact_layer"]
    blocks: list[tuple] = [("h", level, "Model impact: perplexity and next-token KL with each recipe swapped in")]
    if not rows:
        return blocks + [("p", "No results yet.")]
    texts = sorted({str(r.get("text")) for r in rows})
    tokens = sorted({int(r.get("n_tokens") or 0) for r in rows})
    blocks.append(("p", INTRO.format(texts=", ".join(texts), tokens=", ".join(map(str, tokens)),
                                     block=BLOCK_TOKENS)))
    blocks += [("p", n) for n in notes]
    commands = []
    for r in sorted(rows, key=_date):
        cmd = _command_of((r.get("provenance") or {}).get("argv") or [])
        if cmd and cmd not in commands:
            commands.append(cmd)
    if command and command not in commands:
        commands.append(command)
    if commands:
        blocks += [("p", "Commands (by start; `--resume` runs add rows to their file):"),
                   ("code", "\n".join(commands))]
    blocks += _provenance_blocks(rows, files, key_prefix)

    summary = summarize(win)
    for g, entries in summary.items():
        model = g[0]
        p = entries[0]["rows"][0].get("provenance") or {}
        stock = {r["window"]: r["ppl_stock"] for e in entries for r in e["rows"]}
        n_win = sorted({len(e["windows"]) for e in entries})
        blocks += [
            ("h", level + 1, group_title(g, summary)),
            ("p", f"{p.get('model_description', model)}; model file sha256 "
                  f"`{str(p.get('model_sha256', ''))[:16]}…`; {g[1]} tokens of {g[2]}. Stock perplexity per "
                  "window: " + ", ".join(f"w{w}: {v:.3f}" for w, v in sorted(stock.items())) + ". "
                  f"{len(entries)} recipes, "
                  f"{n_win[0] if len(n_win) == 1 else f'{n_win[0]}-{n_win[-1]}'} window(s) each."),
        ]
        body = []
        for e in entries:
            body.append([e["recipe"], str(len(e["windows"])), _fmt_ci(e["ppl_ratio"], ".5f"),
                         _fmt_ci(e["delta_ppl"], "+.4f"), _fmt_ci(e["kl"], ".2e"), _fmt(e["kl_p99"], ".2e"),
                         _fmt(e["top1"], ".4f"), _fmt(e["p_flushed"], ".3f"),
                         _fmt_ci(e["kl_blocks"], ".2e") if e["kl_blocks"] is not None else "nan"])
        blocks.append(("table", f"{key_prefix}-{_slug('-'.join(map(str, g)))}", IMPACT_HEADER, body, False))
    if lay:
        blocks += _layer_blocks(lay, win, stats, level, key_prefix)
    return blocks


def _provenance_blocks(rows, files, key_prefix) -> list[tuple]:
    by_file: dict[str, list] = defaultdict(list)
    for r in rows:
        by_file[str(r.get("_file") or "rows")].append(r)
    info = {f["label"]: f for f in files or []}
    body = []
    for label in list(info) + [x for x in by_file if x not in info]:
        rs = by_file.get(label, [])
        ps = [r.get("provenance") or {} for r in rs]
        dates = sorted(_date(r) for r in rs if _date(r))
        commits = list(dict.fromkeys(str(p.get("git_commit") or "-")[:7] for p in ps))
        dirty = " (dirty)" if any(p.get("git_dirty") for p in ps) else ""
        sha = info.get(label, {}).get("sha256")
        body.append([label, sha[:16] if sha else "-", str(info.get(label, {}).get("rows", len(rs))), str(len(rs)),
                     f"{dates[0]} to {dates[-1]}" if dates else "-",
                     ", ".join(commits[:4]) + (f" (+{len(commits) - 4})" if len(commits) > 4 else "") + dirty,
                     *(_uniq(ps, k) for k in ("torch", "transformers", "cpu"))])
    return [("p", "Result files (rows: in the file / shown after merging; commits: HEAD when each row was written; "
                  "sha256: first 16 hex digits):"),
            ("table", f"{key_prefix}-files", ["file", "sha256", "rows", "shown", "written (UTC)", "commits", "torch",
                                              "transformers", "cpu"], body, True)]


def _uniq(provs: list[dict], key: str) -> str:
    return ", ".join(dict.fromkeys(str(p.get(key)) for p in provs if p.get(key))) or "-"


def _layer_blocks(lay, win, stats, level, key_prefix) -> list[tuple]:
    blocks: list[tuple] = [
        ("h", level + 1, "Per-layer sensitivity (one layer swapped at a time)"),
        ("p", "Each row swaps only that layer; the layer then sees exactly the stock q/k/v, so the recipe's "
              "operator error there (rel-L2 of its output against `reference.attention_fp64` of the original "
              "q/k/v, which includes input quantization) comes from the same forward pass. Share = the layer's "
              "KL over the sum of all layers' KLs. ρ: Spearman correlation over layers between operator error "
              "and KL (p-value in parentheses). Σ layers / all: the sum of one-layer KLs over the KL with all "
              "layers swapped (same window): 1 means the damage adds up.")]
    groups: dict[tuple, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in lay:
        groups[(r["model"], r["window"], r.get("n_tokens"), r.get("text"))][r["recipe"]][r["layer"]] = r
    for (model, w, n_tokens, text), per_recipe in groups.items():
        recipes = list(per_recipe)
        layers = sorted({lyr for d in per_recipe.values() for lyr in d})
        slug = f"{key_prefix}-layers-{_slug(f'{model}-w{w}-{n_tokens}-{text}')}"
        blocks.append(("h", level + 2, f"{model}, window {w}"))
        body = []
        for rc in recipes:
            d = per_recipe[rc]
            ls = sorted(d)
            kl = np.array([d[i]["kl_mean"] for i in ls])
            op = np.array([d[i].get("op_rel_l2", math.nan) for i in ls], dtype=np.float64)
            opk = np.array([d[i].get("op_rel_l2_deq", math.nan) for i in ls], dtype=np.float64)
            total = kl.sum()
            top = np.argsort(-kl)[:5]
            tops = ", ".join(f"{ls[i]} ({kl[i] / total:.0%})" for i in top) if total > 0 else "-"
            all_kl = [r["kl_mean"] for r in win if r["model"] == model and r["recipe"] == rc and r["window"] == w
                      and r.get("n_tokens") == n_tokens and r.get("text") == text]
            ratio = f"{total / all_kl[0]:.2f}" if all_kl and all_kl[0] > 0 else "-"
            body.append([rc, str(len(ls)), _spearman(stats, op, kl), _spearman(stats, opk, kl), tops, ratio])
        blocks.append(("table", f"{slug}-summary", ["recipe", "layers", "ρ(op rel-L2, KL)",
                                                    "ρ(kernel-only rel-L2, KL)", "top layers by KL (share)",
                                                    "Σ layers / all"], body, False))
        head = ["layer", *(c for rc in recipes for c in (f"KL {rc}", "share", f"op rel-L2 {rc}")), "max|k|"]
        totals = {rc: sum(x["kl_mean"] for x in per_recipe[rc].values()) for rc in recipes}
        body = []
        for i in layers:
            cells = []
            kamax = math.nan
            for rc in recipes:
                x = per_recipe[rc].get(i)
                if x is None:
                    cells += ["", "", ""]
                    continue
                kamax = x.get("k_amax", kamax)
                share = x["kl_mean"] / totals[rc] if totals[rc] > 0 else math.nan
                cells += [_fmt(x["kl_mean"], ".2e"), _fmt(share, ".1%"), _fmt(x.get("op_rel_l2", math.nan), ".2e")]
            body.append([str(i), *cells, _fmt(kamax, ".1f")])
        blocks.append(("table", f"{slug}", head, body, False))
    return blocks


def blocks_markdown(blocks: list[tuple]) -> str:
    """Markdown of :func:`section_blocks` (the section alone; ``accuracy.report`` renders it in the report)."""
    return "\n".join(_blocks_markdown(blocks)).rstrip() + "\n"


def render_markdown(rows: list[dict[str, Any]], *, command: str | None = None,
                    files: list[dict] | None = None) -> str:
    """The report section (Markdown): per-model impact tables with CIs, per-layer sensitivity, correlation."""
    return blocks_markdown(section_blocks(rows, command=command, files=files))


def _command_of(argv: list[str]) -> str | None:
    """``zyfa impact ...`` from a recorded argv (python -m zyfa.cli impact ..., or the zyfa script)."""
    if "impact" not in argv:
        return None
    return "zyfa impact " + " ".join(argv[argv.index("impact") + 1:])


def _spearman(stats, x: np.ndarray, y: np.ndarray) -> str:
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.all(x[ok] == x[ok][0]) or np.all(y[ok] == y[ok][0]):
        return "-"
    res = stats.spearmanr(x[ok], y[ok])
    return f"{res.statistic:+.2f} (p={res.pvalue:.2g})"


def results_paths(spec: str | Iterable[str]) -> list[Path]:
    """Files of a comma-separated list (or several), globs expanded in sorted order, duplicates dropped."""
    import glob

    items = [spec] if isinstance(spec, str) else list(spec)
    out: list[Path] = []
    for item in items:
        for s in (x.strip() for x in str(item).split(",")):
            if not s:
                continue
            hits = sorted(glob.glob(s)) if any(c in s for c in "*?[") else [s]
            out += [Path(h) for h in hits if Path(h) not in out]
    return out


def write_markdown(rows_path: str | Path | Iterable[str | Path], md_path: str | Path, *,
                   command: str | None = None) -> Path:
    """Render the section of one or several results files (missing files are skipped) to ``md_path``."""
    md_path = Path(md_path)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    paths = [rows_path] if isinstance(rows_path, (str, Path)) else list(rows_path)
    rows, files = load_rows([p for p in paths if Path(p).exists()])
    md_path.write_text(render_markdown(rows, command=command, files=files), encoding="utf-8")
    return md_path


# ------------------------------------------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default="smollm2,gemma3,qwen25coder",
                        help="comma-separated registry names (smollm2, gemma3, qwen25coder) or model paths")
    parser.add_argument("--recipes", default=DEFAULT_RECIPES, help="comma-separated recipe names")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per window (default 2048)")
    parser.add_argument("--windows", type=int, default=2, help="held-out windows per model (default 2)")
    parser.add_argument("--text", default="lee", help="text source: lee, shakespeare, pydoc (default lee)")
    parser.add_argument("--per-layer", default="", help="models to sweep one layer at a time (comma-separated)")
    parser.add_argument("--layer-recipes", default=DEFAULT_LAYER_RECIPES,
                        help=f"recipes of the per-layer sweep (default {DEFAULT_LAYER_RECIPES})")
    parser.add_argument("--layer-windows", type=int, default=1, help="windows of the per-layer sweep (default 1)")
    parser.add_argument("--layers", default=None, help="restrict the per-layer sweep to these layers (e.g. 0,5,29)")
    parser.add_argument("--out", default="reports/impact/results.jsonl",
                        help="results JSONL (rows appended); with --render-only: one or several files, "
                        "comma-separated or a quoted glob (e.g. 'reports/impact/results*.jsonl')")
    parser.add_argument("--markdown", default=None,
                        help="Markdown section to write (default: impact.md next to --out)")
    parser.add_argument("--resume", action="store_true", help="keep the rows already in --out and skip them")
    parser.add_argument("--render-only", action="store_true",
                        help="only re-render the Markdown from --out (several files are merged)")
    parser.add_argument("--drop-rows", default=None, metavar="MODEL:RECIPE:WINDOW[:LAYER],...",
                        help="remove these rows from --out (moved to <out>.dropped with a note); "
                        "'*' matches anything, e.g. '*:fa3:0'; a later --resume run measures them again")
    parser.add_argument("--reason", default=None, help="with --drop-rows: why, recorded with the dropped rows")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    outs = results_paths(args.out)
    if not outs:
        print(f"zyfa impact: --out {args.out!r} names no file", file=sys.stderr)
        return 2
    out = outs[0]
    md = Path(args.markdown) if args.markdown else out.with_name("impact.md")
    command = _command_of(list(sys.argv))
    if args.render_only:
        write_markdown(outs, md)
        print(f"wrote {md} from {len(outs)} file(s)")
        return 0
    if len(outs) > 1 or any(c in args.out for c in ",*?["):
        print("zyfa impact: --out must be one file (several only with --render-only)", file=sys.stderr)
        return 2
    if args.drop_rows is not None:
        try:
            parse_drop_spec(args.drop_rows)
            if not out.is_file():
                raise FileNotFoundError(f"no such file: {out}")
            n, sidecar = drop_rows(out, args.drop_rows, reason=args.reason)
        except (ValueError, FileNotFoundError, RuntimeError) as e:
            print(f"zyfa impact: {e}", file=sys.stderr)
            return 2
        print(f"dropped {n} row(s) from {out}" + (f" (kept in {sidecar}); re-render with --render-only" if n else ""))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    split = [s.strip() for s in args.models.split(",") if s.strip()]
    try:
        recipes = [get_recipe(r.strip()).name for r in args.recipes.split(",") if r.strip()]
        layer_recipes = [get_recipe(r.strip()).name for r in args.layer_recipes.split(",") if r.strip()]
    except ValueError as e:
        print(f"zyfa impact: {e}", file=sys.stderr)
        return 2
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    per_layer = [s.strip() for s in args.per_layer.split(",") if s.strip()]
    unknown = [m for m in per_layer if m not in split]
    if unknown:
        print(f"zyfa impact: --per-layer {unknown} not in --models", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    run_impact(split, recipes, n_tokens=args.tokens, windows=args.windows, text=args.text, per_layer=per_layer,
               layer_recipes=layer_recipes, layer_windows=args.layer_windows, layers=layers, out=out,
               resume=args.resume, progress=not args.no_progress,
               on_model_done=lambda: write_markdown(out, md, command=command))
    write_markdown(out, md, command=command)
    print(f"wrote {out} and {md} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    p = argparse.ArgumentParser(prog="python -m accuracy.impact")
    add_arguments(p)
    sys.exit(main(p.parse_args()))
