"""docs/RELIABILITY.md names real tests: every ``file::test`` it cites exists (a renamed test fails here)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_cited_test_exists():
    text = (ROOT / "docs" / "RELIABILITY.md").read_text()
    missing, last_file = [], None
    for m in re.finditer(r"`(tests/[\w/]+\.py)?::(test_\w+)", text):
        path, name = m.groups()
        last_file = path or last_file
        assert last_file, f"::{name} cited before any file"
        src = ROOT / last_file
        if not src.is_file() or f"def {name}(" not in src.read_text():
            missing.append(f"{last_file}::{name}")
    assert not missing, f"docs/RELIABILITY.md cites tests that do not exist: {missing}"
    assert len(re.findall(r"^\| ", text, flags=re.M)) > 40  # one row per fault tried
