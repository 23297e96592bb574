"""scripts/seed_state.py on the committed result files of real runs: a GPU session's state folder takes, of the
files an earlier session cut, only those its plan wrote (the plan's hash in their provenance); another plan's file,
an unreadable one and one whose name the folder already has are left, each with one line; nothing else is copied."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.load_file import load_script

ROOT = Path(__file__).resolve().parents[1]
seed_state = load_script("seed_state")
K_SMOOTHING = ROOT / "studies" / "humaneval-k-smoothing.toml"
HE_05B = ROOT / "studies" / "humaneval-0.5b.toml"
GENERATED = ROOT / "studies" / "fp8-retrieval-generated.toml"
GRID = ROOT / "studies" / "longctx-1.5b.toml"
# the generated plan's committed run, put into .stage/ as a cut run would be (the grid writes a file of this name too)
LONGCTX_RUN = ROOT / "reports" / "fp8-retrieval-generated" / "results-qwen25coder-1.5b.jsonl"
CUT_NAME = LONGCTX_RUN.name + ".partial"


def _seed(capsys, state, stage, glob, plan=None):
    code = seed_state.main([str(state), "--from", str(stage), "--glob", glob, *(["--plan", str(plan)] if plan else [])])
    out, err = capsys.readouterr()
    return code, out.strip(), err.strip().splitlines()


def test_humaneval_state_takes_only_its_plans_files(tmp_path, capsys):
    """The failure this guards: the 0.5B plan, started beside the k-smoothing plan's resumed slices in one call, took
    the k-smoothing files as its own and planned only the problems they lacked (6 December)."""
    stage, state = tmp_path / "stage", tmp_path / "state"
    stage.mkdir()
    state.mkdir()
    mine = shutil.copy(ROOT / "reports" / "humaneval-k-smoothing" / "he-0.jsonl", stage)
    shutil.copy(ROOT / "reports" / "humaneval-0.5b" / "he-9.jsonl", stage)  # a slice of the 0.5B plan
    (stage / "he-1.jsonl").write_text("{not json\n")
    (stage / "he-0.jsonl.partial.lock").write_text("12345\n")
    (stage / "notes.txt").write_text("not a result file\n")
    shutil.copy(ROOT / "reports" / "humaneval-k-smoothing" / "he-3.jsonl", stage)
    (state / "he-3.jsonl").write_text("already here\n")  # a name the state has: never replaced
    code, out, err = _seed(capsys, state, stage, "he-*.jsonl*", K_SMOOTHING)
    assert code == 0 and out == f"seeded 1 file(s) into {state}: he-0.jsonl"
    assert sorted(p.name for p in state.iterdir()) == ["he-0.jsonl", "he-3.jsonl"]
    assert (state / "he-0.jsonl").read_bytes() == Path(mine).read_bytes()
    assert (state / "he-3.jsonl").read_text() == "already here\n"
    assert len(err) == 2 and all(x.startswith("seed_state: not seeded: ") for x in err)
    assert "he-1.jsonl: unreadable" in err[0]
    assert "he-9.jsonl: holds qwen25coder under plan 8e64cfcb8565 running bf16, cudnn-fp8" in err[1]
    # the 0.5B plan's own state folder takes its file and leaves the k-smoothing one
    other = tmp_path / "other"
    other.mkdir()
    code, out, err = _seed(capsys, other, stage, "he-*.jsonl*", HE_05B)
    assert code == 0 and sorted(p.name for p in other.iterdir()) == ["he-9.jsonl"]
    assert any("he-0.jsonl: holds qwen25coder-1.5b under plan 7c3ba2bf6d1b" in x for x in err)
    # a run of no plan takes no plan's file
    bare = tmp_path / "bare"
    bare.mkdir()
    assert _seed(capsys, bare, stage, "he-*.jsonl*")[0] == 0 and list(bare.iterdir()) == []


def test_longctx_state_takes_only_its_plans_cut_run(tmp_path, capsys):
    """Two plans of one model write results files of one name: the 1.5B grid's state folder leaves the generated
    plan's cut run, whose own state folder takes it."""
    stage = tmp_path / "stage"
    stage.mkdir()
    shutil.copy(LONGCTX_RUN, stage / CUT_NAME)
    grid, gen = tmp_path / "grid", tmp_path / "gen"
    grid.mkdir()
    gen.mkdir()
    code, out, err = _seed(capsys, grid, stage, "results-*.jsonl.partial", GRID)
    assert code == 0 and out == f"seeded 0 file(s) into {grid}" and list(grid.iterdir()) == []
    assert err == ["seed_state: not seeded: results-qwen25coder-1.5b.jsonl.partial: holds qwen25coder-1.5b under "
                   "plan 250abba19116 running cudnn-fp8, sdpa-bf16:cudnn"]
    code, out, err = _seed(capsys, gen, stage, "results-*.jsonl.partial", GENERATED)
    assert (code, err) == (0, []) and (gen / CUT_NAME).read_bytes() == LONGCTX_RUN.read_bytes()


def test_bad_arguments_are_one_line(tmp_path, capsys):
    stage = tmp_path / "stage"
    stage.mkdir()
    for argv, want in (([str(tmp_path / "missing"), "--from", str(stage), "--glob", "*"], "is not a folder"),
                       ([str(stage), "--from", str(tmp_path / "nowhere"), "--glob", "*"], "is not a folder"),
                       ([str(stage), "--from", str(stage), "--glob", "*", "--plan", str(tmp_path / "no.toml")],
                        "--plan")):
        assert seed_state.main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1 and want in err and "Traceback" not in err
