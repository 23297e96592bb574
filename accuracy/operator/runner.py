"""The accuracy runner: inputs × recipes → result rows, each recipe's error against two FP64 references.

For every input and recipe, :func:`zyfa.emulator.emulate` runs the recipe and the FP64 oracle
(:func:`zyfa.reference.attention.attention_fp64`) gives two references:

- ``deq_*`` metrics: against the oracle on the *dequantized* inputs the recipe saw (``Emulation.q_deq`` …):
  the error the kernel's own arithmetic adds (P rounding, row sums, accumulation, output rounding);
- ``orig_*`` metrics: against the oracle on the *original* inputs: the total error a user sees, including
  the quantization of Q, K and V.

The original reference is computed once per input; the dequantized one once per distinct quantization of
the inputs (recipes that quantize Q/K/V alike share it; a shared reference is checked to be for
bit-identical dequantized inputs before reuse, and one whose inputs equal the originals reuses the
original reference).

A run can skip (input, recipe) pairs already done (``skip``: keys of :func:`zyfa.accuracy.io.results_io.row_key`) and
hand each row to ``on_row`` as it finishes (``zyfa accuracy --out`` appends it to disk there), so a killed run
keeps its rows and a resumed one makes the same rows as an uninterrupted one. Before an input runs, its
memory need is estimated (:func:`zyfa.accuracy.io.device.memory_estimate_bytes`) and a run that cannot fit is refused
with one line.

Exposed:
    run_accuracy(inputs, recipes, *, device="cpu", progress=True, seed=0, skip=(), on_start=None, on_row=None,
                 run_id=None) -> ResultRows
    input_key(inp, recipe) -> the row key of (inp, recipe)

The device, memory and progress helpers live in :mod:`zyfa.accuracy.io.device`, the result files
(``write_results``, ``read_results``, ``ResultRows``) in :mod:`zyfa.accuracy.io.results_io`.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from zyfa.accuracy.implementations import conformance
from zyfa.accuracy.implementations.base import device_platform, pairing
from zyfa.accuracy.implementations.real_rows import implementation_row
from zyfa.accuracy.inputs.attention_input import AttentionInput
from zyfa.accuracy.io.device import ORACLE_CHUNK, check_memory, progress_bar, resolve_device, sync_device
from zyfa.accuracy.io.provenance import device_name, provenance
from zyfa.accuracy.io.results_io import ResultRows, row_key
from zyfa.accuracy.scoring.metrics import compute_metrics
from zyfa.reference.attention import attention_fp64

from zyfa.dispatch import route_input
from zyfa.emulator import emulate, quantization_key, quantize_inputs
from zyfa.platforms import get_platform
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import Recipe

__all__ = ["input_key", "run_accuracy"]

# Per-metric keys of compute_metrics that describe the output, not the reference: kept once, unprefixed.
_UNPREFIXED = ("has_nan", "nonfinite_frac", "n_rows", "n_zero_ref_rows")



def run_accuracy(
    inputs: AttentionInput | Sequence[AttentionInput],
    recipes: Recipe | str | Sequence[Recipe | str],
    *,
    device: str | torch.device = "cpu",
    progress: bool = True,
    seed: int = 0,
    chunk_size: int = ORACLE_CHUNK,
    skip: Collection[tuple] = (),
    on_start: Callable[[dict], None] | None = None,
    on_row: Callable[[dict], None] | None = None,
    run_id: str | None = None,
    implementations: Sequence = (),
    progress_label: str = "accuracy",
    real_platform: str | None = "auto",
) -> ResultRows:
    """Run every recipe on every input; one flat row per (input, recipe), in that order, then one row per
    (input, implementation) for the real implementations (:mod:`zyfa.accuracy.implementations.registry`).

    Args:
        inputs: attention inputs (:mod:`zyfa.accuracy.inputs.attention_input`).
        recipes: recipe names or :class:`~zyfa.recipes.Recipe` objects.
        device: "cpu", "cuda" or "auto"; the emulator and the oracle both run there.
        progress: a tqdm bar over (input × recipe) on stderr, labelled ``progress_label``.
        seed: seeds torch's global generator before the run (the emulator is deterministic; recorded).
        chunk_size: query rows per block of the FP64 oracle.
        skip: row keys (:func:`zyfa.accuracy.io.results_io.row_key`: input name, content hash, recipe) not to run
            again (a resumed run); the rows made are those an uninterrupted run makes for the other pairs.
        on_start: called with the run's provenance before the first input runs.
        on_row: called with each row as soon as it is made (e.g. to append it to a file).
        run_id: the run's id; default a new random one (a resumed run is a segment with an id of its own: its
            results file lists the earlier segments, whose rows keep theirs).
        implementations: real kernels run beside the recipes on the same inputs and device
            (:class:`accuracy.implementations.base.Implementation`); rows by
            :func:`accuracy.implementations.real_rows.implementation_row`
            (``real: true``, ``implementation``, the paired recipe, ``status``). Those not available here
            (device, package) are not run: the provenance's ``implementations_unavailable`` says why. Those with
            rows to make are first probed (:mod:`zyfa.accuracy.implementations.conformance`;
            ``implementations_conformance`` in the
            provenance): a failed probe makes their ``ok`` rows ``nonconforming``, a paired row outside the
            error-ratio band ``suspect``, and a quantization granularity that differs from the pairing's is
            warned (``pairing_warning``).
        real_platform: the platform whose arithmetic the real implementations have, for their pairing
            (:func:`zyfa.accuracy.implementations.base.pairing`): ``"auto"`` (the device's:
            :func:`zyfa.accuracy.implementations.base.device_platform`, CUDA capability 9.0 -> ``h200``), a
            platform name,
            or None (each recipe's own platform). Recorded in the provenance (``implementations_platform``).

    Returns:
        :class:`ResultRows` of the rows made (not the skipped ones); each row holds ``run_id``, the input's
        name, shape and metadata (``input_*``), the recipe's name and ``recipe_short``, the ``platform`` whose
        arithmetic was emulated (the recipe's: ``NAME@PLATFORM`` recipes carry another), ``has_nan``, the
        ``deq_*`` and ``orig_*`` metrics, the emulator's stats (e.g. ``p_flushed_frac``) and wall times in
        seconds. A recipe that names a vendor kernel carries ``vendor_kernel`` (:mod:`zyfa.dispatch`: the kernel the
        vendor's dispatcher selects for the input's shape); where the recipe does not model that kernel (``aiter``
        at head dim 64, where AITER runs CK's fmha) its row is not computed: ``status`` ``refused`` and a one-line
        ``reason`` with the source, no metrics.

    Raises:
        ValueError: no inputs or recipes, or an input that would not fit in the device's memory.
    """
    inputs = [inputs] if isinstance(inputs, AttentionInput) else list(inputs)
    recipes = [get_recipe(recipes)] if isinstance(recipes, (str, Recipe)) else [get_recipe(r) for r in recipes]
    if not inputs:
        raise ValueError("no inputs given")
    if not recipes and not implementations:
        raise ValueError("no recipes given")
    impls, unavailable = [], {}
    for impl in implementations:
        ok, why = impl.available()
        if ok:
            impls.append(impl)
        else:
            unavailable[impl.name] = why
    dev = resolve_device(device)
    if real_platform == "auto":
        real_plat = device_platform(dev)
    elif real_platform is None:
        real_plat = (None, "no platform asked for (real_platform=None)")
    else:
        real_plat = (get_platform(real_platform).name, "")
    for inp in inputs:
        check_memory(inp.shape, dev, what=f"input {inp.name}")
    skip = set(skip)
    # conformance probes (accuracy.implementations.conformance) of the kernels with rows to make, before any is scored
    probed = [i for i in impls if any(input_key(inp, i.recipe, i.name) not in skip for inp in inputs)]
    confs = {i.name: conformance.probe_cached(i, dev) for i in probed}
    warnings = {i.name: w for i in probed if (w := conformance.pairing_warning(i)) is not None}
    torch.manual_seed(seed)
    run_id = run_id or uuid.uuid4().hex[:12]
    prov = provenance({
        "run_id": run_id,
        "device": str(dev),
        "device_name": device_name(dev),
        "seed": seed,
        "recipes": [r.name for r in recipes],
        "inputs": [inp.name for inp in inputs],
        **({"implementations": [i.name for i in impls], "implementations_unavailable": unavailable,
            "implementations_platform": real_plat[0], "implementations_platform_note": real_plat[1],
            "implementations_conformance": {n: c.record() for n, c in confs.items()},
            "implementations_pairing_warnings": warnings,
            "implementations_plugins": {i.name: i.origin for i in impls if i.plugin and i.origin}}
           if implementations else {}),
    })
    if on_start is not None:
        on_start(prov)  # a resumed run's results file lists its earlier segments in prov (kept by the rows' copy)
    rows = ResultRows(provenance=prov)
    todo = [(inp, [r for r in recipes if input_key(inp, r.name) not in skip]
             + [i for i in impls if input_key(inp, i.recipe, i.name) not in skip]) for inp in inputs]
    bar = progress_bar(sum(len(rs) for _, rs in todo), enabled=progress, unit="row", desc=progress_label)
    try:
        for inp, _ in todo:
            rows.extend(_run_input(inp, recipes, skip, dev, run_id, chunk_size, bar, on_row, impls, real_plat,
                                   confs, warnings))
    finally:
        bar.close()
    return rows


def input_key(inp: AttentionInput, recipe: str | None, implementation: str | None = None) -> tuple:
    """The :func:`zyfa.accuracy.io.results_io.row_key` of the row (inp, recipe) will make; with ``implementation``,
    that real implementation's row (``recipe`` is then its paired recipe or None)."""
    return row_key({"input": inp.name, "input_content_hash": inp.meta.get("content_hash"), "recipe": recipe,
                    "implementation": implementation})


def _run_input(inp: AttentionInput, recipes: list[Recipe], skip: set, dev: torch.device, run_id: str,
               chunk_size: int, bar, on_row, impls=(), real_platform: tuple = (None, ""), confs=None,
               warnings=None) -> list[dict]:
    todo = [r for r in recipes if input_key(inp, r.name) not in skip]
    impls_todo = [i for i in impls if input_key(inp, i.recipe, i.name) not in skip]
    if not todo and not impls_todo:
        return []
    x = inp.to(dev)
    kw = {"causal": x.causal, "sm_scale": x.sm_scale, "window": x.window}
    t0 = time.perf_counter()
    ref_orig = attention_fp64(x.q, x.k, x.v, chunk_size=chunk_size, **kw)
    time_ref_orig = time.perf_counter() - t0
    orig32 = tuple(t.float() for t in (x.q, x.k, x.v))
    # quantization key -> [q_deq, k_deq, v_deq, (out, lse) or None]; cleared per input. Skipped recipes still
    # enter their dequantized inputs (cheap), so each row's ref_deq_source is what an uninterrupted run gives.
    cache: dict[tuple, list] = {}
    emulations: dict[Recipe, tuple] = {}  # recipe -> (out, lse, ref_deq): the pairings of real implementations
    wanted = {p.recipe for p in (pairing(i, *real_platform) for i in impls_todo) if p is not None}
    base = _input_fields(inp)
    rows = []
    for recipe in recipes:
        key = quantization_key(recipe)
        if recipe not in todo:
            if key not in cache:
                deq = quantize_inputs(x.q, x.k, x.v, recipe).dequantized()
                if not all(torch.equal(a, b) for a, b in zip(deq, orig32, strict=True)):
                    cache[key] = [*deq, None]
            continue
        bar.set_postfix_str(f"{inp.name} {recipe.name}")
        decision = route_input(recipe, inp)
        if decision is not None and decision.refused is not None:  # the vendor runs another kernel, or none
            row = {"run_id": run_id, **base, "recipe": recipe.name, "recipe_short": recipe.short_str(),
                   "platform": recipe.platform, "status": "refused", "reason": decision.refused,
                   "vendor_kernel": decision.kernel, "device": str(dev)}
            rows.append(row)
            if on_row is not None:
                on_row(row)
            bar.update(1)
            continue
        t0 = time.perf_counter()
        em = emulate(x.q, x.k, x.v, recipe, **kw)
        sync_device(dev)
        time_emulate = time.perf_counter() - t0

        deq = (em.q_deq, em.k_deq, em.v_deq)
        t0 = time.perf_counter()
        if all(torch.equal(a, b) for a, b in zip(deq, orig32, strict=True)):
            ref_deq, ref_deq_source = ref_orig, "orig"  # no quantization: the same FP64 problem
        elif key in cache and all(torch.equal(a, b) for a, b in zip(deq, cache[key][:3], strict=True)):
            if cache[key][3] is None:  # entered by a skipped recipe
                cache[key][3] = attention_fp64(*deq, chunk_size=chunk_size, **kw)
            ref_deq, ref_deq_source = cache[key][3], "shared"
        else:
            ref_deq = attention_fp64(*deq, chunk_size=chunk_size, **kw)
            cache[key] = [*deq, ref_deq]
            ref_deq_source = "computed"
        time_ref_deq = time.perf_counter() - t0

        if recipe in wanted:
            emulations[recipe] = (em.out, em.lse, ref_deq)
        m_deq = compute_metrics(em.out, ref_deq[0], lse=em.lse, lse_ref=ref_deq[1])
        m_orig = compute_metrics(em.out, ref_orig[0], lse=em.lse, lse_ref=ref_orig[1])
        row: dict[str, Any] = {"run_id": run_id, **base, "recipe": recipe.name, "recipe_short": recipe.short_str(),
                               "platform": em.platform}
        for k in _UNPREFIXED:
            row[k] = m_deq[k]
        row["has_nan"] = bool(m_deq["has_nan"] or m_orig["has_nan"])
        for prefix, m in (("deq_", m_deq), ("orig_", m_orig)):
            row.update({prefix + k: v for k, v in m.items() if k not in _UNPREFIXED})
        for k, v in em.stats.items():
            row[k if k not in row else f"emu_{k}"] = _plain(v)
        row.update({
            "ref_deq_source": ref_deq_source,
            "time_emulate_s": time_emulate,
            "time_ref_deq_s": time_ref_deq,
            "time_ref_orig_s": time_ref_orig,
            "device": str(dev),
        })
        row["vendor_kernel"] = decision.kernel if decision is not None else None
        rows.append(row)
        if on_row is not None:
            on_row(row)
        bar.update(1)

    def paired(r: Recipe) -> tuple:
        """A pairing's emulation on this input and its FP64 reference (run here if no recipe row has)."""
        if r not in emulations:
            em = emulate(x.q, x.k, x.v, r, **kw)
            deq = (em.q_deq, em.k_deq, em.v_deq)
            key = quantization_key(r)
            if all(torch.equal(a, b) for a, b in zip(deq, orig32, strict=True)):
                ref = ref_orig
            elif key in cache and cache[key][3] is not None and all(
                    torch.equal(a, b) for a, b in zip(deq, cache[key][:3], strict=True)):
                ref = cache[key][3]
            else:
                ref = attention_fp64(*deq, chunk_size=chunk_size, **kw)
            emulations[r] = (em.out, em.lse, ref)
        return emulations[r]

    for impl in impls_todo:
        bar.set_postfix_str(f"{inp.name} {impl.name}")
        row = implementation_row(impl, x, base={"run_id": run_id, **base}, ref_orig=ref_orig, paired=paired,
                                 device=dev, platform=real_platform)
        conformance.apply(row, (confs or {}).get(impl.name))
        if (warnings or {}).get(impl.name):
            row["pairing_warning"] = warnings[impl.name]
        rows.append(row)
        if on_row is not None:
            on_row(row)
        bar.update(1)
    return rows


def _input_fields(inp: AttentionInput) -> dict[str, Any]:
    fields: dict[str, Any] = {"input": inp.name, **inp.shape, "causal": bool(inp.causal), "window": inp.window,
                              "sm_scale": inp.sm_scale if inp.sm_scale is not None
                              else 1.0 / math.sqrt(inp.shape["head_dim"]),
                              "dtype": str(inp.q.dtype).replace("torch.", "")}
    fields.update(_flatten(inp.meta, "input_"))
    return fields


def _flatten(d: dict, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}_"))
        else:
            out[f"{prefix}{k}"] = _plain(v)
    return out


def _plain(v):
    """Python scalars/lists for JSON (tensors and numpy scalars converted)."""
    if isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict, str)):
        return v.item()
    if isinstance(v, tuple):
        return list(v)
    return v


