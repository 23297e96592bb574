"""The report's real-vs-emulated table, built from recorded rows (tests/report/fixtures/real_rows_cpu.jsonl,
made by tests/report/fixtures/record_real_rows.py on a CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from zyfa.accuracy.implementations.conformance import pairing_warning
from zyfa.accuracy.implementations.plugins import load_plugin
from zyfa.accuracy.report.blocks import blocks_markdown
from zyfa.accuracy.report.real_kernels import not_run, real_kernel_blocks, real_vs_emulated
from zyfa.accuracy.scoring.tolerances import KERNEL_VS_EMULATION

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "real_rows_cpu.jsonl"


@pytest.fixture(scope="module")
def recorded():
    lines = [json.loads(s) for s in FIXTURE.read_text().splitlines() if s.strip()]
    return [r for r in lines if r.get("record") != "provenance"], lines[0]


def test_one_entry_per_compared_row(recorded):
    rows, _ = recorded
    table = real_vs_emulated(rows)
    compared = [r for r in rows if r.get("status") == "ok" and r.get("recipe")]
    assert [(t["implementation"], t["input"], t["recipe"]) for t in table] == \
        [(r["implementation"], r["input"], r["recipe"]) for r in compared]
    for t, r in zip(table, compared, strict=True):
        basis = "orig" if r["quantizes"] == "self" else "deq"  # self-quantizing kernels: total error
        assert t["basis"] == basis
        assert t["real_rel_l2"] == r[f"{basis}_rel_l2"] and t["emu_rel_l2"] == r[f"emu_{basis}_rel_l2"]
        ratio = r[f"{basis}_rel_l2"] / r[f"emu_{basis}_rel_l2"]
        assert t["ratio"] == pytest.approx(ratio, rel=1e-12)
        assert t["flagged"] == (not KERNEL_VS_EMULATION.low <= ratio <= KERNEL_VS_EMULATION.high)
        assert t["real_vs_emu_rel_l2"] == r["real_vs_emu_rel_l2"]
    # the recorded rows hold both kinds: the example plug-in off its emulation, SDPA BF16 on it
    assert any(t["flagged"] for t in table) and any(not t["flagged"] for t in table)


def test_not_run_lists_failures_unsupported_and_unavailable(recorded):
    rows, prov = recorded
    missing = not_run(rows, prov)
    statuses = {(m["implementation"], m["status"]) for m in missing}
    assert ("plugin:broken_kernel.py:attention", "failed") in statuses
    assert ("sdpa-bf16:flash", "unsupported") in statuses
    assert ("cudnn-fp8", "unavailable") in statuses
    failed = next(m for m in missing if m["status"] == "failed")
    assert failed["reason"].startswith("kernel 'broken_kernel.py:attention' returned shape")


def test_markdown(recorded):
    rows, prov = recorded
    md = "\n".join(blocks_markdown(real_kernel_blocks(rows, prov)))
    assert "## Real kernels vs their emulations" in md
    table = real_vs_emulated(rows)
    n_flag = sum(t["flagged"] for t in table)
    assert f"{n_flag} of {len(table)} fall outside [0.97, 1.03]" in md
    assert md.count("| outside |") == n_flag
    assert "| cudnn-fp8 | all | unavailable | no CUDA device |" in md
    assert real_kernel_blocks([{"recipe": "zyfa", "deq_rel_l2": 0.01}]) == []  # recipe rows only: no section


def _row(impl, ratio):
    return {"real": True, "status": "ok", "recipe": "bf16", "implementation": impl, "input": f"in-{impl}",
            "ratio_basis": "deq", "deq_rel_l2": 2e-3 * ratio, "emu_deq_rel_l2": 2e-3, "real_vs_emu_rel_l2": 1e-3}


def test_flagged_implementations_get_their_measured_cause_or_none_named():
    from zyfa.accuracy.report.real_kernels import MEASURED_CAUSES

    rows = [_row("sdpa-bf16:flash", 0.94), _row("mystery-kernel", 1.10), _row("sdpa-bf16:cudnn", 1.0)]
    md = "\n".join(blocks_markdown(real_kernel_blocks(rows)))
    cause = next(line for line in md.splitlines() if line.startswith("Why the flagged rows are outside"))
    assert f"`sdpa-bf16:flash`: {MEASURED_CAUSES['sdpa-bf16:flash']}" in cause
    assert "split-KV" in cause
    assert "`mystery-kernel`: cause not established." in cause
    assert "sdpa-bf16:cudnn" not in cause  # inside the band: nothing to explain
    # no flagged row, no paragraph
    md_ok = "\n".join(blocks_markdown(real_kernel_blocks([_row("sdpa-bf16:cudnn", 1.0)])))
    assert "Why the flagged rows" not in md_ok


def test_a_flagged_kernel_paired_with_another_granularity_names_the_pairing(tmp_path):
    """Issue 45 item 7: a per-head kernel paired with a per-tensor recipe: the pairing is the named cause."""
    p = tmp_path / "per_head.py"
    p.write_text("def kern(q, k, v, *, causal, sm_scale, window):\n    return q\n\n\nkern.quantization = 'head'\n")
    impl = load_plugin(f"{p}:kern", recipe="zyfa", in_process=True)
    warning = pairing_warning(impl)
    assert warning and "per head (the recipe: per tensor)" in warning
    row = {**_row(impl.name, 1.10), "pairing_warning": warning}
    md = "\n".join(blocks_markdown(real_kernel_blocks([row, _row("mystery-kernel", 1.10)])))
    cause = next(line for line in md.splitlines() if line.startswith("Why the flagged rows are outside"))
    assert f"`{impl.name}`: the pairing: {impl.name} paired with zyfa, which quantizes otherwise" in cause
    assert "`mystery-kernel`: cause not established." in cause
