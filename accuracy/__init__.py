"""Accuracy of FP8 attention, in folders by role (docs/DESIGN.md, "accuracy/ by role"), bottom first: ``io``
(result files, sharding, provenance, device), ``scoring`` (metrics, bands, verdicts, plans), ``inputs``,
``implementations`` (real kernels, plug-ins, conformance), ``report`` (rendering), then one folder per command:
``operator`` (``zyfa accuracy``), ``cliffs``, ``impact``, ``longctx``, ``tasks``, and ``study`` on top. A folder
imports only the folders below it (tests/test_layout.py); :mod:`zyfa.accuracy.api` is the Python API.

Sits on top of zyfa, reference and capture's store.
"""

__all__ = ["assert_kernel_conforms", "measure"]


def __getattr__(name: str):
    """``accuracy.measure`` and ``accuracy.assert_kernel_conforms`` (:mod:`zyfa.accuracy.api`), imported on first use so
    that ``import accuracy`` stays light (commands check their arguments before torch is imported)."""
    if name in __all__:
        from zyfa.accuracy import api  # lazy: import zyfa.accuracy stays light (no torch)

        return getattr(api, name)
    raise AttributeError(f"module 'accuracy' has no attribute {name!r}")
