"""User-supplied names cannot add headings, rows or columns to report.md or bench.md (issue 32): one escape,
``zyfa.markdown.md_escape``, for every such string in Markdown tables and headings."""

from __future__ import annotations

import json
import re

from zyfa.cli import main as zyfa
from zyfa.markdown import code_fence, md_escape

EVIL = "x|y\n## Injected heading\r\n| a | b |\u2028# also"


def test_md_escape_is_one_inert_line():
    assert md_escape(EVIL) == "x\\|y ## Injected heading \\| a \\| b \\| # also"
    assert md_escape("a\\|b") == "a\\\\\\|b"  # a backslash before a pipe cannot unescape it
    assert md_escape(EVIL, table=False) == "x|y ## Injected heading | a | b | # also"
    assert code_fence("```\n# not a heading") == "````" and code_fence("plain") == "```"


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)(?:\\\\)*\|", line))


def _check_markdown(text: str) -> None:
    lines, fence = [], None
    for ln in text.splitlines():  # code blocks hold text literally (the regenerate command): left out
        if fence is None and ln.startswith("```"):
            fence = re.match(r"`+", ln).group()
        elif fence is not None and ln == fence:
            fence = None
        elif fence is None:
            lines.append(ln)
    assert fence is None  # no code block left open by a name
    for ln in lines:  # no heading, row or fence that the names made
        assert not ln.lstrip().startswith(("## Injected", "# also", "| a | b |")), ln
    tables, cur = [], []
    for ln in lines + [""]:
        if ln.startswith("|"):
            cur.append(ln)
        elif cur:
            tables.append(cur)
            cur = []
    assert tables
    for t in tables:  # every row of a table has its header's columns
        n = _unescaped_pipes(t[0])
        assert all(_unescaped_pipes(r) == n for r in t), t


def test_report_md_escapes_names_device_and_title(tmp_path):
    res = tmp_path / "r.jsonl"
    assert zyfa(["accuracy", "--seq", "64", "--heads", "2", "--head-dim", "64", "--recipes", "zyfa,fp32",
                 "--device", "cpu", "--no-progress", "--out", str(res)]) == 0
    lines = [json.loads(x) for x in res.read_text().splitlines()]
    lines[0]["device_name"] = EVIL
    for r in lines[1:]:
        r["input"] = "gauss" + EVIL
        r["recipe"] = r["recipe"] + EVIL if r["recipe"] == "fp32" else r["recipe"]
    lines[0]["recipes"] = [r["recipe"] for r in lines[1:]]
    res.write_text("\n".join(map(json.dumps, lines)) + "\n")
    out = tmp_path / "rep"
    assert zyfa(["report", "--results", str(res), "--out", str(out), "--no-plots", "--title", "T" + EVIL]) == 0
    text = (out / "report.md").read_text()
    assert text.startswith("# T" + md_escape(EVIL) + "\n")
    assert md_escape("gauss" + EVIL) in text and md_escape("fp32" + EVIL) in text
    _check_markdown(text)


def test_bench_md_escapes_names_and_device(tmp_path):
    meta = {"device": "H200" + EVIL, "command": "zyfa bench" + EVIL, "date": "2026-11-30", "git_commit": "abc",
            "versions": {"torch": EVIL}, "inputs_note": EVIL}
    row = {"input": "gaussian" + EVIL, "h": 16, "h_kv": 16, "d_qk": 128, "d_v": 128, "s": 1024, "causal": False,
           "impl": "triton-fp8", "recipe": "zyfa-hopper" + EVIL, "tflops": 500.0, "ms": 0.1}
    failed = {**row, "recipe": "ck", "error": "RuntimeError: " + EVIL}
    js = tmp_path / "bench.json"
    js.write_text(json.dumps({"meta": meta, "rows": [row, failed]}))
    assert zyfa(["bench", "--render", str(js)]) == 0
    text = (tmp_path / "bench.md").read_text()
    assert text.splitlines()[0] == "# Benchmark: FP8 attention on H200" + md_escape(EVIL)
    assert md_escape("zyfa-hopper" + EVIL) in text
    _check_markdown(text)
