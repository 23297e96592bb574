"""One result row for one real implementation on one input: its error beside its paired emulation's.

:func:`zyfa.accuracy.operator.runner.run_accuracy` calls :func:`implementation_row` for each (input, implementation)
after the input's recipe rows, with the input's FP64 oracle on the original inputs and a function giving the paired
recipe's emulation and its FP64 reference on the recipe's dequantized inputs (shared with the recipe rows).

Row fields (besides the input's fields and ``run_id``):

- ``implementation``, ``real: true``, ``recipe`` (the recipe it claims, or None), ``recipe_short``,
  ``quantizes`` (``recipe`` / ``self`` / ``none``), ``device``, ``device_name``, ``device_platform`` (the
  platform of the device it ran on, None where none is modelled);
- with a recipe, the emulation it is compared with (:func:`zyfa.accuracy.implementations.base.pairing`):
``paired_spec``
  (the emulated recipe's name, e.g. ``zyfa@h200``; `` (scale_o: oracle amax)`` appended where its FP8 output is
  scaled by the oracle's amax, as the kernel's), ``paired_platform`` and ``pairing_note`` (why not the device's
  platform; empty when it is);
- ``status``: ``ok``, ``failed`` (``error``: one line naming the kernel) or ``unsupported`` (``reason``); the
  runner then makes an ``ok`` row ``nonconforming`` (the kernel failed a conformance probe) or ``suspect`` (its
  error ratio is outside the band), with ``reason`` (:func:`zyfa.accuracy.implementations.conformance.apply`); a
  plug-in whose mask fails on this input's own lengths is ``nonconforming`` here (``scored_mask_check``: ``passed``,
  ``failed``, ``none`` where the mask hides nothing, ``skipped: why``;
  :func:`accuracy.implementations.conformance.scored_mask_check`);
- ``orig_*`` metrics against FP64 on the original inputs; with a paired recipe also ``deq_*`` against FP64
  on the recipe's dequantized inputs where the kernel received them (``quantizes`` ``recipe`` or ``none``; a
  kernel that quantizes for itself, every plug-in, never saw them and has no ``deq_*``), the emulation's
  ``emu_deq_rel_l2`` and ``emu_orig_rel_l2``,
  ``ratio_basis`` (``deq``, or ``orig`` for kernels that quantize for themselves), ``real_emu_ratio`` (real
  error / emulation error on that basis) and ``real_vs_emu_rel_l2`` (between the two outputs);
- what the implementation reported (``scale_o_choice``, ``scale_o``, package versions, ...), ``time_real_s``.

Exposed: ``implementation_row(impl, x, *, base, ref_orig, paired, device, platform=...) -> dict``,
``row_label(row)``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
from zyfa.accuracy.implementations.base import (
    Implementation,
    ImplementationError,
    call_implementation,
    device_platform,
    pairing,
    unsupported_reason,
)
from zyfa.accuracy.implementations.conformance import scored_mask_check
from zyfa.accuracy.inputs.attention_input import AttentionInput
from zyfa.accuracy.io.provenance import device_name
from zyfa.accuracy.scoring.metrics import compute_metrics

from zyfa.formats import round_to_fp8
from zyfa.norms import rel_l2
from zyfa.recipe_spec import get_recipe

__all__ = ["implementation_row", "row_label"]

_UNPREFIXED = ("has_nan", "nonfinite_frac", "n_rows", "n_zero_ref_rows")


def row_label(row: dict) -> str:
    """What a table calls the row: the implementation's name for real rows, else the recipe's."""
    return row.get("implementation") or row.get("recipe") or "?"


def _metrics(out, ref: tuple, lse, row: dict) -> dict:
    """compute_metrics with the LSE where it can be compared (a kernel's LSE whose -inf rows disagree with the
    oracle's is left out, with the reason in ``lse_error``)."""
    if lse is not None:
        try:
            return compute_metrics(out, ref[0], lse=lse, lse_ref=ref[1])
        except ValueError as e:
            row["lse_error"] = str(e)
    return compute_metrics(out, ref[0])


def _paired_output(pair, paired: Callable, oracle_amax: float) -> tuple:
    """(the paired emulation's output, its FP64 reference on the dequantized inputs). With ``scale_o ==
    "oracle"`` the recipe is emulated with an fp32 output, then rounded to e4m3fn at scale 448 / the oracle's
    amax, as the kernel does (the emulator's own e4m3fn output takes its scale from its own amax)."""
    if pair.scale_o != "oracle":
        out, _lse, ref = paired(pair.recipe)
        return out, ref
    r = pair.recipe
    out, _lse, ref = paired(r.replace(name=f"{r.name}:out_format=fp32", out_format="fp32"))
    amax = oracle_amax if math.isfinite(oracle_amax) and oracle_amax > 0 else 448.0
    scale = torch.tensor(448.0 / amax, dtype=torch.float32, device=out.device)  # fp32, as the kernel's scale_o
    return round_to_fp8(out.float() * scale, "e4m3fn") / scale, ref


def implementation_row(impl: Implementation, x: AttentionInput, *, base: dict, ref_orig: tuple,
                       paired: Callable, device: torch.device,
                       platform: tuple[str | None, str] | None = None) -> dict:
    """Run ``impl`` on ``x`` (already on ``device``) and make its row; never raises for the kernel's faults.

    Args:
        base: the input's row fields (``run_id``, name, shape, metadata).
        ref_orig: (out, lse) of the FP64 oracle on the original inputs.
        paired: ``paired(recipe) -> (emulation out, emulation lse, (ref_out, ref_lse) on its dequantized
            inputs)`` for a :class:`~zyfa.recipes.Recipe` (the one
            :func:`zyfa.accuracy.implementations.base.pairing`
            chose).
        platform: (platform name or None, why none) of the device; default
            :func:`zyfa.accuracy.implementations.base.device_platform` of ``device``.
    """
    plat, why_none = platform if platform is not None else device_platform(device)
    row: dict[str, Any] = {**base, "recipe": impl.recipe, "implementation": impl.name, "real": True,
                           "quantizes": impl.quantizes, "device": str(device), "device_name": device_name(device),
                           "device_platform": plat}
    pair = pairing(impl, plat, why_none)
    if impl.recipe is not None:
        row["recipe_short"] = get_recipe(impl.recipe).short_str()
        row.update(paired_spec=pair.spec, paired_platform=pair.recipe.platform, pairing_note=pair.note)
    reason = unsupported_reason(impl, x)
    if reason is not None:
        row.update(status="unsupported", reason=reason)
        return row
    t0 = time.perf_counter()
    try:
        res = call_implementation(impl, x, {"oracle_out_amax": float(ref_orig[0].abs().max())})
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except ImplementationError as e:
        row.update(status="failed", error=str(e))
        return row
    row["time_real_s"] = time.perf_counter() - t0
    out = res.out.to(device)
    lse = res.lse.to(device) if res.lse is not None else None
    m_orig = _metrics(out, ref_orig, lse, row)
    for k in _UNPREFIXED:
        row[k] = m_orig[k]
    row.update({"orig_" + k: v for k, v in m_orig.items() if k not in _UNPREFIXED})
    row["status"] = "ok"
    # the mask at this input's own lengths, not only at the probes' (accuracy.implementations.conformance)
    if impl.plugin:
        outcome, line = scored_mask_check(impl, x, out)
        row["scored_mask_check"] = outcome if outcome != "skipped" else f"skipped: {line}"
        if outcome == "failed":
            row.update(status="nonconforming", reason=line)
    if pair is not None:
        em_out, ref_deq = _paired_output(pair, paired, float(ref_orig[0].abs().max()))
        if impl.quantizes != "self":  # scored on the recipe's inputs only where it received them
            m_deq = _metrics(out, ref_deq, lse, row)
            row["has_nan"] = bool(row["has_nan"] or m_deq["has_nan"])
            row.update({"deq_" + k: v for k, v in m_deq.items() if k not in _UNPREFIXED})
        row["emu_deq_rel_l2"] = rel_l2(em_out, ref_deq[0])
        row["emu_orig_rel_l2"] = rel_l2(em_out, ref_orig[0])
        basis = "orig" if impl.quantizes == "self" else "deq"
        emu = row[f"emu_{basis}_rel_l2"]
        row["ratio_basis"] = basis
        row["real_emu_ratio"] = row[f"{basis}_rel_l2"] / emu if emu > 0 else None
        row["real_vs_emu_rel_l2"] = rel_l2(out, em_out)
    for k, v in res.info.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            row.setdefault(k, v)
    return row
