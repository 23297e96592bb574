"""The report's "real vs emulated" part: each real implementation's error beside its emulation's (torch-free).

Built from result rows only (``real: true`` rows of :func:`zyfa.accuracy.operator.runner.run_accuracy` with
implementations):
one table row per (implementation, input) with the real kernel's error against the FP64 oracle, its paired
recipe's emulation error on the same reference, their ratio and the rel-L2 between the two outputs; rows whose
ratio falls outside :data:`zyfa.accuracy.scoring.tolerances.KERNEL_VS_EMULATION` are flagged. Implementations that
failed, could not take an input, or were not available on the machine are listed with the reason.

Exposed:
    MEASURED_CAUSES: {implementation: why its rows fall outside the band}, each measured (docs/real_kernels.md)
    real_vs_emulated(rows) -> list[dict]     one dict per compared (implementation, input)
    not_run(rows, provenance=None) -> list[dict]   failed / unsupported rows and unavailable implementations
    real_kernel_blocks(rows, provenance=None) -> list[tuple]   report blocks (accuracy.report.blocks)
    split_real(rows) -> (recipe rows, real rows);  unavailable_of(provenances) -> {name: reason}
    measured_on(row) -> str   the device a real row ran on ("H200"; its device_name without "NVIDIA ")
    measured_label(row) -> str   a real kernel's name in the recipe tables: "cudnn-fp8 (real, H200)"
    report_section(rows, provenances) -> add(doc, plots)   for build_report(..., sections=[...])
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from zyfa.accuracy.report.blocks import fmt
from zyfa.accuracy.scoring.tolerances import KERNEL_VS_EMULATION

__all__ = ["MEASURED_CAUSES", "measured_label", "measured_on", "not_run", "real_kernel_blocks",
           "real_vs_emulated", "report_section", "split_real", "unavailable_of"]

# Why a built-in implementation's rows fall outside KERNEL_VS_EMULATION, where that was measured; the report names the
# cause under its table, and says "cause not established" for a flagged implementation missing here.
MEASURED_CAUSES = {
    "sdpa-bf16:flash": (
        "FA2's split-KV forward. Where batch x heads x ceil(s_q / 64) query blocks fill less than 0.8 of two "
        "CTAs per SM (every study input on the H200's 132 SMs), FA2 cuts the keys into splits, runs each split's "
        "online softmax on its own, so each split's P is rounded to bf16 against that split's own row max (its "
        "largest P is exactly 1), and combines the splits through their LSEs in fp32. The `bf16` recipe has one "
        "softmax over all keys, so its error is higher. A model of that forward "
        "(`python3 scripts/explain_sdpa_flash.py fit`, docs/real_kernels.md) reproduces 99.97-99.99% of FA2's "
        "one-hot probe outputs bit for bit and FA2's ratio on every Gaussian input of the study to within 0.001 "
        "(0.9392 for 0.9392 on d256, 0.9636 for 0.9635 on d128 at 2K)."),
}


def _cause(name: str, rows: Sequence[dict]) -> str:
    """Why ``name``'s rows fall outside the band: the measured cause, else the pairing mismatch its rows carry
    (a kernel reporting a quantization granularity its recipe does not have: ``pairing_warning``), else "cause
    not established."."""
    if name in MEASURED_CAUSES:
        return MEASURED_CAUSES[name]
    warned = next((r["pairing_warning"] for r in rows if r.get("implementation") == name
                   and isinstance(r.get("pairing_warning"), str)), None)
    if warned:
        return f"the pairing: {warned.rstrip('.')}."
    return "cause not established."


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def measured_on(row: dict) -> str:
    """The device a real row ran on, as the report names it: the row's ``device_name`` without the vendor
    prefix "NVIDIA " (e.g. "H200"), else its ``device`` ("cpu"), else "?"."""
    return str(row.get("device_name") or row.get("device") or "?").removeprefix("NVIDIA ")


def measured_label(row: dict) -> str:
    """A real kernel's name in the report's recipe tables: ``<implementation> (real, <device>)``."""
    return f"{row.get('implementation') or row.get('recipe')} (real, {measured_on(row)})"


def real_vs_emulated(rows: Sequence[dict]) -> list[dict]:
    """One entry per real row that ran and has a paired emulation, in row order.

    The errors compared are on the row's ``ratio_basis``: ``deq`` (against FP64 on the recipe's dequantized
    inputs) for kernels that take the recipe's FP8 values or none, ``orig`` (against FP64 on the original
    inputs) for kernels that quantize for themselves.

    Each entry names the emulation compared (``paired_spec``, ``paired_platform``: the recipe on the platform of
    the device the kernel ran on, :func:`zyfa.accuracy.implementations.base.pairing`); rows recorded before the
    pairing was (``pairing_recorded`` False) show their claimed recipe and no platform. ``no_platform_model``: the
    device had no platform model, so the recipe's own platform was emulated (flagged in the table).
    """
    out = []
    for r in rows:
        if not r.get("real") or r.get("status", "ok") not in ("ok", "suspect") or not r.get("recipe"):
            continue
        basis = r.get("ratio_basis") or "deq"
        real, emu = _num(r.get(f"{basis}_rel_l2")), _num(r.get(f"emu_{basis}_rel_l2"))
        if real is None or emu is None:
            continue
        ratio = real / emu if emu > 0 else None
        recorded = "paired_spec" in r
        no_model = recorded and r.get("device_platform") is None and bool(r.get("pairing_note"))
        out.append({
            "implementation": r.get("implementation"), "input": r.get("input"), "recipe": r.get("recipe"),
            "paired_spec": r.get("paired_spec") if recorded else r.get("recipe"),
            "paired_platform": r.get("paired_platform") if recorded else None,
            "pairing_recorded": recorded, "pairing_note": r.get("pairing_note") or "",
            "no_platform_model": no_model,
            "device_name": r.get("device_name"), "basis": basis, "real_rel_l2": real, "emu_rel_l2": emu,
            "ratio": ratio, "real_vs_emu_rel_l2": _num(r.get("real_vs_emu_rel_l2")),
            "flagged": not KERNEL_VS_EMULATION.contains(ratio),
            "scale_o_choice": r.get("scale_o_choice"),
        })
    return out


def not_run(rows: Sequence[dict], provenance: dict | None = None) -> list[dict]:
    """Real rows that failed or were unsupported, and implementations the run's provenance lists as not
    available (``implementations_unavailable``: name -> reason)."""
    out = [{"implementation": r.get("implementation"), "input": r.get("input"), "status": r.get("status"),
            "reason": r.get("error") or r.get("reason") or ""}
           for r in rows if r.get("real") and r.get("status", "ok") not in ("ok", "suspect")]
    for name, reason in ((provenance or {}).get("implementations_unavailable") or {}).items():
        out.append({"implementation": name, "input": "all", "status": "unavailable", "reason": reason})
    return out


def split_real(rows: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    """(recipe rows, real-implementation rows) of a result set."""
    return [r for r in rows if not r.get("real")], [r for r in rows if r.get("real")]


def unavailable_of(provenances: Sequence[dict]) -> dict:
    """``implementations_unavailable`` of several result files' provenances, merged."""
    out: dict = {}
    for p in provenances:
        out.update(p.get("implementations_unavailable") or {})
    return out


def report_section(rows: Sequence[dict], provenances: Sequence[dict] = ()):
    """A ``build_report(..., sections=[...])`` callable ``add(doc, plots)`` appending the real-kernel part."""
    blocks = real_kernel_blocks(rows, {"implementations_unavailable": unavailable_of(provenances)})

    def add(doc, plots: bool) -> None:
        doc.blocks.extend(blocks)

    return add


def _flag(t: dict) -> str:
    return ", ".join(f for f, on in (("outside", t["flagged"]), ("no platform model", t["no_platform_model"]))
                     if on)


def real_kernel_blocks(rows: Sequence[dict], provenance: dict | None = None) -> list[tuple]:
    """Report blocks: the "real vs emulated" table and what was not run; empty when no real rows exist and
    nothing was unavailable."""
    table = real_vs_emulated(rows)
    missing = not_run(rows, provenance)
    if not table and not missing:
        return []
    lo, hi = KERNEL_VS_EMULATION
    blocks: list[tuple] = [("h", 2, "Real kernels vs their emulations")]
    if table:
        devices = sorted({t["device_name"] for t in table if t["device_name"]})
        n_flag = sum(t["flagged"] for t in table)
        n_model = sum(t["no_platform_model"] for t in table)
        n_old = sum(not t["pairing_recorded"] for t in table)
        blocks.append(("p", (
            f"Each real kernel ran on the same inputs as the emulation of what it computes where it ran"
            f"{' (measured on ' + ', '.join(devices) + ')' if devices else ''}: its recipe on the platform of "
            "that device (`paired emulation`, `platform`; `zyfa@h200` is zyfa with the H200's FP8 accumulation, "
            "`triton:<recipe>` the recipe as our Triton kernel computes it). Errors are rel-L2 against the "
            "FP64 oracle: on the recipe's dequantized inputs (`deq`) for kernels that take the recipe's FP8 "
            "values, on the original inputs (`orig`) for kernels that quantize for themselves. The ratio is "
            f"real / emulated; {n_flag} of {len(table)} fall outside [{lo}, {hi}] (flagged `outside`). The "
            "column before the flag is the rel-L2 between the two outputs."
            + (f" {n_model} ran on a device with no platform model: compared with the recipe's own platform, "
               "flagged `no platform model`." if n_model else "")
            + (f" {n_old} rows were recorded before the pairing was (no `platform`): compared with the recipe "
               "on its own platform." if n_old else ""))))
        header = ["implementation", "input", "paired emulation", "platform", "basis", "real error",
                  "emulation error", "ratio", "real vs emulation", "flag"]
        body = [[t["implementation"], t["input"], t["paired_spec"], t["paired_platform"] or "-", t["basis"],
                 fmt(t["real_rel_l2"]), fmt(t["emu_rel_l2"]), fmt(t["ratio"], "ratio"),
                 fmt(t["real_vs_emu_rel_l2"]), _flag(t)] for t in table]
        blocks.append(("table", "t-real-vs-emulated", header, body, False))
        flagged = sorted({t["implementation"] for t in table if t["flagged"]})
        if flagged:
            blocks.append(("p", "Why the flagged rows are outside: " + " ".join(
                f"`{name}`: {_cause(name, rows)}" for name in flagged)))
    if missing:
        blocks.append(("p", "Not run, and why:"))
        blocks.append(("table", "t-real-not-run", ["implementation", "input", "status", "reason"],
                       [[m["implementation"], m["input"], m["status"], m["reason"]] for m in missing], True))
    return blocks
