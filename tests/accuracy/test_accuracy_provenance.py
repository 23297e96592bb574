"""Provenance records the code, libraries, device and date, and no hostname; git absent is not an error."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from zyfa.accuracy.io.provenance import device_name, provenance
from zyfa.capture.version import git_state

import zyfa

HOST = "zyfa-test-host-4e7c1d"  # a name no real field could contain by chance


def test_fields_values_and_no_hostname(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: HOST)
    monkeypatch.setattr(platform, "node", lambda: HOST)
    monkeypatch.setattr(sys, "argv", [f"/home/{HOST}/venv/bin/zyfa", "accuracy", "--out", "r.jsonl"])
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    prov = provenance({"run_id": "abc"})
    after = dt.datetime.now(dt.timezone.utc)
    text = json.dumps(prov)  # serializable
    assert HOST not in text  # neither the host name nor the program's install path
    assert prov["argv"] == ["zyfa", "accuracy", "--out", "r.jsonl"]
    assert prov["run_id"] == "abc"
    assert prov["zyfa_version"] == zyfa.__version__
    assert (prov["torch"], prov["numpy"], prov["python"]) == (torch.__version__, np.__version__,
                                                              platform.python_version())
    assert prov["cpu_count"] == len(os.sched_getaffinity(0))
    assert prov["cuda_device"] == (torch.cuda.get_device_name() if torch.cuda.is_available() else None)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", prov["date_utc"])
    stamp = dt.datetime.strptime(prov["date_utc"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    assert before <= stamp <= after


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_git_state_of_a_checkout_clean_dirty_and_outside(tmp_path, monkeypatch):
    monkeypatch.delenv("ZYFA_GIT_COMMIT", raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "first")
    head = _git(repo, "rev-parse", "HEAD")
    assert git_state(repo) == (head, False)
    (repo / "untracked.txt").write_text("x\n")  # untracked files do not make a checkout dirty
    assert git_state(repo) == (head, False)
    (repo / "a.txt").write_text("two\n")
    assert git_state(repo) == (head, True)
    outside = tmp_path / "plain"
    outside.mkdir()
    assert git_state(outside) == (None, None)


def test_device_name_is_the_cpu_model():
    info = Path("/proc/cpuinfo")
    text = info.read_text() if info.is_file() else ""
    lines = [ln for ln in text.splitlines() if ln.lower().startswith("model name")]
    want = lines[0].split(":", 1)[1].strip() if lines else (platform.processor() or platform.machine())
    assert device_name("cpu") == want and want


def test_git_commit_from_environment(monkeypatch, tmp_path):
    # The GPU machine's copy has no usable .git: ZYFA_GIT_COMMIT names the commit the copy was made from.
    monkeypatch.setenv("ZYFA_GIT_COMMIT", "0123abc")
    assert git_state(tmp_path) == ("0123abc", None)
    assert provenance()["git_commit"] == "0123abc"
    monkeypatch.delenv("ZYFA_GIT_COMMIT")
    assert git_state(tmp_path) == (None, None)
