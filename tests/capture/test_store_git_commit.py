"""``capture.version``: the one git reader (``git_state``, ``git_label``), whose label is the ``git_commit`` attribute
of every capture (``zyfa.capture.store``), on real git repositories."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import zyfa.capture.version
from zyfa.capture.version import GitState, git_label, git_state

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@example.com"}


def _git(repo: Path, *args: str) -> str:
    import os

    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                         env={**os.environ, **ENV})
    return out.stdout.strip()


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv("ZYFA_GIT_COMMIT", raising=False)


def git_commit(start=None) -> str:
    return git_label(git_state(start))


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q")
    (r / "a.txt").write_text("one\n")
    _git(r, "add", "a.txt")
    _git(r, "commit", "-q", "-m", "first")
    return r


def test_clean_checkout_gives_head(repo):
    head = _git(repo, "log", "-1", "--format=%H")
    assert len(head) == 40
    assert git_commit(repo) == head
    (repo / "sub").mkdir()
    assert git_commit(repo / "sub") == head  # any folder inside the checkout


def test_untracked_files_do_not_make_it_dirty(repo):
    (repo / "new.txt").write_text("x")
    assert git_commit(repo) == _git(repo, "log", "-1", "--format=%H")


def test_changed_tracked_file_makes_it_dirty(repo):
    head = _git(repo, "log", "-1", "--format=%H")
    (repo / "a.txt").write_text("two\n")
    assert git_commit(repo) == head + "+dirty"
    _git(repo, "add", "a.txt")  # staged counts too
    assert git_commit(repo) == head + "+dirty"


def test_not_a_checkout_or_no_commit_gives_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    plain = tmp_path / "plain"
    plain.mkdir()
    assert git_commit(plain) == "unknown"
    empty = tmp_path / "empty"
    empty.mkdir()
    _git(empty, "init", "-q")
    assert git_commit(empty) == "unknown"  # no HEAD yet


def test_missing_git_gives_unknown(repo, monkeypatch):
    monkeypatch.setenv("PATH", str(repo))  # no git executable on PATH
    assert git_commit(repo) == "unknown"


def test_state_is_commit_and_dirty_flag(repo):
    head = _git(repo, "log", "-1", "--format=%H")
    assert git_state(repo) == GitState(head, False)
    (repo / "a.txt").write_text("two\n")
    assert git_state(repo) == (head, True)
    assert git_label(GitState(None, None)) == "unknown"


def test_environment_names_the_commit_with_dirty_unknown(repo, monkeypatch):
    monkeypatch.setenv("ZYFA_GIT_COMMIT", "0123abc")
    assert git_state(repo) == GitState("0123abc", None)
    assert git_label() == "0123abc"


def test_default_is_this_projects_checkout():
    root = Path(zyfa.capture.version.__file__).resolve().parents[1]
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
    except OSError:
        return
    if top.returncode == 0 and Path(top.stdout.strip()).resolve() == root:
        assert git_state() == git_state(root)
        assert git_commit().removesuffix("+dirty") == _git(root, "rev-parse", "HEAD")
    else:
        assert git_state() == (None, None)

