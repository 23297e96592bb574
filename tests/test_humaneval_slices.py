"""scripts/humaneval_slices.py on state folders of real HumanEval result files (rows and provenance of
reports/humaneval-plan, re-labelled to other problems): done problems are not planned again, a cut file's incomplete
problem continues in that file, every problem left is planned once, the pieces are as even as contiguous pieces of
the runs left allow, new files never take an existing name, every printed PROBLEMS parses to its piece; refusals are
one line with exit status 2."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from pathlib import Path

import pytest
from zyfa.accuracy.io.schemas import read_rows
from zyfa.accuracy.tasks.humaneval import load_problems, select_problems

from tests.load_file import load_script

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "reports" / "humaneval-plan"
SLICES = 12
slices = load_script("humaneval_slices")


@functools.cache
def _real():
    """The provenance record of a real file of the plan (as one run's: its earlier segments left out) and its rows of
    HumanEval/0, one per implementation; read when a test first needs it, not when the module is collected."""
    lines = [json.loads(x) for x in (REAL / "he-0.jsonl").read_text().splitlines()]
    prov = {k: v for k, v in lines[0].items() if k != "earlier_runs"}
    assert prov["record"] == "provenance"
    rows = {r["implementation"]: r for r in lines[1:] if r.get("task_id") == "HumanEval/0"}
    assert list(rows) == prov["implementations"]
    return prov, rows


def _impls() -> list[str]:
    return _real()[0]["implementations"]


def _row(i: int, impl: str) -> dict:
    """The real row of HumanEval/0 under ``impl``, re-labelled as problem ``i``'s."""
    r = copy.deepcopy(_real()[1][impl])
    r["task_id"] = f"HumanEval/{i}"
    r["input"] = f"{r['model']}/HumanEval/{i}/new{r['max_new_tokens']}"
    r["input_content_hash"] = hashlib.sha256(r["input"].encode()).hexdigest()
    return r


def _write(path: Path, problems=(), cut: int | None = None, impls=None, plan_hash: str | None = None) -> Path:
    """A result file with every implementation's row of ``problems``, then (``cut``) the first ``cut`` rows of one
    more problem: a run killed inside it. ``impls``: what its provenance says it runs (the rows follow it);
    ``plan_hash``: another plan's hash in the provenance and the rows (default: studies/humaneval.toml's)."""
    impls = list(impls or _impls())
    prov = {**_real()[0], "implementations": impls}
    rows = [_row(i, n) for i in problems for n in impls]
    if cut is not None:
        nxt = max(problems) + 1 if problems else 0
        rows += [_row(nxt, n) for n in impls[:cut]]
    if plan_hash is not None:
        prov["plan_hash"] = plan_hash
        rows = [{**r, "plan_hash": plan_hash} for r in rows]
    path.write_text("".join(json.dumps(x) + "\n" for x in [prov, *rows]))
    read_rows(path)  # the rows are valid result rows
    return path


def _state(tmp_path: Path) -> Path:
    """Slices of 12 (slice K: K*164//12 .. (K+1)*164//12 - 1), cut at different points:

    slice 0 finished; slice 1 cut inside problem 17 (2 of 5 rows); slice 2 cut after problem 30; slice 3 cut before
    its first row; slice 4's he-4.jsonl finished with 54-58 only and he-4-1.jsonl cut after 60;
    slice 5 finished; slice 6 only as he-6-1.jsonl (90-94, finished); slice 10 cut inside problem 141 (1 row); slices
    7, 8, 9 and 11 not started: 112 problems left, in 6 runs."""
    s = tmp_path / "state"
    s.mkdir()
    _write(s / "he-0.jsonl", range(0, 13))
    _write(s / "he-1.jsonl.partial", range(13, 17), cut=2)
    _write(s / "he-2.jsonl.partial", range(27, 31))
    _write(s / "he-3.jsonl.partial")
    _write(s / "he-4.jsonl", range(54, 59))
    _write(s / "he-4-1.jsonl.partial", range(59, 61))
    _write(s / "he-5.jsonl", range(68, 82))
    _write(s / "he-6-1.jsonl", range(90, 95))
    _write(s / "he-10.jsonl.partial", range(136, 141), cut=1)
    for other in ("he-1.log", "he-1.jsonl.partial.lock", "processes.txt", "commit"):
        (s / other).write_text("not a result file\n")
    return s


@pytest.fixture(scope="module")
def problems():
    return load_problems()[0]


def _main(capsys, state, processes, slices_=SLICES):
    code = slices.main([str(state), "--slices", str(slices_), "--processes", str(processes)])
    out, err = capsys.readouterr()
    return code, out, err


def _parsed(out: str, problems) -> list[tuple[str, list[int]]]:
    """The printed plan as (file, problem indices), each PROBLEMS read by the command's own --problems parser."""
    index = {p.task_id: i for i, p in enumerate(problems)}
    plan = []
    for line in out.splitlines():
        f, probs = line.split(" ")
        assert all("-" in tok for tok in probs.split(",")), line  # ranges only: a bare N means "the first N"
        plan.append((f, [index[p.task_id] for p in select_problems(problems, probs)]))
    return plan


def _facts(state: Path):
    """From the files, independently of the script: the problems left (in order), each incomplete problem's cut file
    (the name it continues under), and the names of every result file there."""
    have: dict[int, set[str]] = {}
    cut_in: dict[int, str] = {}
    names = set()
    for path in state.glob("he-*.jsonl*"):
        if path.suffix == ".lock":
            continue
        names.add(path.name.removesuffix(".partial"))
        for r in read_rows(path)[0]:
            i = int(r["task_id"].split("/")[1])
            have.setdefault(i, set()).add(r["implementation"])
            if path.name.endswith(".partial"):
                cut_in[i] = path.name.removesuffix(".partial")
    left = [i for i in range(164) if have.get(i, set()) != set(_impls())]
    home = {i: f for i, f in cut_in.items() if i in left}
    return left, home, names


def _runs(left: list[int], home: dict[int, str]) -> int:
    """How many runs of contiguous problems are left, a new one starting at each incomplete problem."""
    return sum(1 for j, i in enumerate(left) if j == 0 or i in home or left[j - 1] != i - 1)


def _check(plan, state: Path, processes: int) -> None:
    left, home, names = _facts(state)
    planned = [i for _, probs in plan for i in probs]
    # (a, c) every problem left once, in no two processes; no done problem again
    assert sorted(planned) == left and len(planned) == len(set(planned))
    # (b) an incomplete problem continues first in its own cut file, and in no other process
    for i, f in home.items():
        (entry,) = [(g, probs) for g, probs in plan if i in probs]
        assert entry[0] == f and entry[1][0] == i
    # (e) one process per file; a file that is not a cut file's continuation is one no run has written
    files = [f for f, _ in plan]
    assert len(files) == len(set(files))
    assert all(f in home.values() or f not in names for f in files)
    assert all(slices.FILE.match(f) and not f.endswith(".partial") for f in files)
    # each process runs contiguous problems
    assert all(probs == list(range(probs[0], probs[-1] + 1)) for _, probs in plan)
    # (d) as even as contiguous pieces allow: every run left needs a process of its own (an incomplete problem can
    # only continue in its file); the rest of `processes` split the runs, each run's pieces within one in size
    k = _runs(left, home)
    assert len(plan) == max(k, min(processes, len(left)))
    runs: list[list[int]] = []  # the pieces' sizes, by run (a run's pieces follow each other in the plan)
    for j, (_, probs) in enumerate(plan):
        if j == 0 or probs[0] in home or probs[0] != plan[j - 1][1][-1] + 1:
            runs.append([])
        runs[-1].append(len(probs))
    assert len(runs) == k and all(max(r) - min(r) <= 1 for r in runs)
    largest = max((len(p) for _, p in plan), default=0)
    if processes >= k and largest > 1:
        assert largest <= -(-len(left) // (processes - k + 1))
        # no plan of `processes` contiguous pieces has smaller ones: pieces of largest - 1 need more processes
        assert sum(-(-sum(r) // (largest - 1)) for r in runs) > processes


def test_the_state_with_one_process_per_run_left(tmp_path, capsys, problems):
    state = _state(tmp_path)
    code, out, err = _main(capsys, state, 1)
    assert code == 0 and err == ""
    assert _parsed(out, problems) == [
        ("he-1.jsonl", list(range(17, 27))),  # 17 continues in its cut file, then the rest of slice 1
        ("he-2-1.jsonl", list(range(31, 54))),  # he-2.jsonl is cut (clean) and he-3.jsonl holds no row
        ("he-4-2.jsonl", list(range(61, 68))),  # he-4.jsonl is finished and he-4-1.jsonl cut: neither is reused
        ("he-6.jsonl", list(range(82, 90))),  # no he-6.jsonl yet (he-6-1.jsonl holds 90-94)
        ("he-7.jsonl", list(range(95, 136))),
        ("he-10.jsonl", list(range(141, 164))),  # 141 continues in its cut file
    ]
    assert out.splitlines()[1] == "he-2-1.jsonl 31-53"
    _check(_parsed(out, problems), state, 1)


@pytest.mark.parametrize("processes", [2, 6, 7, 13, 16, 40, 111, 112, 1000])
def test_the_state_spread_over_processes(tmp_path, capsys, problems, processes):
    state = _state(tmp_path)
    code, out, err = _main(capsys, state, processes)
    assert code == 0 and err == ""
    plan = _parsed(out, problems)
    _check(plan, state, processes)
    if processes >= 112:  # one problem per process
        assert len(plan) == 112 and all(len(p) == 1 for _, p in plan)


@pytest.mark.parametrize("processes", [1, 3, 10, 16, 64, 500])
def test_the_committed_state(tmp_path, capsys, problems, processes):
    """reports/humaneval-plan as committed: every problem done (16 finished files, slices and pieces), so nothing is
    planned."""
    code, out, err = _main(capsys, REAL, processes)
    assert code == 0 and err == "" and out == ""
    _check(_parsed(out, problems), REAL, processes)


@pytest.mark.parametrize("processes", [1, 5, 12, 16, 24, 164])
def test_a_fresh_state_splits_evenly(tmp_path, capsys, problems, processes):
    state = tmp_path / "state"
    state.mkdir()
    code, out, err = _main(capsys, state, processes)
    assert code == 0 and err == ""
    plan = _parsed(out, problems)
    _check(plan, state, processes)
    sizes = [len(p) for _, p in plan]
    assert len(plan) == processes and max(sizes) == -(-164 // processes) and max(sizes) - min(sizes) <= 1
    if processes == SLICES:  # the slices' own problems, in their own files
        bounds = [slices.slice_bounds(k, SLICES) for k in range(SLICES)]
        assert plan == [(f"he-{k}.jsonl", list(range(a, b + 1))) for k, (a, b) in enumerate(bounds)]


def test_nothing_left_plans_nothing(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    _write(state / "he-0.jsonl", range(0, 100))
    _write(state / "he-1.jsonl.partial", range(100, 164))
    assert _main(capsys, state, 16) == (0, "", "")


def test_ranges_are_never_a_bare_number(problems):
    assert slices.ranges([5]) == "5-5"
    assert slices.ranges([0, 1, 2, 7, 9, 10, 163]) == "0-2,7-7,9-10,163-163"
    for chunk in ([5], [0], [163], [3, 4], [1, 3, 5]):
        text = slices.ranges(chunk)
        assert [int(p.task_id.split("/")[1]) for p in select_problems(problems, text)] == chunk


def _one_line_exit_2(capsys, argv, want: str):
    code = slices.main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("humaneval_slices: ") and want in err


def test_files_of_runs_with_other_implementations_are_refused(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    _write(state / "he-0.jsonl", range(0, 13))
    _write(state / "he-1.jsonl.partial", range(13, 15), cut=1, impls=["stock", "sdpa-fp32"])
    _one_line_exit_2(capsys, [str(state), "--slices", "12", "--processes", "4"], "one run's files only")


def test_a_damaged_file_is_refused(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    f = _write(state / "he-0.jsonl.partial", range(0, 3))
    f.write_text(f.read_text() + "{not json\n" + json.dumps(_row(3, "stock")) + "\n")
    _one_line_exit_2(capsys, [str(state), "--slices", "12", "--processes", "4"], "he-0.jsonl.partial")


def test_a_state_that_is_not_a_folder_is_refused(tmp_path, capsys):
    f = _write(tmp_path / "he-0.jsonl", range(0, 2))
    _one_line_exit_2(capsys, [str(f), "--slices", "12", "--processes", "4"], "is not a folder")
    _one_line_exit_2(capsys, [str(tmp_path / "missing"), "--slices", "12", "--processes", "4"], "is not a folder")
    _one_line_exit_2(capsys, [str(tmp_path), "--slices", "12", "--processes", "0"], "at least 1")


PLAN = ROOT / "studies" / "humaneval.toml"  # the plan the real rows ran under
OTHER = "7c3ba2bf6d1b" + "0" * 52  # another plan's hash


def test_the_real_rows_carry_the_plans_hash():
    assert _real()[0]["plan_hash"] == slices.load_humaneval_plan(PLAN).hash


def test_with_plan_the_files_of_that_plan_are_planned(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    _write(state / "he-0.jsonl", range(0, 100))
    code = slices.main([str(state), "--slices", "12", "--processes", "2", "--plan", str(PLAN)])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "") and out == "he-7.jsonl 100-131\nhe-9.jsonl 132-163\n"


def test_with_plan_a_file_of_another_plan_is_refused(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    _write(state / "he-9.jsonl.partial", range(130, 140), cut=1, plan_hash=OTHER)
    _one_line_exit_2(capsys, [str(state), "--slices", "12", "--processes", "4", "--plan", str(PLAN)],
                     "he-9.jsonl.partial holds qwen25coder-1.5b under plan 7c3ba2bf6d1b")


def test_files_of_two_plans_are_refused_without_plan(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    _write(state / "he-0.jsonl", range(0, 13))
    _write(state / "he-1.jsonl.partial", range(13, 15), cut=1, plan_hash=OTHER)
    _one_line_exit_2(capsys, [str(state), "--slices", "12", "--processes", "4"], "one run's files only")


def test_a_plan_that_cannot_be_read_is_refused(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    _one_line_exit_2(capsys, [str(state), "--slices", "12", "--processes", "4", "--plan", str(tmp_path / "no.toml")],
                     "--plan")
