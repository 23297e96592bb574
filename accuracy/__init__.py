"""Accuracy of FP8 attention: the core (metrics, inputs, runner, results I/O, provenance, features, the
``zyfa accuracy`` command) as top-level modules, and three packages by role: :mod:`zyfa.accuracy.report` (rendering),
:mod:`zyfa.accuracy.impact` (model impact) and :mod:`zyfa.accuracy.study` (the study and ``zyfa report``, composing the
others). The core imports none of the three; the report imports the core; impact imports the core and the
report's rendering; the study imports all (tests/test_layout.py).

Sits on top of zyfa, reference and capture's store.
"""

__all__ = ["assert_kernel_conforms", "measure"]


def __getattr__(name: str):
    """``accuracy.measure`` and ``accuracy.assert_kernel_conforms`` (:mod:`zyfa.accuracy.api`), imported on first use so
    that ``import accuracy`` stays light (commands check their arguments before torch is imported)."""
    if name in __all__:
        from zyfa.accuracy import api

        return getattr(api, name)
    raise AttributeError(f"module 'accuracy' has no attribute {name!r}")
