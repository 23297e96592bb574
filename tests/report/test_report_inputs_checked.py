"""``zyfa report`` and ``zyfa bench --render`` against hostile inputs (issue 32): real files, the real command.

Duplicates keep the later measurement with a one-line notice; rows without a provenance record are counted and
flagged in the report; impossible metrics (negative or infinite errors) are refused naming file and line; a
hand-written report.md in --out is never overwritten without --force; a line of 100,000 nested brackets and a
5,000-digit number are one line naming file and line, never a RecursionError; a bench file with a NaN or
negative head count is one line, not ``hnan/16``.
"""

from __future__ import annotations

import json

import pytest
from zyfa.accuracy.report.results import load_results

from zyfa.cli import main as zyfa

SMALL = ["accuracy", "--seq", "64", "--heads", "2", "--head-dim", "64", "--recipes", "zyfa,fp32", "--device", "cpu",
         "--no-progress"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = tmp_path_factory.mktemp("res") / "r.jsonl"
    assert zyfa([*SMALL, "--out", str(path)]) == 0
    return path.read_text().splitlines()


def _file(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def _report(tmp_path, *files, extra=()):
    return zyfa(["report", "--results", ",".join(map(str, files)), "--out", str(tmp_path / "rep"), "--no-plots",
                 *extra])


def _one_line(capsys, *words):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]


def test_duplicate_rows_keep_the_later_measurement_with_a_notice(tmp_path, capsys, results):
    later = [json.loads(x) for x in results]
    for row in later[1:]:
        row["deq_rel_l2"] = 0.123456
    a = _file(tmp_path, "a.jsonl", results)
    b = _file(tmp_path, "b.jsonl", [json.dumps(x) for x in later])
    assert _report(tmp_path, a, b) == 0
    out = capsys.readouterr().out
    notice = [ln for ln in out.splitlines() if ln.startswith("notice:")]
    assert notice == ["notice: 2 duplicate rows (same input, content hash, recipe, implementation, platform and "
                      "pairing): the later measurement is kept (a later file on the command line, or a later line "
                      "of one file), the earlier left out"], out
    res = load_results([a, b])
    assert [r["deq_rel_l2"] for r in res.rows] == [0.123456, 0.123456] and res.replaced == 2
    assert "2 rows were measured again later" in (tmp_path / "rep" / "report.md").read_text()


def test_rows_without_provenance_are_flagged(tmp_path, capsys, results):
    rows = [json.loads(x) for x in results[1:]]
    rows[1]["run_id"] = "nobody-ran-this"
    p = _file(tmp_path, "r.jsonl", [results[0], *map(json.dumps, rows)])
    assert _report(tmp_path, p) == 0
    assert "notice: 1 row with no provenance record" in capsys.readouterr().out
    assert "**1 rows have no provenance record**" in (tmp_path / "rep" / "report.md").read_text()
    bare = _file(tmp_path, "bare.jsonl", results[1:])  # no provenance line at all
    assert load_results([bare]).orphans == 2 and load_results([p]).orphans == 1


@pytest.mark.parametrize("key, value, words", [
    ("deq_rel_l2", "-Infinity", ["metric 'deq_rel_l2' must be a finite number", "-inf"]),
    ("orig_rel_l2", "-0.5", ["metric 'orig_rel_l2' is an error, which cannot be negative", "-0.5"]),
    ("deq_max_abs_err", "Infinity", ["metric 'deq_max_abs_err' must be a finite number"]),
    ("deq_cosine", "1.5", ["metric 'deq_cosine' must lie in [-1, 1]"]),
    ("deq_sqnr_db", "-Infinity", ["metric 'deq_sqnr_db'"]),
])
def test_impossible_metrics_are_refused_naming_file_and_line(tmp_path, capsys, results, key, value, words):
    row = json.loads(results[2])
    line = json.dumps(row).replace(f'"{key}": {json.dumps(row[key])}', f'"{key}": {value}')
    assert value in line
    p = _file(tmp_path, "r.jsonl", [*results[:2], line])
    assert _report(tmp_path, p) == 2
    _one_line(capsys, f"{p}:3:", *words)
    assert not (tmp_path / "rep").exists()


def test_nan_metrics_of_an_overflow_stay_readable(tmp_path, results):
    row = json.loads(results[2])
    row.update(deq_rel_l2=float("nan"), has_nan=True)
    p = _file(tmp_path, "r.jsonl", [*results[:2], json.dumps(row)])
    assert load_results([p]).rows[-1]["has_nan"] is True


@pytest.mark.parametrize("line, words", [
    ("[" * 100_000 + "]" * 100_000, ["nested deeper than 32 levels"]),
    ('{"recipe": "zyfa", "input": "x", "n": ' + "7" * 5000 + "}", ["not JSON", "4300 digits"]),
    ('{"recipe": "zyfa", "input": "x", "deq_rel_l2": ' + "7" * 5000 + ".0}",
     ["metric 'deq_rel_l2' must be a finite number"]),
], ids=["deep", "5000-digit int", "5000-digit float"])
def test_hostile_lines_name_file_and_line(tmp_path, capsys, results, line, words):
    p = _file(tmp_path, "r.jsonl", [results[0], line])
    assert _report(tmp_path, p) == 2
    _one_line(capsys, f"{p}:2:", *words)


def test_hostile_csv_cells_name_file_and_line(tmp_path, capsys):
    p = tmp_path / "r.csv"
    p.write_text("input,recipe,n_rows\nx,zyfa," + "7" * 5000 + "\n")
    (tmp_path / "r.provenance.json").write_text(json.dumps({"provenance": {}, "columns": {"n_rows": "int"}}))
    assert _report(tmp_path, p) == 2
    _one_line(capsys, f"{p}:2:")
    (tmp_path / "r.provenance.json").write_text("[" * 100_000 + "]" * 100_000)
    assert _report(tmp_path, p) == 2
    _one_line(capsys, "r.provenance.json: not JSON")


def test_hand_written_report_is_not_overwritten_without_force(tmp_path, capsys, results):
    p = _file(tmp_path, "r.jsonl", results)
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "report.md").write_text("# My notes on this run\n")
    assert _report(tmp_path, p) == 2
    _one_line(capsys, f"{rep / 'report.md'} was not written by zyfa report", "--force")
    assert (rep / "report.md").read_text() == "# My notes on this run\n"
    assert sorted(x.name for x in rep.iterdir()) == ["report.md"]
    assert _report(tmp_path, p, extra=["--force"]) == 0
    assert "zyfa report --results" in (rep / "report.md").read_text()
    assert _report(tmp_path, p) == 0  # its own report is replaced without --force


META = {"device": "NVIDIA H200", "command": "zyfa bench", "date": "2026-11-30T00:00:00+00:00",
        "git_commit": "abc", "versions": {"torch": "2.13"}, "inputs_note": "Gaussian"}
ROW = {"input": "gaussian", "h": 16, "h_kv": 16, "d_qk": 128, "d_v": 128, "s": 1024, "causal": False,
       "impl": "triton-fp8", "recipe": "zyfa-hopper", "tflops": 500.0, "ms": 0.1}


@pytest.mark.parametrize("field, value, words", [
    ("h", "NaN", ["rows[0]: 'h' must be a positive integer, got nan"]),
    ("h", "-4", ["rows[0]: 'h' must be a positive integer, got -4"]),
    ("h_kv", "2.5", ["'h_kv' must be a positive integer"]),
    ("ms", "-1.0", ["'ms' must be a finite number >= 0"]),
    ("tflops", "Infinity", ["'tflops' must be a finite number >= 0"]),
])
def test_bench_render_refuses_bad_counts(tmp_path, capsys, field, value, words):
    js, md = tmp_path / "bench.json", tmp_path / "bench.md"
    js.write_text(json.dumps({"meta": META, "rows": [ROW]}).replace(f'"{field}": {json.dumps(ROW[field])}',
                                                                    f'"{field}": {value}'))
    md.write_text("old\n")
    assert zyfa(["bench", "--render", str(js)]) == 2
    _one_line(capsys, str(js), *words)
    assert md.read_text() == "old\n"


def test_bench_render_deep_and_long_json(tmp_path, capsys):
    js = tmp_path / "bench.json"
    for text in ("[" * 100_000 + "]" * 100_000, '{"meta": ' + "9" * 5000 + "}"):
        js.write_text(text)
        assert zyfa(["bench", "--render", str(js)]) == 2
        _one_line(capsys, str(js))
