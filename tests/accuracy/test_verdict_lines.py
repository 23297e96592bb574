"""The terminal summary of the scoring commands: one line per implementation with its verdict and reason, built by
:func:`accuracy.scoring.kernel_verdicts.verdict_lines` from the rows the command wrote (``zyfa accuracy`` and ``zyfa
cliffs`` here; ``zyfa study`` in tests/report/test_study_real_kernels.py, ``zyfa longctx`` in
tests/longctx/test_longctx_cli.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from zyfa.accuracy.io.results_io import read_results
from zyfa.accuracy.scoring.kernel_verdicts import verdict_lines

from zyfa.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fp8_torch_attention.py"
PLUGINS = ROOT / "tests" / "cliffs" / "plugins.py"
SMALL = ["accuracy", "--seq", "64", "--head-dim", "64", "--heads", "2", "--device", "cpu", "--no-progress",
         "--recipes", "fp32"]


def test_zyfa_accuracy_prints_each_implementations_verdict_and_reason(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("def attention(q, k, v, *, causal, sm_scale, window):\n    raise RuntimeError('boom')\n")
    out = tmp_path / "r.jsonl"
    assert main([*SMALL, "--kernel", f"{bad}:attention", "--kernel", f"{EXAMPLE}:attention", "--out", str(out)]) == 3
    err = capsys.readouterr().err
    mine = [x for x in err.splitlines() if x.startswith("zyfa accuracy: ") and " rows failed " not in x]
    expect = [f"zyfa accuracy: {x}" for x in verdict_lines(list(read_results(out)))]
    assert mine == expect
    assert expect == [f"zyfa accuracy: failed: plugin:{bad}:attention: kernel '{bad}:attention' raised RuntimeError: "
                      "boom (on its only row)",
                      f"zyfa accuracy: ok: fp32, plugin:{EXAMPLE}:attention"]


def test_zyfa_cliffs_prints_each_implementations_verdict_and_reason(tmp_path, capsys):
    out = tmp_path / "c"
    refuse, exact = f"{PLUGINS}:refuse_above_32", f"{PLUGINS}:exact"
    assert main(["cliffs", "--kernel", refuse, "--kernel", exact, "--lengths", "30-34", "--head-dim", "64",
                 "--heads", "2", "--kv-heads", "1", "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
    lines = [json.loads(x) for x in (out / "cliffs.jsonl").read_text().splitlines()][1:]
    printed = capsys.readouterr().out.splitlines()
    expect = verdict_lines(lines)
    assert printed[:len(expect)] == expect
    assert expect[0].startswith(f"ok: plugin:{refuse}: declined 2 of 5 rows (refused): ") and "above 32" in expect[0]
    assert expect[1] == f"ok: plugin:{exact}"
