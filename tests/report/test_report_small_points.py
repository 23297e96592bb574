"""``zyfa report`` on a run of one input: no interval where n = 1, a speed link that lands on a table of the
report, and the bench file ``zyfa study`` finds (accuracy.study.compose.find_bench) used without ``--bench``."""

from __future__ import annotations

import re

import pytest
from zyfa.accuracy.study.compose import find_bench

from zyfa.cli import main


@pytest.fixture(scope="module")
def one_input_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("one-input")
    rows = d / "r.jsonl"
    assert main(["accuracy", "--seq", "32", "--heads", "1", "--head-dim", "64", "--recipes", "zyfa,bf16",
                 "--device", "cpu", "--no-progress", "--out", str(rows)]) == 0
    assert main(["report", "--results", str(rows), "--out", str(d / "rep"), "--no-plots"]) == 0
    return (d / "rep" / "report.md").read_text(encoding="utf-8")


def test_one_input_shows_n_and_no_interval(one_input_report):
    front = one_input_report.split('<a id="t-front-error"></a>', 1)[1].split("<a id=", 1)[0]
    zyfa_row = next(line for line in front.splitlines() if line.startswith("| zyfa |"))
    assert "(n = 1)" in zyfa_row
    assert not re.search(r"\[[0-9.e+-]+, [0-9.e+-]+\]", zyfa_row), zyfa_row


def test_every_details_link_lands_on_an_anchor_of_the_report(one_input_report):
    details = next(line for line in one_input_report.splitlines() if line.startswith("Details: "))
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', one_input_report))
    targets = dict(re.findall(r"\[([^\]]+)\]\(#([^)]+)\)", details))
    assert targets, details
    for label, anchor in targets.items():
        assert anchor in anchors, f"{label} -> #{anchor} is not in the report"
    if find_bench():  # the checkout has a bench file: zyfa report found it as zyfa study does, and links to it
        assert targets.get("speed", "").startswith("t-bench-0")
    else:
        assert "speed" not in targets
