"""One namespace: the toolkit installs no generic top-level import name, and runs from a folder that holds a user's
own ``reference.py``, ``capture.py`` and ``accuracy.py``."""

from __future__ import annotations

import os
import subprocess
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

from zyfa import SOURCE_TREE_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_installed_packages_are_all_under_zyfa():
    assert all(p == "zyfa" or p.startswith("zyfa.") for p in CONFIG["packages"]), CONFIG["packages"]


def test_installed_packages_cover_every_package_folder():
    """A new subpackage folder that pyproject.toml does not list would be missing from a wheel install."""
    folders = set()
    for top in ("zyfa", *SOURCE_TREE_PACKAGES):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT).parts
            folders.add(".".join(rel) if rel[0] == "zyfa" else ".".join(("zyfa", *rel)))
    assert folders == set(CONFIG["packages"])
    assert CONFIG["package-dir"] == {f"zyfa.{p}": p for p in SOURCE_TREE_PACKAGES}


def test_runs_beside_a_users_reference_capture_and_accuracy_modules(tmp_path):
    for name in ("reference", "capture", "accuracy"):
        (tmp_path / f"{name}.py").write_text(f"raise SystemExit('the user\\'s {name}.py was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = ("import sys, zyfa.reference.attention, zyfa.capture.store, zyfa.accuracy.scoring.metrics; "
            "sys.exit(zyfa.cli.main(['recipes', 'zyfa']) if False else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "zyfa", "accuracy", "--inputs", "gaussian", "--seq", "64",
                        "--head-dim", "64", "--heads", "1", "--recipes", "bf16", "--out", "r.jsonl"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "r.jsonl").is_file()
