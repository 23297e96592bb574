"""The README's and docs/FINDINGS.md's verdict rows are generated (accuracy.study.findings) from the committed
result and plan files: each file's block must equal the generated one, so that neither drifts from the data."""

from __future__ import annotations

from pathlib import Path

import pytest

from accuracy.study.findings import BEGIN, END, TARGETS, findings, render, replace_block

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def block():
    return render(findings(ROOT))


@pytest.mark.parametrize("name", TARGETS)
def test_the_committed_block_is_the_generated_one(block, name):
    text = (ROOT / name).read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    mine = text[text.index(BEGIN):text.index(END) + len(END)]
    assert mine == block, f"{name}: regenerate with python -m accuracy.study.findings --write"


def test_every_row_states_condition_unit_n_interval_and_verdict(block):
    rows = [line for line in block.splitlines() if line.startswith("| ") and "(generated)" not in line]
    assert len(rows) == len(findings(ROOT))
    for row in rows:
        question, condition, unit, figure, verdict, source = (c.strip() for c in row.strip("| ").split(" | "))
        assert "n = " in unit and condition and verdict and "`studies/" in source
        if verdict.startswith("untested"):
            assert "n = 0" in unit and figure == "–"
        else:
            assert "[" in figure and "tokens" in condition and "head dim" in condition
        if "inconclusive" in verdict.split(";")[0]:
            assert "detectable" in verdict.split(";")[0]  # a null says what it could have seen
    # the hd128 claims: intervals over the 28 layers, not the 336 heads as if independent
    assert sum("n = 336 in 28 layers (interval over layers)" in r for r in rows) == 3
    # the technique-1 sensitivity: each claim says under how many variants its verdict holds, and which change it
    assert sum("technique-1 variants against zyfa on the same 14 even layers" in r for r in rows) == 3
    # (the plain chord puts zyfa's kernel-only error above CK's: the deq verdict rests on our MAD choice)
    assert any("`zyfa:mad_rounding=nearest,mad_offset=0`: deq contradicted (above the range)" in r for r in rows)
    # the long-context accumulator plan has no rows yet: said so, not counted as "no"
    assert any("never-flushed" in r and "untested at the condition" in r for r in rows)


def test_a_file_without_the_markers_is_refused():
    with pytest.raises(ValueError, match="no generated findings block"):
        replace_block("# README\n", "x")
    assert replace_block(f"a\n{BEGIN}\nold\n{END}\nb", "NEW") == "a\nNEW\nb"
