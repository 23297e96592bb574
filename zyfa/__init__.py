"""ZYFA: speed and numerical error of FP8 FlashAttention.

The core of this package (formats, quantizers, recipes, the emulator) imports nothing else of ours; the
Triton kernels are imported lazily (GPU only); only :mod:`zyfa.cli` wires the other packages together.

The repository keeps the toolkit's other packages in top-level folders beside this one (``accuracy/``,
``capture/``, ``reference/``), and they are imported as ``zyfa.accuracy``, ``zyfa.capture`` and
``zyfa.reference``, never under generic top-level names that a user's own ``reference.py`` could shadow. An
installed wheel holds them inside ``zyfa/`` (pyproject.toml's package-dir); in a source checkout (an editable
install, or the tree on ``PYTHONPATH``) :class:`_SourceTreeFinder` finds them beside this folder.
"""

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

__version__ = "0.1.0"

#: the packages that live beside zyfa/ in the repository and are imported as zyfa.<name>
SOURCE_TREE_PACKAGES = ("accuracy", "capture", "reference")


class _SourceTreeFinder(importlib.abc.MetaPathFinder):
    """Finds ``zyfa.accuracy``, ``zyfa.capture`` and ``zyfa.reference`` in the repository's top-level folders."""

    def __init__(self, root: Path):
        self.root = str(root)
        self.names = {f"{__name__}.{p}" for p in SOURCE_TREE_PACKAGES}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.root])


def _install_source_tree_finder() -> None:
    here = Path(__file__).resolve().parent
    root = here.parent
    in_checkout = (root / "pyproject.toml").is_file() and not (here / SOURCE_TREE_PACKAGES[0]).exists()
    present = all((root / p / "__init__.py").is_file() for p in SOURCE_TREE_PACKAGES)
    if in_checkout and present and not any(isinstance(f, _SourceTreeFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceTreeFinder(root))


_install_source_tree_finder()
