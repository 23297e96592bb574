"""``zyfa accuracy --out`` and ``zyfa report`` under mistakes and faults: one clear line (exit 2, no traceback)
before any work, nothing written earlier lost.

Faults: an existing output (refused unless --force / --resume), a read-only folder, a directory, ``/proc``, a
missing folder, a full disk (a tiny tmpfs as root; everywhere, a writer whose os.write raises ENOSPC mid-run),
inputs too large for memory, and foreign result files read by ``zyfa report``.
"""

from __future__ import annotations

import json

import pytest

from tests.faults import disk_full_after_rows, readonly_dir, result_rows, rows_match, tiny_fs
from zyfa.cli import main as zyfa

SMALL = ["accuracy", "--seq", "128", "--heads", "2", "--head-dim", "64", "--recipes", "zyfa,ck,fp32",
         "--no-progress"]


def _one_line_error(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_existing_out_is_refused_then_force_and_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert zyfa([*SMALL, "--out", "r.jsonl"]) == 0
    before = (tmp_path / "r.jsonl").read_bytes()
    capsys.readouterr()
    assert zyfa([*SMALL, "--out", "r.jsonl"]) == 2
    _one_line_error(capsys, "r.jsonl exists", "--resume", "--force")
    assert (tmp_path / "r.jsonl").read_bytes() == before

    # --resume of a finished file: nothing to run, the same rows
    assert zyfa([*SMALL, "--out", "r.jsonl", "--resume"]) == 0
    assert "3 of 3 rows done" in capsys.readouterr().out
    assert result_rows(tmp_path / "r.jsonl") == [
        {k: v for k, v in r.items()} for r in result_rows_from_bytes(before, tmp_path)]

    # --resume with one more recipe: the three kept, one new, in the order of an uninterrupted run
    assert zyfa([*SMALL[:-2], "zyfa,ck,fp32,bf16", "--no-progress", "--out", "r.jsonl", "--resume"]) == 0
    assert zyfa([*SMALL[:-2], "zyfa,ck,fp32,bf16", "--no-progress", "--out", "full.jsonl"]) == 0
    assert rows_match(result_rows(tmp_path / "r.jsonl"), result_rows(tmp_path / "full.jsonl"))

    # --force starts over
    assert zyfa([*SMALL, "--out", "r.jsonl", "--force"]) == 0
    assert [r["recipe"] for r in result_rows(tmp_path / "r.jsonl")] == ["zyfa", "ck", "fp32"]
    capsys.readouterr()
    assert zyfa([*SMALL, "--out", "r.jsonl", "--force", "--resume"]) == 2
    _one_line_error(capsys, "--force", "--resume")


def result_rows_from_bytes(data: bytes, tmp_path):
    p = tmp_path / "copy.jsonl"
    p.write_bytes(data)
    return result_rows(p)


def test_resume_refuses_another_runs_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert zyfa([*SMALL, "--out", "r.jsonl"]) == 0
    before = (tmp_path / "r.jsonl").read_bytes()
    capsys.readouterr()
    assert zyfa([*SMALL[:2], "256", *SMALL[3:], "--out", "r.jsonl", "--resume"]) == 2
    _one_line_error(capsys, "holds rows this run would not make")
    assert (tmp_path / "r.jsonl").read_bytes() == before


@pytest.mark.parametrize("out, words", [
    ("{tmp}", ["must end in .jsonl or .csv"]),
    ("{tmp}/adir.jsonl", ["is a directory"]),
    ("/proc/r.jsonl", ["cannot write in /proc"]),
    ("{tmp}/missing/r.jsonl", ["does not exist"]),
])
def test_unwritable_out_fails_before_work(tmp_path, capsys, out, words):
    (tmp_path / "adir.jsonl").mkdir()
    # a Gaussian input of 10^5 heads would take minutes to make: the output is checked before it
    assert zyfa([*SMALL, "--heads", "100000", "--out", out.format(tmp=tmp_path)]) == 2
    _one_line_error(capsys, *words)


def test_read_only_folder_fails_before_work_and_keeps_files(tmp_path, capsys):
    old = b'{"record": "provenance"}\n'
    with readonly_dir(tmp_path / "ro", {"r.jsonl": old}) as ro:
        assert zyfa([*SMALL, "--out", str(ro / "new.jsonl")]) == 2
        line = _one_line_error(capsys, "cannot write in")
        assert "read-only" in line or "Permission denied" in line
        assert zyfa([*SMALL, "--out", str(ro / "r.jsonl"), "--force"]) == 2
        _one_line_error(capsys, "cannot write in")
        assert (ro / "r.jsonl").read_bytes() == old
        assert sorted(p.name for p in ro.iterdir()) == ["r.jsonl"]


def test_tiny_disk_is_refused_before_work(tmp_path, capsys):
    with tiny_fs(tmp_path / "tiny", "64k") as tiny:
        (tiny / "old.jsonl").write_bytes(b"x" * 1000)
        assert zyfa([*SMALL, "--out", str(tiny / "r.jsonl")]) == 2
        _one_line_error(capsys, "not enough free space")
        assert (tiny / "old.jsonl").read_bytes() == b"x" * 1000
        assert sorted(p.name for p in tiny.iterdir()) == ["old.jsonl"]


def test_disk_full_mid_run_keeps_earlier_rows_and_the_old_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert zyfa([*SMALL, "--out", "r.jsonl"]) == 0
    before = (tmp_path / "r.jsonl").read_bytes()
    capsys.readouterr()
    with disk_full_after_rows(monkeypatch, 1):
        assert zyfa([*SMALL, "--out", "r.jsonl", "--force"]) == 2
    line = _one_line_error(capsys, "no space left on device", "r.jsonl.partial", "--resume")
    assert "lines written before are kept" in line
    assert (tmp_path / "r.jsonl").read_bytes() == before  # the finished file of the earlier run is intact
    kept = result_rows(tmp_path / "r.jsonl.partial")
    assert [r["recipe"] for r in kept] == ["zyfa"]
    assert kept == result_rows(tmp_path / "r.jsonl")[:1]
    # and the interrupted run resumes to the same rows
    assert zyfa([*SMALL, "--out", "r.jsonl", "--resume"]) == 0
    assert result_rows(tmp_path / "r.jsonl") == result_rows_from_bytes(before, tmp_path)


@pytest.mark.parametrize("flags, words", [
    (["--heads", "100000"], ["needs about", "GiB", "heads 100000"]),
    (["--seq", "100000000"], ["needs about", "GiB", "seq 100000000"]),
])
def test_oversized_inputs_are_refused_before_allocating(tmp_path, capsys, flags, words):
    assert zyfa(["accuracy", *flags, "--recipes", "zyfa", "--no-progress"]) == 2
    _one_line_error(capsys, *words)


def test_seq_not_an_integer_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        zyfa(["accuracy", "--seq", "1e8"])
    assert e.value.code == 2
    assert "invalid int value: '1e8'" in capsys.readouterr().err


@pytest.mark.parametrize("line, words", [
    ('{"input": "x", "deq_rel_l2": 0.1}', ["r.jsonl:2", "no 'recipe' key"]),
    ('[1, 2, 3]', ["r.jsonl:2", "expected a JSON object", "list"]),
    ('{"input": "x", "recipe": "zyfa", "deq_rel_l2": "small"}', ["r.jsonl:2", "'deq_rel_l2' must be a number"]),
    ('{"input": "x", "recipe": 3}', ["r.jsonl:2", "'recipe' must be a string"]),
    ('not json', ["r.jsonl:2", "not JSON"]),
])
def test_report_names_file_and_line_of_a_foreign_row(tmp_path, capsys, line, words):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"record": "provenance", "run_id": "x"}) + "\n" + line + "\n")
    assert zyfa(["report", "--results", str(path), "--out", str(tmp_path / "rep")]) == 2
    _one_line_error(capsys, *words)
    assert not (tmp_path / "rep").exists()


def test_foreign_csv_row_is_named(tmp_path):
    from zyfa.accuracy.io.results_io import read_results

    path = tmp_path / "r.csv"
    path.write_text("input,recipe,deq_rel_l2\nx,zyfa,0.5\ny,zyfa,0.5,extra\n")
    with pytest.raises(ValueError, match=r"r\.csv:3: more cells than columns"):
        read_results(path)
