"""Real attention implementations beside the recipes' emulations: a registry, built-in adapters, user plug-ins.

An :class:`Implementation` is a named callable that runs one attention forward over an
:class:`~accuracy.inputs.attention_input.AttentionInput` and returns the output (and the natural-log LSE where it has
one).
It carries the recipe whose numerics it claims (so it can be paired with that recipe's emulation), what it
needs (a device, a package: :meth:`Implementation.available` says whether they are here, and why not), and how
it quantizes: ``"recipe"`` (it takes the FP8 values the recipe's quantizer, :func:`zyfa.emulator.quantize_inputs`,
produces: the emulation sees bit-identical inputs), ``"self"`` (it quantizes for itself: scored against FP64
on the original inputs) or ``"none"`` (a BF16 kernel).

Built-ins (:func:`builtin_names`):

- ``triton:<recipe>``: our Triton FP8 kernel (:mod:`zyfa.kernels.attention_fp8`), one per recipe it honours.
- ``cudnn-fp8``: cuDNN's FP8 SDPA through nvidia-cudnn-frontend's graph API (``sdpa_fp8``). On Hopper it
  writes FP8 output, so ``scale_o`` must be chosen: ``cudnn-fp8`` takes 448 / amax(O) from a first pass,
  ``cudnn-fp8:oracle-scale`` from the FP64 oracle's output amax. The choice is in the row (``scale_o_choice``).
- ``sdpa-bf16:cudnn``, ``sdpa-bf16:flash``: PyTorch SDPA in BF16 on one backend, paired with ``bf16``.
- ``sdpa-fp32``: PyTorch SDPA in fp32 on any device and backend, paired with ``fp32``: the FP32 baseline of the
  long-context tasks (a window or a causal mask with s_q != s_k is passed as an explicit bottom-right mask).
- ``flash-attn-triton-amd``: AMD's Triton FP8 forward from the ``flash-attn`` package
  (``flash_attn.flash_attn_triton_amd.fwd_prefill``), installed as a package; the adapter sets its launch
  config (the AMD-only ``waves_per_eu`` hint left out) and imports its forward alone. docs/real_kernels.md says
  which numerics the released package has and why it is paired with ``triton-amd:p_scale=tile_amax``.
- ``flashinfer-fa3``: FA3's FP8 forward as FlashInfer (``flashinfer-python``) builds it for sm_90
  (``single_prefill_with_kv_cache`` with ``backend="fa3"``), paired with ``fa3`` with P scaled by 448, Q per
  query head, FlashInfer's tiles and KV tiles visited last to first (:data:`FLASHINFER_FA3_RECIPE`).
  FlashInfer compiles the kernel with nvcc on first use, or loads it from its AOT folder;
  ``scripts/build_flashinfer_fa3.py`` does that build where the GPU machine cannot.

Plug-ins (:func:`load_plugin`): ``"[NAME=]module:function"`` or ``"[NAME=]path/to/file.py:function"`` with the
contract in docs/CONTRACTS.md, ``fn(q, k, v, *, causal, sm_scale, window) -> out | (out, lse)``, read by
:mod:`zyfa.plugins` and run in a worker process (:mod:`zyfa.accuracy.implementations.plugin_worker`: copies of the
inputs
checked for writes, a time limit, the worker's death a failed row) unless ``in_process``. Every failure (bad
path, wrong signature, wrong output shape, NaN, an exception, a time-out) raises :class:`ImplementationError`,
whose message names the kernel, so the runner can mark that row failed and go on.

Exposed:
    Implementation, ImplResult, ImplementationError
    builtin_names() -> list[str];  get_implementation(name) -> Implementation
    parse_implementations(spec) -> list[Implementation]   ("all", "available", or comma-separated names)
    load_plugin(spec, *, recipe=None, in_process=False, timeout=600) -> Implementation
    load_plugins(specs, recipes=None, *, in_process=False, timeout=600) -> list[Implementation]
    call_implementation(impl, x, context=None, *, allow_nonfinite=False) -> ImplResult   (runs, validates;
        ImplementationError on failure; with allow_nonfinite NaN/Inf outputs come back to be counted)
    unsupported_reason(impl, x) -> str | None
    unavailable_lines(unavailable) -> list[str]   the terminal's lines for the implementations not run (those
        lacking a GPU in one line)
    device_platform(device) -> (platform name | None, why none)
    pairing(impl, platform, why_none="") -> Pairing | None   the emulation a real row is compared with

Pairing: a real kernel is compared with the emulation of what it computes where it runs: its recipe on the
platform of the device it ran on (CUDA capability 9.0 -> ``h200``), for ``triton:<recipe>`` the kernel's own
version of the recipe; on a device with no platform model the recipe's own platform, with a note in the row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from zyfa.accuracy.implementations.plugin_worker import DEFAULT_TIMEOUT_S, KernelFault, protected_call, shared_worker
from zyfa.accuracy.inputs.attention_input import AttentionInput

from zyfa.peers import cudnn_fp8, flash_attn_amd, flashinfer_fa3
from zyfa.peers.common import NO_CUDA, per_head_descales
from zyfa.peers.common import all_checks as _all
from zyfa.peers.common import cuda_check as _cuda
from zyfa.peers.common import package_check as _package
from zyfa.peers.flash_attn_amd import FLASH_ATTN_AMD_RECIPE, flash_attn_amd_forward
from zyfa.peers.flashinfer_fa3 import (
    FLASHINFER_FA3_DIMS,
    FLASHINFER_FA3_RECIPE,
    flashinfer_fa3_forward,
    flashinfer_fa3_inputs,
    packed_head_dims,
)
from zyfa.peers.registry import PEERS
from zyfa.peers.sdpa import sdpa_forward
from zyfa.plugins import PluginError, check_signature, load_callable, parse_spec
from zyfa.recipes import SpecError, get_recipe, split_spec, split_spec_list

__all__ = [
    "BASELINE_ONLY",
    "FLASHINFER_FA3_DIMS",
    "FLASHINFER_FA3_RECIPE",
    "FLASH_ATTN_AMD_RECIPE",
    "ImplResult",
    "Implementation",
    "ImplementationError",
    "Pairing",
    "builtin_names",
    "call_implementation",
    "callable_implementation",
    "device_platform",
    "failed_implementation",
    "flash_attn_amd_forward",
    "flashinfer_fa3_forward",
    "flashinfer_fa3_inputs",
    "get_implementation",
    "load_plugin",
    "load_plugins",
    "pairing",
    "per_head_descales",
    "parse_implementations",
    "unavailable_lines",
    "unsupported_reason",
]

QUANTIZES = ("recipe", "self", "none")
class ImplementationError(RuntimeError):
    """An implementation (built-in or plug-in) could not be loaded, failed, or returned a bad output."""


@dataclass
class ImplResult:
    """What one implementation returned: out (b, h, s_q, d_v), lse (b, h, s_q) natural log or None, and
    details for the row (e.g. ``scale_o_choice``)."""

    out: torch.Tensor
    lse: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Implementation:
    """One real attention forward.

    Attributes:
        name: registry name (``triton:zyfa``, ``cudnn-fp8``, ``plugin:module:function``, ...).
        fn: ``fn(x: AttentionInput, context: dict) -> ImplResult``; ``x`` is already on the run's device;
            ``context`` may hold ``oracle_out_amax`` (the FP64 oracle's max |out| on the original inputs).
        recipe: the recipe (name or ``name:field=value`` spec) whose numerics it claims, or None.
        quantizes: ``"recipe"``, ``"self"`` or ``"none"`` (see the module docstring).
        device: what it runs on, in words (``"CUDA, Hopper (sm_90)"``, ``"any"``).
        package: the distribution it needs (``"nvidia-cudnn-frontend"``), or None.
        check: ``() -> (ok, reason)``: whether the device and package are here.
        limits: ``(x: AttentionInput) -> reason | None``: inputs it cannot take (a mask, a head dim); such
            rows are recorded as unsupported, not failed.
        description: one line for listings and reports.
        plugin: True for a user's kernel loaded by :func:`load_plugin`.
        emulation: what its paired emulation is (:func:`pairing`): ``"recipe"`` (the recipe it claims) or
            ``"triton-kernel"`` (the recipe as our Triton kernel computes it, ``kernel_recipe``).
        scale_o: ``"oracle"`` when its FP8 output scale comes from the FP64 oracle's amax (the emulation's
            output is then scaled alike), else None.
        origin: a plug-in's identity for provenance (name, spec, resolved path, sha256, function, how it runs:
            :meth:`zyfa.plugins.PluginSource.record`), else None.
    """

    name: str
    fn: Callable[[AttentionInput, dict], ImplResult]
    recipe: str | None = None
    quantizes: str = "self"
    device: str = "any"
    package: str | None = None
    check: Callable[[], tuple[bool, str]] | None = None
    limits: Callable[[AttentionInput], str | None] | None = None
    description: str = ""
    plugin: bool = False
    emulation: str = "recipe"
    scale_o: str | None = None
    origin: dict | None = field(default=None, compare=False)  # a dict: left out of eq and hash

    def __post_init__(self) -> None:
        if self.quantizes not in QUANTIZES:
            raise ValueError(f"implementation {self.name!r}: quantizes must be one of {QUANTIZES}")
        if self.emulation not in ("recipe", "triton-kernel"):
            raise ValueError(f"implementation {self.name!r}: emulation must be 'recipe' or 'triton-kernel'")

    def available(self) -> tuple[bool, str]:
        """(True, "") when its device and package are here, else (False, the reason in one line)."""
        if self.check is None:
            return True, ""
        try:
            return self.check()
        except Exception as e:  # noqa: BLE001 - a broken probe is a reason, not a crash
            return False, f"availability check failed: {type(e).__name__}: {e}"

    def paired_recipe(self):
        """The :class:`~zyfa.recipes.Recipe` it claims (overrides applied), or None."""
        return None if self.recipe is None else get_recipe(self.recipe)


# ---------------------------------------------------------------------------------------------- pairing

@dataclass(frozen=True)
class Pairing:
    """The emulation a real implementation is compared with, where it ran.

    Attributes:
        recipe: the :class:`~zyfa.recipes.Recipe` emulated (its ``name`` is the row's ``paired_spec``, its
            ``platform`` the row's ``paired_platform``).
        scale_o: ``"oracle"``: the emulation's FP8 output is scaled by 448 / the FP64 oracle's amax, as the
            implementation's (``cudnn-fp8:oracle-scale``); None: by the recipe's own rule.
        note: why the emulation is not on the device's platform ("" when it is).
    """

    recipe: Any
    scale_o: str | None = None
    note: str = ""

    @property
    def spec(self) -> str:
        return self.recipe.name + (" (scale_o: oracle amax)" if self.scale_o == "oracle" else "")


def device_platform(device) -> tuple[str | None, str]:
    """The platform (:mod:`zyfa.platforms`) whose arithmetic a real kernel on ``device`` has: (name, "") or
    (None, why none). CUDA compute capability 9.0 (H100, H200: Hopper's FP8 wgmma, fitted on the H200) is
    ``h200``; no other device has a model (an MI355X would be ``mi355x``, but ROCm builds are not run here)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None, f"no platform model for device {dev.type}"
    major, minor = torch.cuda.get_device_capability(dev)
    name = torch.cuda.get_device_name(dev)
    if getattr(torch.version, "hip", None):
        return None, f"no platform model for {name} (ROCm)"
    if (major, minor) == (9, 0):
        return "h200", ""
    return None, f"no platform model for {name} (compute capability {major}.{minor})"


def pairing(impl: Implementation, platform: str | None, why_none: str = "") -> Pairing | None:
    """What ``impl`` is compared with when it runs on a device of ``platform`` (None: a device with no platform
    model, ``why_none`` saying so): the emulation of what it computes there.

    - The recipe it claims on that platform (``zyfa`` -> ``zyfa@h200``); for ``triton:<recipe>`` the kernel's own
      version of the recipe (:func:`zyfa.kernels.attention_fp8.kernel_recipe`). A spec that names its platform
      (``--kernel-recipe zyfa@mi355x``) keeps it.
    - Where the device has no platform model the recipe's own platform is kept and the note says so (the
      report flags the row).
    - ``cudnn-fp8:oracle-scale``: the emulation's FP8 output scaled by the oracle's amax, as the kernel's.
    None for an implementation paired with no recipe.
    """
    if impl.recipe is None:
        return None
    spec = impl.recipe
    r = get_recipe(spec if impl.emulation == "recipe" else f"triton:{spec}")
    named = isinstance(spec, str) and "@" in spec
    note = ""
    if named:
        note = f"platform {r.platform} named by the paired spec"
    elif platform is not None:
        r = r.on(platform)
    else:
        note = f"{why_none or 'no platform model for the device'}: emulated on the recipe's own platform " \
               f"({r.platform})"
    return Pairing(r, impl.scale_o, note)


# ---------------------------------------------------------------------------------------------- availability

# ---------------------------------------------------------------------------------------------- input limits

def _sm(x: AttentionInput) -> float:
    return float(x.sm_scale) if x.sm_scale is not None else 1.0 / math.sqrt(x.q.shape[-1])


def _effective_window(x: AttentionInput) -> int | None:
    """The window, or None where it cannot bind (causal, s_q == s_k, window >= s_k: it equals the causal mask)."""
    if x.window is None:
        return None
    if x.causal and x.q.shape[2] == x.k.shape[2] and x.window >= x.k.shape[2]:
        return None
    return x.window


def _no_window_limits(*, same_dims: bool = False, equal_seq_causal: bool = True, dims=None):
    def limits(x: AttentionInput) -> str | None:
        if _effective_window(x) is not None:
            return f"sliding window ({x.window} keys) not supported"
        if (x.causal or x.window is not None) and equal_seq_causal and x.q.shape[2] != x.k.shape[2]:
            return "causal with s_q != s_k not supported (top-left vs bottom-right alignment)"
        d_qk, d_v = x.q.shape[-1], x.v.shape[-1]
        if same_dims and d_qk != d_v:
            return f"d_qk {d_qk} != d_v {d_v} not supported"
        if dims is not None and (d_qk, d_v) not in dims:
            return f"head dims {d_qk}/{d_v} not supported (takes {', '.join(f'{a}/{b}' for a, b in dims)})"
        return None

    return limits


def unsupported_reason(impl: Implementation, x: AttentionInput) -> str | None:
    """Why ``impl`` cannot take input ``x`` (a mask, a shape), or None."""
    return impl.limits(x) if impl.limits is not None else None


# ---------------------------------------------------------------------------------------------- triton:<recipe>

def _triton_recipes() -> list[str]:
    from zyfa.kernels.attention_fp8 import kernel_plan
    from zyfa.recipes import RECIPES

    names = []
    for name, r in RECIPES.items():
        try:
            kernel_plan(r)
        except ValueError:
            continue
        names.append(name)
    return names


def _triton_impl(recipe: str) -> Implementation:
    from zyfa.kernels.attention_fp8 import SUPPORTED_HEAD_DIMS

    def fn(x: AttentionInput, context: dict) -> ImplResult:
        from zyfa.kernels.attention_fp8 import attention_fp8_quantized

        out, lse = attention_fp8_quantized(x.q, x.k, x.v, recipe=recipe, causal=bool(x.causal),
                                           sm_scale=x.sm_scale, window=x.window)
        return ImplResult(out, lse)

    def limits(x: AttentionInput) -> str | None:
        dims = (x.q.shape[-1], x.v.shape[-1])
        if dims not in SUPPORTED_HEAD_DIMS:
            return f"head dims {dims[0]}/{dims[1]} not supported by the Triton kernel"
        return None

    return Implementation(
        name=f"triton:{recipe}", fn=fn, recipe=recipe, quantizes="recipe", device="CUDA, Hopper (sm_90)",
        package="triton", check=_all(lambda: _cuda(exact_major=9), lambda: _package("triton", "triton")),
        limits=limits, description=f"our Triton FP8 kernel under recipe {recipe}", emulation="triton-kernel")


# ---------------------------------------------------------------------------------------------- peers

def _peer_impl(name: str, fn: Callable[[AttentionInput, dict], ImplResult], limits, description: str,
               **kw) -> Implementation:
    """A peer of zyfa.peers' table (:data:`zyfa.peers.registry.PEERS`): its name, recipe, device, package and check
    from there."""
    peer = PEERS[name]
    return Implementation(name=peer.name, fn=fn, recipe=peer.recipe, device=peer.device, package=peer.package,
                          check=peer.check, limits=limits, description=description, **kw)


def _run_prepared(prepare: Callable[..., Any], x: AttentionInput, **kw) -> ImplResult:
    """One forward of a peer through its "prepare once, call many" entry (zyfa.peers): prepared, called once."""
    prepared = prepare(x.q, x.k, x.v, causal=bool(x.causal), sm_scale=_sm(x), **kw)
    prepared.call()
    if x.q.is_cuda:
        torch.cuda.synchronize(x.q.device)
    return ImplResult(prepared.output(), prepared.lse() if prepared.lse else None, dict(prepared.details))


def _cudnn_fp8_run(x: AttentionInput, context: dict, scale_o_choice: str) -> ImplResult:
    amax = None
    if scale_o_choice == "oracle":
        amax = context.get("oracle_out_amax")
        if amax is None:
            raise ImplementationError("cudnn-fp8:oracle-scale needs the oracle's output amax (runner context)")
    return _run_prepared(cudnn_fp8.prepare, x, out_amax=amax)


def _cudnn_impl(name: str, scale_o_choice: str) -> Implementation:
    return _peer_impl(
        name, lambda x, c: _cudnn_fp8_run(x, c, scale_o_choice), _no_window_limits(same_dims=False),
        f"cuDNN FP8 SDPA (graph sdpa_fp8), FP8 output, scale_o from the {scale_o_choice} amax", quantizes="recipe",
        scale_o="oracle" if scale_o_choice == "oracle" else None)


def _sdpa_impl(backend: str) -> Implementation:
    def fn(x: AttentionInput, context: dict) -> ImplResult:
        out = sdpa_forward(x.q, x.k, x.v, causal=bool(x.causal), sm_scale=_sm(x), dtype=torch.bfloat16,
                           backend=backend)
        return ImplResult(out, None, {"sdpa_backend": backend})

    return _peer_impl(f"sdpa-bf16:{backend}", fn, _no_window_limits(),
                      f"PyTorch scaled_dot_product_attention in BF16, {backend} backend", quantizes="none")


def _sdpa_fp32_impl() -> Implementation:
    def fn(x: AttentionInput, context: dict) -> ImplResult:
        out = sdpa_forward(x.q, x.k, x.v, causal=bool(x.causal), sm_scale=_sm(x), window=_effective_window(x),
                           dtype=torch.float32)
        return ImplResult(out, None, {"sdpa_dtype": "float32"})

    return _peer_impl("sdpa-fp32", fn, None,
                      "PyTorch scaled_dot_product_attention in fp32 (any backend; the FP32 baseline)", quantizes="none")


def _flash_attn_amd_impl() -> Implementation:
    return _peer_impl(
        "flash-attn-triton-amd", lambda x, c: _run_prepared(flash_attn_amd.prepare, x),
        _no_window_limits(same_dims=True, equal_seq_causal=False),
        "AMD's Triton FP8 forward from flash-attn (flash_attn_triton_amd), run on Hopper", quantizes="recipe")


_FLASHINFER_SHAPES = _no_window_limits(equal_seq_causal=False, dims=FLASHINFER_FA3_DIMS)


def _flashinfer_limits(x: AttentionInput) -> str | None:
    """Its kernel's shapes, and on a packed install (scripts/build_flashinfer_fa3.py) the head dims packed."""
    why = _FLASHINFER_SHAPES(x)
    if why is None:
        packed = packed_head_dims()
        if packed is not None and x.q.shape[-1] not in packed:
            why = (f"head dim {x.q.shape[-1]} is not in this FlashInfer FA3 pack (built for "
                   f"{', '.join(map(str, packed))}; scripts/build_flashinfer_fa3.py --head-dims adds it)")
    return why


def _flashinfer_fa3_impl() -> Implementation:
    return _peer_impl(
        "flashinfer-fa3", lambda x, c: _run_prepared(flashinfer_fa3.prepare, x), _flashinfer_limits,
        "FA3's FP8 forward as FlashInfer builds it for sm_90 (single_prefill_with_kv_cache, backend fa3)",
        quantizes="recipe")


# ---------------------------------------------------------------------------------------------- registry

def _builtins() -> dict[str, Callable[[], Implementation]]:
    reg: dict[str, Callable[[], Implementation]] = {}
    for recipe in _triton_recipes():
        reg[f"triton:{recipe}"] = (lambda r=recipe: _triton_impl(r))
    reg["cudnn-fp8"] = lambda: _cudnn_impl("cudnn-fp8", "first-pass")
    reg["cudnn-fp8:oracle-scale"] = lambda: _cudnn_impl("cudnn-fp8:oracle-scale", "oracle")
    reg["sdpa-bf16:cudnn"] = lambda: _sdpa_impl("cudnn")
    reg["sdpa-bf16:flash"] = lambda: _sdpa_impl("flash")
    reg["sdpa-fp32"] = _sdpa_fp32_impl
    reg["flash-attn-triton-amd"] = _flash_attn_amd_impl
    reg["flashinfer-fa3"] = _flashinfer_fa3_impl
    return reg


def _triton_spec_impl(name: str, reg: dict[str, Callable[[], Implementation]]) -> Implementation:
    """``triton:SPEC`` beyond the named recipes: our kernel under the recipe SPEC names, named by its canonical
    spec (``triton:zyfa:accum_flush_tiles=1``)."""
    from zyfa.kernels.attention_fp8 import kernel_plan

    spec = split_spec(name).text()[len("triton:"):]
    if f"triton:{spec}" in reg:
        return reg[f"triton:{spec}"]()
    try:
        kernel_plan(get_recipe(spec))
    except SpecError:
        raise
    except ValueError as e:
        raise ValueError(f"implementation {name!r}: {e}") from None
    return _triton_impl(spec)


# built-ins that are baselines, not kernels under study: named explicitly, never part of "all" or "available"
BASELINE_ONLY = ("sdpa-fp32",)


def builtin_names() -> list[str]:
    """Every built-in implementation's name, in a fixed order."""
    return list(_builtins())


def get_implementation(name: str) -> Implementation:
    """A built-in by name; ``triton:SPEC`` for any recipe spec the Triton kernel honours (``triton:fa3:
    accum_flush_tiles=1``: the kernel with that field changed); ValueError listing the names for an unknown one,
    the spec grammar's one line (:class:`zyfa.recipes.SpecError`) for a bad ``triton:`` spec."""
    reg = _builtins()
    if name not in reg and name.startswith("triton:"):
        return _triton_spec_impl(name, reg)
    if name not in reg:
        raise ValueError(f"unknown implementation {name!r}; built-ins: {', '.join(reg)} "
                         "(a kernel of your own: --kernel module:function)")
    return reg[name]()


def parse_implementations(spec: str | None) -> list[Implementation]:
    """``"all"`` (every built-in but the baselines of :data:`BASELINE_ONLY`), ``"available"`` (those of them whose
    device and package are here), ``"none"``/empty,
    or comma-separated names (:func:`zyfa.recipes.split_spec_list`: a ``triton:`` spec's overrides stay with it);
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


# ---------------------------------------------------------------------------------------------- plug-ins

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
    if src.name in _builtins():
        raise ImplementationError(f"kernel {spec!r}: the name {src.name!r} is a built-in implementation's; "
                                  "choose another NAME")
    info = {"plugin_source": where, "plugin_sha256": src.sha256}

    def run(x: AttentionInput, context: dict) -> ImplResult:
        kw = {"causal": bool(x.causal), "sm_scale": _sm(x), "window": x.window}
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
    if len(recipes) > 1 and len(recipes) != len(specs):
        raise ValueError(f"--kernel-recipe given {len(recipes)} times for {len(specs)} --kernel; give it once "
                         "(for every kernel) or once per kernel, in the same order")
    for r in recipes:
        try:
            get_recipe(r)
        except ValueError as e:
            raise ValueError(f"--kernel-recipe {r!r}: {e}") from None
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
            out, lse = protected_call(fn, x.q, x.k, x.v, {"causal": bool(x.causal), "sm_scale": _sm(x),
                                                          "window": x.window})
        except KernelFault as e:
            raise ImplementationError(f"kernel {name!r} {e}") from (e.__cause__ or e)
        return ImplResult(out, lse, {"plugin_source": f"{getattr(fn, '__module__', '?')}."
                                                      f"{getattr(fn, '__qualname__', '?')}"})

    run.quantization = getattr(fn, "quantization", None)
    return Implementation(name=name, fn=run, recipe=recipe, quantizes="self", device="the run's",
                          description=f"user kernel {name} (a Python callable)", plugin=True)


# ---------------------------------------------------------------------------------------------- running

def call_implementation(impl: Implementation, x: AttentionInput, context: dict | None = None, *,
                        allow_nonfinite: bool = False) -> ImplResult:
    """Run ``impl`` on ``x`` (already on the run's device) and check what came back.

    ``allow_nonfinite``: return an output (and LSE) holding NaN/Inf instead of raising, for a caller that counts
    them (``zyfa cliffs``); the other checks stay.

    Raises:
        ImplementationError: naming the implementation, for an exception inside it (chained as its
            ``__cause__``), an output that is not a floating-point tensor of shape (b, h, s_q, d_v), a NaN/Inf in
            it (unless ``allow_nonfinite``), or a bad LSE.
    """
    b, h, s_q, _ = x.q.shape
    d_v = x.v.shape[3]
    label = f"kernel {impl.origin['spec'] if impl.origin else impl.name.removeprefix('plugin:')!r}" \
        if impl.plugin else f"kernel {impl.name!r}"
    try:
        res = impl.fn(x, dict(context or {}))
    except (ImplementationError, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - the kernel's own failure (SystemExit too) becomes a failed row
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ImplementationError(f"{label} raised {type(e).__name__}: {msg}"[:500]) from e
    out = res.out
    if not isinstance(out, torch.Tensor):
        raise ImplementationError(f"{label} returned {type(out).__name__}, expected a torch.Tensor "
                                  f"of shape {(b, h, s_q, d_v)}")
    if not out.dtype.is_floating_point:
        raise ImplementationError(f"{label} returned a {out.dtype} output; expected a float dtype")
    if out.device != x.q.device:
        raise ImplementationError(f"{label} returned its output on {out.device}; the inputs are on {x.q.device}")
    if tuple(out.shape) != (b, h, s_q, d_v):
        raise ImplementationError(f"{label} returned shape {tuple(out.shape)}, expected (b, h, s_q, d_v) = "
                                  f"{(b, h, s_q, d_v)}")
    n_bad = 0 if allow_nonfinite else int((~torch.isfinite(out.float())).sum())
    if n_bad:
        n_nan = int(torch.isnan(out.float()).sum())
        raise ImplementationError(f"{label} returned {n_bad} non-finite output value(s) ({n_nan} NaN) "
                                  f"of {out.numel()}")
    lse = res.lse
    if lse is not None:
        if not isinstance(lse, torch.Tensor) or not lse.dtype.is_floating_point:
            raise ImplementationError(f"{label} returned an lse that is not a float tensor")
        if lse.dim() == 4 and lse.shape[-1] == 1:
            lse = lse.squeeze(-1)
        if tuple(lse.shape) != (b, h, s_q):
            raise ImplementationError(f"{label} returned lse of shape {tuple(lse.shape)}, expected {(b, h, s_q)}")
        if not allow_nonfinite and bool(torch.isnan(lse.float()).any()):
            raise ImplementationError(f"{label} returned NaN in its lse")
    res.out, res.lse = out, lse
    return res


def unavailable_lines(unavailable: dict[str, str]) -> list[str]:
    """The terminal's lines for the implementations this machine could not run (a provenance's
    ``implementations_unavailable``, name -> reason): one line per reason, the GPU ones as
    ``no GPU: N GPU implementations skipped (names)``."""
    by_reason: dict[str, list[str]] = {}
    for name, why in unavailable.items():
        by_reason.setdefault(why, []).append(name)
    lines = []
    for why, names in by_reason.items():
        if why == NO_CUDA:
            lines.append(f"no GPU: {len(names)} GPU implementation{'s' if len(names) != 1 else ''} skipped "
                         f"({', '.join(names)})")
        else:
            lines.append(f"not run: {', '.join(names)}: {why}")
    return lines
