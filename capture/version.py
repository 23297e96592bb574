"""Which code ran: the one reader of the git commit, for every record that carries it.

Captures (``capture.store``), result files (``accuracy.io.provenance``), the bench's report (``zyfa.bench.cli``) and
``zyfa --version`` all read the commit here, in one format: the full hex commit and a dirty flag (tracked files
differ from it, staged or not; untracked files do not count), written as one string ``<commit>`` or
``<commit>+dirty`` where a record has one field for it. It lives in ``capture/``, the lowest package that records it
(``capture`` imports no other package of ours; ``accuracy``, ``zyfa/bench/`` and ``zyfa/cli.py`` may import it).

``$ZYFA_GIT_COMMIT``, when set, names the commit instead (dirty unknown): for copies of a checkout whose ``.git`` is
missing or stale, such as the GPU machine's (``scripts/gpu_check.sh`` sets it).

Exposed:
    GitState(commit, dirty)          commit: the full hex name (or $ZYFA_GIT_COMMIT) or None; dirty: bool or None
    git_state(start=None) -> GitState
    git_label(state=None) -> str     "<commit>", "<commit>+dirty", or "unknown"
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NamedTuple

__all__ = ["ENV", "GitState", "git_label", "git_state"]

ENV = "ZYFA_GIT_COMMIT"
_PROJECT = Path(__file__).resolve().parents[1]  # the checkout holding this package


class GitState(NamedTuple):
    """The commit (None outside a checkout) and whether tracked files differ from it (None when unknown)."""

    commit: str | None
    dirty: bool | None


def _git(cwd: Path, *args: str) -> str | None:
    try:
        res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def git_state(start: str | Path | None = None) -> GitState:
    """The state of the checkout holding ``start`` (any folder inside it), or by default of this project's own
    checkout, which must be the checkout's top (an installed copy inside someone else's repository has none).
    ``$ZYFA_GIT_COMMIT`` overrides (dirty None); (None, None) outside a checkout, before the first commit, or
    without git."""
    if os.environ.get(ENV):
        return GitState(os.environ[ENV], None)
    cwd = Path(start) if start is not None else _PROJECT
    if not cwd.is_dir():
        return GitState(None, None)
    out = _git(cwd, "rev-parse", "--show-toplevel", "HEAD")
    lines = out.splitlines() if out else []
    if len(lines) != 2 or len(lines[1]) not in (40, 64):  # SHA-1 or SHA-256 object names
        return GitState(None, None)
    if start is None and Path(lines[0]).resolve() != _PROJECT:
        return GitState(None, None)
    status = _git(cwd, "status", "--porcelain", "--untracked-files=no")
    return GitState(lines[1], None if status is None else bool(status))


def git_label(state: GitState | None = None) -> str:
    """One string for a record with one field: ``<commit>``, ``<commit>+dirty``, or ``unknown`` (no commit)."""
    commit, dirty = git_state() if state is None else state
    if not commit:
        return "unknown"
    return commit + ("+dirty" if dirty else "")
