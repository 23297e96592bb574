"""One check for the kernel wrappers' import cost: a module of ``zyfa.kernels`` imported afresh must not import a
heavy dependency (Triton, Gluon, the CuTe DSL) that it loads lazily."""

from __future__ import annotations

import importlib
import sys


def imports_heavy(module: str, heavy: str) -> bool:
    """Whether importing ``module`` afresh (every ``zyfa.kernels`` module dropped first) imported ``heavy`` when it
    was not imported before. False when it was already imported: the check then cannot tell, and passes."""
    for name in [m for m in sys.modules if m == "zyfa.kernels" or m.startswith("zyfa.kernels.")]:
        del sys.modules[name]
    had = heavy in sys.modules
    importlib.import_module(module)
    return not had and heavy in sys.modules
