"""The implementations by name: every built-in (:mod:`zyfa.accuracy.implementations.builtins`), ``triton:SPEC``
and ``cute:SPEC`` for any recipe spec our Triton or CuTe kernel honours, and the ``--implementations`` list of a
command.

Exposed:
    builtin_names() -> list[str] (from accuracy.implementations.names);  get_implementation(name) -> Implementation
    parse_implementations(spec) -> list[Implementation]   ("all", "available", or comma-separated names)
    BASELINE_ONLY                                   built-ins that are baselines, never part of "all"
"""

from __future__ import annotations

from zyfa.accuracy.implementations.base import Implementation
from zyfa.accuracy.implementations.builtins import builtin_implementation
from zyfa.accuracy.implementations.names import builtin_key, builtin_names

from zyfa.recipe_spec import split_spec_list

__all__ = ["BASELINE_ONLY", "builtin_names", "get_implementation", "parse_implementations"]

# built-ins that are baselines, not kernels under study: named explicitly, never part of "all" or "available"
BASELINE_ONLY = ("sdpa-fp32",)


def get_implementation(name: str) -> Implementation:
    """A built-in by name; ``triton:SPEC`` for any recipe spec the Triton kernel honours (``triton:fa3:
    accum_flush_tiles=1``: the kernel with that field changed), ``cute:SPEC`` for one the CuTe kernel honours;
    ValueError listing the names for an unknown one, the spec grammar's one line
    (:class:`zyfa.recipe_spec.SpecError`) for a bad spec, the kernel's plan's line for a recipe it does not take."""
    # the one table of names and their lines (accuracy.implementations.names, torch-free)
    return builtin_implementation(builtin_key(name))


def parse_implementations(spec: str | None) -> list[Implementation]:
    """``"all"`` (every built-in but the baselines of :data:`BASELINE_ONLY`), ``"available"`` (those of them whose
    device and package are here), ``"none"``/empty,
    or comma-separated names (:func:`zyfa.recipe_spec.split_spec_list`: a ``triton:`` spec's overrides stay with it);
    ValueError names an unknown one."""
    if spec is None or not spec.strip() or spec.strip() == "none":
        return []
    items = split_spec_list(spec)
    if items == ["all"]:
        return [get_implementation(n) for n in builtin_names() if n not in BASELINE_ONLY]
    if items == ["available"]:
        return [impl for impl in (get_implementation(n) for n in builtin_names() if n not in BASELINE_ONLY)
                if impl.available()[0]]
    out: list[Implementation] = []
    for name in dict.fromkeys(items):
        out.append(get_implementation(name))
    return out
