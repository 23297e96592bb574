"""Real kernels in the report's summary, recipe x metric and paired-ratio tables, marked as measured on their
device, with the same metrics and intervals as the recipes; and a CPU study naming the real implementations it
did not run, with the reason.

Rows: tests/report/fixtures/study_h200_subset.jsonl (a subset of the committed H200 study, unchanged; made by
tests/report/fixtures/record_h200_subset.py), and rows made here on the CPU by the runner with the example
plug-in and every built-in.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from zyfa.accuracy.report.build import build_report
from zyfa.accuracy.report.document import render_markdown
from zyfa.accuracy.report.real_kernels import split_real
from zyfa.accuracy.report.results import Results, group_of, load_results
from zyfa.accuracy.report.sections import MAIN_METRICS
from zyfa.accuracy.report.stats import MIN_INTERVAL_N

from tests.report.conftest import html_tables, md_tables, numbers

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "study_h200_subset.jsonl"
EXAMPLE = str(ROOT / "examples" / "fp8_torch_attention.py") + ":attention"
REL = 6e-3  # fmt's "err": 3 significant digits; "db": 2 decimals


def _render(tmp_path, results: Path, name: str) -> tuple[str, str]:
    from zyfa.cli import main

    out = tmp_path / name
    assert main(["report", "--results", str(results), "--out", str(out), "--no-plots"]) == 0
    return (out / "report.md").read_text(), (out / "report.html").read_text()


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    """(rows, real rows, markdown tables, html tables, markdown) of `zyfa report` on the fixture."""
    lines = [json.loads(s) for s in FIXTURE.read_text().splitlines() if s.strip()]
    rows = lines[1:]
    recipe_rows, real_rows = split_real(rows)
    md, page = _render(tmp_path_factory.mktemp("h200"), FIXTURE, "report")
    return recipe_rows, real_rows, md_tables(md), html_tables(page), md


def _label(r: dict) -> str:
    return f"{r['implementation']} (real, {r['device_name'].removeprefix('NVIDIA ')})"


def _close(shown: float, value: float, rel: float = REL) -> bool:
    return abs(shown - value) <= rel * abs(value)


def _groups(rows):
    out = {}
    for r in rows:
        out.setdefault(group_of(r), []).append(r)
    return out


def test_fixture_holds_what_the_tests_need(h200):
    recipe_rows, real_rows, *_ = h200
    assert {r["device_name"] for r in real_rows} == {"NVIDIA H200"}
    assert {r["status"] for r in real_rows} == {"ok", "unsupported", "failed"}
    assert any(r["recipe"] == "zyfa-exp2" for r in real_rows)  # paired with an ablation
    assert any(r["recipe"] == "triton-amd:p_scale=tile_amax" for r in real_rows)  # an overridden recipe spec


def test_md_and_html_tables_agree(h200):
    *_, t_md, t_html, _ = h200
    assert set(t_md) == set(t_html)
    for key, table in t_md.items():
        assert table == t_html[key], key


def test_summary_gives_every_implementations_error_with_its_interval(h200):
    recipe_rows, real_rows, tables, _, md = h200
    t = tables["t-summary-error"]
    groups = t[0][1:]
    assert t[0][0] == "implementation" and set(groups) == {group_of(r) for r in recipe_rows}
    names = [line[0] for line in t[1:]]
    # every recipe and every real kernel that ran, the real ones after the recipe they are paired with
    ran = [r for r in real_rows if r["status"] == "ok"]
    assert set(names) == {r["recipe"] for r in recipe_rows} | {_label(r) for r in ran}
    assert names.index("triton:zyfa-hopper (real, H200)") == names.index("zyfa-hopper") + 1
    assert names.index("triton:zyfa-exp2 (real, H200)") == names.index("zyfa-exp2") + 1
    assert names.index("flash-attn-triton-amd (real, H200)") == names.index("triton-amd") + 1
    assert names.index("cudnn-fp8 (real, H200)") == names.index("cudnn-fp8") + 1
    assert names.index("sdpa-bf16:flash (real, H200)") == names.index("bf16") + 1
    n_in = {g: len({r["input"] for r in rs}) for g, rs in _groups(recipe_rows).items()}
    for line in t[1:]:
        for g, cell in zip(groups, line[1:], strict=True):
            real = [r for r in ran if _label(r) == line[0] and group_of(r) == g]
            rs = real or [r for r in recipe_rows if r["recipe"] == line[0] and group_of(r) == g]
            vals = [r["deq_rel_l2"] for r in rs]
            got = numbers(cell)
            assert _close(got[0], float(np.mean(vals))), (line[0], g, cell)
            if len(vals) >= MIN_INTERVAL_N:
                assert got[1] <= got[0] <= got[2], (line[0], g, cell)
            else:  # an interval over fewer inputs carries no information: the mean alone
                assert "[" not in cell
            if len(vals) < n_in[g]:  # a real kernel that could not take every input says on how many it ran
                assert cell.endswith(f"({len(vals)} of {n_in[g]} inputs)"), (line[0], g, cell)
            else:
                assert "inputs)" not in cell
    # the gemma3 sliding-window layer is one no real peer takes; sdpa flash fails on d 192/128
    assert "(1 of 2 inputs)" in next(line for line in t if line[0] == "cudnn-fp8 (real, H200)")[1 + groups.index(
        "gemma3")]
    assert "(1 of 2 inputs)" in next(line for line in t if line[0] == "sdpa-bf16:flash (real, H200)")[
        1 + groups.index("Gaussian inputs")]
    # the ratio summary keeps one column per emulated peer and says where the real kernels' ratios are
    assert not any("(real," in h for h in tables["t-summary"][0])
    assert "Real kernels are left out of this table" in md


def test_recipe_tables_show_real_kernels_with_the_same_metrics(h200):
    recipe_rows, real_rows, tables, _, md = h200
    ran = [r for r in real_rows if r["status"] == "ok"]
    for g in _groups(recipe_rows):
        key = "t-gaussian-inputs-recipes" if g == "Gaussian inputs" else f"t-{g}-recipes"
        t = tables[key]
        by_label = {line[0]: line for line in t[1:]}
        greal = [r for r in ran if group_of(r) == g]
        labels = {_label(r) for r in greal}
        assert labels and labels <= set(by_label)
        for label in labels:
            rs = [r for r in greal if _label(r) == label]
            line = by_label[label]
            assert int(line[1]) == len(rs)
            for metric, header in MAIN_METRICS.items():
                cell = line[t[0].index(header)]
                if metric == "p_flushed_frac":
                    assert cell == "-"  # the emulator's count: no real kernel has it
                    continue
                vals = [float(r[metric]) for r in rs]
                got = numbers(cell)
                mean = float(np.mean(vals))
                if metric.endswith("_db"):
                    assert abs(got[0] - mean) <= 0.006, (g, label, metric, cell)
                else:
                    assert _close(got[0], mean), (g, label, metric, cell)
                assert (len(got) == 3) == (len(set(vals)) > 1), (g, label, metric, cell)
        # the other metrics table has the real kernels too
        other = tables[key.replace("-recipes", "-other")]
        assert labels <= {line[0] for line in other[1:]}
    assert "`flash-attn-triton-amd (real, H200)` is paired with `triton-amd:p_scale=tile_amax`, shown after " \
           "`triton-amd`." in md


def test_recipe_rows_are_unchanged_by_real_rows(h200, tmp_path):
    """The recipes' cells are the same whether the real kernels are shown beside them or not."""
    recipe_rows, real_rows, tables, *_ = h200
    res = load_results([FIXTURE])
    recipes_only = Results([r for r in res.rows if not r.get("real")], res.provenances,
                             [x for x in res.recipes if x in {r["recipe"] for r in recipe_rows}])
    alone = md_tables(render_markdown(build_report(recipes_only, plots=False, front=False)))
    for key, t in alone.items():
        if key not in tables or key == "t-summary-error":
            continue
        with_real = [line for line in tables[key] if "(real," not in line[0]]
        assert [line for line in t] == with_real, key


def test_paired_ratios_include_real_kernels(h200):
    recipe_rows, real_rows, tables, _, md = h200
    ran = [r for r in real_rows if r["status"] == "ok"]
    for g, grows in _groups(recipe_rows).items():
        key = "t-gaussian-inputs-ratios" if g == "Gaussian inputs" else f"t-{g}-ratios"
        t = tables[key]
        zyfa = {r["input"]: r for r in grows if r["recipe"] == "zyfa"}
        shown = {line[0]: line for line in t[1:]}
        assert "triton:zyfa-exp2 (real, H200)" not in shown  # an ablation's kernel: in the recipe table only
        for label in {_label(r) for r in ran if group_of(r) == g and r["recipe"] != "zyfa-exp2"}:
            rs = [r for r in ran if group_of(r) == g and _label(r) == label]
            line = shown[label]
            assert int(line[1]) == len(rs)
            for metric, col in (("deq_rel_l2", 2), ("orig_rel_l2", 3)):
                gmean = math.exp(float(np.mean([math.log(zyfa[r["input"]][metric] / r[metric]) for r in rs])))
                assert abs(numbers(line[col])[0] - gmean) <= 0.0015, (g, label, metric, line)
            wins = sum(zyfa[r["input"]]["deq_rel_l2"] < r["deq_rel_l2"] for r in rs)
            assert line[4] == f"{wins}/{len(rs)}"
    assert "The real kernels of ZYFA's ablations (triton:zyfa-exp2) are in the table above" in md


def test_the_device_is_the_rows_own(tmp_path):
    """The label names the device the rows give, not a fixed GPU."""
    lines = [json.loads(s) for s in FIXTURE.read_text().splitlines() if s.strip()]
    for r in lines[1:]:
        if r.get("real"):
            r["device_name"] = "NVIDIA B200" if r["implementation"] == "cudnn-fp8" else "AMD Instinct MI355X"
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    md, _ = _render(tmp_path, path, "report")
    names = [line[0] for line in md_tables(md)["t-summary-error"][1:]]
    assert "cudnn-fp8 (real, B200)" in names and "triton:zyfa-hopper (real, AMD Instinct MI355X)" in names
    assert not any("H200" in n for n in names)


@pytest.fixture(scope="module")
def cpu_study(tmp_path_factory):
    """The runner on the CPU with the example plug-in (paired with zyfa) and every built-in, as `zyfa study`
    runs them, rendered as the study renders its report."""
    from zyfa.accuracy.implementations.plugins import load_plugin
    from zyfa.accuracy.implementations.registry import parse_implementations
    from zyfa.accuracy.inputs.attention_input import GaussianSpec, make_gaussian
    from zyfa.accuracy.io.results_io import write_results
    from zyfa.accuracy.operator.runner import run_accuracy
    from zyfa.accuracy.study.compose import ReportInputs, render

    inputs = [make_gaussian(GaussianSpec(heads_q=2, heads_kv=1, seq=128, head_dim=64, causal=c, seed=0))
              for c in (False, True)]
    impls = [*parse_implementations("all"), load_plugin(EXAMPLE, recipe="zyfa")]
    rows = run_accuracy(inputs, ["zyfa", "bf16"], progress=False, implementations=impls)
    out = tmp_path_factory.mktemp("cpu")
    write_results(rows, out / "results.jsonl")
    res = load_results([out / "results.jsonl"])
    _, paths = render(res, out / "report", ReportInputs(), title="t", plots=False)
    md = paths["markdown"].read_text()
    return list(rows), rows.provenance, md_tables(md), md, impls


def test_cpu_study_shows_the_plugin_as_measured_on_the_cpu(cpu_study):
    rows, _, tables, md, _ = cpu_study
    real = [r for r in rows if r.get("real") and r["status"] == "ok"]
    assert len(real) == 2 and all(r["quantizes"] == "self" for r in real)
    label = _label(real[0])
    # it quantizes for itself: no deq error, so the summary and the front page give its orig error, marked
    mean_orig = float(np.mean([r["orig_rel_l2"] for r in real]))
    summary = {line[0]: line for line in tables["t-summary-error"][1:]}
    assert summary[label][1].endswith(" (orig)") and _close(numbers(summary[label][1])[0], mean_orig)
    front = {line[0]: line for line in tables["t-front-error"][1:]}
    plugin = f"plugin:{EXAMPLE}"
    head = tables["t-front-error"][0]
    g_deq, g_orig = head.index("Gaussian: deq"), head.index("Gaussian: orig")
    assert front[plugin][g_deq] == "-" and _close(numbers(front[plugin][g_orig])[0], mean_orig)
    assert "quantizes for itself, so only the orig error is defined" in md
    line = next(line for line in tables["t-gaussian-inputs-recipes"][1:] if line[0] == label)
    t = tables["t-gaussian-inputs-recipes"]
    orig = numbers(line[t[0].index("rel L2 (orig)")])
    assert _close(orig[0], float(np.mean([r["orig_rel_l2"] for r in real])))
    assert orig[1] <= orig[0] <= orig[2]
    assert line[t[0].index("rel L2 (deq)")] == "-"
    ratio = next(line for line in tables["t-gaussian-inputs-ratios"][1:] if line[0] == label)
    gmean = math.exp(float(np.mean([math.log(z["orig_rel_l2"] / r["orig_rel_l2"]) for r in real
                                    for z in rows if z["recipe"] == "zyfa" and not z.get("real")
                                    and z["input"] == r["input"]])))
    assert ratio[2] == "-" and abs(numbers(ratio[3])[0] - gmean) <= 0.0015
    assert f"`{label}` quantizes for itself, so it has no `deq` error" in md


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU study: the built-ins need a GPU")
def test_cpu_study_names_the_real_implementations_not_run(cpu_study):
    rows, prov, tables, md, impls = cpu_study
    builtins = [i for i in impls if not i.name.startswith("plugin:")]
    reasons = {i.name: i.available()[1] for i in builtins}
    assert all(reasons.values()) and prov["implementations_unavailable"] == reasons
    not_run = {line[0]: line for line in tables["t-real-not-run"][1:]}
    for name, why in reasons.items():
        assert not_run[name][1:] == ["all", "unavailable", why]
    names = ", ".join(f"`{n}`" for n in reasons)
    assert f"Real implementations not run on this machine: {names} (each with the reason under" in md
    assert not any(r.get("implementation") in reasons for r in rows)  # none ran
