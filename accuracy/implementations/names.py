"""The names ``--implementations`` and ``--kernel`` take, checked with no heavy import (no torch, no kernel code).

Every command that runs real implementations (``zyfa accuracy``, ``study``, ``cliffs``, ``impact``, ``longctx``,
``tasks``) checks these flags in its ``check_args``, which the ``zyfa`` dispatch runs before torch is imported, and
again with the registry (:mod:`zyfa.accuracy.implementations.registry`) once it has loaded: both read the one table
here and raise the one message, so a bad name gets the same line with or without torch
(tests/zyfa/test_fast_refusals.py).

- :func:`builtin_names`: the built-ins in the registry's order: ``triton:<recipe>`` for each named recipe the Triton
  kernel honours (:func:`zyfa.kernels.kernel_plan.kernel_plan`, torch-free), ``cute:<recipe>`` for each the CuTe DSL
  kernel honours (:func:`zyfa.kernels.cute_plan.cute_plan`: ``zyfa-hopper``), then the peers
  (:data:`zyfa.peers.names.PEER_NAMES`).
- :func:`builtin_key`: the registry entry a name denotes (``triton:SPEC`` or ``cute:SPEC``, SPEC read by the
  recipe-spec grammar and checked by that kernel's plan), or the registry's ValueError.
- :func:`kernel_namespace`: which of our kernels (:data:`KERNEL_PLANS`) a name runs, if any.
- :func:`check_decoding`: the names a greedy decoder (``zyfa tasks``, ``zyfa longctx --generate``) cannot run.
- :func:`check_implementations`: a ``--implementations`` list of built-ins (``all``, ``available``, ``none``).
- :func:`attention_kind`: what runs a name as a model's attention (``stock``, a built-in ``kernel``, a recipe
  spec's ``emulator``), as :func:`zyfa.accuracy.impact.model.model_attention` resolves it.
- :func:`check_kernels`: ``--kernel`` specs and ``--kernel-recipe`` without importing the user's file: the spec's
  form, the file's presence and a top-level binding of the function (:func:`zyfa.plugins.parse_spec`, by ``ast``),
  a NAME that is a built-in's, one NAME for two kernels.

Exposed: ``STOCK``, ``KERNEL_PLANS``, ``builtin_names()``, ``builtin_key(name)``, ``kernel_namespace(name)``,
``unknown_implementation(name)``, ``check_implementations(spec)``, ``attention_kind(name)``,
``check_decoding(names, prefix)``, ``check_plugin_name(src, spec)``,
``check_kernels(specs, recipes)``, ``check_kernel_recipes(recipes, n_kernels)``; per kind of command:
``check_kernel_flags(args)`` (accuracy, study, cliffs: built-ins and plug-ins), ``check_attention_names(names,
plugins, prefix)`` (longctx, tasks: anything a model's attention can be).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from zyfa.kernels.cute_plan import NOT_FOR_DECODING, cute_plan
from zyfa.kernels.kernel_plan import kernel_plan
from zyfa.peers.names import PEER_NAMES
from zyfa.plugins import PluginError, PluginSource, parse_spec, wall_options
from zyfa.recipe_spec import NAMESPACES, SpecError, get_recipe, split_spec, split_spec_list
from zyfa.recipes import RECIPES

__all__ = ["KERNEL_PLANS", "STOCK", "attention_kind", "builtin_key", "builtin_names", "check_attention_names",
           "check_decoding", "check_implementations", "check_kernel_flags", "check_kernel_recipes", "check_kernels",
           "check_plugin_name", "kernel_namespace", "unknown_implementation"]

# the model's own attention, nothing swapped (longctx, tasks, impact's reference)
STOCK = "stock"
# our own kernels, by the namespace that names one under a recipe spec (NAMESPACE:SPEC), each with the torch-free check
# of the recipes it honours (its switches, or ValueError in one line naming the field): the Triton kernel
# (zyfa.kernels.attention_fp8) and the CuTe DSL kernel (zyfa.kernels.attention_cute)
KERNEL_PLANS = {"triton": kernel_plan, "cute": cute_plan}
if tuple(KERNEL_PLANS) != NAMESPACES:  # pragma: no cover - a kernel added to one table and not the other
    raise ImportError(f"implementations.names: kernels {tuple(KERNEL_PLANS)} are not the recipe-spec grammar's "
                      f"namespaces {NAMESPACES} (zyfa.recipe_spec.NAMESPACES)")
# the peers in the order the registry lists them after our kernel's recipes (their names: zyfa.peers.names)
_PEER_ORDER = ("cudnn-fp8", "cudnn-fp8:oracle-scale", "sdpa-bf16:cudnn", "sdpa-bf16:flash", "sdpa-fp32",
               "flash-attn-triton-amd", "flashinfer-fa3")
if set(_PEER_ORDER) != set(PEER_NAMES):  # pragma: no cover - a peer added to one table and not the other
    raise ImportError(f"implementations.names: peers {sorted(set(_PEER_ORDER) ^ set(PEER_NAMES))} are not in both "
                      "zyfa.peers.names.PEER_NAMES and _PEER_ORDER")


@functools.lru_cache(maxsize=1)
def _names() -> tuple[str, ...]:
    ours = []
    for namespace, plan in KERNEL_PLANS.items():
        for name, r in RECIPES.items():
            try:
                plan(r)
            except ValueError:
                continue
            ours.append(f"{namespace}:{name}")
    return (*ours, *_PEER_ORDER)


def builtin_names() -> list[str]:
    """Every built-in implementation's name, in the registry's fixed order."""
    return list(_names())


def unknown_implementation(name: str) -> ValueError:
    """The one line for a name that is no built-in."""
    return ValueError(f"unknown implementation {name!r}; built-ins: {', '.join(_names())} "
                      "(a kernel of your own: --kernel module:function)")


def kernel_namespace(name: str) -> str | None:
    """``"triton"`` or ``"cute"`` for a name of our kernel under a recipe spec (``triton:SPEC``, ``cute:SPEC``;
    :data:`KERNEL_PLANS`), None for anything else (a peer's ``sdpa-bf16:cudnn`` included)."""
    namespace, colon, _ = name.partition(":")
    return namespace if colon and namespace in KERNEL_PLANS else None


def builtin_key(name: str) -> str:
    """The registry name ``name`` denotes: itself for a built-in; for ``triton:SPEC`` or ``cute:SPEC`` beyond the named
    recipes that kernel under the recipe spec, named by its canonical spec (``triton:zyfa:accum_flush_tiles=1``).

    Raises:
        SpecError: the spec grammar's one line for a bad spec after ``triton:`` or ``cute:``.
        ValueError: an unknown name (listing the built-ins), or a recipe the kernel does not honour (its plan's line:
            :func:`~zyfa.kernels.kernel_plan.kernel_plan`, :func:`~zyfa.kernels.cute_plan.cute_plan`).
    """
    names = _names()
    if name in names:
        return name
    namespace = kernel_namespace(name)
    if namespace is None:
        raise unknown_implementation(name)
    # both kernels' namespaces are the recipe-spec grammar's (its lines then name the whole spec)
    inner = name[len(namespace) + 1:].partition(":")[0].strip()
    if inner in NAMESPACES:
        raise ValueError(f"implementation {name!r}: {namespace}:SPEC takes a recipe spec, not another kernel's name "
                         f"({inner}:...)")
    spec = dataclasses.replace(split_spec(name), namespace=None).text()
    key = f"{namespace}:{spec}"
    if key in names:
        return key
    try:
        KERNEL_PLANS[namespace](get_recipe(spec))
    except SpecError:
        raise
    except ValueError as e:
        raise ValueError(f"implementation {name!r}: {e}") from None
    return key


def check_implementations(spec: str | None) -> list[str]:
    """The names of a ``--implementations`` list of built-ins, each checked (:func:`builtin_key`): ``all`` and
    ``available`` as themselves, nothing for ``none`` or an empty list."""
    if spec is None or not spec.strip() or spec.strip() == "none":
        return []
    items = split_spec_list(spec)
    if items in (["all"], ["available"]):
        return items
    return [builtin_key(n) for n in dict.fromkeys(items)]


def attention_kind(name: str) -> str:
    """What runs ``name`` as a model's attention: ``"stock"``, ``"kernel"`` (a built-in, ``triton:SPEC`` or
    ``cute:SPEC``) or ``"emulator"`` (a recipe spec); ValueError (the spec grammar's one line, or the registry's)
    otherwise. Plug-in names are the caller's: they are known only from ``--kernel``."""
    if name == STOCK:
        return "stock"
    if name in _names() or kernel_namespace(name) is not None:
        builtin_key(name)
        return "kernel"
    get_recipe(name)
    return "emulator"


def check_plugin_name(src: PluginSource, spec: str) -> None:
    """ValueError when a ``--kernel`` spec's NAME is a built-in implementation's."""
    if src.name in _names():
        raise ValueError(f"kernel {spec!r}: the name {src.name!r} is a built-in implementation's; choose another NAME")


def check_kernel_recipes(recipes: Sequence[str], n_kernels: int) -> None:
    """``--kernel-recipe``: none, one for every kernel or one per kernel, each a recipe; ValueError in one line."""
    if len(recipes) > 1 and len(recipes) != n_kernels:
        raise ValueError(f"--kernel-recipe given {len(recipes)} times for {n_kernels} --kernel; give it once "
                         "(for every kernel) or once per kernel, in the same order")
    for r in recipes:
        try:
            get_recipe(r)
        except ValueError as e:
            raise ValueError(f"--kernel-recipe {r!r}: {e}") from None


def check_kernels(specs: Sequence[str] | None, recipes: Sequence[str] | None = None) -> list[PluginSource]:
    """``--kernel`` specs and ``--kernel-recipe`` checked without running the user's code, in the order and with
    the lines of :func:`zyfa.accuracy.implementations.load_plugins`: the recipes, then per spec its form and file
    (:func:`zyfa.plugins.parse_spec`: the file is parsed, not run), a built-in's NAME, a NAME given to two kernels.
    Returns the resolved sources. ValueError in one line."""
    specs, recipes = list(specs or []), list(recipes or [])
    check_kernel_recipes(recipes, len(specs))
    out: list[PluginSource] = []
    for spec in specs:
        try:
            src = parse_spec(spec)
        except PluginError as e:
            raise ValueError(str(e)) from None
        check_plugin_name(src, spec)
        for other in out:
            if other.name == src.name and (other.path, other.function) != (src.path, src.function):
                raise ValueError(f"--kernel: the name {src.name!r} is given to two kernels ({other.spec} and {spec})")
        out.append(src)
    return out


def check_kernel_flags(args, implementations: str | None = None) -> list[PluginSource]:
    """The real-kernel flags of ``zyfa accuracy``, ``study`` and ``cliffs``, in the order their runs read them:
    ``--implementations`` (built-ins; ``implementations`` stands for a flag left out), ``--kernel-timeout``, then
    ``--kernel`` and ``--kernel-recipe`` (:func:`check_kernels`). ValueError in one line."""
    spec = getattr(args, "implementations", None)
    check_implementations(spec if spec is not None else implementations)
    wall_options(args)
    return check_kernels(getattr(args, "kernel", None), getattr(args, "kernel_recipe", None))


def check_attention_names(names: Sequence[str], plugins: Sequence[PluginSource] = (), *,
                          prefix: str = "--implementations: ") -> None:
    """Names of ``zyfa longctx`` / ``tasks`` ``--implementations``: ``stock``, a ``--kernel``'s NAME (``plugins``),
    a built-in or a recipe spec (:func:`attention_kind`); ValueError ``prefix`` + the one line otherwise."""
    own = {p.name for p in plugins}
    for name in names:
        if name == STOCK or name in own:
            continue
        try:
            attention_kind(name)
        except ValueError as e:
            raise ValueError(f"{prefix}{e}") from None


def check_decoding(names: Sequence[str], *, prefix: str = "--implementations: ") -> None:
    """Names a model's attention cannot be in greedy decoding (``zyfa tasks``, ``zyfa longctx --generate``): our CuTe
    kernel (:data:`zyfa.kernels.cute_plan.NOT_FOR_DECODING`); ValueError ``prefix`` + one line naming the first and
    the Triton kernel under the same spec, which decodes."""
    for name in names:
        if kernel_namespace(name) == "cute":
            raise ValueError(f"{prefix}{name}: {NOT_FOR_DECODING}; the Triton kernel runs the same recipe spec as "
                             f"triton:{name[len('cute:'):]}")
