"""zyfa.outputs: atomic replacement, the row log, the staged output folder, and their failures (real files)."""

from __future__ import annotations

import errno
import os

import pytest

from tests.faults import readonly_dir
from zyfa.outputs import (
    AppendLog,
    OutputError,
    StagedFolder,
    atomic_write_text,
    check_writable,
    read_complete_lines,
)


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "report.md"
    atomic_write_text(path, "old\n")
    path.chmod(0o640)
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n" and (path.stat().st_mode & 0o777) == 0o640  # permissions kept
    real_write = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OutputError, match="no space left on device.*unchanged"):
        atomic_write_text(path, "newer\n" * 1000)
    monkeypatch.setattr(os, "write", real_write)
    assert path.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]  # no temporary file left


def test_append_log_keeps_lines_and_drops_a_torn_tail(tmp_path):
    path = tmp_path / "rows.partial"
    with AppendLog(path, fresh=True) as log:
        log.write_line("a")
        log.write_line("b")
    with open(path, "ab") as f:
        f.write(b"half a li")  # a write cut short by a kill
    assert read_complete_lines(path)[0] == ["a", "b"]
    with AppendLog(path, fresh=False) as log:
        log.write_line("c")
    assert path.read_text() == "a\nb\nc\n"


def test_check_writable_names_the_problem(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(OutputError, match="is a directory"):
        check_writable(tmp_path / "d")
    with pytest.raises(OutputError, match="does not exist"):
        check_writable(tmp_path / "nope" / "x.jsonl")
    with pytest.raises(OutputError, match="not enough free space"):
        check_writable(tmp_path / "x.jsonl", need_bytes=1 << 62)
    with readonly_dir(tmp_path / "ro") as ro, pytest.raises(OutputError, match="cannot write in"):
        check_writable(ro / "x.jsonl")


def _folder(path, files):
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).write_text(text)


def test_staged_folder_refuses_forces_resumes_and_commits(tmp_path):
    out = tmp_path / "study"
    _folder(out, {"report.md": "old report", "results.jsonl": "old rows", "README.md": "notes",
                  "report_screenshot.png": "old picture"})
    with pytest.raises(OutputError, match="study exists.*--resume.*--force"):
        StagedFolder.open(out)
    with pytest.raises(OutputError, match="finished run"):
        StagedFolder.open(out, resume=True)
    st = StagedFolder.open(out, force=True)
    (st.stage / "results.jsonl").write_text("new rows")
    assert (out / "report.md").read_text() == "old report"  # the old folder stands until the commit
    # while it runs, any other open is refused (it holds the folder's lock)
    with pytest.raises(OutputError, match="another run is writing"):
        StagedFolder.open(out, resume=True)
    st.release()  # killed here (the kernel drops its lock): the stage stays; a plain rerun is refused, --resume
    with pytest.raises(OutputError, match="interrupted run"):  # continues it
        StagedFolder.open(out)
    st = StagedFolder.open(out, resume=True)
    assert st.resumed and (st.stage / "results.jsonl").read_text() == "new rows"
    (st.stage / "report.md").write_text("new report")
    removed = st.commit(keep=lambda name: name == "README.md")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "report.md", "results.jsonl"]
    assert (out / "report.md").read_text() == "new report" and (out / "README.md").read_text() == "notes"
    assert removed == ["report_screenshot.png"]  # a stale screenshot never sits beside a new report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study"]


def test_staged_folder_in_a_read_only_folder(tmp_path):
    with readonly_dir(tmp_path / "ro", {"keep.txt": b"x"}) as ro:
        with pytest.raises(OutputError, match="cannot write in"):
            StagedFolder.open(ro / "study")
        assert sorted(p.name for p in ro.iterdir()) == ["keep.txt"]
