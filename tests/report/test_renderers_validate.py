"""Renderers validate what they read (issue 44, fault 7): every row kind has a typed schema (accuracy.io.schemas),
checked on load by ``zyfa report``, ``zyfa longctx --render`` and ``zyfa cliffs --render``: a wrong type or an
impossible value is one line ``file:line: field: problem``, exit 2, nothing written. report.md is as inert as
report.html for names from result files, and a page combining rows of several commits or a dirty tree says so.

The rows are real: slices of the committed long-context and cliff results, and a tiny ``zyfa accuracy`` run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from zyfa.accuracy.io.schemas import SchemaError, check_any_row, check_provenance, mixed_code_notice

from zyfa.cli import main as zyfa

ROOT = Path(__file__).resolve().parents[2]
LONGCTX = ROOT / "reports" / "longctx" / "results-smollm2.jsonl"
CLIFFS = ROOT / "reports" / "cliffs" / "results.jsonl"


def _lines(path: Path) -> tuple[dict, list[dict]]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return lines[0], lines[1:]


def _write(path: Path, prov: dict, rows: list[dict], tail: str = "") -> Path:
    path.write_text("\n".join(json.dumps(x) for x in [prov, *rows]) + "\n" + tail)
    return path


def _one_line(capsys, *words) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
    return err


@pytest.fixture(scope="module")
def longctx_rows():
    """Real long-context rows: one length, two seeds, the baseline and two FP8 kernels (36 rows)."""
    prov, rows = _lines(LONGCTX)
    keep = [r for r in rows if r["length"] == 1024 and r["task"] == "needle" and r["seed"] < 2
            and r["implementation"] in ("sdpa-fp32", "triton:zyfa", "triton:fa3")]
    assert len({r["implementation"] for r in keep}) == 3 and len(keep) <= 80
    return prov, keep


@pytest.fixture(scope="module")
def cliff_rows():
    prov, rows = _lines(CLIFFS)
    keep = [r for r in rows if r["implementation"] == "triton:zyfa-exp2"]
    assert keep
    return prov, keep


@pytest.fixture(scope="module")
def accuracy_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("acc") / "r.jsonl"
    assert zyfa(["accuracy", "--seq", "64", "--heads", "2", "--head-dim", "64", "--recipes", "zyfa,fp32",
                 "--device", "cpu", "--no-progress", "--out", str(path)]) == 0
    return path


def _changed(rows, i, **fields):
    out = [dict(r) for r in rows]
    out[i].update(fields)
    return out


# (case, provenance change, row index, row change, words of the error)
LONGCTX_CASES = [
    ("recipes-5", {"recipes": 5}, None, {}, [":1: recipes: must be a list of strings, got 5"]),
    ("platform-list", {"platform": ["Linux", "x86_64"]}, None, {}, [":1: platform: must be a string"]),
    ("length-abc", {}, 3, {"length": "abc"}, [":5: length: must be an integer >= 1, got 'abc'"]),
    ("length-negative", {}, 0, {"length": -1024}, [":2: length: must be an integer >= 1, got -1024"]),
    ("logprob-infinity", {}, 1, {"answer_logprob": float("inf")}, [":3: answer_logprob: must be a finite number"]),
    ("logprob-positive", {}, 1, {"answer_logprob": 2.5}, [":3: answer_logprob:", "<= 1e-06"]),
    ("depth-7.5", {}, 2, {"depth": 7.5}, [":4: depth: must be a finite number in [0.0, 1.0], got 7.5"]),
    ("exact-yes", {}, 4, {"exact": "yes"}, [":6: exact: must be true or false", "'yes'"]),
    ("seed-missing", {}, 0, {"seed": None}, [":2: seed: must be an integer >= 0"]),
]


@pytest.mark.parametrize("case,prov_change,at,change,words", LONGCTX_CASES, ids=[c[0] for c in LONGCTX_CASES])
def test_longctx_render_refuses_wrong_types_and_impossible_values(longctx_rows, tmp_path, capsys, case, prov_change,
                                                                  at, change, words):
    prov, rows = longctx_rows
    rows = _changed(rows, at, **change) if at is not None else rows
    path = _write(tmp_path / "lc.jsonl", {**prov, **prov_change}, rows)
    out = tmp_path / "rep"
    assert zyfa(["longctx", "--render", str(path), "--out", str(out)]) == 2
    _one_line(capsys, str(path), *words)
    assert not out.exists()


def test_longctx_render_of_good_rows_works(longctx_rows, tmp_path, capsys):
    prov, rows = longctx_rows
    path = _write(tmp_path / "lc.jsonl", prov, rows)
    assert zyfa(["longctx", "--render", str(path), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "Notice:" not in text  # one run: no notice


def test_report_refuses_bad_provenance_rows_and_a_longctx_file_without_baseline(accuracy_file, longctx_rows,
                                                                                 tmp_path, capsys):
    prov, rows = _lines(accuracy_file)
    out = tmp_path / "rep"
    bad = _write(tmp_path / "recipes5.jsonl", {**prov, "recipes": 5}, rows)
    assert zyfa(["report", "--results", str(bad), "--out", str(out), "--no-plots"]) == 2
    _one_line(capsys, f"{bad}:1: recipes: must be a list of strings, got 5")
    bad = _write(tmp_path / "plat.jsonl", prov, _changed(rows, 1, platform=["h200"]))
    assert zyfa(["report", "--results", str(bad), "--out", str(out), "--no-plots"]) == 2
    _one_line(capsys, f"{bad}:3: platform: must be a string or null")
    bad = _write(tmp_path / "seq.jsonl", prov, _changed(rows, 0, seq_q=-64))
    assert zyfa(["report", "--results", str(bad), "--out", str(out), "--no-plots"]) == 2
    _one_line(capsys, f"{bad}:2: seq_q: must be an integer >= 0")
    lprov, lrows = longctx_rows
    nobase = _write(tmp_path / "nobase.jsonl", lprov, [r for r in lrows if r["implementation"] != "sdpa-fp32"])
    assert zyfa(["report", "--results", str(accuracy_file), "--longctx", str(nobase), "--out", str(out),
                 "--no-plots"]) == 2
    _one_line(capsys, "--longctx:", str(nobase), "no rows of a baseline implementation")
    deep = _write(tmp_path / "deep.jsonl", {**lprov, "models": [[[["smollm2"]]]]}, lrows)
    assert zyfa(["report", "--results", str(accuracy_file), "--longctx", str(deep), "--out", str(out),
                 "--no-plots"]) == 2
    _one_line(capsys, f"{deep}:1: models: must be a list of strings")
    assert not out.exists()


CLIFF_CASES = [
    ("length-abc", {}, 2, {"length": "abc"}, "", [":4: length: must be an integer >= 1, got 'abc'"]),
    ("length-negative", {}, 0, {"length": -3}, "", [":2: length: must be an integer >= 1, got -3"]),
    ("causal-string", {}, 1, {"causal": "False"}, "", [":3: causal: must be true or false"]),
    ("error-negative", {}, 1, {"orig_rel_l2": -0.5}, "", [":3: orig_rel_l2: must be a finite number >= 0.0"]),
    ("platform-list", {"platform": ["x"]}, None, {}, "", [":1: platform: must be a string"]),
    ("deep-partial", {}, None, {}, "[" * 100_000 + "]" * 100_000 + "\n", ["nested deeper than 32 levels"]),
]


@pytest.mark.parametrize("case,prov_change,at,change,tail,words", CLIFF_CASES, ids=[c[0] for c in CLIFF_CASES])
def test_cliffs_render_refuses_wrong_types_and_impossible_values(cliff_rows, tmp_path, capsys, case, prov_change,
                                                                 at, change, tail, words):
    prov, rows = cliff_rows
    rows = _changed(rows, at, **change) if at is not None else rows
    name = "cliffs.jsonl.partial" if tail else "cliffs.jsonl"
    path = _write(tmp_path / name, {**prov, **prov_change}, rows, tail)
    out = tmp_path / "rendered"
    assert zyfa(["cliffs", "--render", str(path), "--out", str(out)]) == 2
    _one_line(capsys, str(path), *words)
    assert not out.exists()


EVIL = {"script": "<script>alert(1)</script>", "img": "<img src=x onerror=alert(1)>",
        "link": "[click me](https://evil.example/x)", "bare": "see https://evil.example/y"}


def test_report_md_is_as_inert_as_report_html(accuracy_file, tmp_path):
    prov, rows = _lines(accuracy_file)
    names = {"zyfa": EVIL["script"] + EVIL["img"], "fp32": EVIL["link"] + " " + EVIL["bare"]}
    for r in rows:
        r["recipe"] = names.get(r["recipe"], r["recipe"])
        r["input"] = r["input"] + EVIL["img"]
    prov = {**prov, "recipes": list(names.values()), "device_name": EVIL["script"]}
    path = _write(tmp_path / "evil.jsonl", prov, rows)
    out = tmp_path / "rep"
    assert zyfa(["report", "--results", str(path), "--out", str(out), "--no-plots", "--title", EVIL["link"]]) == 0
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    md = re.sub(r"(?ms)^(`{3,})\n.*?^\1$", "", md)  # code blocks show their text literally (the command)
    page = re.sub(r"(?s)<pre><code>.*?</code></pre>", "", page)
    for text in (md, page):
        assert "<script" not in text and "<img" not in text, "raw HTML from a result file"
    assert "](https://evil" not in md and 'href="https://evil' not in page, "a link from a result file"
    assert "https://evil" not in md  # no bare URL (autolinked by GitHub) outside code
    assert "&lt;script>alert(1)&lt;/script>" in md  # shown, not dropped
    assert "\\[click me](https\\://evil.example/x)" in md


def test_notice_where_rows_of_several_commits_or_a_dirty_tree_are_combined(accuracy_file, longctx_rows, cliff_rows,
                                                                           tmp_path):
    notice = "Notice: rows of 2 git commits"
    # zyfa report: the same run's file twice, one copy from another commit of a dirty tree (another run id)
    prov, rows = _lines(accuracy_file)
    other = {**prov, "git_commit": "0ddc0de", "git_dirty": True, "run_id": "other-run"}
    b = _write(tmp_path / "b.jsonl", other, [dict(r, run_id="other-run", input=r["input"] + "-b") for r in rows])
    out = tmp_path / "rep"
    assert zyfa(["report", "--results", f"{accuracy_file},{b}", "--out", str(out), "--no-plots"]) == 0
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert notice in text and "0ddc0de" in text and "uncommitted changes" in text, name
    assert zyfa(["report", "--results", str(accuracy_file), "--out", str(tmp_path / "one"), "--no-plots"]) == 0
    assert "Notice:" not in (tmp_path / "one" / "report.md").read_text()
    # zyfa longctx --render of two files
    lprov, lrows = longctx_rows
    a = _write(tmp_path / "a.jsonl", lprov, [r for r in lrows if r["seed"] == 0])
    b = _write(tmp_path / "b2.jsonl", {**lprov, "git_commit": "0ddc0de", "run_id": "other"},
               [r for r in lrows if r["seed"] == 1])
    assert zyfa(["longctx", "--render", f"{a},{b}", "--out", str(tmp_path / "lc")]) == 0
    assert notice in (tmp_path / "lc" / "report.md").read_text()
    # zyfa cliffs --render of two sweeps
    cprov, crows = cliff_rows
    a = _write(tmp_path / "c1.jsonl", cprov, crows)
    b = _write(tmp_path / "c2.jsonl", {**cprov, "git_commit": "0ddc0de", "run_id": "other"},
               [dict(r, implementation="triton:zyfa-exp2-b") for r in crows])
    assert zyfa(["cliffs", "--render", f"{a},{b}", "--out", str(tmp_path / "cl")]) == 0
    assert notice in (tmp_path / "cl" / "cliffs.md").read_text()


def test_schemas_name_the_field_and_pass_every_committed_row():
    with pytest.raises(SchemaError, match=r"^f:3: git_dirty: must be true or false \(or null\), got 'no'$"):
        check_provenance({"git_dirty": "no"}, "f:3")
    with pytest.raises(SchemaError, match=r"^f:4: kind: must be a string"):
        check_any_row({"kind": 5, "recipe": "x", "input": "y"}, "f:4")  # an unknown kind: an operator row
    with pytest.raises(SchemaError, match=r"^f:5: task: missing \(every long-context row has it\)$"):
        check_any_row({"kind": "longctx"}, "f:5")
    assert mixed_code_notice([{"git_commit": "a", "git_dirty": False}] * 2) is None
    assert "1 of the 2 runs" in mixed_code_notice([{"git_commit": "a"}, {"git_commit": "a+dirty"}])
    from zyfa.accuracy.io.schemas import read_rows

    with pytest.raises(SchemaError, match=r"^f:6: window: must be an integer >= 0, got 'w1'$"):
        check_any_row({"kind": "impact_window", "model": "m", "recipe": "zyfa", "window": "w1", "n_tokens": 8,
                       "text": "lee"}, "f:6")
    for path in (LONGCTX, CLIFFS, *sorted((ROOT / "reports" / "real_kernels").glob("*.jsonl")),
                 *sorted((ROOT / "reports" / "impact").glob("*.jsonl"))):
        rows, _ = read_rows(path)
        assert rows


def test_task_summaries_and_calibration_read_through_the_schemas(longctx_rows, tmp_path, capsys):
    """``zyfa tasks humaneval --summarize`` and ``zyfa longctx --calibrate`` render rows too: the same checks."""
    row = {"kind": "humaneval", "input": "smollm2/HumanEval/0", "recipe": None, "implementation": "stock",
           "model": "smollm2", "task_id": "HumanEval/0", "status": "ok", "passed": True, "max_new_tokens": 8}
    good = _write(tmp_path / "he.jsonl", {"record": "provenance", "run_id": "r"}, [row])
    assert zyfa(["tasks", "humaneval", "--summarize", str(good)]) == 0
    capsys.readouterr()
    bad = _write(tmp_path / "he-bad.jsonl", {"record": "provenance", "run_id": "r"}, [dict(row, passed="yes")])
    assert zyfa(["tasks", "humaneval", "--summarize", str(bad)]) == 2
    _one_line(capsys, f"{bad}:2: passed: must be true or false")
    prov, rows = longctx_rows
    bad = _write(tmp_path / "lc.jsonl", prov, _changed(rows, 0, exact=1))
    assert zyfa(["longctx", "--calibrate", str(bad), "--baseline", "sdpa-fp32"]) == 2
    _one_line(capsys, f"{bad}:2: exact: must be true or false")
