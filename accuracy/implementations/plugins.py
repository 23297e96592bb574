"""User plug-ins: a kernel of one's own (``--kernel``, or a Python callable through the API) as an
:class:`~zyfa.accuracy.implementations.base.Implementation`.

Plug-ins (:func:`load_plugin`): ``"[NAME=]module:function"`` or ``"[NAME=]path/to/file.py:function"`` with the
contract in docs/CONTRACTS.md, ``fn(q, k, v, *, causal, sm_scale, window) -> out | (out, lse)``, read by
:mod:`zyfa.plugins` and run in a worker process (:mod:`zyfa.accuracy.implementations.plugin_worker`: copies of the
inputs checked for writes, a time limit, the worker's death a failed row) unless ``in_process``. Every failure (bad
path, wrong signature, wrong output shape, NaN, an exception, a time-out) raises :class:`ImplementationError`,
whose message names the kernel, so the runner can mark that row failed and go on.

Exposed:
    load_plugin(spec, *, recipe=None, in_process=False, timeout=600) -> Implementation
    load_plugins(specs, recipes=None, *, in_process=False, timeout=600) -> list[Implementation]
    failed_implementation(name, error, *, recipe=None) -> Implementation   each call raises ``error``
    callable_implementation(fn, *, name, recipe=None) -> Implementation    a Python callable (the API)
"""

from __future__ import annotations

from collections.abc import Callable

from zyfa.accuracy.implementations.base import Implementation, ImplementationError, ImplResult, input_sm_scale
from zyfa.accuracy.implementations.names import check_kernels, check_plugin_name
from zyfa.accuracy.implementations.plugin_worker import DEFAULT_TIMEOUT_S, KernelFault, protected_call, shared_worker
from zyfa.accuracy.inputs.attention_input import AttentionInput

from zyfa.plugins import PluginError, check_signature, load_callable, parse_spec
from zyfa.recipe_spec import get_recipe

__all__ = ["callable_implementation", "failed_implementation", "load_plugin", "load_plugins"]


def load_plugin(spec: str, *, recipe: str | None = None, in_process: bool = False,
                timeout: float = DEFAULT_TIMEOUT_S) -> Implementation:
    """A user's kernel as an :class:`Implementation`, named ``NAME`` for ``NAME=...`` specs, else
    ``plugin:<module or absolute path>:<function>`` (:func:`zyfa.plugins.parse_spec`).

    Args:
        spec: ``[NAME=]module:function`` (importable) or ``[NAME=]path/to/file.py:function``.
        recipe: with ``--kernel-recipe``: the recipe it is paired with (compared with its emulation); the kernel
            still gets the original inputs.
        in_process: call it in this process (``--kernel-in-process``) instead of the shared worker process
            (:mod:`zyfa.accuracy.implementations.plugin_worker`, the default).
        timeout: the time limit of one call in the worker (``--kernel-timeout``).

    Raises:
        ImplementationError: naming the kernel, for a bad path or a signature that breaks the contract.
    """
    if recipe is not None:
        try:
            get_recipe(recipe)
        except ValueError as e:
            raise ImplementationError(f"kernel {spec!r}: --kernel-recipe: {e}") from None
    try:
        src = parse_spec(spec)
        if in_process:
            fn, where = load_callable(src)
            check_signature(spec, fn)
            quantization = getattr(fn, "quantization", None)
        else:
            worker = shared_worker()
            where, quantization = worker.load(src, timeout)
    except PluginError as e:
        raise ImplementationError(str(e)) from None
    try:
        check_plugin_name(src, spec)
    except ValueError as e:
        raise ImplementationError(str(e)) from None
    info = {"plugin_source": where, "plugin_sha256": src.sha256}

    def run(x: AttentionInput, context: dict) -> ImplResult:
        kw = {"causal": bool(x.causal), "sm_scale": input_sm_scale(x), "window": x.window}
        try:
            if in_process:
                out, lse = protected_call(fn, x.q, x.k, x.v, kw)
            else:
                out, lse = worker.call(src.name, x.q, x.k, x.v, kw, timeout)
        except KernelFault as e:
            raise ImplementationError(f"kernel {spec!r} {e}") from (e.__cause__ or e)
        return ImplResult(out, lse, dict(info))

    run.quantization = quantization  # its granularity, if it says (accuracy.implementations.conformance)
    mode = "in this process" if in_process else f"in a worker process, {timeout:g} s per call"
    return Implementation(name=src.name, fn=run, recipe=recipe, quantizes="self", device="the run's",
                          package=None, check=None, limits=None, description=f"user kernel {spec} ({where}; {mode})",
                          plugin=True, origin={**src.record(), "in_process": in_process, "timeout_s": timeout})


def load_plugins(specs, recipes=None, *, in_process: bool = False,
                 timeout: float = DEFAULT_TIMEOUT_S) -> list[Implementation]:
    """Plug-ins for ``--kernel`` (repeatable) and ``--kernel-recipe`` (none, one for all kernels, or one per
    kernel in order), each resolved and its signature checked before any work (in the worker process unless
    ``in_process``: :func:`load_plugin`).

    Raises:
        ValueError: an unknown ``--kernel-recipe``, or more than one but not one per ``--kernel``; a kernel that
            does not load (no such file or module, no such function, an import that fails, a wrong signature),
            a NAME given to two different kernels, in one line naming it.
    """
    specs = list(specs or [])
    recipes = list(recipes or [])
    check_kernels(specs, recipes)  # what is known without running the user's code, in the lines checked before torch
    paired = recipes * len(specs) if len(recipes) == 1 else (recipes or [None] * len(specs))
    out: list[Implementation] = []
    for spec, recipe in zip(specs, paired, strict=True):
        try:
            impl = load_plugin(spec, recipe=recipe, in_process=in_process, timeout=timeout)
        except ImplementationError as e:
            raise ValueError(str(e)) from None
        for other in out:
            if other.name == impl.name and (other.origin["path"], other.origin["function"]) != \
                    (impl.origin["path"], impl.origin["function"]):
                raise ValueError(f"--kernel: the name {impl.name!r} is given to two kernels "
                                 f"({other.origin['spec']} and {spec})")
        out.append(impl)
    return out


def failed_implementation(name: str, error: str, *, recipe: str | None = None) -> Implementation:
    """An implementation that could not be loaded: each call raises ``error``, so each row says why."""

    def fn(x: AttentionInput, context: dict) -> ImplResult:
        raise ImplementationError(error)

    return Implementation(name=name, fn=fn, recipe=recipe, quantizes="self", device="the run's",
                          description=f"failed to load: {error}", plugin=name.startswith("plugin:"))


def callable_implementation(fn: Callable, *, name: str, recipe: str | None = None) -> Implementation:
    """A kernel given as a Python callable with the plug-in contract (``fn(q, k, v, *, causal, sm_scale, window)
    -> out | (out, lse)``) as an :class:`Implementation` named ``name`` (the Python API, :mod:`zyfa.accuracy.api`):
    probed and scored as a ``--kernel`` plug-in; ``recipe`` pairs it as ``--kernel-recipe`` does.

    Raises:
        ImplementationError: a signature that breaks the contract, or an unknown recipe.
    """
    try:
        check_signature(name, fn)
        if recipe is not None:
            get_recipe(recipe)
    except (PluginError, ValueError) as e:
        raise ImplementationError(f"kernel {name!r}: {e}") from None

    def run(x: AttentionInput, context: dict) -> ImplResult:  # in this process: a callable cannot cross to a worker
        try:
            out, lse = protected_call(fn, x.q, x.k, x.v, {"causal": bool(x.causal), "sm_scale": input_sm_scale(x),
                                                          "window": x.window})
        except KernelFault as e:
            raise ImplementationError(f"kernel {name!r} {e}") from (e.__cause__ or e)
        return ImplResult(out, lse, {"plugin_source": f"{getattr(fn, '__module__', '?')}."
                                                      f"{getattr(fn, '__qualname__', '?')}"})

    run.quantization = getattr(fn, "quantization", None)
    return Implementation(name=name, fn=run, recipe=recipe, quantizes="self", device="the run's",
                          description=f"user kernel {name} (a Python callable)", plugin=True)
