"""The dependency arrows of docs/DESIGN.md point one way; this parses imports and fails on a wrong one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"zyfa", "reference", "capture", "accuracy"}
# package -> packages of ours it may import (command modules that wire packages together are exempt)
ALLOWED = {
    "reference": set(),
    "zyfa": set(),
    "capture": set(),
    "accuracy": {"zyfa", "reference", "capture"},
}
EXEMPT = {ROOT / "zyfa" / "cli.py", ROOT / "zyfa" / "bench.py"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_one_way(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if path in EXEMPT:
            continue
        wrong = (_imports(path) & OURS) - ALLOWED[package] - {package}
        if wrong:
            bad.append(f"{path.relative_to(ROOT)} imports {sorted(wrong)}")
    assert not bad, "imports against docs/DESIGN.md's direction:\n" + "\n".join(bad)


def test_reference_imports_no_triton():
    for path in (ROOT / "reference").rglob("*.py"):
        assert "triton" not in _imports(path), f"{path} imports triton"


def test_cli_lists_subcommands(capsys):
    from zyfa.cli import main

    assert main([]) == 2
    out = capsys.readouterr().out
    assert "accuracy" in out
