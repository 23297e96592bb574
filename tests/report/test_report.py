"""zyfa report: numbers in the Markdown and the HTML are the result file's, the HTML is self-contained and opens
in headless Chromium without console errors."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections import defaultdict

import numpy as np
import pytest
from zyfa.accuracy.report import build, document, results, sections, speed

from tests.report.conftest import RECIPES, html_tables, md_tables, numbers
from zyfa.bench.table import ROW_HEADER

REL = 6e-3  # 3 significant digits (fmt's "err"); ratios have 3 decimals


@pytest.fixture(scope="module")
def rendered(small_results, tmp_path_factory):
    path, rows = small_results
    out = tmp_path_factory.mktemp("report")
    from zyfa.cli import main

    assert main(["report", "--results", str(path), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    return out, rows, md, page


def _close(shown: float, value: float, rel: float = REL, abs_: float = 0.0) -> bool:
    if math.isnan(value):
        return math.isnan(shown)
    return abs(shown - value) <= rel * abs(value) + abs_


def _col(table, name):
    return table[0].index(name)


def test_every_table_is_in_both_documents(rendered):
    _, _, md, page = rendered
    t_md, t_html = md_tables(md), html_tables(page)
    assert set(t_md) == set(t_html)
    for key in ("t-summary", "t-provenance", "t-gaussian-inputs-recipes", "t-gaussian-inputs-ratios",
                "t-gaussian-inputs-ablation", "t-causes", "t-all", "t-inputs"):
        assert key in t_md, key
    for key, table in t_md.items():
        assert table == t_html[key], f"table {key} differs between report.md and report.html"


def test_recipe_table_means_and_intervals(rendered):
    _, rows, md, _ = rendered
    t = md_tables(md)["t-gaussian-inputs-recipes"]
    by = defaultdict(list)
    for r in rows:
        by[r["recipe"]].append(r)
    assert [line[0] for line in t[1:]] == RECIPES  # zyfa first, then the run order
    for line in t[1:]:
        rs = by[line[0]]
        assert int(line[1]) == len(rs) == 8
        for metric, header in sections.MAIN_METRICS.items():
            vals = [float(r[metric]) for r in rs]
            got = numbers(line[_col(t, header)])
            mean = float(np.mean(vals))
            if metric.endswith("_db"):
                assert _close(got[0], mean, 0, 0.006), (line[0], metric, got, mean)
            else:
                assert _close(got[0], mean), (line[0], metric, got, mean)
            if len(got) == 3:  # estimate [low, high]: the interval holds the mean, inside the data's range
                assert got[1] <= got[0] <= got[2]
                assert min(vals) * (1 - REL) - 0.006 <= got[1] and got[2] <= max(vals) * (1 + REL) + 0.006
            else:
                assert len(set(vals)) == 1


def test_every_result_cell(rendered):
    _, rows, md, _ = rendered
    t = md_tables(md)["t-all"]
    assert t[0] == ["input", *RECIPES]
    cells = {(line[0], name): line[1 + i] for line in t[1:] for i, name in enumerate(RECIPES)}
    assert len(cells) == len(rows)
    for r in rows:
        cell = cells[(r["input"], r["recipe"])]
        assert cell == f"{r['deq_rel_l2']:.3e}"
        assert _close(numbers(cell)[0], r["deq_rel_l2"])


def test_paired_ratios(rendered):
    _, rows, md, page = rendered
    val = {(r["input"], r["recipe"]): r for r in rows}
    inputs = sorted({r["input"] for r in rows})
    for tables in (md_tables(md), html_tables(page)):
        t = tables["t-gaussian-inputs-ratios"]
        assert [line[0] for line in t[1:]] == ["ck"]  # ablations are not peers
        for line in t[1:]:
            for metric, col in (("deq_rel_l2", 2), ("orig_rel_l2", 3)):
                ratios = [val[(i, "zyfa")][metric] / val[(i, line[0])][metric] for i in inputs]
                gmean = math.exp(np.mean(np.log(ratios)))
                est, lo, hi = numbers(line[col])
                assert abs(est - gmean) <= 0.0015, (line, metric, gmean)
                assert lo <= est <= hi
            wins = sum(val[(i, "zyfa")]["deq_rel_l2"] < val[(i, "ck")]["deq_rel_l2"] for i in inputs)
            assert line[4] == f"{wins}/{len(inputs)}"
        ab = tables["t-gaussian-inputs-ablation"]
        (exp2,) = [line for line in ab[1:] if line[0] == "zyfa-exp2"]
        ratios = [val[(i, "zyfa-exp2")]["deq_rel_l2"] / val[(i, "zyfa")]["deq_rel_l2"] for i in inputs]
        assert abs(numbers(exp2[4])[0] - math.exp(np.mean(np.log(ratios)))) <= 0.0015


def test_summary_matches_the_ratio_tables(rendered):
    _, rows, md, _ = rendered
    tables = md_tables(md)
    (line,) = tables["t-summary"][1:]
    assert line[0] == "Gaussian inputs" and line[1] == "8"
    z = [r["deq_rel_l2"] for r in rows if r["recipe"] == "zyfa"]
    assert _close(numbers(line[2])[0], float(np.mean(z)))
    ratio = tables["t-gaussian-inputs-ratios"][1]
    assert tables["t-summary"][0][3] == "zyfa/ck" and numbers(line[3])[0] == numbers(ratio[2])[0]


def test_sequence_length_tables(rendered):
    _, rows, md, _ = rendered
    tables = md_tables(md)
    for causal, key in ((False, "t-gaussian-inputs-d64-h2x1-seq"), (True, "t-gaussian-inputs-d64-h2x1-causal-seq")):
        t = tables[key]
        assert [int(line[0]) for line in t[1:]] == [128, 256]
        for line in t[1:]:
            for i, name in enumerate(t[0][1:], 1):
                vals = [r["deq_rel_l2"] for r in rows if r["seq_q"] == int(line[0]) and r["causal"] == causal
                        and r["recipe"] == name]
                assert len(vals) == 2  # two seeds
                assert _close(numbers(line[i])[0], float(np.mean(vals)))


def test_causes_and_inputs(rendered):
    from scipy import stats

    _, rows, md, _ = rendered
    tables = md_tables(md)
    t = tables["t-causes"]
    col = _col(t, sections.CAUSES["feat_entropy_nats"])
    for line in t[1:]:
        rs = [r for r in rows if r["recipe"] == line[0]]
        res = stats.spearmanr([r["feat_entropy_nats"] for r in rs], [r["deq_rel_l2"] for r in rs])
        shown = numbers(line[col])  # rho, its p, its n
        assert abs(shown[0] - res.statistic) <= 0.006
        assert _close(shown[1], res.pvalue, 0.05, 1e-12) and shown[2] == len(rs), line[col]
    assert "Error against its causes" not in md and "A correlation is not a cause" in md
    inp = tables["t-inputs"]
    hashes = {r["input"]: r["input_content_hash"] for r in rows}
    assert {line[0]: line[_col(inp, "content hash")] for line in inp[1:]} == hashes
    for line in inp[1:]:
        r = next(r for r in rows if r["input"] == line[0])
        assert _close(numbers(line[_col(inp, "feat_k_outlier")])[0], r["feat_k_outlier"], 5e-3)


def test_provenance_and_command_at_the_top(rendered, small_results):
    out, rows, md, _ = rendered
    path, _ = small_results
    about = md.split("## About this report", 1)[1].split("\n## ", 1)[0]  # right after the front page
    # the bench file zyfa study finds is used (and named) without --bench, so the command may carry --bench
    assert f"zyfa report --results {path} " in about and f" --out {out}" in about
    prov = md_tables(md)["t-provenance"]
    fields = {line[0]: line[1] for line in prov[1:]}
    assert fields["run_id"] == rows[0]["run_id"]
    assert fields["torch"] and fields["git_commit"] and fields["device"] == "cpu"


def test_html_is_self_contained(rendered):
    out, _, _, page = rendered
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    assert "url(" not in page
    pngs = sorted(p.name for p in out.glob("fig_*.png"))
    assert len(pngs) >= 3
    assert page.count('src="data:image/png;base64,') == len(pngs)
    for name in pngs:  # every plot the Markdown links is next to it
        assert f"]({name})" in (out / "report.md").read_text()


def test_bad_input_exits_2(tmp_path, capsys):
    from zyfa.cli import main

    assert main(["report", "--results", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "not found" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["report", "--results", str(empty), "--out", str(tmp_path / "o")]) == 2


def test_speed_table_from_bench_json(small_results, tmp_path):
    import json

    path, _ = small_results
    bench = tmp_path / "bench_test.json"
    shape = {"input": "gaussian", "h": 16, "h_kv": 16, "s": 32768, "d_qk": 128, "d_v": 128}
    bench.write_text(json.dumps({"meta": {"device": "NVIDIA H200", "versions": {"torch": "2.11"}}, "rows": [
        {**shape, "causal": False, "impl": "triton-fp8", "recipe": "zyfa", "ms": 1.2345, "tflops": 912.34},
        {**shape, "causal": False, "impl": "sdpa-bf16:cudnn", "recipe": "bf16", "ms": 1.1, "tflops": 927.0},
        {**shape, "causal": True, "impl": "triton-fp8", "recipe": "fa3", "error": "correctness check failed"}]}))
    res = results.load_results([path])
    doc = build.build_report(res, bench=speed.load_bench([bench]), plots=False)
    md = document.render_markdown(doc)
    assert "NVIDIA H200" in md and "torch 2.11" in md
    tables = md_tables(md)
    t = tables["t-bench-0"]  # the bench's own every-row table (zyfa.bench.table), old peer names read as today's
    assert t[0] == list(ROW_HEADER)
    assert t[1][:9] == ["gaussian", "h16/16 d128/128", "32768", "False", "triton-fp8", "zyfa", "912", "-", "1.234"]
    assert t[2][4] == "sdpa-bf16:cudnn"
    assert t[3][6] == "failed: correctness check failed" and t[3][7:] == [""] * 9
    pivot = tables["t-bench-0-tflops"]
    assert pivot[0] == ["input", "h", "h_kv", "d_qk", "d_v", "s", "causal", "triton-fp8 zyfa", "sdpa-bf16:cudnn bf16"]
    assert pivot[1] == ["gaussian", "16", "16", "128", "128", "32768", "no", "912.3", "927"]


def test_speed_section_leaves_out_rows_of_another_format(small_results, tmp_path):
    """A benchmark file whose rows lack the bench's fields gets one line saying so instead of a table."""
    import json

    path, _ = small_results
    bench = tmp_path / "other.json"
    bench.write_text(json.dumps([{"kernel": "x", "tflops": 1.0}]))
    md = document.render_markdown(build.build_report(results.load_results([path]), bench=speed.load_bench([bench]),
                                                     plots=False))
    assert "Every benchmark row: left out, a row has no 'input' field" in md and "t-bench-0" not in md_tables(md)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed (apt-get install chromium)")
def test_html_opens_in_headless_chromium(rendered, tmp_path):
    out, _, _, page = rendered
    shot = tmp_path / "report.png"
    console = document.screenshot(out / "report.html", shot, height=2400)
    assert not console, "console errors:\n" + "\n".join(console)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    env = {**os.environ, "HOME": str(tmp_path)}
    dom = subprocess.run(["chromium", *document.CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                          "--dump-dom", (out / "report.html").resolve().as_uri()],
                         capture_output=True, text=True, timeout=120, env=env)
    assert dom.returncode == 0
    assert dom.stdout.count("<table") == page.count("<table") > 5
    assert dom.stdout.count("<img") == page.count("<img")


def test_console_errors_are_caught(tmp_path):
    if shutil.which("chromium") is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><p>x</p><script>undefinedFunction();</script></body></html>")
    console = document.screenshot(bad, tmp_path / "bad.png", height=300)
    assert any("Uncaught" in line for line in console)


def test_csv_results_render_the_same_tables(small_results, tmp_path):
    from zyfa.accuracy.io.results_io import read_results, write_results

    path, _ = small_results
    csv = write_results(read_results(path), tmp_path / "results.csv")
    docs = [document.render_markdown(build.build_report(results.load_results([p]), plots=False)) for p in (path, csv)]
    a, b = (md_tables(d) for d in docs)
    for key in ("t-gaussian-inputs-recipes", "t-gaussian-inputs-ratios", "t-causes", "t-all", "t-inputs"):
        assert a[key] == b[key], key


def test_two_result_files_are_merged(small_results, tmp_path):
    import json

    path, rows = small_results
    lines = path.read_text().splitlines()
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    zyfa = [ln for ln in lines[1:] if json.loads(ln)["recipe"] == "zyfa"]
    rest = [ln for ln in lines[1:] if json.loads(ln)["recipe"] != "zyfa"]
    first.write_text("\n".join([lines[0], *zyfa]) + "\n")
    second.write_text("\n".join([lines[0], *rest]) + "\n")
    merged = results.load_results([first, second])
    assert len(merged.rows) == len(rows) and merged.recipes[0] == "zyfa"
    t = md_tables(document.render_markdown(build.build_report(merged, plots=False)))
    assert t["t-provenance"][0] == ["", "a.jsonl", "b.jsonl"]
    assert [line[0] for line in t["t-gaussian-inputs-ratios"][1:]] == ["ck"]


def test_recipes_filter(small_results, tmp_path):
    from zyfa.cli import main

    path, rows = small_results
    out = tmp_path / "r"
    assert main(["report", "--results", str(path), "--out", str(out), "--recipes", "zyfa,ck", "--no-plots"]) == 0
    md = (out / "report.md").read_text()
    assert "--recipes zyfa,ck" in md.split("## About this report", 1)[1].split("\n## ", 1)[0]
    assert md_tables(md)["t-all"][0] == ["input", "zyfa", "ck"]
    assert main(["report", "--results", str(path), "--out", str(out), "--recipes", "fa3"]) == 2
