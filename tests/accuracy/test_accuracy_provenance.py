"""Provenance records the code, libraries, device and date, and no hostname; git absent is not an error."""

from __future__ import annotations

import json
import re
import socket

import torch

from accuracy.provenance import device_name, git_state, provenance


def test_fields_and_no_hostname():
    prov = provenance({"run_id": "abc"})
    for key in ("zyfa_version", "git_commit", "git_dirty", "python", "torch", "numpy", "cpu", "cuda_device",
                "date_utc", "argv"):
        assert key in prov
    assert prov["run_id"] == "abc" and prov["torch"] == torch.__version__
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", prov["date_utc"])
    text = json.dumps(prov)  # serializable
    host = socket.gethostname()
    assert len(host) < 4 or host not in text


def test_git_state_inside_and_outside_a_checkout(tmp_path):
    commit, dirty = git_state()
    if commit is not None:  # this checkout
        assert re.fullmatch(r"[0-9a-f]{40}", commit) and isinstance(dirty, bool)
    assert git_state(tmp_path) == (None, None)


def test_device_name():
    assert device_name("cpu") and isinstance(device_name("cpu"), str)


def test_git_commit_from_environment(monkeypatch, tmp_path):
    # The GPU machine's copy has no usable .git: ZYFA_GIT_COMMIT names the commit the copy was made from.
    monkeypatch.setenv("ZYFA_GIT_COMMIT", "0123abc")
    assert git_state(tmp_path) == ("0123abc", None)
    monkeypatch.delenv("ZYFA_GIT_COMMIT")
    assert git_state(tmp_path) == (None, None)
