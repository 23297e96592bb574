"""``zyfa impact``: a mistyped argument deletes and creates nothing; the default output is in the current
directory; an existing results file is refused unless --resume or --force (no model is loaded in these tests)."""

from __future__ import annotations

import pytest

from zyfa.cli import main as zyfa

ROWS = b'{"kind": "impact_window", "model": "smollm2", "recipe": "zyfa", "window": 0}\n'


def _one_line(capsys, *words):
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("argv, words", [
    (["--models", "nope", "--recipes", "zyfa"], ["unknown model 'nope'", "smollm2"]),
    (["--models", "smollm2", "--recipes", "zyfa,nope"], ["unknown recipe 'nope'"]),
    (["--models", "smollm2", "--layers", "1,x"], ["--layers takes comma-separated integers"]),
    (["--models", "smollm2", "--per-layer", "gemma3"], ["not in --models"]),
    (["--models", "smollm2", "--force", "--resume"], ["exclude each other"]),
])
def test_a_typo_deletes_and_creates_nothing(tmp_path, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results.jsonl"
    out.write_bytes(ROWS)
    assert zyfa(["impact", *argv, "--out", str(out)]) == 2
    _one_line(capsys, *words)
    assert out.read_bytes() == ROWS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]
    assert zyfa(["impact", *argv]) == 2  # default --out: nothing is created either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


def test_default_out_is_in_the_current_directory():
    import argparse

    from zyfa.accuracy.impact.impact_args import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    out = p.parse_args([]).out
    assert not out.startswith(("/", "reports")) and out.endswith(".jsonl")


def test_existing_out_is_refused_without_resume_or_force(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results.jsonl"
    out.write_bytes(ROWS)
    assert zyfa(["impact", "--models", "smollm2", "--recipes", "zyfa", "--out", str(out)]) == 2
    _one_line(capsys, "results.jsonl exists", "--resume", "--force")
    assert out.read_bytes() == ROWS


def test_a_live_run_on_the_output_is_refused(tmp_path, monkeypatch, capsys):
    """Issue 42/44: ``zyfa impact`` writes through the results file every command uses (fsync'd rows in
    ``<out>.partial`` under the run lock), so a second run on a live output is refused naming the live PID, before
    any model loads; the live run's files are untouched."""
    import os

    from zyfa.outputs import RunLock, partial_path

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results.jsonl"
    lock = RunLock.acquire(partial_path(out), what=str(out))
    try:
        assert zyfa(["impact", "--models", "smollm2", "--recipes", "zyfa", "--out", str(out)]) == 2
        _one_line(capsys, "another run is writing", f"PID {os.getpid()}")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl.partial.lock"]
    finally:
        lock.release()
