"""The README is a front door: short, its findings table names where each answer comes from, and what it names
exists in the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_short_and_in_order():
    assert len(README.splitlines()) < 130  # the generated verdict rows (accuracy.study.findings) included
    heads = [line[3:] for line in README.splitlines() if line.startswith("## ")]
    assert heads[:6] == ["Set up and run", "Test", "What we found", "Commands", "Your own kernel through the study",
                         "On several GPUs"]
    gpus = README.split("## On several GPUs", 1)[1].split("\n## ", 1)[0]  # the invocation and its promise
    assert "torchrun --nproc-per-node 8 -m zyfa study --out my-study`" in gpus and "--resume" in gpus
    assert "same rows in the same order" in gpus and "any number of ranks" in gpus
    assert 'python3 -m pytest -m "not gpu and not slow" -q' in README  # the command CI runs (.ci/run)
    assert 'python3 -m pytest -m "not gpu and not slow" -q' in (ROOT / ".ci" / "run").read_text()


def test_findings_table_names_existing_sources_backed_by_findings_md():
    block = README.split("## What we found", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| question")]
    # the accumulator plan's verdicts, one row per model of the plan, from its rows in reports/accumulator/; a plan
    # without rows yet names its plan file
    assert sum("never-flushed" in r and "studies/accumulator.toml" in r for r in rows) == 2
    assert len(rows) >= 6
    findings = (ROOT / "docs" / "FINDINGS.md").read_text(encoding="utf-8")
    for row in rows:
        source = row.rstrip(" |").rsplit("|", 1)[1]
        paths = re.findall(r"`?((?:reports|docs|studies)/[\w./-]+)`?", source)
        paths += re.findall(r"(docs/[\w.]+\.md)", source)
        assert paths, row
        for p in paths:
            assert (ROOT / p).exists(), f"{p} named in the README's findings table does not exist"
    for number in ("0.917 [0.898, 0.936]", "1.465 [1.315, 1.632]", "[0.56, 0.83]", "0.90× [0.89–0.92]", "1.000"):
        assert number in README and number in findings, number


def test_docs_the_readme_points_to_exist():
    for p in set(re.findall(r"\b(docs/[\w]+\.md)", README)):
        assert (ROOT / p).is_file(), p
