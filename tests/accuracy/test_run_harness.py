"""The run discipline every command shares (accuracy.io.run_harness, accuracy.io.results_io, accuracy.io.shard,
capture.ranges): refusals before anything is written, a damaged partial named by file and line, a resume that never
deletes rows, ranges bounded before they are expanded, a time budget that counts work (issue 44)."""

from __future__ import annotations

import json
import time

import pytest
import torch
from zyfa.accuracy.io.results_io import ResultsFile, read_log, row_key
from zyfa.accuracy.io.run_harness import WorkBudget, refuse_unavailable
from zyfa.accuracy.io.shard import Dist, ShardedResults
from zyfa.capture.ranges import expand_ranges

from zyfa.cli import main
from zyfa.outputs import OutputError

PROV = json.dumps({"record": "provenance", "run_id": "abc"})
ROW = {"input": "a", "input_content_hash": "h", "recipe": "zyfa", "implementation": None, "deq_rel_l2": 0.1}

# a damaged <out>.partial: (bytes of its second line, what the one line says)
DAMAGED = {
    "not-json": (b"{not json", "not JSON"),
    "not-utf8": (b'{"input": "\xff\xfe"}', "not UTF-8"),
    "deep": (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 32"),
    "list-row": (b"[1, 2, 3]", "expected a JSON object"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_partial_is_named_by_file_and_line(tmp_path, case):
    """Fault 8: every way a partial can be damaged is one OutputError ``file:line: what``, never a traceback."""
    bad, what = DAMAGED[case]
    partial = tmp_path / "r.jsonl.partial"
    partial.write_bytes(PROV.encode() + b"\n" + bad + b"\n")
    with pytest.raises(ValueError, match=f"{partial}:2: {what}"):
        read_log(partial)
    with pytest.raises(OutputError, match=f"cannot resume: {partial}:2: {what}"):
        ResultsFile.open(tmp_path / "r.jsonl", resume=True)
    assert partial.read_bytes() == PROV.encode() + b"\n" + bad + b"\n"


def test_a_resume_that_plans_less_keeps_the_other_rows(tmp_path):
    """Fault 1 at the results file: rows the resumed run does not plan stay in the finished file, after the
    planned ones (an uninterrupted run's order), instead of being dropped."""
    out = tmp_path / "r.jsonl"
    other = {**ROW, "input": "b"}
    (tmp_path / "r.jsonl.partial").write_text("\n".join([PROV, json.dumps(ROW), json.dumps(other)]) + "\n")
    rf = ResultsFile.open(out, resume=True)
    rf.start({"run_id": "abc"})
    new = {**ROW, "input": "c"}
    rf.add(new)
    keys = [row_key(new), row_key(ROW)]
    assert rf.unplanned(keys) == [other]
    assert rf.rows_in_order(keys) == [new, ROW, other]
    rf.close()


def test_a_refused_sharded_resume_leaves_no_folder(tmp_path):
    """Fault 9: a sharded --resume refused (rows this run would not make) creates no ``<out>.partial/``, so the
    finished file can still be resumed by the right command."""
    out = tmp_path / "r.jsonl"
    out.write_text(PROV + "\n" + json.dumps(ROW) + "\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(OutputError, match="holds rows this run would not make"):
        ShardedResults.open(out, Dist(), resume=True, planned=[("other", None, "zyfa", None)],
                            reader=lambda p: (read_log(p)))
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    res = ShardedResults.open(out, Dist(), resume=True, planned=[row_key(ROW)], reader=read_log)
    assert res.done == {row_key(ROW)}
    res.close()


def test_a_sharded_run_refused_after_open_leaves_no_folder(tmp_path):
    """Fault 9: a run refused after the output was opened (a needle that does not fit, found once the model is
    loaded) closes it; the empty ``<out>.partial/`` goes, so the corrected command is not called an interrupted
    run."""
    out = tmp_path / "r.jsonl"
    ShardedResults.open(out, Dist(), reader=read_log).close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("spec, flag, highest, message", [
    ("1-1000000000", "--lengths", 1 << 20, "--lengths: 1000000000 in '1-1000000000' is above the highest "
                                          "accepted, 1048576"),
    ("0-1000000000", "--layers", 4095, "--layers: 1000000000 in '0-1000000000' is above the highest accepted, "
                                       "4095"),
    ("1,x", "--layers", 4095, "--layers: bad item 'x'"),
    ("9-3", "--lengths", 100, "--lengths: bad item '9-3'"),
    ("1,,2", "--lengths", 100, "an empty item"),
])
def test_ranges_are_bounded_before_they_are_expanded(spec, flag, highest, message):
    """Fault 12: the bound is checked on the item, in microseconds, before any list is built."""
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        expand_ranges(spec, flag, lowest=0, highest=highest)
    assert time.perf_counter() - t0 < 0.1
    assert expand_ranges("0-3,7,2-8:3", "--x", lowest=0, highest=8) == [0, 1, 2, 3, 5, 7, 8]


def test_cliffs_and_capture_refuse_huge_ranges_at_once(tmp_path, capsys):
    """Fault 12 through the commands: one line with the upper bound, nothing created, no MemoryError."""
    t0 = time.perf_counter()
    assert main(["cliffs", "--recipes", "zyfa", "--lengths", "1-1000000000", "--device", "cpu",
                 "--out", str(tmp_path / "c")]) == 2
    assert main(["capture", "--model", "smollm2", "--text", "lee", "--tokens", "64", "--layers", "0-1000000000",
                 "--out", str(tmp_path / "c.h5")]) == 2
    assert time.perf_counter() - t0 < 30
    err = capsys.readouterr().err.strip().splitlines()
    assert any("1000000000" in line and "1048576" in line for line in err), err
    assert any("1000000000" in line and "4095" in line for line in err), err
    assert not any("Traceback" in line for line in err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cliffs_refuses_a_named_kernel_that_cannot_run_here(tmp_path, capsys):
    """Fault 14: ``--implementations cudnn-fp8`` on a CPU is one line (as zyfa longctx says it), not 0 rows and
    exit 0; nothing is created."""
    assert main(["cliffs", "--implementations", "cudnn-fp8", "--lengths", "1-4", "--device", "cpu",
                 "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "implementation cudnn-fp8 cannot run here" in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_work_budget_counts_only_work():
    """Fault 10's clock: time outside ``working()`` (a model load) is not counted; 0 stops before any work and
    any positive budget lets one unit run."""
    b = WorkBudget(0.05)
    time.sleep(0.1)  # loading
    assert not b.spent_out()
    with b.working():
        time.sleep(0.06)
    assert b.spent_out()
    assert WorkBudget(0).spent_out() and not WorkBudget(None).spent_out()
    with pytest.raises(ValueError, match="--max-seconds must be 0 or more"):
        WorkBudget(-1)


class _Impl:
    def __init__(self, ok, why=""):
        self.ok, self.why = ok, why

    def available(self):
        return self.ok, self.why


def test_refuse_unavailable_names_the_first_and_counts_the_rest():
    refuse_unavailable([("zyfa", None), ("a", _Impl(True))])
    with pytest.raises(ValueError, match=r"--implementations: implementation b cannot run here: no CUDA device "
                                         r"\(and 1 more\)"):
        refuse_unavailable([("a", _Impl(True)), ("b", _Impl(False, "no CUDA device")), ("c", _Impl(False, "x"))])

