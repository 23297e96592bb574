"""The report's front page: its first section holds the error table and the speed table, with numbers computed
here from the rows and the benchmark file, the GPU named, and the speed-against-accuracy picture."""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from zyfa.accuracy.report import front
from zyfa.accuracy.report.build import build_report
from zyfa.accuracy.report.document import FIRST_SCREEN, render_html, render_markdown
from zyfa.accuracy.report.results import load_results
from zyfa.accuracy.report.speed import load_bench

from tests.report.conftest import html_tables, md_tables, numbers

ROOT = Path(__file__).resolve().parents[2]


def _bench_row(impl, recipe, tflops, *, s=32768, d=128, causal=False):
    return {"input": "gaussian", "b": 1, "h": 16, "h_kv": 16, "s": s, "d_qk": d, "d_v": d, "causal": causal,
            "impl": impl, "recipe": recipe, "tflops": tflops, "ms": 1.0}


BENCH_ROWS = [
    _bench_row("triton-fp8", "zyfa-hopper", 813.2), _bench_row("triton-fp8", "zyfa", 405.7),
    _bench_row("triton-fp8", "ck", 700.4), _bench_row("triton-fp8", "ck:accumulator=matrix_unit", 777.0),
    _bench_row("sdpa-bf16:cudnn", "bf16", 603.1), _bench_row("sdpa-bf16:flash", "bf16", 350.0),
    _bench_row("cudnn-fp8", "cudnn-fp8", 933.3),
    _bench_row("triton-fp8", "zyfa", 300.0, s=16384),  # shorter: not the speed of the picture
    _bench_row("triton-fp8", "zyfa-hopper", 802.0, causal=True),
    _bench_row("cudnn-fp8", "cudnn-fp8", 904.0, causal=True),
]


@pytest.fixture(scope="module")
def bench_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    path.write_text(json.dumps({"meta": {"device": "NVIDIA H200", "date": "2026-11-30T03:09:12+00:00",
                                         "git_commit": "abc1234"}, "rows": BENCH_ROWS}))
    return path


def _half_as_captures(res) -> None:
    """Relabel the first half of the inputs (by name) as captures of a model "tiny"."""
    inputs = sorted({r["input"] for r in res.rows})
    for r in res.rows:
        if r["input"] in inputs[: len(inputs) // 2]:
            r["input_source"] = "capture"
            r["input_model"] = "tiny"


@pytest.fixture(scope="module")
def front_doc(small_results, bench_file):
    """The report of the small results with half the inputs relabelled as captures (rows of the real runner)."""
    path, _ = small_results
    res = load_results([path])
    _half_as_captures(res)
    doc = build_report(res, bench=load_bench([bench_file]), plots=True)
    return res.rows, doc, render_markdown(doc), render_html(doc)


def _first_section_html(page: str, k: int = 1) -> str:
    body = page.split("<body>", 1)[1]
    parts = re.split(r"<h2>", body)
    return parts[k]  # the text from the k-th <h2> to the next


@pytest.fixture(scope="module")
def front_doc_timed(small_results, bench_file):
    """As front_doc, with rows for the timed implementations too (zyfa-hopper, bf16, cudnn-fp8: copies of zyfa's
    rows under their names), so the speed table keeps their columns."""
    import copy

    path, _ = small_results
    res = load_results([path])
    _half_as_captures(res)
    extra = []
    for r in res.rows:
        if r["recipe"] == "zyfa":
            for name in ("zyfa-hopper", "bf16", "cudnn-fp8"):
                c = copy.deepcopy(r)
                c["recipe"] = c["recipe_short"] = name
                extra.append(c)
    res.rows.extend(extra)
    res.recipes.extend(["zyfa-hopper", "bf16", "cudnn-fp8"])
    doc = build_report(res, bench=load_bench([bench_file]), plots=True)
    return res.rows, doc, render_markdown(doc), render_html(doc)


def test_the_first_section_holds_both_tables(front_doc):
    _, _, md, page = front_doc
    first = _first_section_html(page)
    assert first.startswith("At a glance")
    for key in front.FRONT_KEYS:
        assert f'<table id="{key}"' in first, key
    assert "NVIDIA H200" in first and "fig_front_speed_accuracy" not in first.split("<table")[0]
    assert "<img" in first  # the picture
    # the Markdown too: both tables before the second "## " heading
    first_md = md.split("\n## ", 2)[1]
    assert first_md.startswith("At a glance")
    assert all(f'<a id="{k}"></a>' in first_md for k in front.FRONT_KEYS)
    # the details are linked from it and exist
    links = re.findall(r'<a href="#([^"]+)">', first)
    assert "t-all" in links and "t-provenance" in links
    for anchor in links:
        assert f'id="{anchor}"' in page, anchor


def test_error_table_means_intervals_and_status(front_doc):
    rows, _, md, page = front_doc
    t = md_tables(md)["t-front-error"]
    assert t == html_tables(page)["t-front-error"]
    assert t[0] == ["implementation", "verdict", "captures: deq", "captures: orig", "Gaussian: deq",
                    "Gaussian: orig", "status", "from"]
    from zyfa.recipe_spec import get_recipe

    shown = {line[0]: line for line in t[1:]}
    assert list(shown) == ["zyfa", "ck"]  # the ablation zyfa-exp2 is in the details only
    for name, line in shown.items():
        assert line[1] == "ok" and line[6] == get_recipe(name).status
        assert line[7].startswith("results.jsonl @ ")  # a file of no named run: its name, commit and device
        for col, is_cap, metric in ((2, True, "deq"), (3, True, "orig"), (4, False, "deq"), (5, False, "orig")):
            vals = [r[f"{metric}_rel_l2"] for r in rows if r["recipe"] == name
                    and (r.get("input_source") == "capture") == is_cap]
            est, lo, hi = numbers(line[col])
            assert est == pytest.approx(float(np.mean(vals)), rel=6e-3)
            assert lo <= est <= hi and lo >= min(vals) * 0.99 and hi <= max(vals) * 1.01


def test_error_table_explains_deq_and_orig(front_doc):
    _, _, md, _ = front_doc
    first = md.split("\n## ", 2)[1]
    assert "**deq**: against FP64 on the very FP8 inputs" in first and "**orig**: against FP64 on the original" in first


def test_speed_columns_only_for_implementations_with_error_rows(front_doc):
    _, _, md, _ = front_doc
    t = md_tables(md)["t-front-speed"]
    assert t[0] == ["shape", "s", "mask", "from"]  # zyfa, ck: none of the timed implementations has error rows
    first = md.split("\n## ", 2)[1]
    assert ("Timed on the NVIDIA H200, not in these results: zyfa kernel (zyfa-hopper numerics), cuDNN BF16, "
            "cuDNN FP8") in first


def test_speed_columns_with_errors_keeps_ratio_columns_with_their_peer():
    head = ["shape", "zyfa-hopper", "cuDNN FP8", "AMD Triton FP8", "× cuDNN FP8", "× AMD Triton FP8"]
    body = [["hd128", "830", "927", "192", "0.90", "4.3"]]
    h, b, dropped = front.speed_columns_with_errors(head, body, ["zyfa-hopper", "cudnn-fp8 (real, H200)"])
    assert h == ["shape", "zyfa-hopper", "cuDNN FP8", "× cuDNN FP8"] and b == [["hd128", "830", "927", "0.90"]]
    assert dropped == ["AMD Triton FP8"]
    # --quick: no zyfa-hopper rows, so no "× peer" column (our kernel's speed over the peer's) either
    h, b, dropped = front.speed_columns_with_errors(head, body, ["zyfa", "cudnn-fp8"])
    assert h == ["shape", "cuDNN FP8"] and dropped == ["zyfa-hopper", "AMD Triton FP8"]


def test_speed_table_is_the_bench_where_we_land(front_doc_timed):
    _, _, md, _ = front_doc_timed
    t = md_tables(md)["t-front-speed"]
    head = t[0]
    assert head[:4] == ["shape", "s", "mask", "zyfa kernel (zyfa-hopper numerics)"]
    assert head[-1] == "from" and all(r[-1] == "bench.json @ abc1234, H200, 2026-11-30" for r in t[1:])
    assert "fastest of our recipes" not in head and "AMD Triton FP8" not in head
    rows = {(r[0], r[2]): dict(zip(head, r, strict=True)) for r in t[1:]}
    nc = rows[("hd128", "non-causal")]
    ours = "zyfa kernel (zyfa-hopper numerics)"
    assert nc["s"] == "32768" and nc[ours] == "813" and nc["cuDNN FP8"] == "933"
    assert nc["cuDNN BF16"] == "603"
    assert float(nc["× cuDNN FP8"]) == pytest.approx(813.2 / 933.3, abs=0.005)
    assert rows[("hd128", "causal")][ours] == "802"


def test_speed_points_name_the_kernel_that_was_timed():
    """Our kernel under recipe X is ``triton:X``, never ``X`` (the emulation whose numerics it borrows: a point
    labelled "fa3" must be FA3); peers by their own names, old bench names mapped."""
    speeds, shape = front.speed_points(BENCH_ROWS)
    assert shape == "hd128, non-causal, 32K tokens"
    assert speeds["triton:zyfa-hopper"] == 813.2 and "zyfa-hopper" not in speeds
    assert speeds["triton:zyfa"] == 405.7 and "zyfa" not in speeds  # the 32K one, not the 16K one
    assert speeds["sdpa-bf16:cudnn"] == 603.1 and "bf16" not in speeds
    assert speeds["cudnn-fp8"] == 933.3
    assert speeds["triton:ck"] == 700.4 and "ck" not in speeds
    causal_only = [r for r in BENCH_ROWS if r["causal"]]
    assert front.speed_points(causal_only)[1] == "hd128, causal, 32K tokens"
    assert front.speed_points([]) == ({}, "")


def test_speed_points_name_our_cute_kernel_as_the_registry_does():
    """The bench's ``cute-fp8`` rows are our CuTe DSL kernel: ``cute:X`` on the front page (the registry's name),
    beside ``triton:X``, and both borrow recipe X's emulation."""
    rows = [_bench_row("triton-fp8", "zyfa-hopper", 813.2), _bench_row("cute-fp8", "zyfa-hopper", 790.5),
            _bench_row("cudnn-fp8", "cudnn-fp8", 933.3)]
    speeds, _ = front.speed_points(rows)
    assert speeds == {"triton:zyfa-hopper": 813.2, "cute:zyfa-hopper": 790.5, "cudnn-fp8": 933.3}
    assert front.emulation_of_timed("cute:zyfa-hopper") == front.emulation_of_timed("triton:zyfa-hopper") == \
        "zyfa-hopper"


def test_pareto_frontier_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(50):
        pts = {f"p{i}": (float(rng.integers(1, 6)), float(rng.integers(1, 6))) for i in range(7)}
        expect = {n for n, (x, y) in pts.items()
                  if not any(x2 >= x and y2 <= y and (x2, y2) != (x, y) for m, (x2, y2) in pts.items() if m != n)}
        got = front.pareto(pts)
        assert set(got) == expect
        assert [pts[n][0] for n in got] == sorted(pts[n][0] for n in got)
    pts = {"fast-rough": (930.0, 2.5e-2), "ours": (813.0, 6e-3), "slow-exact": (600.0, 1.6e-3),
           "dominated": (700.0, 7e-3), "nan": (math.nan, 1.0)}
    assert front.pareto(pts) == ["slow-exact", "ours", "fast-rough"]


def test_pareto_caption_says_why(front_doc_timed):
    _, doc, _, _ = front_doc_timed
    caps = [b[2] for b in doc.blocks if b[0] == "img" and b[1] == "fig_front_speed_accuracy.png"]
    assert caps and "no other beats on both speed and error" in caps[0] and "by definition" in caps[0]


def test_picture_and_frontier_line(front_doc):
    rows, doc, md, _ = front_doc
    assert "fig_front_speed_accuracy.png" in doc.images
    png = doc.images["fig_front_speed_accuracy.png"]
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", png[16:24])
    assert 300 < w < 700 and 150 < h < 400  # small enough to sit beside the speed table
    # zyfa (405.7) and ck (700.4): on the frontier exactly when neither is both faster and more accurate
    cap = {n: float(np.mean([r["deq_rel_l2"] for r in rows if r["recipe"] == n
                             and r.get("input_source") == "capture"])) for n in ("zyfa", "ck")}
    expect = ["zyfa kernel (zyfa numerics)", "zyfa kernel (ck numerics)"] if cap["zyfa"] < cap["ck"] else \
        ["zyfa kernel (ck numerics)"]
    assert f"Red: the Pareto frontier ({', '.join(expect)}): the implementations no other beats" in md
    assert "the recipe that emulates it" in md  # a point's error where the timed kernel has no rows here
    assert "No speed-against-accuracy picture" not in md
    # each group keeps its own recipe figure next to the front page's
    assert {"fig_tiny_recipes.png", "fig_gaussian-inputs_recipes.png"} <= set(doc.images)


def test_no_bench_still_opens_on_both_tables(small_results):
    path, _ = small_results
    doc = build_report(load_results([path]), plots=False)
    page = render_html(doc)
    first = _first_section_html(page)
    assert all(f'<table id="{k}"' in first for k in front.FRONT_KEYS)
    assert "no benchmark file" in first


def test_real_kernel_rows_are_their_own_implementation():
    rows = [{"recipe": "cudnn-fp8", "implementation": "plugin:my_cudnn.py:attn", "device_name": "NVIDIA H200",
             "input_source": "capture", "deq_rel_l2": 0.02, "orig_rel_l2": 0.1},
            {"recipe": "cudnn-fp8", "input_source": "capture", "deq_rel_l2": 0.025, "orig_rel_l2": 0.11}]
    entries = {e["name"]: e for e in front.error_table(rows)}
    assert entries["plugin:my_cudnn.py:attn"]["status"] == "measured on H200"
    assert entries["cudnn-fp8"]["status"] == "verified"
    assert entries["plugin:my_cudnn.py:attn"]["captures_deq_rel_l2"][0] == 0.02
    assert front.status_of("no-such-recipe") == "-"


def test_committed_study_reports_open_on_the_front_page():
    for folder in ("study", "study-long"):
        page = (ROOT / "reports" / folder / "report.html").read_text(encoding="utf-8")
        lead = _first_section_html(page)  # the answer at head dim 128 leads (zyfa.accuracy.study.hd128_answer)
        assert lead.startswith("At head dim 128 on real activations") and 'id="t-hd128-answer"' in lead, folder
        first = _first_section_html(page, 2)
        assert first.startswith("At a glance"), folder
        for key in front.FRONT_KEYS:
            assert f'<table id="{key}"' in first, (folder, key)
        assert "NVIDIA H200" in first, folder
    shot = ROOT / "reports" / "study" / "report_screenshot.png"
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == FIRST_SCREEN


def test_the_study_finds_the_bench_from_the_repository_not_the_current_directory(tmp_path, monkeypatch):
    from zyfa.accuracy.study.compose import REPO_ROOT, find_bench

    reports = tmp_path / "repo" / "reports" / "bench"
    reports.mkdir(parents=True)
    assert find_bench(tmp_path / "repo") == []
    for name in ("bench_2026-11-29.json", "bench_2026-11-30_s3b.json"):
        (reports / name).write_text("{}")
    assert [Path(p).name for p in find_bench(tmp_path / "repo")] == ["bench_2026-11-30_s3b.json"]  # the newest
    (reports / "bench.json").write_text("{}")
    assert [Path(p).name for p in find_bench(tmp_path / "repo")] == ["bench.json"]  # the current one first
    monkeypatch.chdir(tmp_path)  # outside the repository: the repository's own file, by its full path
    expect = sorted((REPO_ROOT / "reports" / "bench").glob("bench*.json"))
    got = find_bench()
    assert got and Path(got[0]).is_absolute() and Path(got[0]).resolve() in [p.resolve() for p in expect]
    monkeypatch.chdir(REPO_ROOT)  # inside it: as a user would type it
    assert not Path(find_bench()[0]).is_absolute()


def test_real_kernels_on_the_front_page_beside_their_emulations():
    def row(recipe, impl=None, err=0.01):
        r = {"recipe": recipe, "input_source": "capture", "deq_rel_l2": err, "orig_rel_l2": 10 * err}
        if impl:
            r.update(implementation=impl, real=True, device_name="NVIDIA H200")
        return r

    rows = [row("cudnn-fp8", err=0.025), row("zyfa-exp2"), row("zyfa-hopper", err=0.006),
            row("cudnn-fp8", "cudnn-fp8", 0.026), row("zyfa-exp2", "triton:zyfa-exp2"),
            row("zyfa-hopper", "triton:zyfa-hopper", 0.0061), row("zyfa", "plugin:mine.py:attn", 0.03)]
    entries = error_table_by_name(rows)
    # a real kernel named like its recipe is its own row, never averaged with the emulation
    assert entries["cudnn-fp8"]["status"] == "verified"
    assert entries["cudnn-fp8"]["captures_deq_rel_l2"][0] == 0.025
    assert entries["cudnn-fp8 (real)"]["status"] == "measured on H200"
    assert entries["cudnn-fp8 (real)"]["captures_deq_rel_l2"][0] == 0.026
    # our kernel's default and user plug-ins are shown; our kernel under an ablation is left to the details
    assert "triton:zyfa-hopper" in entries and "plugin:mine.py:attn" in entries
    assert "triton:zyfa-exp2" not in entries and "zyfa-exp2" not in entries
    # recipes first, then the real kernels
    names = [e["name"] for e in front.error_table(rows)]
    assert names == ["cudnn-fp8", "zyfa-hopper", "cudnn-fp8 (real)", "triton:zyfa-hopper", "plugin:mine.py:attn"]


def error_table_by_name(rows):
    return {e["name"]: e for e in front.error_table(rows)}


def test_a_measurement_made_again_later_replaces_the_earlier_row(tmp_path):
    """Two result files with the same (input, recipe) row: the later file's is used, once, and the report says
    how many rows were replaced; distinct rows of both files are kept."""
    import json

    from zyfa.accuracy.report.build import build_report
    from zyfa.accuracy.report.document import render_markdown
    from zyfa.accuracy.report.results import load_results

    def write(path, rows):
        prov = {"record": "provenance", "run_id": path.stem, "recipes": sorted({r["recipe"] for r in rows})}
        path.write_text("\n".join(json.dumps(x) for x in [prov, *rows]) + "\n")

    def row(inp, recipe, err):
        return {"input": inp, "input_content_hash": inp, "recipe": recipe, "platform": "h200", "deq_rel_l2": err,
                "orig_rel_l2": err, "input_source": "gaussian", "head_dim": 64, "seq_q": 64}

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write(a, [row("x", "fa3", 0.1), row("y", "fa3", 0.2), row("x", "zyfa", 0.3)])
    write(b, [row("x", "fa3", 0.5)])
    res = load_results([a, b])
    assert res.replaced == 1 and len(res.rows) == 3
    got = {(r["input"], r["recipe"]): r["deq_rel_l2"] for r in res.rows}
    assert got == {("x", "fa3"): 0.5, ("y", "fa3"): 0.2, ("x", "zyfa"): 0.3}
    assert res.rows[0]["_file"] == "b.jsonl"  # in the earlier row's place
    md = render_markdown(build_report(res, plots=False, front=False))
    assert "1 rows were measured again later" in md
    assert load_results([a]).replaced == 0


def _page_widths(page: Path, width: int, work: Path) -> tuple[int, int]:
    """(document scroll width, viewport width) of ``page`` in headless Chromium at ``width`` px: a copy of the
    page in ``work`` with a one-line script that writes both into the title (the report itself has no script)."""
    import os
    import shutil
    import subprocess
    import tempfile

    from zyfa.accuracy.report.document import CHROMIUM_FLAGS

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    probe = work / f"{page.parent.name}-width_probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace(
        "</body>", "<script>document.title = 'W' + document.documentElement.scrollWidth + 'x' + "
                   "document.documentElement.clientWidth;</script></body>"), encoding="utf-8")
    with tempfile.TemporaryDirectory() as prof:
        res = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={prof}", f"--window-size={width},1000",
                              "--dump-dom", probe.resolve().as_uri()], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "HOME": prof})
    m = re.search(r"<title>W(\d+)x(\d+)</title>", res.stdout)
    assert m, res.stderr[-500:]
    return int(m.group(1)), int(m.group(2))


@pytest.mark.skipif(__import__("shutil").which("chromium") is None, reason="needs Debian's chromium (CI installs it)")
def test_first_screen_fits_1280_px_without_horizontal_scroll(front_doc_timed, tmp_path):
    from zyfa.accuracy.report.document import write_report

    _, doc, _, _ = front_doc_timed
    page = write_report(doc, tmp_path / "report")["html"]
    scroll, view = _page_widths(page, 1280, tmp_path)
    assert view <= 1280 and scroll <= view, f"the page scrolls sideways: {scroll} px of content in {view} px"
    for committed in ("study", "study-long"):
        scroll, view = _page_widths(ROOT / "reports" / committed / "report.html", 1280, tmp_path)
        assert scroll <= view, (committed, scroll, view)
    # the measurement itself: a page wider than the window is seen as one
    wide = tmp_path / "wide" / "report.html"
    wide.parent.mkdir()
    wide.write_text("<html><body><div style='width:3000px'>x</div></body></html>")
    scroll, view = _page_widths(wide, 1280, tmp_path)
    assert scroll > view
