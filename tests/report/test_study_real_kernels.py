"""``zyfa study --kernel`` on a CPU: the example plug-in beside its paired recipe, the built-ins this machine
lacks listed with the reason, the plug-in's rows beside its recipe in the summary and recipe tables."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from zyfa.accuracy.implementations.registry import BASELINE_ONLY, builtin_names

from tests.report.conftest import md_tables

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "datasets" / "smollm2-lee-2048.h5"
EXAMPLE = str(ROOT / "examples" / "fp8_torch_attention.py") + ":attention"


@pytest.mark.skipif(not SAMPLE.is_file(), reason="shipped sample capture datasets/smollm2-lee-2048.h5 absent")
def test_study_with_a_kernel(tmp_path, monkeypatch, capsys):
    from zyfa.cli import main

    monkeypatch.setattr("zyfa.accuracy.study.cli.shutil.which", lambda name: None)  # no screenshot
    out = tmp_path / "study"
    argv = ["study", "--captures", str(SAMPLE), "--max-tokens", "64", "--gaussian-filter", "^$", "--recipes",
            "zyfa,ck", "--kernel", EXAMPLE, "--kernel-recipe", "zyfa", "--device", "cpu", "--impact", "none",
            "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    lines = (out / "results.jsonl").read_text().splitlines()
    prov = json.loads(lines[0])
    rows = [json.loads(s) for s in lines[1:]]
    real = [r for r in rows if r.get("real")]
    assert {r["recipe"] for r in rows if not r.get("real")} == {"zyfa", "ck"}
    assert len(real) == 3 and all(r["implementation"] == f"plugin:{EXAMPLE}" and r["status"] == "ok" for r in real)
    assert "deq_rel_l2_heads" not in real[0]  # per-head errors belong to the recipe rows
    assert f"--kernel {EXAMPLE} --kernel-recipe zyfa" in prov["study_command"]

    md = (out / "report.md").read_text() if (out / "report.md").is_file() else \
        next(out.glob("*.md")).read_text()
    tables = md_tables(md)
    assert "## Real kernels vs their emulations" in md
    table = tables["t-real-vs-emulated"]
    assert table[0][:5] == ["implementation", "input", "paired emulation", "platform", "basis"]
    assert [line[1] for line in table[1:]] == [r["input"] for r in real]
    for line, r in zip(table[1:], real, strict=True):
        assert line[4] == "orig" and line[7] == f"{r['orig_rel_l2'] / r['emu_orig_rel_l2']:.3f}"
    if not torch.cuda.is_available():
        # a CPU has no platform model: the plug-in is compared with zyfa on zyfa's own platform, flagged
        assert prov["implementations_platform"] is None
        assert prov["implementations_platform_note"] == "no platform model for device cpu"
        for line, r in zip(table[1:], real, strict=True):
            assert (r["device_platform"], r["paired_spec"], r["paired_platform"]) == (None, "zyfa", "mi355x")
            assert r["pairing_note"] == ("no platform model for device cpu: emulated on the recipe's own "
                                         "platform (mi355x)")
            assert line[2:4] == ["zyfa", "mi355x"] and line[-1].endswith("no platform model")
        assert "3 ran on a device with no platform model" in md
    if not torch.cuda.is_available():
        not_run = tables["t-real-not-run"]
        assert [line[0] for line in not_run[1:]] == [n for n in builtin_names() if n not in BASELINE_ONLY]
        assert all(line[2:] == ["unavailable", "no CUDA device"] for line in not_run[1:])
        assert re.search(r"no GPU: \d+ GPU implementations skipped \([^)]*cudnn-fp8", err), err[-2000:]
    # the summary, recipe and paired tables show the plug-in beside its recipe, as measured on this machine's
    # device; the per-layer, per-head and every-result tables keep the recipes
    label = f"plugin:{EXAMPLE} (real, {real[0]['device_name'].removeprefix('NVIDIA ')})"
    beside = ("t-summary-error", "t-smollm2-recipes", "t-smollm2-other", "t-smollm2-ratios")
    for key in beside:
        names = [line[0] for line in tables[key][1:]]
        after = names.index("zyfa") + 1 if "zyfa" in names else 0  # the ratio table's peers: zyfa's kernels first
        assert names[after] == label, key
    for key, t in tables.items():
        if key not in ("t-real-vs-emulated", "t-real-not-run", "t-front-error", *beside):
            assert not any("plugin:" in cell for line in t for cell in line), key
    front_row = dict(zip(tables["t-front-error"][0], next(line for line in tables["t-front-error"]
                                                          if line[0] == f"plugin:{EXAMPLE}"), strict=True))
    assert front_row["verdict"] == "ok" and front_row["status"].startswith("measured on ")
    assert front_row["from"].startswith("this run (")  # the study's own rows


@pytest.mark.skipif(not SAMPLE.is_file(), reason="shipped sample capture datasets/smollm2-lee-2048.h5 absent")
def test_study_with_failed_rows_exits_3_unless_allowed(tmp_path, monkeypatch, capsys):
    """Issue 32: the study is written whole, then exit 3 for its failed kernel rows; --allow-failed gives 0."""
    from zyfa.cli import main

    monkeypatch.setattr("zyfa.accuracy.study.cli.shutil.which", lambda name: None)  # no screenshot
    bad = tmp_path / "bad.py"
    bad.write_text("def attn(q, k, v, *, causal, sm_scale, window):\n    raise RuntimeError('boom')\n")
    out = tmp_path / "study"
    argv = ["study", "--captures", str(SAMPLE), "--max-tokens", "64", "--gaussian-filter", "^$", "--recipes", "zyfa",
            "--kernel", f"{bad}:attn", "--device", "cpu", "--impact", "none", "--no-progress", "--out", str(out)]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "zyfa study: 3 of 6 rows failed (3 failed)" in err
    # the same per-implementation lines as every scoring command (accuracy.scoring.kernel_verdicts.verdict_lines)
    assert f"zyfa study: failed: plugin:{bad}:attn: kernel '{bad}:attn' raised RuntimeError: boom (on all 3 rows)" \
        in err.splitlines() and "zyfa study: ok: zyfa" in err.splitlines()
    assert (out / "results.jsonl").is_file() and (out / "report.md").is_file()
    assert not (tmp_path / "study.partial.lock").exists()
    assert main([*argv, "--force", "--allow-failed"]) == 0
