"""Running models with each recipe swapped in: ``zyfa impact``'s measurement, rows handed to the results file.

Exposed: ``run_impact``, ``impact_cells``, ``ids_hash`` (the default recipes are in
:mod:`zyfa.accuracy.impact.impact_args`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import platform
import sys
import time
from collections.abc import Callable, Iterable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from zyfa.accuracy.impact.impact_args import DEFAULT_LAYER_RECIPES
from zyfa.accuracy.impact.model import RecipeAttention, compare_logits, final_hidden, model_attention, stock_logits
from zyfa.accuracy.impact.rows import impact_key
from zyfa.capture.hook import attention_modules, swap_attention
from zyfa.capture.text import load_text, num_windows, token_window
from zyfa.reference.attention import attention_fp64

from zyfa.norms import rel_l2
from zyfa.recipe_spec import get_recipe


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ids_hash(ids: Iterable[int]) -> str:
    """sha256 of the token ids as comma-separated decimal text."""
    return _sha256(",".join(str(int(i)) for i in ids).encode())


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


def _provenance(extra: dict[str, Any]) -> dict[str, Any]:
    try:
        # lazy: inside its ImportError fallback
        from zyfa.accuracy.io.provenance import provenance
    except ImportError:  # pragma: no cover - the module exists in this tree

        rec = {"python": platform.python_version(), "torch": torch.__version__,
               "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        rec.update(extra)
        return rec
    return provenance(extra)


def run_impact(models: list[str], recipes: list[str], *, n_tokens: int = 2048, windows: int = 2,
               text: str = "lee", per_layer: Iterable[str] = (), layer_recipes: list[str] | None = None,
               layer_windows: int = 1, layers: list[int] | None = None, out: str | Path,
               progress: bool = True,
               on_model_done: Callable[[], None] | None = None, implementations: Iterable[str] = (),
               plugins=(), device: str | torch.device = "cpu", sink,
               owns: Callable[[str, str, int, str], bool] | None = None) -> Path:
    """Run the measurement, each row to ``sink``; returns ``out`` (the results file the sink finishes).

    ``implementations``: registry names (:func:`accuracy.impact.model.model_attention`) run as the model's attention
    beside the recipes' emulations, and ``plugins`` (loaded ``--kernel`` implementations); their rows carry the
    name in ``recipe``, ``implementation`` and what ran in each layer (``ran``). ``device``: where the model runs.

    Rows: ``kind="impact_window"`` per (model, recipe, window), all layers swapped;
    ``kind="impact_layer"`` per (model, recipe, window, layer), one layer swapped, with operator error. Every row
    records the ``device`` it ran on.

    ``sink``: an object with ``done`` (the row keys made before) and ``write(row)``, over the command's results
    file (:class:`accuracy.io.results_io.ResultsFile`, or a rank's file of :class:`accuracy.io.shard.ShardedResults`:
    fsync'd rows under the run lock). A sharded rank passes ``owns(kind, model, window, recipe)``, its
    share of the cells (:func:`impact_cells`): the others are skipped, and a model with no cell of this rank is
    not loaded.
    """
    # lazy: tqdm is optional (a silent stand-in without it)
    from tqdm import tqdm

    # lazy: looked up when called, so a test can stand a stub in for it
    from zyfa.capture.models import load_model

    recipes = [get_recipe(r).name for r in recipes]
    impl_names = list(dict.fromkeys([*implementations, *(p.name for p in plugins)]))
    dev = torch.device(device)
    layer_recipes = [get_recipe(r).name for r in (layer_recipes or DEFAULT_LAYER_RECIPES.split(","))]
    per_layer = set(per_layer)
    out = Path(out)
    owns = owns or (lambda kind, model, window, recipe: True)
    text_sha = load_text(text).sha256

    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    # the emulator's p_flushed_frac is a fraction (tests/zyfa/test_emulator.py::
    # test_flushed_fraction_is_a_fraction_on_multi_head_inputs); the readers refuse an impact row without this mark
    # (rows from before commit 2f53d66 were migrated: scripts/migrate_rows.py)
    checked = {"p_flushed_checked": True}

    for model_name in models:
        mine = [c for c in impact_cells([model_name], recipes, impl_names, windows=windows,
                                        per_layer=per_layer, layer_recipes=layer_recipes,
                                        layer_windows=layer_windows) if owns(*c)]
        if not any(k != "window" or impact_key("impact_window", m, r, w, None, n_tokens, text) not in sink.done
                   for k, m, w, r in mine):
            continue  # nothing of this model left for this process
        t_load = time.perf_counter()
        loaded = load_model(model_name)
        model = loaded.model.to(dev)
        n_layers = len(attention_modules(model))
        sweep_layers = sorted(layers) if layers is not None else list(range(n_layers))
        avail = num_windows(loaded.tokenizer, text, n_tokens, "heldout")
        if windows > avail:
            raise ValueError(f"text {text!r} has only {avail} held-out windows of {n_tokens} tokens")
        do_sweep = model_name in per_layer
        total = windows * (1 + len(recipes)) * n_layers
        if do_sweep:
            total += min(layer_windows, windows) * (1 + len(sweep_layers) * len(layer_recipes)) * n_layers
        bar = tqdm(total=total, desc=f"impact {model_name}: layer passes", unit="layer", disable=not progress,
                   dynamic_ncols=True, file=sys.stderr)
        tqdm.write(f"[impact] {model_name}: loaded in {time.perf_counter() - t_load:.1f} s, {n_layers} layers, "
                   f"{windows} held-out window(s) of {n_tokens} tokens", file=sys.stderr)

        def tick(_layer: int, bar=bar) -> None:
            bar.update(1)

        for w in range(windows):
            tw = token_window(loaded.tokenizer, text, n_tokens, w, split="heldout")
            ids = torch.tensor([tw.ids], dtype=torch.long, device=dev)
            base = {"model": model_name, "window": w, "split": "heldout", "text": text, "n_tokens": n_tokens,
                    "token_offset": tw.offset}
            prov = {**loaded.provenance, "text_sha256": text_sha, "token_ids_sha256": ids_hash(tw.ids),
                    "transformers": _version("transformers"), "run_started_utc": started}
            todo = [r for r in [*recipes, *impl_names]
                    if impact_key("impact_window", model_name, r, w, None, n_tokens, text) not in sink.done
                    and owns("window", model_name, w, r)]
            sweep_here = do_sweep and w < layer_windows
            sweep_todo = [(lay, r) for lay in sweep_layers for r in layer_recipes
                          if impact_key("impact_layer", model_name, r, w, lay, n_tokens, text) not in sink.done
                          and owns("layer", model_name, w, r)]
            if not todo and not (sweep_here and sweep_todo):
                bar.update(n_layers * (1 + len(recipes)) + (n_layers * (1 + len(sweep_layers) * len(layer_recipes))
                                                            if sweep_here else 0))
                continue

            t0 = time.perf_counter()
            h_stock = final_hidden(model, ids)
            ref_logits = stock_logits(model, h_stock)
            t_stock = time.perf_counter() - t0
            bar.update(n_layers)

            for r in [*recipes, *impl_names]:
                if r not in todo:
                    bar.update(n_layers)
                    continue
                t0 = time.perf_counter()
                if r in impl_names:
                    fn = model_attention(r, plugins=plugins, on_layer=tick)
                else:
                    fn = RecipeAttention(r, on_layer=tick)
                with swap_attention(model, fn):
                    h = final_hidden(model, ids)
                cmp = compare_logits(model, ref_logits, h, ids[0])
                extra = {"implementation": r, "ran": fn.ran_summary()} if r in impl_names else {}
                row = {"kind": "impact_window", **base, "recipe": r, "layer": None, **_window_row(cmp), **extra,
                       "device": str(dev),
                       # a real kernel reports no P: its fraction is unknown (null), never 0
                       "p_flushed_mean": float(np.mean(list(fn.p_flushed.values()))) if fn.p_flushed else None,
                       **checked, "seconds": time.perf_counter() - t0, "seconds_stock": t_stock,
                       "provenance": _provenance(prov)}
                sink.write(row)
                tqdm.write(f"[impact] {model_name} w{w} {r:10s} ppl {row['ppl_stock']:.4f} -> {row['ppl_recipe']:.4f} "
                           f"(x{row['ppl_ratio']:.5f})  KL {row['kl_mean']:.3e} nats/token  "
                           f"top1 {row['top1_agree']:.4f}  {row['seconds']:.0f} s", file=sys.stderr)

            if sweep_here:
                bar.update(n_layers)  # the stock pass the sweep shares
                _sweep(model, ids, ref_logits, sweep_layers, layer_recipes, sweep_todo, n_layers,
                       {**base, **checked, "device": str(dev)}, prov, sink, bar, swap_attention)
        bar.close()
        if on_model_done is not None:
            on_model_done()
        del loaded, model
    return out


def impact_cells(models: Iterable[str], recipes: Iterable[str], implementations: Iterable[str] = (), *,
                 windows: int, per_layer: Iterable[str] = (), layer_recipes: Iterable[str] = (),
                 layer_windows: int = 1) -> list[tuple[str, str, int, str]]:
    """The cells of a ``zyfa impact`` run, in its order: ("window", model, window, recipe) for each model's windows
    and recipes (then implementations), and ("layer", model, window, recipe) for the per-layer sweep of a
    recipe (every swept layer, one at a time) on the first ``layer_windows`` windows of the ``per_layer``
    models."""
    per_layer = set(per_layer)
    cells = []
    for m in models:
        for w in range(windows):
            cells += [("window", m, w, r) for r in [*recipes, *implementations]]
        if m in per_layer:
            cells += [("layer", m, w, r) for w in range(min(layer_windows, windows)) for r in layer_recipes]
    return cells


def _sweep(model, ids, ref_logits, sweep_layers, layer_recipes, todo, n_layers, base, prov, sink, bar,
           swap_attention) -> None:
    """One layer swapped at a time; operator error of that layer from the same pass."""
    # lazy: tqdm is optional (a silent stand-in without it)
    from tqdm import tqdm

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
                op.update(op_rel_l2=rel_l2(emu.out, ref_orig[layer]), op_rel_l2_deq=rel_l2(emu.out, ref_deq),
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
        return version(pkg)
    except Exception:  # noqa: BLE001
        return None
