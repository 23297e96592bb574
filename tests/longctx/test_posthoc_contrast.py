"""scripts/posthoc_contrast.py on the committed rows of the hd128 accumulator plan: every line marked post hoc, the
fact as the unit, and bad input refused in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "posthoc_contrast.py"
PLAN = ROOT / "studies" / "accumulator-hd128.toml"
ROWS = ROOT / "reports" / "accumulator-hd128" / "results-qwen25coder-1.5b.jsonl"


def _run(*argv):
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300)


def test_a_contrast_outside_the_rule_is_printed_as_post_hoc():
    r = _run("--plan", str(PLAN), "--rows", str(ROWS), "--contrast", "stock,triton:fa3")
    assert r.returncode == 0, r.stderr
    head, *cells = r.stdout.strip().splitlines()
    assert "post hoc" in head and "not corrected" in head and "triton:fa3 − stock" in head
    # 2 tasks x 3 lengths x 2 metrics, each over the 50 facts of its cell
    assert len(cells) == 12 and all(c.endswith("(post hoc)") and "in 50 facts" in c for c in cells)
    # the plan's own primary contrast is not printed here: only the one asked for
    assert not any("accum_flush_tiles" in c for c in cells)


def test_bad_input_is_one_line():
    r = _run("--plan", str(PLAN), "--rows", str(ROWS), "--contrast", "stock,triton:zyfa")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "triton:zyfa has no rows under this plan" in r.stderr
    r = _run("--plan", str(PLAN), "--rows", str(ROWS), "--contrast", "stock")
    assert r.returncode == 2 and "give two implementations as A,B" in r.stderr and r.stderr.count("\n") == 1
    other = ROOT / "studies" / "accumulator.toml"
    r = _run("--plan", str(other), "--rows", str(ROWS), "--contrast", "stock,triton:fa3")
    assert r.returncode == 2 and "no rows of plan accumulator" in r.stderr
