"""The study's first section: the answer at head dim 128 (zyfa.accuracy.study.hd128_answer).

Planted rows check the arithmetic (geometric means over layers, the BF16 ratio paired per layer, the layer as the
unit); the committed hd128 rows and retrieval plan check the path the study takes on real data."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from zyfa.accuracy.report.document import Doc, render_markdown
from zyfa.accuracy.report.results import load_results
from zyfa.accuracy.study.hd128_answer import (
    COMMITTED,
    RETRIEVAL_PLANS,
    hd128_rows,
    impact_kl,
    layer_entries,
    lead_section,
    retrieval_effects,
)

RUN = "run-planted"


def _row(recipe: str, layer: int, deq: float, orig: float, *, impl: str | None = None, head_dim: int = 128,
         status: str = "ok") -> dict:
    r = {"run_id": RUN, "input": f"m-L{layer}", "input_source": "capture", "input_file": "m.h5",
         "input_layer": layer, "input_model": "qwen25coder-1.5b", "head_dim": head_dim, "seq_k": 2048,
         "causal": True, "recipe": recipe, "status": status, "deq_rel_l2": deq, "orig_rel_l2": orig,
         "device": "cpu"}
    if impl:
        r.update(implementation=impl, real=True, device="cuda", device_name="NVIDIA H200")
    return r


def _planted(layers: int = 6) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for L in range(layers):
        base = 1e-3 * (1 + L)
        rows.append(_row("bf16", L, base / 2, base))
        rows.append(_row("zyfa", L, 0.01 * (1 + rng.random()), 15 * base))
        rows.append(_row("cudnn-fp8", L, 0.03, 16 * base, impl="cudnn-fp8"))
    return rows


def _write(path: Path, rows: list[dict]) -> Path:
    prov = {"record": "provenance", "run_id": RUN, "git_commit": "0123456789abcdef", "git_dirty": False,
            "device": "cpu", "device_name": "test CPU", "recipes": sorted({r["recipe"] for r in rows})}
    path.write_text("\n".join(json.dumps(x) for x in [prov, *rows]) + "\n")
    return path


def test_layer_entries_take_geometric_means_over_layers_and_pair_the_bf16_ratio_per_layer():
    rows = _planted()
    by = {e["name"]: e for e in layer_entries(rows)}
    assert set(by) == {"bf16", "zyfa", "cudnn-fp8 (real)"}
    z = by["zyfa"]
    deq = [r["deq_rel_l2"] for r in rows if r["recipe"] == "zyfa"]
    assert z["n"] == 6 and z["deq"][0] == pytest.approx(math.exp(np.mean(np.log(deq))))
    assert z["deq"][1] <= z["deq"][0] <= z["deq"][2]
    # orig is 15x bf16's on every layer: the paired ratio is exactly 15 with no spread, whatever the layers' levels
    assert z["x_bf16"][0] == pytest.approx(15) and z["x_bf16"][2] - z["x_bf16"][1] == pytest.approx(0, abs=1e-9)
    assert by["cudnn-fp8 (real)"]["x_bf16"][0] == pytest.approx(16) and by["cudnn-fp8 (real)"]["real"]
    assert by["bf16"]["x_bf16"] is None
    assert [e["name"] for e in layer_entries(rows)][0] == "cudnn-fp8 (real)"  # real kernels first


def test_a_layer_counted_once_and_other_head_dims_failed_rows_and_ablations_left_out():
    rows = _planted(3)
    rows += [_row("zyfa", 0, 9.0, 9.0)]  # a second row of layer 0: the first is kept, the layer counts once
    rows += [_row("zyfa", 7, 0.01, 0.1, head_dim=64), _row("zyfa", 8, 0.01, 0.1, status="failed"),
             _row("zyfa-pow2fixed", 1, 0.01, 0.1), {**_row("zyfa", 9, 0.01, 0.1), "orig_rel_l2": math.nan}]
    kept = hd128_rows(rows)
    assert len(kept) == 10
    z = next(e for e in layer_entries(kept) if e["name"] == "zyfa")
    assert z["n"] == 3 and z["deq"][0] < 1


def _md(add) -> str:
    doc = Doc(title="t")
    add(doc, False)
    return render_markdown(doc)


def test_this_runs_rows_replace_the_committed_ones_when_they_cover_as_many_layers(tmp_path):
    committed = (_write(tmp_path / "committed.jsonl", _planted(4)),)
    mine = _write(tmp_path / "mine.jsonl", [{**r, "deq_rel_l2": r["deq_rel_l2"] * 2} for r in _planted(4)])
    res = load_results([mine])
    md = _md(lead_section(res.rows, res.provenances, ["mine.jsonl"], committed=committed, plans=(),
                          impact_folder=tmp_path))
    assert "this run" in md and "committed.jsonl" not in md


def test_a_users_kernel_on_fewer_layers_is_added_below_the_committed_rows_with_its_own_source(tmp_path):
    committed = (_write(tmp_path / "committed.jsonl", _planted(6)),)
    mine_rows = [r for r in _planted(2) if r["recipe"] == "bf16"]
    mine_rows += [_row("zyfa", L, 0.02, 0.05, impl="plugin:mine") for L in range(2)]
    res = load_results([_write(tmp_path / "mine.jsonl", mine_rows)])
    md = _md(lead_section(res.rows, res.provenances, ["mine.jsonl"], committed=committed, plans=(),
                          impact_folder=tmp_path))
    line = next(x for x in md.splitlines() if x.startswith("| plugin:mine |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2] == "2" and "this run" in cells[-1]
    assert cells[5].startswith("35.4×")  # 0.05 over the run's own bf16 rows (1e-3, 2e-3): sqrt(50 x 25)
    zyfa = next(x for x in md.splitlines() if x.startswith("| zyfa |"))
    assert "committed.jsonl @ 0123456" in zyfa and zyfa.split("|")[3].strip() == "6"
    # the committed rows first, the run's extra rows last; the sentence on the spread is about the committed rows
    rows = [x.split("|")[1].strip() for x in md.splitlines() if x.startswith("| ") and "|---" not in x][1:]
    assert rows[-1] == "plugin:mine"
    assert "every FP8 implementation here has 15×–16×" not in md  # (the planted ratios are exactly 15 and 16)
    assert re.search(r"here has 15–16× BF16's error \(2 implementations", md)
    assert "The last 1 rows (`plugin:mine`) are this run's implementations" in md


def test_no_rows_anywhere_says_untested(tmp_path):
    md = _md(lead_section([], (), (), committed=(tmp_path / "none.jsonl",), plans=(), impact_folder=tmp_path))
    assert "Untested here" in md and "| untested |" in md


def test_impact_rows_of_an_hd128_model_fill_the_kl_column(tmp_path):
    def row(model, recipe, w, kl):
        return {"kind": "impact_window", "run_id": RUN, "model": model, "window": w, "recipe": recipe, "layer": None,
                "n_tokens": 64, "text": "pydoc", "device": "cuda", "kl_mean": kl, "ppl_ratio": 1.1, "delta_ppl": 0.5,
                "kl_p99": kl * 9,
                "top1_agree": 0.9, "p_flushed_mean": 0.1, "p_flushed_checked": True,
                "provenance": {"git_commit": "e578be6abc", "cuda_device": "NVIDIA H200",
                               "date_utc": f"2026-12-04T19:2{w}:00Z"}}

    rows = [row("qwen25coder-1.5b", "zyfa", w, kl) for w, kl in enumerate((0.01, 0.03))]
    rows += [row("smollm2", "ck", 0, 0.5)]  # head dim 64: not this table's
    _write(tmp_path / "impact.jsonl", rows)
    kl, condition = impact_kl(tmp_path)
    assert "e578be6, H200" in condition and "pydoc" in condition
    assert set(kl) == {"zyfa"} and kl["zyfa"][0] == pytest.approx(0.02) and kl["zyfa"][3] == 2
    assert kl["zyfa"][1] <= 0.02 <= kl["zyfa"][2]
    md = _md(lead_section([], (), (), committed=(tmp_path / "none.jsonl",), plans=(), impact_folder=tmp_path))
    assert "Untested here" in md  # no capture rows: the KL alone does not make the table


def test_the_committed_rows_give_the_retrieval_verdicts_and_the_fp8_spread():
    if not all(p.is_file() for p in COMMITTED) or not all(p.is_file() for p in RETRIEVAL_PLANS):
        pytest.skip("the committed hd128 and retrieval rows are not in this checkout")
    effects, sources = retrieval_effects()
    assert "fp8-retrieval-hd128.toml" in sources[0]
    assert re.search(r"−80 to −100 pts vs sdpa-bf16:cudnn; 6 effects of 6 cells \(primary\)", effects["cudnn-fp8"])
    assert "exploratory" in effects["triton:fa3"] and "vs stock; 3 no effect of 3 cells" in effects["sdpa-bf16:cudnn"]
    md = _md(lead_section([], ()))
    assert re.search(r"every FP8 implementation here has 1\d\.\d–1\d\.\d× BF16's error", md)
    assert "| cudnn-fp8 (real) | real | 28 |" in md and "`cudnn-fp8 (real)` −80 to −100 pts" in md
    if (Path(__file__).resolve().parents[2] / "reports" / "impact" / "results_qwen25coder-1.5b.jsonl").is_file():
        # the committed H200 impact rows fill the KL column, their condition and source said under the table
        assert re.search(r"\| 1\.1\de\+0 \[[^]]+\] \(8 windows\) \|", md)
        assert "of the pydoc text, from results_qwen25coder-1.5b.jsonl @ e578be6, H200" in md and "nats/token" in md
        assert "held-out windows of 2048 tokens" in md


def test_the_report_composer_still_imports_no_torch():
    # zyfa report renders committed results without torch; the lead section reads longctx rows lazily
    code = "import sys, zyfa.accuracy.study.compose; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_the_kl_sentence_says_equal_error_unequal_effect_only_where_the_data_carry_it(tmp_path):
    """Two FP8 rows of equal orig error: KL 3x apart with disjoint intervals is called an unequal effect; KL
    1.1x apart is only reported."""
    from zyfa.accuracy.study.hd128_answer import kl_sentence

    def entry(name, orig):
        return {"name": name, "implementation": None, "recipe": name, "x_bf16": (15.0, 14.0, 16.0),
                "orig": (orig, orig * 0.9, orig * 1.1)}

    entries = [entry("zyfa", 0.09), entry("fa3", 0.0905)]
    far = {"zyfa": (1.1, 0.9, 1.3, 8), "fa3": (0.34, 0.26, 0.44, 8)}
    near = {"zyfa": (1.1, 0.9, 1.3, 8), "fa3": (1.0, 0.8, 1.2, 8)}
    assert "equal layer error, unequal effect on the model" in kl_sentence(entries, far)
    assert "3.24× apart (intervals disjoint)" in kl_sentence(entries, far)
    said = kl_sentence(entries, near)
    assert "1.1× apart" in said and "unequal effect" not in said and "disjoint" not in said
