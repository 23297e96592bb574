"""``zyfa study`` and ``zyfa report`` under mistakes and faults.

A study writes into ``--out`` or a folder of the current directory (never the repository's committed reports
unless named); its report and results change together (``<out>.partial/`` renamed into place); a killed study
resumes to the rows of an uninterrupted one; outputs are checked before any work; without Chromium no old
screenshot stays beside a new report; the bench and impact inputs are found from the repository, whatever the
current directory. Studies here are small (``--captures none``, Gaussian inputs of 128 tokens, two recipes).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults import (
    ROOT,
    disk_full_after_rows,
    kill_when,
    path_without_chromium,
    readonly_dir,
    result_rows,
    rows_match,
)
from zyfa.cli import main as zyfa

SMALL = ["study", "--quick", "--max-seq", "128", "--captures", "none", "--gaussian-filter", "d64",
         "--recipes", "zyfa,bf16", "--impact", "none", "--no-progress"]
N_ROWS = 6  # 3 Gaussian inputs (plain, causal, outliers) x 2 recipes


@pytest.fixture
def no_chromium(monkeypatch, tmp_path_factory):
    """PATH without Chromium (links to Python and git only)."""
    monkeypatch.setenv("PATH", path_without_chromium(tmp_path_factory.mktemp("bin")))


def _one_line(capsys, *words):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[zyfa study")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _run_id(folder: Path) -> str:
    return json.loads((folder / "results.jsonl").read_text().splitlines()[0])["run_id"]


def test_default_output_is_a_folder_of_the_current_directory(tmp_path, monkeypatch, no_chromium):
    monkeypatch.chdir(tmp_path)
    assert zyfa(SMALL) == 0
    out = tmp_path / "zyfa-study-quick"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zyfa-study-quick"]
    assert {"results.jsonl", "report.md", "report.html"} <= {p.name for p in out.iterdir()}
    assert len(result_rows(out / "results.jsonl")) == N_ROWS
    assert _run_id(out) in (out / "report.md").read_text()  # the report names the run of its results


def test_bad_arguments_create_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert zyfa([*SMALL[:-4], "nope", "--impact", "none"]) == 2
    _one_line(capsys, "unknown recipe 'nope'")
    assert zyfa([*SMALL[:7], "^$", *SMALL[8:]]) == 2
    _one_line(capsys, "no inputs")
    assert zyfa([*SMALL, "--impact", str(tmp_path / "none.jsonl")]) == 2
    _one_line(capsys, "--impact: no such file")
    assert list(tmp_path.iterdir()) == []


def test_existing_out_refused_force_keeps_notes_and_drops_stale_screenshot(tmp_path, monkeypatch, capsys,
                                                                         no_chromium):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "st"
    assert zyfa([*SMALL, "--out", "st"]) == 0
    first = _run_id(out)
    (out / "README.md").write_text("how this study was made\n")
    (out / "report_screenshot.png").write_bytes(b"a picture of the previous report")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert zyfa([*SMALL, "--out", "st"]) == 2
    _one_line(capsys, "st exists", "--resume", "--force")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert zyfa([*SMALL, "--out", "st", "--resume"]) == 2
    _one_line(capsys, "finished run", "--force")

    assert zyfa([*SMALL, "--out", "st", "--force"]) == 0
    names = {p.name for p in out.iterdir()}
    assert "report_screenshot.png" not in names, "an old screenshot stayed beside a new report"
    assert "old report_screenshot.png" in capsys.readouterr().err
    assert (out / "README.md").read_text() == "how this study was made\n"
    second = _run_id(out)
    assert second != first and second in (out / "report.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"]  # no stage or old folder left


def test_disk_full_mid_study_keeps_the_old_study_and_resumes(tmp_path, monkeypatch, capsys, no_chromium):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "st"
    assert zyfa([*SMALL, "--out", "st"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with disk_full_after_rows(monkeypatch, 2):
        capsys.readouterr()
        assert zyfa([*SMALL, "--out", "st", "--force"]) == 2
    _one_line(capsys, "no space left on device", "st.partial", "--resume")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # report and results of the old study
    kept = result_rows(tmp_path / "st.partial" / "accuracy_rows.jsonl.partial" / "rank-0.jsonl")
    assert len(kept) == 2
    assert zyfa([*SMALL, "--out", "st", "--resume"]) == 0
    assert not (tmp_path / "st.partial").exists()
    assert rows_match(result_rows(out / "results.jsonl"), result_rows_of(before["results.jsonl"], tmp_path))


def result_rows_of(data: bytes, tmp_path: Path) -> list[dict]:
    p = tmp_path / "copy.jsonl"
    p.write_bytes(data)
    return result_rows(p)


def test_read_only_out_fails_before_work(tmp_path, capsys):
    with readonly_dir(tmp_path / "ro", {"old.txt": b"x"}) as ro:
        assert zyfa([*SMALL, "--out", str(ro / "st")]) == 2
        line = _one_line(capsys, "cannot write in")
        assert "read-only" in line or "Permission denied" in line
        assert sorted(p.name for p in ro.iterdir()) == ["old.txt"]
    assert zyfa([*SMALL, "--out", "/proc/st"]) == 2
    _one_line(capsys, "/proc")


def test_bench_and_impact_inputs_found_from_any_directory(tmp_path, monkeypatch):
    from zyfa.accuracy.study.cli import impact_files
    from zyfa.accuracy.study.compose import find_bench

    monkeypatch.chdir(tmp_path)
    impact = impact_files(None)
    assert impact and all(p.is_file() and (ROOT / "reports" / "impact") in p.resolve().parents for p in impact)
    bench = find_bench()
    assert bench and all(Path(b).is_file() for b in bench)


def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    env = {"PATH": path_without_chromium(tmp_path / "bin")}  # no Chromium: the screenshot is not tested here
    args = [*SMALL, "--out"]
    full = _run(args + ["full"], tmp_path, env)
    assert full.returncode == 0, full.stderr
    expected = result_rows(tmp_path / "full" / "results.jsonl")
    assert len(expected) == N_ROWS

    # a finished study in "st", then a --force run killed at a random row: "st" must still be the old study
    assert _run(args + ["st"], tmp_path, env).returncode == 0
    old = {p.name: p.read_bytes() for p in (tmp_path / "st").iterdir()}
    watch = tmp_path / "st.partial" / "accuracy_rows.jsonl.partial" / "rank-0.jsonl"
    seed = random.randrange(1 << 30)  # printed on failure, to replay the kill points
    rng = random.Random(seed)
    seen: list[dict] = []
    for extra, lines in ((["--force"], 1 + rng.randrange(1, N_ROWS - 2)), (["--resume"], N_ROWS)):
        at = kill_when([*args, "st", *extra], tmp_path, watch, lines, extra_delay=rng.uniform(0, 0.2),
                       env_extra=env)
        if at == -2:  # it finished before the kill point (the rank files are merged and removed early)
            break
        assert {p.name: p.read_bytes() for p in (tmp_path / "st").iterdir()} == old, \
            "a killed study changed the finished one (its report and results must change together)"
        merged = tmp_path / "st.partial" / "accuracy_rows.jsonl"  # killed after the rows were merged
        kept = result_rows(watch if watch.exists() else merged)
        assert kept[:len(seen)] == seen, f"rows written before the kill were lost (seed {seed})"
        seen = kept
    if (tmp_path / "st.partial").exists():
        res = _run(args + ["st", "--resume"], tmp_path, env)
        assert res.returncode == 0, res.stderr
    assert not (tmp_path / "st.partial").exists()
    assert rows_match(result_rows(tmp_path / "st" / "results.jsonl"), expected)
    assert _run_id(tmp_path / "st") in (tmp_path / "st" / "report.md").read_text()


def _run(args, cwd, env):
    from tests.faults import env as base_env

    return subprocess.run([sys.executable, "-m", "zyfa.cli", *args], cwd=cwd, env={**base_env(), **env},
                          capture_output=True, text=True, timeout=900)


def _clone(tmp_path: Path) -> tuple[Path, str]:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True, timeout=300)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    return clone, head


def _study_in_clone(tmp_path: Path, args: list[str]) -> tuple[Path, str, subprocess.CompletedProcess]:
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    clone, head = _clone(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(clone), "PATH": path_without_chromium(tmp_path / "bin")}
    env.pop("ZYFA_GIT_COMMIT", None)
    res = subprocess.run([sys.executable, "-m", "zyfa.cli", *args], cwd=clone, env=env, capture_output=True,
                         text=True, timeout=3600)
    return clone, head, res


def _check_clean(clone: Path, head: str, folder: str) -> None:
    status = subprocess.run(["git", "-C", str(clone), "status", "--porcelain"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    assert status in ([], [f"?? {folder}/"]), f"the study changed the repository: {status}"
    prov = json.loads((clone / folder / "results.jsonl").read_text().splitlines()[0])
    assert prov["git_commit"] == head and prov["git_dirty"] is False  # the clone's code ran, not stamped +dirty


def test_small_study_in_a_fresh_clone_changes_no_tracked_file(tmp_path):
    clone, head, res = _study_in_clone(tmp_path, SMALL)
    assert res.returncode == 0, res.stderr
    _check_clean(clone, head, "zyfa-study-quick")


@pytest.mark.slow
def test_quick_study_in_a_fresh_clone_changes_no_tracked_file(tmp_path):
    clone, head, res = _study_in_clone(tmp_path, ["study", "--quick", "--no-progress"])
    assert res.returncode == 0, res.stderr
    _check_clean(clone, head, "zyfa-study-quick")


def test_report_checks_out_before_rendering_and_drops_a_stale_screenshot(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert zyfa(["accuracy", "--seq", "128", "--heads", "1", "--head-dim", "64", "--recipes", "zyfa,bf16",
                 "--no-progress", "--out", "r.jsonl"]) == 0
    capsys.readouterr()
    assert zyfa(["report", "--results", "r.jsonl", "--out", "/proc/rep", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "/proc" in err and "Traceback" not in err
    with readonly_dir(tmp_path / "ro") as ro:
        assert zyfa(["report", "--results", "r.jsonl", "--out", str(ro / "rep"), "--no-plots"]) == 2
        assert "cannot write in" in capsys.readouterr().err
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "report_screenshot.png").write_bytes(b"old")
    assert zyfa(["report", "--results", "r.jsonl", "--out", "rep", "--no-plots"]) == 0
    assert not (tmp_path / "rep" / "report_screenshot.png").exists()
    assert "previous report" in capsys.readouterr().out
