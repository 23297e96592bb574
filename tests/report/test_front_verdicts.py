"""The front page leads with a verdict per implementation and never shows a failed or nonconforming kernel's numbers;
every number of it names its source; the terminal summary of the scoring commands gives the same reasons.

The rows are real: four plug-in kernels measured on small inputs (two Gaussian ones and a few tokens of the shipped
SmolLM2 capture) by the accuracy runner on the CPU (:func:`zyfa.accuracy.api.measure`), each run written to its own
result file with its provenance, as ``zyfa accuracy`` writes them:

- ``good``: the shipped example kernel (per-tensor FP8 then fp32 attention): ok;
- ``crash``: raises: failed, with the kernel's error;
- ``nomask``: ignores ``causal`` and ``window``: nonconforming (the conformance probes);
- ``log2lse``: the example's output with its LSE in base 2: nonconforming (the ``lse`` probe says "log2").
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from zyfa.accuracy.api import measure
from zyfa.accuracy.io.results_io import write_results
from zyfa.accuracy.report.build import build_report
from zyfa.accuracy.report.document import Doc, render_html, render_markdown
from zyfa.accuracy.report.front import (
    FRONT_KEYS,
    error_table,
    front_prose,
    implementation_of,
    number,
    section_front,
    source_label,
    sources_of,
)
from zyfa.accuracy.report.results import load_results
from zyfa.accuracy.report.speed import load_bench
from zyfa.accuracy.scoring.kernel_verdicts import implementation_verdicts, short_reason, verdict_lines
from zyfa.capture.models import MODELS

from tests.load_file import load_module
from tests.report.conftest import FLOAT, html_tables, md_tables

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fp8_torch_attention.py"
SAMPLE = ROOT / "datasets" / "smollm2-lee-2048.h5"
INPUTS = ["gaussian", SAMPLE]
OPTIONS = {"layers": [0], "max_tokens": 32, "seq": 64, "device": "cpu"}


def _example():
    return load_module(EXAMPLE, "fp8_torch_attention_front_test").attention


def _kernels() -> dict:
    attention = _example()

    def crash(q, k, v, *, causal, sm_scale, window):
        raise RuntimeError("boom: out of shared memory")

    def nomask(q, k, v, *, causal, sm_scale, window):
        return attention(q, k, v, causal=False, sm_scale=sm_scale, window=None)

    def log2lse(q, k, v, *, causal, sm_scale, window):
        out, lse = attention(q, k, v, causal=causal, sm_scale=sm_scale, window=window)
        return out, lse / math.log(2.0)

    return {"good": attention, "crash": crash, "nomask": nomask, "log2lse": log2lse}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """(result files, bench file): one file per kernel (the first with the zyfa recipe's emulation too)."""
    folder = tmp_path_factory.mktemp("front_verdicts")
    paths = []
    for i, (name, fn) in enumerate(_kernels().items()):
        rows = measure(fn, inputs=INPUTS, recipes=["zyfa", "fa3"] if i == 0 else [], pair_with="zyfa",
                       name=f"plugin:{name}", progress=False, **OPTIONS)
        path = folder / f"{name}.jsonl"
        write_results(rows, path)
        paths.append(path)
    bench = folder / "bench.json"
    bench.write_text(json.dumps({"meta": {"device": "NVIDIA H200", "date": "2026-11-30T03:09:12+00:00",
                                          "git_commit": "abc1234def"},
                                 "rows": [{"input": "gaussian", "b": 1, "h": 16, "h_kv": 16, "s": 32768, "d_qk": 128,
                                           "d_v": 128, "causal": False, "impl": impl, "recipe": recipe,
                                           "tflops": t, "ms": 1.0}
                                          for impl, recipe, t in (("triton-fp8", "zyfa", 405.7),
                                                                  ("triton-fp8", "zyfa-hopper", 813.2),
                                                                  ("sdpa-bf16:cudnn", "bf16", 603.1),
                                                                  ("sdpa-bf16:flash", "bf16", 350.0),
                                                                  ("triton-fp8", "fa3", 774.0),
                                                                  ("flashinfer-fa3", "fa3", 843.0),
                                                                  ("cudnn-fp8", "cudnn-fp8", 933.3))]}))
    return paths, bench


@pytest.fixture(scope="module")
def page(planted):
    paths, bench = planted
    res = load_results(paths)
    doc = build_report(res, bench=load_bench([bench]), plots=False, this_run=("good.jsonl",))
    md = render_markdown(doc)
    return res, doc, md, render_html(doc)


def _front_md(md: str) -> str:
    return md.split("\n## ", 2)[1]


def test_each_kind_of_kernel_gets_its_verdict_and_reason(page):
    res, _, md, html = page
    t = md_tables(md)[FRONT_KEYS[0]]
    assert t == html_tables(html)[FRONT_KEYS[0]]
    head = t[0]
    assert head[:2] == ["implementation", "verdict"]  # the verdict leads, beside the name
    rows = {line[0]: dict(zip(head, line, strict=True)) for line in t[1:]}
    assert list(rows) == ["zyfa", "fa3", "plugin:good", "plugin:crash", "plugin:nomask", "plugin:log2lse"]
    assert rows["zyfa"]["verdict"] == "ok" and rows["plugin:good"]["verdict"] == "ok"
    assert rows["plugin:crash"]["verdict"].startswith("failed: ") and "boom" in rows["plugin:crash"]["verdict"]
    assert rows["plugin:nomask"]["verdict"].startswith("nonconforming: probe 'causal': causal=True ignored")
    # the log2-LSE kernel: as the conformance probes say (the lse probe names log2)
    conf = next(p for _, p in res.provenances if "plugin:log2lse" in (p.get("implementations_conformance") or {}))
    lse = conf["implementations_conformance"]["plugin:log2lse"]
    assert not lse["ok"] and "log2" in lse["failures"]["lse"]
    assert rows["plugin:log2lse"]["verdict"].startswith("nonconforming: probe 'lse': LSE looks like log2")
    # the whole reason where the cell cut it, in a line below the table
    front = _front_md(md)
    assert "`plugin:log2lse` is **nonconforming**: conformance probe 'lse'" in front and "log2" in front


def test_a_failed_or_nonconforming_kernel_shows_no_number_on_the_front_page(page):
    res, _, md, _ = page
    front = _front_md(md)
    t = md_tables(md)[FRONT_KEYS[0]]
    head = t[0]
    errors = [i for i, h in enumerate(head) if ":" in h]  # captures: deq ... Gaussian: orig
    for line in t[1:]:
        name = line[0]
        cells = [line[i] for i in errors]
        if name in ("plugin:crash", "plugin:nomask", "plugin:log2lse"):
            verdict = line[1].split(":")[0]
            assert all(c.startswith(f"{verdict}: ") for c in cells), (name, cells)
            assert not any(re.search(r"\d\.\d+e[-+]\d", c) for c in cells), (name, cells)
        else:  # the correct kernel: its numbers, the mean of its rows
            mine = [r for r in res.rows if implementation_of(r) == name and r.get("input_source") != "capture"]
            est = float(FLOAT.findall(line[head.index("Gaussian: orig")])[0])
            assert est == pytest.approx(sum(r["orig_rel_l2"] for r in mine) / len(mine), rel=6e-3)
    # nor in the prose, the picture's points or the frontier: the mask-ignoring kernel's own means appear nowhere
    # (the log2-LSE kernel's output is the correct kernel's, so its means are the correct kernel's numbers)
    mine = [r for r in res.rows if implementation_of(r) == "plugin:nomask" and r.get("orig_rel_l2") is not None]
    assert mine  # it ran: there are numbers to hide
    for src in (True, False):
        vals = [r["orig_rel_l2"] for r in mine if (r.get("input_source") == "capture") == src]
        assert number(sum(vals) / len(vals)) not in front
    entries = {e["name"]: e for e in error_table(res.rows)}
    assert "plugin:nomask" not in front_prose(list(entries.values()))


def test_every_number_on_the_front_page_names_its_source(page):
    _, _, md, html = page
    tables = md_tables(md)
    assert tables == {k: v for k, v in html_tables(html).items() if k in tables}
    number_cell = re.compile(r"\d")
    for key in FRONT_KEYS:
        head, *body = tables[key]
        assert head[-1] == "from", key
        for line in body:
            if any(number_cell.search(c) for c in line[1:-1]):
                src = line[-1]
                assert re.fullmatch(r"this run \(.+\)|[\w.-]+ @ [0-9a-f]{7}(\+dirty)?, [^;]+(; .+)?", src), \
                    (key, line)
    errors = {line[0]: line[-1] for line in tables[FRONT_KEYS[0]][1:]}
    assert errors["plugin:good"].startswith("this run (")  # the file this command wrote
    assert re.fullmatch(r"crash\.jsonl @ [0-9a-f]{7}(\+dirty)?, .+", errors["plugin:crash"])
    assert all(line[-1] == "bench.json @ abc1234, H200, 2026-11-30" for line in tables[FRONT_KEYS[1]][1:])
    # and all of them together above the first table, on the first screen
    above = _front_md(md).split('<a id="t-front-error">')[0]
    assert errors["plugin:good"] in above and errors["plugin:crash"] in above
    assert "speeds from bench.json @ abc1234, H200, 2026-11-30" in above
    # the prose's ratios are the table's own numbers divided
    front = _front_md(md)
    ratios = {}
    for line in tables[FRONT_KEYS[0]][1:3]:  # zyfa and fa3's emulations (the plug-ins quantize for themselves)
        cells = dict(zip(tables[FRONT_KEYS[0]][0], line, strict=True))
        for src in ("captures", "Gaussian"):
            d, o = (float(FLOAT.findall(cells[f"{src}: {m}"])[0]) for m in ("deq", "orig"))
            ratios.setdefault(src, []).append(o / d)
    cap, gau = sorted(ratios["captures"]), sorted(ratios["Gaussian"])
    assert (f"in this table the FP8 implementations' orig error is {cap[0]:.3g}× to {cap[1]:.3g}× their deq error "
            f"on the captures and {gau[0]:.3g}× to {gau[1]:.3g}× on the Gaussian inputs.") in front


def test_status_and_weights_are_explained_where_they_appear(page):
    _, _, md, _ = page
    front = _front_md(md)
    from zyfa.recipe_spec import get_recipe

    assert f"`zyfa` is **assumed**: {get_recipe('zyfa').status_note}." in front  # the paper's recipe, and why
    assert f"`fa3` is **modelled**: {get_recipe('fa3').status_note}" in front
    assert "**measured on X**" in front
    assert "**The captures come from 4-bit-weight models**" in front and "smollm2 (Q4_1)" in front


def test_timed_kernels_are_named_by_what_was_timed(page):
    _, _, md, _ = page
    front = _front_md(md)
    # the bench's triton-fp8 under fa3 is our kernel, FA3's real kernel is FlashInfer's
    assert "Pareto frontier of speed and error:" in front
    line = next(x for x in front.splitlines() if x.startswith("Pareto frontier"))
    assert "zyfa kernel (zyfa numerics)" in line or "zyfa kernel (fa3 numerics)" in line
    assert not re.search(r"(?<![\w-])fa3(?! numerics| \(FlashInfer\))", line), line


def test_verdicts_of_rows_kinds_and_reasons():
    rows = [{"implementation": "k", "status": "ok"}, {"implementation": "k", "status": "failed", "error": "boom"},
            {"implementation": "k", "status": "unsupported", "reason": "no window"},
            {"recipe": "zyfa"}, {"implementation": "s", "status": "suspect", "reason": "ratio 3"},
            {"implementation": "s", "status": "suspect", "reason": "ratio 4"},
            {"implementation": "n", "status": "nonconforming", "error": "nonconforming: mask ignored"},
            {"implementation": "n", "status": "failed", "error": "boom"},
            {"implementation": "u", "status": "refused", "reason": "head dim 80"}]
    v = {x.name: x for x in implementation_verdicts(rows)}
    assert v["k"].verdict == "failed"
    assert v["k"].reason == "boom (on 1 of 3 rows); declined 1 of 3 rows (unsupported): no window"
    assert v["zyfa"].verdict == "ok" and v["zyfa"].reason == ""
    assert v["s"].verdict == "suspect" and v["s"].reason == "ratio 3 (on all 2 rows; 1 other reason)"
    assert v["n"].verdict == "nonconforming" and v["n"].reason.startswith("mask ignored (on 1 of 2 rows)")
    assert v["u"].verdict == "not run" and not v["u"].scored and v["k"].short() == f"failed: {v['k'].reason}"
    assert verdict_lines(rows) == [f"failed: k: {v['k'].reason}", f"suspect: s: {v['s'].reason}",
                                   f"nonconforming: n: {v['n'].reason}", f"not run: u: {v['u'].reason}", "ok: zyfa"]
    assert verdict_lines([]) == []
    assert short_reason("word " * 40, 20) == "word word word…" and short_reason("short") == "short"


def test_the_readme_results_state_the_4_bit_weights_of_the_shipped_models():
    block = (ROOT / "README.md").read_text(encoding="utf-8").split("## What we found", 1)[1].split("\n## ", 1)[0]
    assert "4-bit-weight models" in block
    shipped = {p.stem.split("-")[0] for p in (ROOT / "datasets").glob("*.h5")}  # smollm2, gemma3, qwen25coder
    quants = {re.search(r"GGUF (Q\w+)", MODELS[m].description).group(1) for m in shipped}
    assert quants and all(q in block for q in quants), quants


def test_source_labels_read_the_provenance_record():
    assert source_label("r.jsonl", {"device": "cuda", "cuda_device": "NVIDIA H200", "git_commit": "8c975bd"}) == \
        "r.jsonl @ 8c975bd, H200"
    assert source_label("r.jsonl", {"device": "cpu", "device_name": "AMD EPYC", "git_commit": "abcdef123456",
                                    "git_dirty": True}) == "r.jsonl @ abcdef1+dirty, AMD EPYC"
    assert source_label("r.jsonl", {"device": "cpu", "device_name": "AMD EPYC"}, ("r.jsonl",)) == \
        "this run (AMD EPYC)"
    assert source_label("old.jsonl", {}) == "old.jsonl @ no commit, device unknown"
    rows = [{"_file": "a.jsonl"}, {"_file": "b.jsonl"}, {"_file": "a.jsonl"}, {"_file": "a.jsonl", "_no_provenance": 1}]
    provs = [("a.jsonl", {"device": "cpu", "git_commit": "1234567"}), ("b.jsonl", {})]
    assert sources_of(rows, provs, ()) == ("a.jsonl @ 1234567, cpu; b.jsonl @ no commit, device unknown; "
                                           "unknown source")


def test_quick_study_shows_no_speed_column_of_a_kernel_it_does_not_show(planted):
    """--quick has bf16 and zyfa but not zyfa-hopper: cuDNN BF16's speed stays beside bf16, and neither our
    kernel's column nor its "× cuDNN BF16" ratio (our kernel's speed over cuDNN's) appears."""
    _, bench = planted
    rows = [{"recipe": r, "input_source": "gaussian", "deq_rel_l2": e, "orig_rel_l2": 2 * e}
            for r, e in (("zyfa", 0.02), ("bf16", 0.002))]
    doc = Doc(title="t")
    section_front(doc, rows, load_bench([bench]), plots=False)
    head = md_tables(render_markdown(doc))[FRONT_KEYS[1]][0]
    assert head == ["shape", "s", "mask", "cuDNN BF16", "from"]
