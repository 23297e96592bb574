"""The report's quantization section and its closing recommendation table (accuracy.report.quantization), built
from recorded rows: tests/report/fixtures/quant_rows_cpu.jsonl (a CPU study of the schemes on the three shipped
captures, with per-head errors; record_quant_subset.py says how it was made), small impact rows and a benchmark
file written here. Every expected number is computed here from the rows, independently of the module."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from zyfa.accuracy.report.quantization import scheme_samples, scheme_table
from zyfa.accuracy.report.results import load_results
from zyfa.accuracy.study.compose import ReportInputs, load_report_inputs, render

from tests.report.conftest import html_tables, md_tables, numbers

FIXTURE = Path(__file__).parent / "fixtures" / "quant_rows_cpu.jsonl"
MODELS = ("gemma3", "qwen25coder", "smollm2")


@pytest.fixture(scope="module")
def rows():
    return load_results([FIXTURE]).rows


def _indep_samples(rows, recipe, model, per_head=True):
    """{(input, head): orig rel L2} (or {input: ...}) of one recipe and model, straight from the row fields."""
    out = {}
    for r in rows:
        if r["recipe"] != recipe or r.get("input_model") != model:
            continue
        if per_head and isinstance(r.get("orig_rel_l2_heads"), list):
            for h, v in zip(r["input_q_heads"], r["orig_rel_l2_heads"], strict=True):
                out[(r["input"], h)] = v
        else:
            out[r["input"]] = r["orig_rel_l2"]
    return out


def _col(header, name):
    return header.index(name)


def test_the_fixture_holds_the_captures_and_per_head_errors(rows):
    assert {r["input_model"] for r in rows} == set(MODELS)
    assert {r["recipe"] for r in rows} == {"zyfa", "zyfa+smooth", "zyfa+hadamard", "zyfa+block+smooth", "sage2"}
    assert all(isinstance(r.get("orig_rel_l2_heads"), list) for r in rows if r["recipe"] != "sage2")
    samples, unit = scheme_samples([r for r in rows if r["input_model"] == "smollm2"], "zyfa")
    assert unit == "head" and len(samples) == 9  # 3 layers x 3 query heads


def test_scheme_table_errors_and_ratios_are_the_rows_means(rows):
    header, body, _ = scheme_table(rows)
    by = {line[0]: line for line in body}
    assert [line[0] for line in body] == ["zyfa", "zyfa+smooth", "zyfa+hadamard", "zyfa+block+smooth", "sage2 (peer)"]
    for model in MODELS:
        base = _indep_samples(rows, "zyfa", model)
        for name in ("zyfa", "zyfa+smooth", "zyfa+hadamard", "zyfa+block+smooth", "sage2"):
            line = by[name if name != "sage2" else "sage2 (peer)"]
            per_head = name != "sage2"
            mine = _indep_samples(rows, name, model, per_head)
            err = numbers(line[_col(header, f"{model}: rel L2 (orig)")])
            assert err[0] == pytest.approx(np.mean(list(mine.values())), rel=2e-3)
            if len(err) == 3:
                assert err[1] <= err[0] <= err[2]
            ratio_cell = line[_col(header, f"{model}: / zyfa")]
            if name == "zyfa":
                assert ratio_cell == "1"
                continue
            ref = base if per_head else _indep_samples(rows, "zyfa", model, per_head=False)
            ratios = [mine[k] / ref[k] for k in mine]
            ratio = numbers(ratio_cell)
            assert ratio[0] == pytest.approx(math.exp(np.mean(np.log(ratios))), abs=6e-4)
            assert ratio[1] <= ratio[0] <= ratio[2]


def test_pooled_ratio_pairs_every_sample_of_every_model(rows):
    header, body, _ = scheme_table(rows)
    line = {x[0]: x for x in body}["zyfa+smooth"]
    ratios = []
    for model in MODELS:
        mine, base = _indep_samples(rows, "zyfa+smooth", model), _indep_samples(rows, "zyfa", model)
        ratios += [mine[k] / base[k] for k in mine]
    assert len(ratios) == 2 + 6 + 9
    got = numbers(line[_col(header, "all captures: / zyfa")])
    assert got[0] == pytest.approx(math.exp(np.mean(np.log(ratios))), abs=6e-4)


def test_a_ratio_is_paired_on_the_same_sample():
    """Two inputs: the scheme halves one error and doubles the other: the paired ratio is 1, the means differ."""
    def row(recipe, inp, err):
        return {"recipe": recipe, "input": inp, "input_source": "capture", "input_model": "m", "orig_rel_l2": err}

    rows = [row("zyfa", "a", 0.1), row("zyfa", "b", 0.2), row("zyfa+block", "a", 0.05), row("zyfa+block", "b", 0.4)]
    header, body, details = scheme_table(rows)
    assert header[2:] == ["m: rel L2 (orig)", "m: / zyfa", "all captures: / zyfa"]
    assert details[("zyfa+block", "m")]["ratio"][0] == pytest.approx(1.0)
    assert details[("zyfa+block", "m")]["err"][0] == pytest.approx(0.225)
    assert details[("zyfa+block", "m")]["unit"] == "input"
    # per-head errors of one recipe only: both compared per input
    rows[0]["orig_rel_l2_heads"], rows[1]["orig_rel_l2_heads"] = [0.1], [0.2]
    assert scheme_table(rows)[2][("zyfa+block", "m")]["unit"] == "input"


def _impact_row(model, recipe, window, kl):
    return {"kind": "impact_window", "model": model, "window": window, "split": "heldout", "text": "lee",
            "n_tokens": 2048, "token_offset": 2048 * (2 * window + 1), "recipe": recipe, "layer": None,
            "nll_stock": 3.0, "nll_recipe": 3.0 + kl, "ppl_stock": 20.0, "ppl_recipe": 20.0 * math.exp(kl),
            "delta_ppl": 20.0 * (math.exp(kl) - 1), "ppl_ratio": math.exp(kl), "kl_mean": kl, "kl_p99": 8 * kl,
            "kl_max": 20 * kl, "top1_agree": 0.95, "kl_blocks": [kl, kl], "n_scored": 2047, "p_flushed_mean": 0.01,
            "p_flushed_checked": True, "seconds": 1.0,
            "provenance": {"date_utc": f"2026-12-01T01:00:{window:02d}Z", "git_commit": "0" * 40, "git_dirty": False,
                           "argv": ["cli.py", "impact"], "num_q_heads": 3}}


@pytest.fixture(scope="module")
def report(tmp_path_factory, rows):
    d = tmp_path_factory.mktemp("quant")
    impact = d / "results_quant.jsonl"
    kls = {"zyfa": [0.010, 0.020, 0.030], "zyfa+smooth": [0.001, 0.002, 0.003]}
    impact.write_text("".join(json.dumps(_impact_row("smollm2", rc, w, kl)) + "\n"
                              for rc, vals in kls.items() for w, kl in enumerate(vals)))
    bench = d / "bench.json"
    bench.write_text(json.dumps({"meta": {"device": "test GPU"}, "rows": [
        {"impl": "triton-fp8", "recipe": "zyfa+smooth", "input": "gaussian", "s": 32768, "causal": False, "d_qk": 128,
         "h": 16, "ms": 11.5, "tflops": 700.0, "error": None},
        {"impl": "triton-fp8", "recipe": "zyfa+hadamard@h200", "input": "gaussian", "s": 32768, "causal": True,
         "d_qk": 128, "h": 16, "ms": 6.25, "tflops": 700.0, "rotation": "random_hadamard", "rotation_ms": 0.125,
         "error": None},
        {"impl": "triton-fp8", "recipe": "zyfa-hopper", "input": "gaussian", "s": 32768, "causal": False,
         "d_qk": 128, "h": 16, "ms": 10.25, "tflops": 820.0, "error": None}]}))
    from zyfa.cli import main

    out = d / "report"
    assert main(["report", "--results", str(FIXTURE), "--impact", str(impact), "--bench", str(bench), "--out",
                 str(out), "--no-plots"]) == 0
    return (out / "report.md").read_text(encoding="utf-8"), (out / "report.html").read_text(encoding="utf-8")


def test_zyfa_report_renders_the_section_from_the_rows(report, rows):
    md, page = report
    header, body, _ = scheme_table(rows)
    for tables in (md_tables(md), html_tables(page)):
        assert tables["t-quant-schemes"] == [header, *body]
    assert md.index("## Quantization of Q, K and V") < md.index("## Model impact")


def test_the_report_ends_with_the_recommendation_table(report):
    md, page = report
    assert list(md_tables(md))[-1] == "t-quant-recommend" and list(html_tables(page))[-1] == "t-quant-recommend"
    table = md_tables(md)["t-quant-recommend"]
    head, by = table[0], {line[0]: line for line in table[1:]}
    kl = head.index("KL smollm2 (2048 tokens of lee)")
    cost = head.index("kernel cost")
    assert numbers(by["zyfa"][kl])[0] == pytest.approx(0.02)
    smooth = numbers(by["zyfa+smooth"][kl])
    assert smooth[0] == pytest.approx(0.002) and smooth[-1] == pytest.approx(10.0)  # zyfa/scheme
    assert "3 windows" in by["zyfa+smooth"][kl]
    for name in ("zyfa+hadamard", "zyfa+block", "zyfa+block+smooth", "zyfa+block+hadamard", "sage2 (peer)"):
        assert by[name][kl] == "not measured"
    assert by["zyfa+smooth"][cost].startswith("11.5 ms (triton-fp8, zyfa+smooth, s 32768, d 128, full)")
    # against zyfa-hopper on the same input of the same run (11.5 / 10.25); the causal hadamard row has none
    assert "11.5 ms (triton-fp8, zyfa+smooth, s 32768, d 128, full) = 1.122× zyfa-hopper, same run" in \
        by["zyfa+smooth"][cost]
    assert by["zyfa+hadamard"][cost] == ("6.25 ms (triton-fp8, zyfa+hadamard@h200, s 32768, d 128, causal; "
                                         "rotation of Q and K 0.125 ms on its own)")
    assert by["zyfa"][cost] == "as `zyfa-hopper`: 10.25 ms (triton-fp8, zyfa-hopper, s 32768, d 128, full)"
    assert by["zyfa+block"][cost] == by["sage2 (peer)"][cost] == "not measured"
    # the operator column is the quantization section's pooled ratio
    schemes = md_tables(md)["t-quant-schemes"]
    pooled = {line[0]: line[-1] for line in schemes[1:]}
    assert by["zyfa+block+smooth"][1] == pooled["zyfa+block+smooth"]
    assert by["zyfa+block"][1] == "not in these results"
    # what is missing is said, with the command that measures it
    tail = md[md.index("## Recommendation"):]
    assert ("`zyfa impact --models smollm2 --recipes zyfa+hadamard,zyfa+block,zyfa+block+smooth,zyfa+block+hadamard,"
            "sage2 --tokens 2048 --windows 3 --text lee --out reports/impact/results_quantization.jsonl`") in tail
    assert ("Kernel cost not measured (no row of the benchmark file runs the recipe) for `zyfa+block`, "
            "`zyfa+block+smooth`, `zyfa+block+hadamard`: `zyfa bench --recipes 'zyfa+block:accumulator=matrix_unit,"
            "accum_flush_tiles=1;") in tail
    assert "for the peers `sage2`: their own kernels are not in the benchmark." in tail


def test_no_scheme_rows_no_quantization_tables(tmp_path, rows):
    res = load_results([FIXTURE])
    res.rows = [r for r in res.rows if r["recipe"] in ("zyfa", "sage2")]
    res.recipes = ["zyfa", "sage2"]
    doc, paths = render(res, tmp_path, ReportInputs(), title="t", plots=False)
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    assert "t-quant-schemes" not in md and "t-quant-recommend" not in md
    # impact rows of a scheme alone bring the recommendation table (its operator cells say the rows lack it)
    impact = tmp_path / "i.jsonl"
    impact.write_text(json.dumps(_impact_row("smollm2", "zyfa+block", 0, 0.004)) + "\n")
    doc, paths = render(res, tmp_path / "b", load_report_inputs((), [impact]), title="t", plots=False)
    table = md_tables(Path(paths["markdown"]).read_text(encoding="utf-8"))["t-quant-recommend"]
    assert {line[0]: line[1] for line in table[1:]}["zyfa+block"] == "not in these results"
