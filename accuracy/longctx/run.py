"""The long-context grid: (model, task, length, depth, seed) prompts x implementations -> one scored row each.

Each implementation (a recipe's emulator, ``triton:<recipe>``, a real peer kernel, a plug-in, the model's own
``stock`` attention) runs as the model's attention in the chosen layers (all by default) for the whole prefill,
answer tokens included (teacher forcing, :mod:`zyfa.accuracy.longctx.tasks`). From the logits at the answer's positions
a row records the log probability of the answer and whether greedy decoding returns it (the argmax at every answer
position is the answer's token). Operator error against the FP64 oracle is measured in the same pass, on the first
prompt of each batch, in a few layers: the error curve beside the accuracy curve.

Rows are appended to ``<out>.partial`` as each batch finishes (:class:`zyfa.accuracy.io.results_io.ResultsFile`), so a
stopped run keeps them and ``--resume`` runs only the missing ones; ``max_seconds`` stops the run cleanly between
batches, so a long grid can be spread over several calls of a GPU machine.

Exposed: ``DEFAULT_LENGTHS``, ``DEFAULT_DEPTHS``, ``GridSpec``, ``plan_lengths``, ``run_longctx``, ``row_input``,
``DECODE_NOTE``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from zyfa.accuracy.impact.model import (
    STOCK,
    ModelAttention,
    UnsupportedLayerError,
    UnsupportedMaskError,
    logits_from_hidden,
    model_attention,
)
from zyfa.accuracy.implementations.base import ImplementationError, device_platform, pairing
from zyfa.accuracy.io.results_io import row_key
from zyfa.accuracy.io.run_harness import WorkBudget
from zyfa.accuracy.longctx.coverage import Coverage, equal_coverage
from zyfa.accuracy.longctx.generate import greedy_generate
from zyfa.accuracy.longctx.tasks import DEFAULT_TASKS, PromptError, build_prompt, fact_id, min_length, score_generated
from zyfa.capture.hook import attention_modules, swap_attention
from zyfa.capture.models import MODELS
from zyfa.reference.attention import attention_fp64

from zyfa.norms import rel_l2
from zyfa.platforms import get_platform

__all__ = ["DECODE_NOTE", "DEFAULT_DEPTHS", "DEFAULT_LENGTHS", "OUT_OF_MEMORY", "GridSpec", "accumulation",
           "plan_lengths", "row_input", "run_longctx", "score_in_halves"]

DEFAULT_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
DEFAULT_DEPTHS = tuple(i / 10 for i in range(11))
DECODE_NOTE = ("teacher-forced: the answer's tokens are scored inside the prefill, by the implementation under test "
               "(greedy exact match = the argmax at every answer position is the answer's token)")


@dataclass
class GridSpec:
    """What to run. ``lengths`` None: :data:`DEFAULT_LENGTHS` up to each model's context; explicit lengths above a
    model's context are refused (:func:`plan_lengths`)."""

    models: list[str]
    implementations: list[str]
    tasks: list[str] = field(default_factory=lambda: list(DEFAULT_TASKS))
    lengths: list[int] | None = None
    depths: list[float] = field(default_factory=lambda: list(DEFAULT_DEPTHS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    text: str = "lee"
    layers: list[int] | None = None  # swap only these layers (others run stock); None: all
    op_layers: int = 3  # layers whose operator error is measured (first, middle, last, ...)
    fallback: str | None = None  # "stock": layers an implementation refuses run the model's own attention
    row_fields: dict[str, Any] = field(default_factory=dict)  # added to every row (a study plan's name and hash)
    # implementation name -> fields every row of it carries (an --ablate group: accuracy.scoring.ablation)
    row_tags: dict[str, dict[str, str]] = field(default_factory=dict)
    # with fallback "stock": "equal" swaps only the layers every implementation takes (the rest run stock for all,
    # accuracy.longctx.coverage); "own" lets each implementation fall back on its own
    coverage: str = "equal"
    generate: int = 0  # > 0: also decode the answer greedily, len(answer) + generate tokens at most


def row_input(model: str, task: str, length: int, depth: float, seed: int) -> str:
    """The row's ``input`` name: one prompt of the grid."""
    return f"{model}/{task}/L{int(length)}/d{round(float(depth) * 100)}/s{int(seed)}"


def plan_lengths(lengths: Sequence[int] | None, max_context: int, model: str) -> tuple[list[int], list[int]]:
    """(lengths to run, default lengths left out as above the model's context).

    Raises:
        ValueError: an explicitly asked length above the model's context (one line naming both).
    """
    if lengths is None:
        keep = [n for n in DEFAULT_LENGTHS if n <= max_context]
        return keep, [n for n in DEFAULT_LENGTHS if n > max_context]
    over = [n for n in lengths if n > max_context]
    if over:
        raise ValueError(f"length {over[0]} is above {model}'s context of {max_context} tokens; ask for at most "
                         f"{max_context} (or leave --lengths out: the default ladder stops at each model's context)")
    return list(lengths), []


def _op_layer_set(n_layers: int, k: int) -> list[int]:
    if k <= 0 or n_layers <= 0:
        return []
    if k == 1:
        return [n_layers // 2]
    return sorted({round(i * (n_layers - 1) / (k - 1)) for i in range(k)})


def _max_context(model_name: str) -> int | None:
    return MODELS[model_name].max_context if model_name in MODELS else None


def run_longctx(spec: GridSpec, *, results, device: torch.device, dtype: str = "fp32", plugins=(),
                batch_tokens: int = 8192, max_seconds: float | None = None, progress: bool = True,
                run_id: str | None = None, log: Callable[[str], None] | None = None,
                nonconforming: dict[str, str] | None = None,
                owns: Callable[[str, str, int, str], bool] | None = None,
                on_start: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run the grid into ``results`` (an opened :class:`~accuracy.io.results_io.ResultsFile`, started by the
    caller). ``nonconforming``: implementation -> the conformance probes' line
    (:mod:`zyfa.accuracy.implementations.conformance`); such
    an implementation is not run, its rows are ``status: nonconforming`` with that line. Returns
    ``{"keys": planned row keys, "order": their places in a whole grid's order, "complete": bool, "made": rows made,
    "failed": n}``.

    ``owns(model, task, length, implementation)``: a sharded run's share (:mod:`zyfa.accuracy.io.shard`); cells it does
    not own are neither run nor planned here, and a model with no owned cell is not loaded.

    ``on_start()``: called once, after the first model's checks (lengths, needle fit, layers) and before its first
    row or a stop, so a refused run writes nothing (the caller starts its results file there).
    ``max_seconds`` counts scoring work only (:class:`zyfa.accuracy.io.run_harness.WorkBudget`), not model loading: a
    budget above zero always makes at least one batch.

    Batches are cut from a cell's full prompt list, never from what is left of it: a resumed run scores the same
    batches as an uninterrupted one (a batch partly done is scored whole and only its missing rows are written), so
    its rows are the same, the operator error included (measured on the cell's first batch).

    Raises:
        ValueError: a length above a model's context, a prompt that cannot hold its needle, an unknown
            implementation (one line each, before that model's first row).
    """
    # lazy: tqdm is optional (a silent stand-in without it)
    from tqdm import tqdm

    # lazy: looked up when called, so a test can stand a stub in for it
    from zyfa.capture.models import load_model

    log = log or (lambda msg: tqdm.write(msg, file=sys.stderr))
    run_id = run_id or uuid.uuid4().hex[:12]
    budget = WorkBudget(max_seconds)
    started = False

    def begin() -> None:
        nonlocal started
        if not started and on_start is not None:
            on_start()
        started = True
    plat, plat_note = device_platform(device)
    keys: list[tuple] = []
    order: list[tuple] = []
    made = failed = 0
    complete = True
    for name in spec.implementations:  # every name checked before any model loads
        if name != STOCK and not any(p.name == name for p in plugins):
            model_attention(name)
    for model_name in spec.models:
        ctx = _max_context(model_name)
        if ctx is not None:
            plan_lengths(spec.lengths, ctx, model_name)  # refuse before the (slow) load
    for mi, model_name in enumerate(spec.models):
        ctx = _max_context(model_name)
        if owns is not None and ctx is not None and not any(
                owns(model_name, task, n, name) for task in spec.tasks
                for n in plan_lengths(spec.lengths, ctx, model_name)[0] for name in spec.implementations):
            continue  # none of this model's cells is this rank's: not loaded here
        t0 = time.perf_counter()
        loaded = load_model(model_name, dtype=dtype)
        model = loaded.model.to(device)
        tok = loaded.tokenizer
        n_layers = len(attention_modules(model))
        if spec.layers is not None and max(spec.layers) >= n_layers:
            raise ValueError(f"--layers: layer {max(spec.layers)} does not exist; {model_name} has layers 0.."
                             f"{n_layers - 1}")
        lengths, left_out = plan_lengths(spec.lengths, loaded.max_context, model_name)
        if left_out:
            log(f"[longctx] {model_name}: lengths {', '.join(map(str, left_out))} are above its context of "
                f"{loaded.max_context} tokens and are left out")
        for task in spec.tasks:
            need = min_length(tok, task)
            short = [n for n in lengths if n < need]
            if short:
                raise ValueError(f"{model_name} {task}: length {short[0]} is too short for the needle to fit "
                                 f"(needle, question and answer take {need} tokens)")
        op_layers = _op_layer_set(n_layers, spec.op_layers)
        swap_layers, cov = spec.layers, None
        if spec.fallback is not None and spec.coverage == "equal":
            probe = {n: model_attention(n, plugins=plugins) for n in spec.implementations
                     if n != STOCK and n not in (nonconforming or {})}
            cov = equal_coverage(model, probe, probe_len=max(lengths), device=device, layers=spec.layers)
            swap_layers = cov.layers
            if cov.fixed or cov.failed:
                log(f"[longctx] {model_name}: {cov.note()}")
        log(f"[longctx] {model_name}: loaded in {time.perf_counter() - t0:.1f} s, {n_layers} layers, lengths "
            f"{', '.join(map(str, lengths))}, {dtype} on {device}")
        base_fields = {"model": model_name, "model_sha256": loaded.provenance.get("model_sha256"),
                       "model_dtype": dtype, "text": spec.text, "run_id": run_id, "device": str(device),
                       "layers_swapped": swap_layers if swap_layers is not None else "all",
                       "decode": DECODE_NOTE, "coverage": cov.note() if cov is not None else None,
                       **spec.row_fields}
        refused: dict[str, str] = {}  # implementation -> why it cannot run this model (skip its other prompts)
        refused.update({n: f"nonconforming: {why}" for n, why in (nonconforming or {}).items()})
        grid = [(task, n, d, s) for task in spec.tasks for n in lengths for d in spec.depths for s in spec.seeds]
        prompts = {}
        for task, n, d, s in grid:
            try:
                prompts[(task, n, d, s)] = build_prompt(tok, task, n, d, s, text=spec.text)
            except PromptError as e:
                raise ValueError(f"{model_name}: {e}") from None
        def mine(task, n, name, model_name=model_name):
            return owns is None or owns(model_name, task, n, name)

        todo_total = sum(1 for (task, n, d, s), p in prompts.items() for name in spec.implementations
                         if mine(task, n, name)
                         and _key(model_name, task, n, d, s, p, name, plugins) not in results.done)
        for (task, n, d, s), p in prompts.items():
            for ii, name in enumerate(spec.implementations):
                if mine(task, n, name):
                    keys.append(_key(model_name, task, n, d, s, p, name, plugins))
                    order.append((mi, spec.tasks.index(task), lengths.index(n), spec.depths.index(d),
                                  spec.seeds.index(s), ii))
        begin()
        bar = tqdm(total=todo_total, desc=f"longctx {model_name}: prompts", unit="prompt", disable=not progress,
                   dynamic_ncols=True, file=sys.stderr)
        try:
            for task in spec.tasks:
                for n in lengths:
                    cell = [(d, s, prompts[(task, n, d, s)]) for d in spec.depths for s in spec.seeds]
                    for name in spec.implementations:
                        if not mine(task, n, name):
                            continue
                        per_batch = max(1, batch_tokens // n)
                        cell_rows: list[dict] = []
                        for i in range(0, len(cell), per_batch):
                            batch = cell[i:i + per_batch]
                            missing = [_key(model_name, task, n, d, s, p, name, plugins) not in results.done
                                       for d, s, p in batch]
                            if not any(missing):
                                continue
                            if budget.spent_out():
                                complete = False
                                log(f"[longctx] stopping: {max_seconds:.0f} s budget reached; run again with "
                                    "--resume to continue")
                                return {"keys": keys, "order": order, "complete": False, "made": made,
                                        "failed": failed}
                            bar.set_postfix_str(f"{task} {n} tokens, {name}: {len(batch)} prompt(s) in this "
                                                "forward pass", refresh=True)
                            score = functools.partial(_score_batch, model, name, task=task, length=n,
                                                      device=device, plugins=plugins, spec=spec, refused=refused,
                                                      platform=plat, platform_note=plat_note,
                                                      model_name=model_name, dtype=dtype, tokenizer=tok,
                                                      layers=swap_layers, coverage=cov)
                            with budget.working():
                                rows = score_in_halves(score, batch, op_layers if i == 0 else [])
                            rows = [r for r, m in zip(rows, missing, strict=True) if m]
                            cell_rows += rows
                            for row in rows:
                                row.update(base_fields)
                                results.add(row)
                                results.done.add(row_key(row))
                                made += 1
                                failed += row["status"] == "failed"
                            bar.update(len(rows))
                        _log_cell(log, model_name, task, n, name, cell_rows)
        finally:
            bar.close()
        del loaded, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    begin()
    return {"keys": keys, "order": order, "complete": complete, "made": made, "failed": failed}


OUT_OF_MEMORY = "out of GPU memory: "  # the error of a batch's rows when its forward pass ran out of GPU memory


def score_in_halves(score: Callable[..., list[dict]], batch: list, op_layers: list[int]) -> list[dict]:
    """``score(batch, op_layers=op_layers)``'s rows; where the batch ran out of GPU memory, its halves' rows instead,
    split again as often as needed down to one prompt (a prompt that fails alone keeps its failed row). A failed row
    counts as done for ``--resume``, so a batch too large for this GPU (an H100's 80 GB where the grid's batch was
    sized on an H200's 141 GB) must not leave failed rows behind. ``op_layers`` (where the operator error is measured,
    on the batch's first prompt) go with the first half only."""
    rows = score(batch, op_layers=op_layers)
    if len(batch) > 1 and rows and all(r["status"] == "failed" and (r.get("error") or "").startswith(OUT_OF_MEMORY)
                                       for r in rows):
        if torch.cuda.is_available():  # pragma: no cover - GPU only
            torch.cuda.empty_cache()
        half = len(batch) // 2
        return score_in_halves(score, batch[:half], op_layers) + score_in_halves(score, batch[half:], [])
    return rows


def _paired_recipe(name: str, plugins) -> str | None:
    if name == STOCK:
        return None
    for p in plugins:
        if p.name == name:
            return p.recipe
    fn = model_attention(name)
    return fn.impl.recipe if fn.impl is not None else fn.recipe.name


def _key(model_name, task, n, d, s, p, name, plugins) -> tuple:
    return row_key({"input": row_input(model_name, task, n, d, s), "input_content_hash": p.sha256,
                    "recipe": _paired_recipe_cached(name, plugins), "implementation": name})


_PAIRED: dict[tuple, str | None] = {}


def _paired_recipe_cached(name: str, plugins) -> str | None:
    k = (name, tuple(id(p) for p in plugins))
    if k not in _PAIRED:
        _PAIRED[k] = _paired_recipe(name, plugins)
    return _PAIRED[k]


def _score_batch(model, name, batch, *, task, length, device, plugins, spec, op_layers, refused, platform,
                 platform_note, model_name, dtype, tokenizer, layers=None, coverage: Coverage | None = None
                 ) -> list[dict]:
    """Run one batch of prompts of the same length under implementation ``name``; one row per prompt."""
    t0 = time.perf_counter()
    op: dict[str, float] = {}

    def on_output(layer, q, k, v, out, sm_scale, window):
        if layer in op_layers and str(layer) not in op:
            ref = attention_fp64(q[:1], k[:1], v[:1], causal=True, sm_scale=sm_scale, window=window,
                                 device=q.device)[0]
            op[str(layer)] = rel_l2(out[:1], ref)

    fn = None if name == STOCK else model_attention(name, fallback=spec.fallback, plugins=plugins,
                                                    on_output=on_output)
    paired = _paired_recipe_cached(name, plugins)
    if fn is not None and fn.impl is None:
        what_platform, note = fn.recipe.platform, "emulated"
    elif fn is not None:
        what_platform, note = platform, platform_note or "real kernel on the run's device"
    else:
        what_platform, note = platform, "the model's own attention"
    common = {"kind": "longctx", "task": task, "length": int(length), "implementation": name, "recipe": paired,
              "platform": what_platform, "platform_note": note,
              "accumulation": accumulation(fn, platform) if fn is not None else "stock attention",
              **spec.row_tags.get(name, {})}
    rows = []
    error = refused.get(name)
    status = ("nonconforming" if error.startswith("nonconforming: ") else "unsupported") if error else "ok"
    hidden = None
    ran: dict[str, list[int]] = {}
    if error is None:
        ids = torch.tensor([p.ids for _, _, p in batch], dtype=torch.long, device=device)
        swap = swap_attention(model, fn, layers=layers) if fn is not None else contextlib.nullcontext()
        try:
            with torch.no_grad(), swap:
                hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
            ran = fn.ran_summary() if fn is not None else {f"stock sdpa ({dtype})": "all"}
        except (UnsupportedLayerError, UnsupportedMaskError) as e:
            status, error = "unsupported", str(e)
            refused[name] = error
        except ImplementationError as e:
            status, error = "failed", str(e)
        except torch.cuda.OutOfMemoryError as e:  # pragma: no cover - GPU only
            status, error = "failed", OUT_OF_MEMORY + str(e).splitlines()[0]
    seconds = time.perf_counter() - t0
    for i, (d, s, p) in enumerate(batch):
        row = {**common, "input": row_input(model_name, task, length, d, s), "input_content_hash": p.sha256,
               "fact_id": fact_id(task, s), "haystack": p.meta.get("haystack"),
               "depth": float(d), "depth_actual": p.depth_actual, "seed": int(s), "answer_text": p.answer_text,
               "answer_tokens": len(p.answer), "status": status, "error": error,
               "text_sha256": p.meta.get("text_sha256"), "text_offset": p.meta.get("text_offset"),
               "seconds": seconds / len(batch), "batch": len(batch)}
        if hidden is not None:
            row.update(_score(model, tokenizer, hidden[i], p))
            row["ran"] = ran
            row["layers_by_impl"] = coverage.layers_by_impl(name, dtype) if coverage is not None else ran
            if spec.generate > 0:
                row.update(_generated(model, tokenizer, p, fn, spec.generate, layers=layers, device=device,
                                      name=name, dtype=dtype))
            row["op_rel_l2"] = dict(op) if i == 0 and op else None
            row["op_rel_l2_mean"] = (sum(op.values()) / len(op)) if i == 0 and op else None
        else:
            row.update(exact=None, answer_logprob=None, answer_logprob_mean=None, first_token_rank=None,
                       greedy_answer=None, ran=None, op_rel_l2=None, op_rel_l2_mean=None)
        rows.append(row)
    return rows


def _generated(model, tokenizer, p, fn, extra: int, *, layers, device, name: str, dtype: str) -> dict[str, Any]:
    """The answer decoded greedily after the question, with ``fn`` in the prefill and every decode step, scored
    by :func:`zyfa.accuracy.longctx.tasks.score_generated`; stops at a newline."""
    prompt = p.ids[:len(p.ids) - (len(p.answer) - 1)]

    def stop(tokens: list[int]) -> bool:
        return "\n" in tokenizer.decode(tokens)

    try:
        g = greedy_generate(model, prompt, fn, max_new_tokens=len(p.answer) + int(extra), device=device,
                            layers=layers, stop=stop, dtype=dtype,
                            eos_ids=[tokenizer.eos_token_id] if isinstance(tokenizer.eos_token_id, int) else [])
    except (UnsupportedLayerError, UnsupportedMaskError, ImplementationError) as e:
        return {"gen_text": None, "gen_exact": None, "gen_contains": None, "gen_recall": None,
                "gen_error": str(e)}
    text = tokenizer.decode(g.tokens)
    return {"gen_text": text, **score_generated(text.split("\n")[0], p), "gen_tokens": len(g.tokens),
            "gen_decode": g.decode, "gen_decode_note": g.decode_note(name), "gen_ran_decode": g.ran_decode,
            "gen_seconds": round(g.seconds, 3)}


def accumulation(fn: ModelAttention, platform: str | None) -> str:
    """How the implementation's FP8 dots accumulate where it runs (the long-context hypothesis, docs/LONGCTX.md):
    ``high precision`` (no FP8: bf16/fp32 recipes, SDPA), ``matrix_unit never flushed``, ``matrix_unit flushed every
    N KV tiles``, ``fp32`` (true fp32 sums: the mi355x platform) or ``fp32 via k=32 flushes`` (a true fp32 sum kept
    on Hopper by flushing the tensor cores' accumulator every k=32 step)."""
    if fn.impl is None:
        r = fn.recipe
    else:
        pr = pairing(fn.impl, platform)
        if pr is None:
            return "unknown (no paired recipe)"
        r = pr.recipe
    if "e4m3" not in r.q_format and "e5m2" not in r.q_format and "int8" not in r.q_format:
        return "high precision"
    if r.accumulator == "matrix_unit":
        if r.accum_flush_tiles == 0:
            return "matrix_unit never flushed"
        return f"matrix_unit flushed every {r.accum_flush_tiles} KV tile" + ("s" if r.accum_flush_tiles > 1 else "")

    plat = get_platform(r.platform)
    return "fp32 via k=32 flushes" if plat.fp8_pv != "fp32" else "fp32"


def _score(model, tokenizer, hidden: torch.Tensor, p) -> dict[str, Any]:
    """Answer log probability, greedy exact match and first-token rank from one prompt's final hidden states."""
    n, a = hidden.shape[0], len(p.answer)
    logits = logits_from_hidden(model, hidden[n - a:n])
    lp = torch.log_softmax(logits.double(), dim=-1)
    tgt = torch.tensor(p.answer, dtype=torch.long, device=lp.device)
    tok_lp = lp.gather(1, tgt.view(-1, 1)).view(-1)
    greedy = lp.argmax(dim=-1)
    if not bool(torch.isfinite(tok_lp).all()):
        return {"exact": False, "answer_logprob": None, "answer_logprob_mean": None, "first_token_rank": None,
                "greedy_answer": None, "nonfinite_logits": True}
    return {
        "exact": bool((greedy == tgt).all()),
        "answer_logprob": float(tok_lp.sum()),
        "answer_logprob_mean": float(tok_lp.mean()),
        "first_token_rank": int((lp[0] > lp[0, tgt[0]]).sum()),
        "greedy_answer": tokenizer.decode(greedy.tolist()),
    }


def _log_cell(log, model_name, task, n, name, rows: list[dict]) -> None:
    ok = [r for r in rows if r.get("status") == "ok"]
    if not rows:
        return
    if not ok:
        log(f"[longctx] {model_name} {task} L{n} {name}: {rows[0]['status']}: {rows[0].get('error')}")
        return
    acc = sum(bool(r["exact"]) for r in ok) / len(ok)
    lps = [r["answer_logprob"] for r in ok if r.get("answer_logprob") is not None]
    mean_lp = sum(lps) / len(lps) if lps else math.nan
    log(f"[longctx] {model_name} {task} L{n} {name}: exact {acc:.2f} ({len(ok)} prompts), log p(answer) "
        f"{mean_lp:.2f}")
