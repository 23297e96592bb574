"""The one way tests load a file that is in no package (a script under ``scripts/``, an example kernel) as a module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_module(path: str | Path, name: str | None = None, *, register: bool = False):
    """The file at ``path`` executed as a module named ``name`` (default: its stem); ``register`` puts it into
    ``sys.modules`` before it runs (for code that looks itself up there, e.g. pickling in worker processes)."""
    path = Path(path)
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_script(stem: str, *, register: bool = False):
    """``scripts/<stem>.py`` as a module named ``stem``."""
    return load_module(ROOT / "scripts" / f"{stem}.py", stem, register=register)
