"""A run cut and continued with ``--resume`` is a chain of segments, each with its own run_id, commit, device and
date: every row carries the run_id of the segment that made it, and the file's provenance is the latest segment's,
listing the earlier ones (``earlier_runs``, oldest first, never nested). Real files in tmp_path through the harness
(accuracy.io.results_io.ResultsFile, accuracy.io.shard.ShardedResults / RankRows) and through ``zyfa accuracy``;
then the readers that attribute rows: the report's orphan count, mixed_code_notice, source_label."""

from __future__ import annotations

import json

import pytest
from zyfa.accuracy.io.cost_model import add_record
from zyfa.accuracy.io.results_io import (
    ResultsFile,
    read_jsonl,
    read_log,
    row_key,
    run_provenances,
    write_results,
)
from zyfa.accuracy.io.schemas import SchemaError, check_provenance, mixed_code_notice, read_rows
from zyfa.accuracy.io.shard import Dist, RankRows, ShardedResults
from zyfa.accuracy.report.document import Doc, render_markdown
from zyfa.accuracy.report.front import source_label
from zyfa.accuracy.report.results import load_results
from zyfa.accuracy.report.sections import section_provenance

from tests.faults import disk_full_after_rows
from zyfa.cli import main as zyfa

COMMIT_A, COMMIT_B, COMMIT_C = "e578be6" + "0" * 33, "d3c31b1" + "0" * 33, "a7ef594" + "0" * 33


def _prov(run_id: str, commit: str, gpu: str, day: int) -> dict:
    return {"run_id": run_id, "git_commit": commit, "git_dirty": False, "date_utc": f"2026-01-{day:02d}T10:00:00Z",
            "device": "cuda", "cuda_device": f"NVIDIA {gpu}", "torch": "2.11.0", "platform": "Linux x86_64",
            "command": "zyfa tasks humaneval --resume"}


def _row(i: int, run_id: str | None) -> dict:
    return {"run_id": run_id, "input": f"in{i}", "input_content_hash": f"h{i}", "recipe": "zyfa",
            "implementation": None, "deq_rel_l2": 0.1 * (i + 1)}


KEYS = [row_key(_row(i, None)) for i in range(6)]


def _segment(out, prov: dict, rows: range, *, resume: bool, finish: bool) -> ResultsFile:
    """One run segment through the harness: open, start with ``prov``, add ``rows`` (made by it), then finish or
    close (cut)."""
    rf = ResultsFile.open(out, resume=resume)
    assert rf.run_id is None, "a file hands no run_id on: each segment has its own"
    rf.start(prov)
    for i in rows:
        rf.add(_row(i, prov["run_id"]))
    if finish:
        rf.finish(rf.rows_in_order(KEYS[:rows.stop]), prov, write_results)
    else:
        rf.close()
    return rf


def _ids(prov: dict) -> list:
    return [p.get("run_id") for p in run_provenances(prov)]


def test_a_resumed_run_is_a_segment_with_its_own_run_id(tmp_path):
    out = tmp_path / "he.jsonl"
    a, b = _prov("run-a", COMMIT_A, "H200", 1), _prov("run-b", COMMIT_B, "H100", 3)
    _segment(out, a, range(2), resume=False, finish=False)  # A: 2 rows, cut
    rf = ResultsFile.open(out, resume=True)
    assert rf.resumed_from == rf.partial and rf.provenance["run_id"] == "run-a"
    assert rf.earlier == [a]
    rf.start(b)
    assert _ids(b) == ["run-a", "run-b"], "start lists the earlier segment in the caller's provenance, in place"
    # B's start writes nothing: a segment that makes no row leaves no trace in the partial
    assert [json.loads(x).get("record") for x in rf.partial.read_text().splitlines()] == \
        ["provenance", None, None], "nothing of B before its first row"
    rf.add(_row(2, "run-b"))
    # the partial between B's first row and its finish: B's provenance, A listed; each row made by its segment
    rows, prov = read_log(rf.partial)
    assert prov["run_id"] == "run-b" and run_provenances(prov) == [a, {k: v for k, v in b.items()
                                                                       if k in a}]
    assert [r["run_id"] for r in rows] == ["run-a", "run-a", "run-b"]
    assert [json.loads(x).get("record") for x in rf.partial.read_text().splitlines()] == \
        ["provenance", None, None, "provenance", None], "B's provenance line is appended before its rows"
    rf.add(_row(3, "run-b"))
    rf.finish(rf.rows_in_order(KEYS[:4]), b, write_results)

    rows, prov = read_jsonl(out)
    assert prov["run_id"] == "run-b" and prov["git_commit"] == COMMIT_B and prov["cuda_device"] == "NVIDIA H100"
    assert run_provenances(prov) == [a, {k: v for k, v in prov.items() if k in a}]
    assert [r["run_id"] for r in rows] == ["run-a", "run-a", "run-b", "run-b"]
    assert out.read_text().count('"record": "provenance"') == 1, "a finished file has one provenance record"
    check_provenance(prov, str(out))
    # read through the renderers' schema reader too: the last record of the partial, every record checked
    assert read_rows(out)[1] == prov


def test_a_resume_with_nothing_left_adds_no_segment(tmp_path):
    """A finished file resumed by a run that makes no row is left byte for byte (no segment, no partial); a run
    that makes no row on a cut partial writes nothing to it, and a later segment that adds rows lists only the
    segments that made some."""
    out = tmp_path / "r.jsonl"
    a, b, c = (_prov("run-a", COMMIT_A, "H200", 1), _prov("run-b", COMMIT_B, "H100", 2),
               _prov("run-c", COMMIT_C, "H100", 3))
    _segment(out, a, range(2), resume=False, finish=True)
    before = out.read_bytes()
    rf = ResultsFile.open(out, resume=True)
    rf.start(b)
    assert rf.finish(rf.rows_in_order(KEYS[:2]), b, write_results) == out
    assert out.read_bytes() == before and not rf.partial.exists()
    # a cut partial: B starts and is cut before a row; C then adds rows and finishes
    out2 = tmp_path / "s.jsonl"
    _segment(out2, a, range(2), resume=False, finish=False)
    part = tmp_path / "s.jsonl.partial"
    cut = part.read_bytes()
    rf = ResultsFile.open(out2, resume=True)
    rf.start(b)
    rf.close()
    assert part.read_bytes() == cut
    _segment(out2, c, range(2, 4), resume=True, finish=True)
    rows, prov = read_jsonl(out2)
    assert _ids(prov) == ["run-a", "run-c"] and [r["run_id"] for r in rows] == ["run-a"] * 2 + ["run-c"] * 2


def test_three_segments_chain_without_nesting(tmp_path):
    out = tmp_path / "r.jsonl"
    a, b, c = (_prov("run-a", COMMIT_A, "H200", 1), _prov("run-b", COMMIT_B, "H100", 2),
               _prov("run-c", COMMIT_C, "H100", 3))
    _segment(out, a, range(2), resume=False, finish=False)
    _segment(out, b, range(2, 4), resume=True, finish=False)
    _, mid = read_log(tmp_path / "r.jsonl.partial")
    assert _ids(mid) == ["run-a", "run-b"]
    _segment(out, c, range(4, 6), resume=True, finish=True)
    rows, prov = read_jsonl(out)
    assert _ids(prov) == ["run-a", "run-b", "run-c"]
    assert [p["git_commit"] for p in run_provenances(prov)] == [COMMIT_A, COMMIT_B, COMMIT_C]
    assert [r["run_id"] for r in rows] == ["run-a"] * 2 + ["run-b"] * 2 + ["run-c"] * 2
    raw = json.loads(out.read_text().splitlines()[0])
    assert [e["run_id"] for e in raw["earlier_runs"]] == ["run-a", "run-b"]
    assert not any("earlier_runs" in e for e in raw["earlier_runs"]), "earlier segments never nest"


def test_resuming_a_finished_file_adds_a_segment(tmp_path):
    """A finished file continued (more rows planned): its rows keep their run_id; resumed again after a cut, the
    chain is still A, B, C."""
    out = tmp_path / "r.jsonl"
    a, b, c = (_prov("run-a", COMMIT_A, "H200", 1), _prov("run-b", COMMIT_B, "H100", 2),
               _prov("run-c", COMMIT_B, "H100", 3))
    _segment(out, a, range(2), resume=False, finish=True)
    _segment(out, b, range(2, 3), resume=True, finish=False)  # resumed from the finished file, then cut
    _, mid = read_log(tmp_path / "r.jsonl.partial")
    assert _ids(mid) == ["run-a", "run-b"]
    _segment(out, c, range(3, 4), resume=True, finish=True)
    rows, prov = read_jsonl(out)
    assert _ids(prov) == ["run-a", "run-b", "run-c"]
    assert [r["run_id"] for r in rows] == ["run-a", "run-a", "run-b", "run-c"]


def test_a_sharded_resume_lists_every_segment_of_every_file(tmp_path):
    """ShardedResults and RankRows (one process, no torchrun): a single-process partial (A, cut) continued by a
    sharded run (B, cut), then finished by another (C). The merged file's provenance is C's, listing A and B."""
    out = tmp_path / "r.jsonl"
    a = _prov("run-a", COMMIT_A, "H200", 1)
    _segment(out, a, range(2), resume=False, finish=False)

    def sharded(run_id: str, commit: str, day: int, rows: range, finish: bool):
        results = ShardedResults.open(out, Dist(), resume=True, planned=KEYS, reader=read_jsonl)
        rr = RankRows(results, lambda key: 1.0, "cuda", run_id)
        rr.check_plan(KEYS)
        prov = {k: v for k, v in _prov("ignored", commit, "H100", day).items() if k != "run_id"}
        rr.start(prov)
        assert prov["run_id"] == run_id, "RankRows stamps this segment's id on the caller's provenance"
        for i in rows:
            rr.add(_row(i, run_id))
        if finish:
            return rr.rows_in_order(KEYS)
        rr.close()
        return prov

    b = sharded("run-b", COMMIT_B, 2, range(2, 4), finish=False)
    assert _ids(b) == ["run-a", "run-b"]
    sharded("run-c", COMMIT_C, 3, range(4, 6), finish=True)
    rows, prov = read_jsonl(out)
    assert _ids(prov) == ["run-a", "run-b", "run-c"]
    assert [r["run_id"] for r in rows] == ["run-a"] * 2 + ["run-b"] * 2 + ["run-c"] * 2
    assert not (tmp_path / "r.jsonl.partial").exists()


def test_a_sharded_resume_with_nothing_left_for_a_rank_adds_no_segment(tmp_path):
    """A cut sharded run (A) resumed by one (B) that makes no row before it is cut: B's rank file is never
    written, so the next resume (C) lists A and C only; a fresh sharded run writes its provenance at once (cut
    before a row, it is still an interrupted run that --resume continues)."""
    out = tmp_path / "r.jsonl"

    def sharded(run_id, day, rows, finish, resume=True):
        results = ShardedResults.open(out, Dist(), resume=resume, planned=KEYS, reader=read_jsonl)
        rr = RankRows(results, lambda key: 1.0, "cuda", run_id)
        rr.check_plan(KEYS)
        rr.start({k: v for k, v in _prov("ignored", COMMIT_A, "H100", day).items() if k != "run_id"})
        for i in rows:
            rr.add(_row(i, run_id))
        if finish:
            return rr.rows_in_order(KEYS)
        rr.close()

    sharded("run-a", 1, range(0), finish=False, resume=False)
    part = tmp_path / "r.jsonl.partial"
    assert [p.name for p in part.iterdir() if p.suffix == ".jsonl"] == ["rank-0.jsonl"], "fresh: written at start"
    sharded("run-a2", 1, range(2), finish=False)
    before = {p.name: p.read_bytes() for p in part.iterdir()}
    sharded("run-b", 2, range(0), finish=False)
    assert {p.name: p.read_bytes() for p in part.iterdir()} == before, "a resume that made nothing wrote nothing"
    sharded("run-c", 3, range(2, 6), finish=True)
    rows, prov = read_jsonl(out)
    assert "run-b" not in _ids(prov) and _ids(prov)[-1] == "run-c"
    assert [r["run_id"] for r in rows] == ["run-a2"] * 2 + ["run-c"] * 4


def test_readers_attribute_every_segment(tmp_path):
    """The report's orphan check accepts earlier segments' run_ids; mixed_code_notice and source_label name both
    commits and both devices; a row no segment names is still an orphan."""
    out = tmp_path / "he.jsonl"
    a, b = _prov("run-a", COMMIT_A, "H200", 1), _prov("run-b", COMMIT_B, "H100", 3)
    _segment(out, a, range(2), resume=False, finish=False)
    _segment(out, b, range(2, 4), resume=True, finish=True)
    res = load_results([out])
    assert res.orphans == 0 and len(res.rows) == 4
    _, prov = read_jsonl(out)
    notice = mixed_code_notice([prov])
    assert notice is not None and COMMIT_A in notice and COMMIT_B in notice
    assert source_label("he.jsonl", prov) == "he.jsonl @ e578be6, H200 and d3c31b1, H100"
    assert source_label("he.jsonl", prov, ("he.jsonl",)) == "this run (H200, H100)"
    # the report's provenance table: a column per segment, oldest first
    doc = Doc(title="t")
    section_provenance(doc, res)
    md = render_markdown(doc)
    assert "he.jsonl (run 1 of 2)" in md and "he.jsonl (run 2 of 2)" in md and "was resumed: 2 runs" in md
    table = [ln for ln in md.splitlines() if ln.startswith("| cuda_device") or ln.startswith("| run_id")]
    assert table == ["| run_id | run-a | run-b |", "| cuda_device | NVIDIA H200 | NVIDIA H100 |"], table
    # one segment alone: no notice, the label as before
    assert mixed_code_notice([a]) is None and source_label("x.jsonl", a) == "x.jsonl @ e578be6, H200"
    # a row whose run_id no segment names is an orphan still
    lines = out.read_text().splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), "run_id": "nobody"})
    out.write_text("\n".join(lines) + "\n")
    assert load_results([out]).orphans == 1


def test_cost_records_of_every_earlier_segment_are_kept(tmp_path):
    """A finished file (A, B: its record list [a, b]) resumed by C, which is cut (its partial's provenance, written at
    start, has no records), then finished by D: D's file keeps a and b once each, then d."""
    out = tmp_path / "r.jsonl"
    a, b = _prov("run-a", COMMIT_A, "H200", 1), _prov("run-b", COMMIT_B, "H100", 2)
    c, d = _prov("run-c", COMMIT_B, "H100", 3), _prov("run-d", COMMIT_B, "H100", 4)
    _segment(out, a, range(1), resume=False, finish=False)
    rf = ResultsFile.open(out, resume=True)
    rf.start(b)
    rf.add(_row(1, "run-b"))
    ra = add_record({}, None, 1.0, 1.0, "cuda", command="tasks", cells=1)
    rb = add_record(b, {"cost_model": [ra]}, 2.0, 1.0, "cuda", command="tasks", cells=1)
    rf.finish(rf.rows_in_order(KEYS[:2]), b, write_results)
    _segment(out, c, range(2, 3), resume=True, finish=False)
    rf = ResultsFile.open(out, resume=True)
    assert "cost_model" not in rf.provenance, "a cut segment's provenance line holds no record"
    rf.start(d)
    rd = add_record(d, rf.provenance, 3.0, 1.0, "cuda", command="tasks", cells=1)
    rf.finish(rf.rows_in_order(KEYS[:3]), d, write_results)
    _, prov = read_jsonl(out)
    assert [r["record_id"] for r in prov["cost_model"]] == [ra["record_id"], rb["record_id"], rd["record_id"]]
    assert _ids(prov) == ["run-a", "run-b", "run-c", "run-d"]


def test_the_schema_checks_the_earlier_runs(tmp_path):
    check_provenance({"run_id": "b", "earlier_runs": [{"run_id": "a", "git_commit": COMMIT_A}]}, "f:1")
    with pytest.raises(SchemaError, match="earlier_runs: must be a list of provenance records"):
        check_provenance({"run_id": "b", "earlier_runs": "a"}, "f:1")
    with pytest.raises(SchemaError, match=r"earlier_runs: earlier run \[0\]: git_dirty"):
        check_provenance({"run_id": "b", "earlier_runs": [{"git_dirty": "yes"}]}, "f:1")
    # every provenance line of a partial is checked, not only the one returned
    bad = tmp_path / "r.jsonl.partial"
    bad.write_text(json.dumps({"record": "provenance", "run_id": 3}) + "\n"
                   + json.dumps({"record": "provenance", "run_id": "b"}) + "\n")
    with pytest.raises(SchemaError, match=r"r.jsonl.partial:1: run_id"):
        read_rows(bad)


SMALL = ["accuracy", "--seq", "128", "--heads", "2", "--head-dim", "64", "--recipes", "zyfa,ck,fp32",
         "--no-progress"]


def test_zyfa_accuracy_resume_is_a_new_segment(tmp_path, monkeypatch, capsys):
    """Through ``zyfa accuracy``: run A (commit e578be6) is cut by a full disk after its first row; ``--resume``
    at another commit (d3c31b1) makes the other rows under a new run_id, and the finished file lists A."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZYFA_GIT_COMMIT", COMMIT_A)
    with disk_full_after_rows(monkeypatch, 1):
        assert zyfa([*SMALL, "--out", "r.jsonl"]) == 2
    kept, first = read_log(tmp_path / "r.jsonl.partial")
    assert len(kept) == 1 and first["git_commit"] == COMMIT_A

    monkeypatch.setenv("ZYFA_GIT_COMMIT", COMMIT_B)
    capsys.readouterr()
    assert zyfa([*SMALL, "--out", "r.jsonl", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "1 of 3 rows done" in out and f"resumed from: run {first['run_id']} @ e578be6000" in out
    rows, prov = read_jsonl(tmp_path / "r.jsonl")
    assert prov["run_id"] != first["run_id"] and prov["git_commit"] == COMMIT_B
    assert run_provenances(prov)[0] == first and _ids(prov) == [first["run_id"], prov["run_id"]]
    assert [r["run_id"] for r in rows] == [first["run_id"], prov["run_id"], prov["run_id"]]
    assert [r["recipe"] for r in rows] == ["zyfa", "ck", "fp32"]
    assert prov["cost_model"][-1]["cells"] == 2, "the cost record is this segment's rows"
    assert load_results([tmp_path / "r.jsonl"]).orphans == 0
    notice = mixed_code_notice([prov])
    assert notice is not None and COMMIT_A in notice and COMMIT_B in notice
