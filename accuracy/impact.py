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

Exposed: ``RecipeAttention``, ``UnsupportedMaskError``, ``final_hidden``, ``logits_from_hidden``,
``compare_logits``, ``run_impact``, ``render_markdown``, ``add_arguments``, ``main``.
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

from zyfa.emulator import emulate
from zyfa.recipes import Recipe, get_recipe

__all__ = [
    "RecipeAttention",
    "UnsupportedMaskError",
    "add_arguments",
    "compare_logits",
    "final_hidden",
    "logits_from_hidden",
    "main",
    "render_markdown",
    "run_impact",
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
                    "transformers": _version("transformers")}
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
                       "seconds": time.perf_counter() - t0, "seconds_stock": t_stock, "provenance": _provenance(prov)}
                sink.write(row)
                tqdm.write(f"[impact] {model_name} w{w} {r:10s} ppl {row['ppl_stock']:.4f} -> {row['ppl_recipe']:.4f} "
                           f"(x{row['ppl_ratio']:.5f})  KL {row['kl_mean']:.3e} nats/token  "
                           f"top1 {row['top1_agree']:.4f}  {row['seconds']:.0f} s", file=sys.stderr)

            if sweep_here:
                bar.update(n_layers)  # the stock pass the sweep shares
                _sweep(model, ids, ref_logits, sweep_layers, layer_recipes, sweep_todo, n_layers, base, prov,
                       sink, bar, swap_attention)
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


# ------------------------------------------------------------------------------------------------- report

def _ci(values, *, seed: int = 0):
    from accuracy.metrics import bootstrap_ci

    return bootstrap_ci(np.asarray(values, dtype=np.float64), seed=seed)


def _fmt(x: float, spec: str) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _fmt_ci(ci, spec: str) -> str:
    if ci.low == ci.high:
        return _fmt(ci.estimate, spec)
    return f"{_fmt(ci.estimate, spec)} [{_fmt(ci.low, spec)}, {_fmt(ci.high, spec)}]"


def render_markdown(rows: list[dict[str, Any]], *, command: str | None = None) -> str:
    """The report section (Markdown): per-model impact tables with CIs, per-layer sensitivity, correlation."""
    from scipy import stats

    rows = list({_row_key(r): r for r in rows}.values())  # a repeated measurement counts once (the last)
    win = [r for r in rows if r.get("kind") == "impact_window"]
    lay = [r for r in rows if r.get("kind") == "impact_layer"]
    lines = ["## Model impact: perplexity and next-token KL with each recipe swapped in", ""]
    if not rows:
        return "\n".join(lines + ["No results yet.", ""])
    prov = rows[0].get("provenance", {})
    texts = sorted({r["text"] for r in rows})
    tokens = sorted({r["n_tokens"] for r in rows})
    lines += [
        "Every attention layer of each model runs a recipe's tiled emulator (CPU, `zyfa.emulator.emulate`) "
        "instead of the model's own attention (transformers `sdpa`, fp32), on held-out windows of the "
        f"{', '.join(texts)} text ({', '.join(map(str, tokens))} tokens each; the odd slices of the token stream, "
        "disjoint from the capture windows). Δppl = ppl(recipe) − ppl(stock) over each window's own next "
        "tokens; KL = mean over positions of KL(stock ‖ recipe) of the next-token distributions, in "
        "nats/token (float64 from fp32 logits); top-1 = fraction of positions whose argmax is unchanged. "
        "Brackets: 95% bootstrap CI over windows (scipy; with 2–3 windows this is rough); the last column "
        f"pools {BLOCK_TOKENS}-token blocks of all windows (correlated, so optimistic). `fp32` (no "
        "quantization) is the control: its KL shows the emulator's own summation-order noise.",
        "",
    ]
    commands = []
    for r in rows:
        argv = r.get("provenance", {}).get("argv") or []
        cmd = _command_of(argv)
        if cmd and cmd not in commands:
            commands.append(cmd)
    if command and command not in commands:
        commands.append(command)
    if commands:
        lines += ["Commands (in order; later ones `--resume` and add rows):", ""]
        lines += [f"    {c}" for c in commands] + [""]
    lines += [f"Provenance: commit `{prov.get('git_commit')}`{' (dirty tree)' if prov.get('git_dirty') else ''}, "
              f"{prov.get('date_utc')}, torch {prov.get('torch')}, transformers {prov.get('transformers')}, "
              f"{prov.get('cpu')}.", ""]

    by_model: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in win:
        by_model[r["model"]][r["recipe"]].append(r)
    for model, per_recipe in by_model.items():
        any_row = next(iter(per_recipe.values()))[0]
        p = any_row.get("provenance", {})
        stock = {r["window"]: r["ppl_stock"] for rs in per_recipe.values() for r in rs}
        lines += [f"### {model}", "",
                  f"{p.get('model_description', model)}; model file sha256 `{str(p.get('model_sha256', ''))[:16]}…`. "
                  f"Stock perplexity per window: "
                  + ", ".join(f"w{w}: {v:.3f}" for w, v in sorted(stock.items())) + ".", "",
                  "| recipe | windows | ppl ratio | Δppl | KL (nats/token) | KL p99 | top-1 agree "
                  "| KL, block CI |",
                  "|---|---|---|---|---|---|---|---|"]
        order = sorted(per_recipe, key=lambda rc: float(np.mean([r["kl_mean"] for r in per_recipe[rc]])))
        for rc in order:
            rs = sorted(per_recipe[rc], key=lambda r: r["window"])
            blocks = [b for r in rs for b in r.get("kl_blocks", [])]
            lines.append(
                f"| `{rc}` | {len(rs)} | {_fmt_ci(_ci([r['ppl_ratio'] for r in rs]), '.5f')} "
                f"| {_fmt_ci(_ci([r['delta_ppl'] for r in rs]), '+.4f')} "
                f"| {_fmt_ci(_ci([r['kl_mean'] for r in rs]), '.2e')} "
                f"| {_fmt(float(np.mean([r['kl_p99'] for r in rs])), '.2e')} "
                f"| {_fmt(float(np.mean([r['top1_agree'] for r in rs])), '.4f')} "
                f"| {_fmt_ci(_ci(blocks), '.2e') if blocks else 'nan'} |")
        lines.append("")

    if lay:
        lines += _render_layers(lay, win, stats)
    return "\n".join(lines) + "\n"


def _render_layers(lay, win, stats) -> list[str]:
    lines = ["### Per-layer sensitivity (one layer swapped at a time)", "",
             "Each row swaps only that layer; the layer then sees exactly the stock q/k/v, so the recipe's "
             "operator error there (rel-L2 of its output against `reference.attention_fp64` of the original "
             "q/k/v, which includes input quantization) comes from the same forward pass. Share = the layer's "
             "KL over the sum of all layers' KLs. ρ: Spearman correlation over layers between operator error "
             "and KL (p-value in parentheses). Σ layers / all: the sum of one-layer KLs over the KL with all "
             "layers swapped (same window): 1 means the damage adds up.", ""]
    groups: dict[tuple, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in lay:
        groups[(r["model"], r["window"])][r["recipe"]][r["layer"]] = r
    for (model, w), per_recipe in groups.items():
        recipes = list(per_recipe)
        layers = sorted({lyr for d in per_recipe.values() for lyr in d})
        lines += [f"#### {model}, window {w}", ""]
        # summary per recipe
        lines += ["| recipe | layers | ρ(op rel-L2, KL) | ρ(kernel-only rel-L2, KL) | top layers by KL (share) "
                  "| Σ layers / all |", "|---|---|---|---|---|---|"]
        for rc in recipes:
            d = per_recipe[rc]
            ls = sorted(d)
            kl = np.array([d[i]["kl_mean"] for i in ls])
            op = np.array([d[i].get("op_rel_l2", math.nan) for i in ls])
            opk = np.array([d[i].get("op_rel_l2_deq", math.nan) for i in ls])
            rho = _spearman(stats, op, kl)
            rhok = _spearman(stats, opk, kl)
            total = kl.sum()
            top = np.argsort(-kl)[:5]
            tops = ", ".join(f"{ls[i]} ({kl[i] / total:.0%})" for i in top) if total > 0 else "-"
            all_kl = [r["kl_mean"] for r in win if r["model"] == model and r["recipe"] == rc and r["window"] == w]
            ratio = f"{total / all_kl[0]:.2f}" if all_kl and all_kl[0] > 0 else "-"
            lines.append(f"| `{rc}` | {len(ls)} | {rho} | {rhok} | {tops} | {ratio} |")
        lines.append("")
        head = "| layer | " + " | ".join(f"KL `{rc}` | share | op rel-L2 `{rc}`" for rc in recipes) + " | max\\|k\\| |"
        lines += [head, "|" + "---|" * (2 + 3 * len(recipes))]
        totals = {rc: sum(x["kl_mean"] for x in per_recipe[rc].values()) for rc in recipes}
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
            lines.append(f"| {i} | " + " | ".join(cells) + f" | {_fmt(kamax, '.1f')} |")
        lines.append("")
    return lines


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


def write_markdown(rows_path: str | Path, md_path: str | Path, *, command: str | None = None) -> Path:
    md_path = Path(md_path)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    rows = read_rows(rows_path) if Path(rows_path).exists() else []
    md_path.write_text(render_markdown(rows, command=command), encoding="utf-8")
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
    parser.add_argument("--out", default="reports/impact/results.jsonl", help="results JSONL (rows appended)")
    parser.add_argument("--markdown", default=None,
                        help="Markdown section to write (default: impact.md next to --out)")
    parser.add_argument("--resume", action="store_true", help="keep the rows already in --out and skip them")
    parser.add_argument("--render-only", action="store_true", help="only re-render the Markdown from --out")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    md = Path(args.markdown) if args.markdown else out.with_name("impact.md")
    command = _command_of(list(sys.argv))
    if args.render_only:
        write_markdown(out, md)
        print(f"wrote {md}")
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
