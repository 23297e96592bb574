"""The Python API: measure a kernel from Python, and a pytest helper for a kernel repository's own tests.

The same work as ``zyfa accuracy --kernel``, through the same runner
(:func:`zyfa.accuracy.operator.runner.run_accuracy`) and
the same plug-in path (:mod:`zyfa.accuracy.implementations.registry`: conformance probes first, then the kernel scored
against the FP64 oracle beside the paired recipe's emulation)::

    from zyfa.accuracy.api import assert_kernel_conforms, measure

    rows = measure(my_attention, pair_with="zyfa")            # a callable with the plug-in contract
    rows = measure("kernels/mine.py:attention", inputs=["datasets/smollm2-lee-2048.h5"], max_tokens=256,
                   recipes=("zyfa", "fa3"), pair_with="zyfa")

    def test_my_kernel():                                     # in the kernel's own test suite
        assert_kernel_conforms(my_attention, recipe="zyfa", max_error_ratio=1.1)

The contract (docs/CONTRACTS.md): ``fn(q, k, v, *, causal, sm_scale, window) -> out | (out, lse)``.

Exposed: ``measure(kernel=None, *, inputs="gaussian", recipes=(), pair_with=None, ...) -> ResultRows``,
``assert_kernel_conforms(kernel, *, recipe="zyfa", inputs="gaussian", max_error_ratio=1.1, ...) -> ResultRows``,
``api_inputs(inputs, ...) -> list[AttentionInput]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from zyfa.accuracy.implementations.base import Implementation, ImplementationError
from zyfa.accuracy.implementations.plugins import callable_implementation, load_plugin
from zyfa.accuracy.inputs.attention_input import AttentionInput, GaussianSpec, capture_inputs, make_gaussian
from zyfa.accuracy.io.device import resolve_device
from zyfa.accuracy.io.results_io import ResultRows
from zyfa.accuracy.operator.runner import run_accuracy

from zyfa.recipe_spec import parse_recipes

__all__ = ["api_inputs", "assert_kernel_conforms", "measure"]

# "gaussian": two small inputs (no mask, causal), seconds on a CPU
GAUSSIAN = {"seq": 256, "head_dim": 64, "heads": 2}


def api_inputs(inputs="gaussian", *, seq: int = GAUSSIAN["seq"], head_dim: int = GAUSSIAN["head_dim"],
               heads: int = GAUSSIAN["heads"], seed: int = 0, layers: Sequence[int] | None = None,
               max_tokens: int | None = None, device="cpu") -> list[AttentionInput]:
    """The inputs of :func:`measure`: ``"gaussian"`` (a no-mask and a causal Gaussian input of ``seq`` tokens,
    ``heads`` heads, head dim ``head_dim``), a capture file's path (.h5; ``layers`` and ``max_tokens`` select), a
    :class:`~accuracy.inputs.attention_input.GaussianSpec`, an
    :class:`~accuracy.inputs.attention_input.AttentionInput`, or a list of these.

    Raises:
        ValueError: an item that is none of these, or a missing file.
    """
    items = [inputs] if isinstance(inputs, (str, Path, GaussianSpec, AttentionInput)) else list(inputs)
    if not items:
        raise ValueError("no inputs given")
    out: list[AttentionInput] = []
    for item in items:
        if isinstance(item, AttentionInput):
            out.append(item)
        elif isinstance(item, GaussianSpec):
            out.append(make_gaussian(item))
        elif isinstance(item, str) and item == "gaussian":
            out += [make_gaussian(GaussianSpec(heads_q=heads, heads_kv=heads, seq=seq, head_dim=head_dim,
                                               causal=causal, seed=seed)) for causal in (False, True)]
        elif isinstance(item, (str, Path)):
            if not Path(item).is_file():
                raise ValueError(f"no such input file: {item} (inputs: 'gaussian', capture .h5 files, "
                                 "GaussianSpec or AttentionInput)")
            out += capture_inputs(item, layers=list(layers) if layers is not None else None, max_tokens=max_tokens,
                                  device=device)
        else:
            raise ValueError(f"inputs: {item!r} is not 'gaussian', a capture file, a GaussianSpec or an "
                             "AttentionInput")
    return out


def _implementation(kernel, pair_with: str | None, name: str | None) -> Implementation:
    if isinstance(kernel, Implementation):
        return kernel
    if isinstance(kernel, (str, Path)):
        try:
            return load_plugin(str(kernel), recipe=pair_with)
        except ImplementationError as e:
            raise ValueError(str(e)) from None
    if callable(kernel):
        label = name or f"plugin:{getattr(kernel, '__module__', '?')}.{getattr(kernel, '__qualname__', '?')}"
        try:
            return callable_implementation(kernel, name=label, recipe=pair_with)
        except ImplementationError as e:
            raise ValueError(str(e)) from None
    raise ValueError(f"kernel must be a callable, a 'path/to/file.py:function' or 'module:function' spec, "
                     f"got {type(kernel).__name__}")


def measure(kernel: Callable | str | Implementation | None = None, *, inputs="gaussian",
            recipes: str | Sequence[str] = (), pair_with: str | None = None, name: str | None = None,
            device: str = "auto", seed: int = 0, progress: bool = False, **input_options) -> ResultRows:
    """The error of ``kernel`` (and of ``recipes``' emulations) against the FP64 oracle: the rows of
    ``zyfa accuracy`` (docs/CONTRACTS.md, row fields in :mod:`zyfa.accuracy.implementations.real_rows`).

    Args:
        kernel: a callable with the plug-in contract, a ``path/to/file.py:function`` / ``module:function`` spec
            (imported and run in this process), an :class:`~accuracy.implementations.base.Implementation`, or None
            (recipes only).
        inputs: see :func:`api_inputs` (``input_options``: ``seq``, ``head_dim``, ``heads``, ``layers``,
            ``max_tokens``).
        recipes: recipe names (or one comma-separated string) whose emulations run beside it.
        pair_with: the recipe the kernel is compared with (``--kernel-recipe``): its rows get
            ``real_emu_ratio`` (the kernel's error over the emulation's) and ``suspect`` outside [0.5, 2].
        name: what the rows call a callable kernel (default ``plugin:<module>.<function>``).
        device: "auto" (CUDA if present), "cpu" or "cuda".

    Returns:
        :class:`~accuracy.io.results_io.ResultRows` (with ``.provenance``): one row per input and recipe, then one per
        input for the kernel with its ``status`` (``ok``, ``suspect``, ``nonconforming``, ``failed``,
        ``unsupported``) and ``reason``/``error``.

    Raises:
        ValueError: a kernel that does not load or breaks the contract's signature, unknown recipes, bad inputs.
    """
    if isinstance(recipes, str):
        recipes = parse_recipes(recipes) if recipes.strip() else []
    recipes = list(recipes)
    impls = [] if kernel is None else [_implementation(kernel, pair_with, name)]
    if not recipes and not impls:
        raise ValueError("nothing to measure: give a kernel or recipes")
    dev = resolve_device(device)
    xs = api_inputs(inputs, seed=seed, device=dev, **input_options)
    return run_accuracy(xs, recipes, device=dev, progress=progress, seed=seed, implementations=impls)


def _problems(rows: Sequence[dict], max_error_ratio: float | None) -> list[str]:
    """Why a kernel's rows fail the helper, one line each (deduplicated)."""
    out: list[str] = []
    for r in rows:
        if not r.get("real"):
            continue
        status, where = r.get("status"), r.get("input")
        if status in ("failed", "nonconforming", "unsupported"):
            line = f"{status}: {r.get('error') or r.get('reason')}"
            out.append(line if status == "nonconforming" else f"{where}: {line}")
            continue
        ratio = r.get("real_emu_ratio")
        if max_error_ratio is not None and isinstance(ratio, (int, float)) and not (
                math.isfinite(ratio) and ratio <= max_error_ratio):
            basis = r.get("ratio_basis", "orig")
            out.append(f"{where}: {basis}_rel_l2 {r.get(f'{basis}_rel_l2'):.4g} is {ratio:.4g}x the "
                       f"{r.get('paired_spec')} emulation's ({r.get(f'emu_{basis}_rel_l2'):.4g}), above "
                       f"max_error_ratio {max_error_ratio:g}")
        elif status == "suspect":
            out.append(f"{where}: suspect: {r.get('reason')}")
    return list(dict.fromkeys(out))


def assert_kernel_conforms(kernel: Callable | str, *, recipe: str | None = "zyfa", inputs="gaussian",
                           max_error_ratio: float | None = 1.1, device: str = "auto", name: str | None = None,
                           **options) -> ResultRows:
    """For a kernel repository's tests: ``kernel`` passes every conformance probe (mask, window, LSE base, GQA
    mapping), runs on every input, and its error is at most ``max_error_ratio`` times the error of ``recipe``'s
    emulation on each input (total error against FP64 on the original inputs, as ``real_emu_ratio``; None: no
    bound). Returns the rows (:func:`measure`) when it does.

    Raises:
        AssertionError: naming the kernel and every reason, one per line (a nonconforming probe with what it
            saw, a failed or unsupported input, an error ratio beyond the bound).
        ValueError: a kernel that does not load or breaks the contract's signature.
    """
    if max_error_ratio is not None and recipe is None:
        raise ValueError("max_error_ratio needs a recipe to compare with (recipe=None: give max_error_ratio=None)")
    rows = measure(kernel, inputs=inputs, pair_with=recipe, device=device, name=name, **options)
    problems = _problems(rows, max_error_ratio)
    if problems:
        label = next((r["implementation"] for r in rows if r.get("real")), str(kernel))
        raise AssertionError(f"kernel {label} does not conform:\n" + "\n".join(f"  - {p}" for p in problems))
    return rows
