"""What a real attention implementation is, what it is compared with, and how one call of it is checked.

An :class:`Implementation` is a named callable that runs one attention forward over an
:class:`~accuracy.inputs.attention_input.AttentionInput` and returns the output (and the natural-log LSE where it has
one). It carries the recipe whose numerics it claims (so it can be paired with that recipe's emulation), what it
needs (a device, a package: :meth:`Implementation.available` says whether they are here, and why not), and how
it quantizes: ``"recipe"`` (it takes the FP8 values the recipe's quantizer, :func:`zyfa.emulator.quantize_inputs`,
produces: the emulation sees bit-identical inputs), ``"self"`` (it quantizes for itself: scored against FP64
on the original inputs) or ``"none"`` (a BF16 kernel).

Pairing: a real kernel is compared with the emulation of what it computes where it runs: its recipe on the
platform of the device it ran on (CUDA capability 9.0 -> ``h200``), for ``triton:<recipe>`` and ``cute:<recipe>``
our kernels' own version of the recipe; on a device with no platform model the recipe's own platform, with a note
in the row.

Every failure of a call (an exception, a wrong output shape, NaN) raises :class:`ImplementationError`, whose
message names the kernel, so the runner can mark that row failed and go on. The built-ins are in
:mod:`zyfa.accuracy.implementations.builtins`, the plug-ins in :mod:`zyfa.accuracy.implementations.plugins`, the
lookup by name in :mod:`zyfa.accuracy.implementations.registry`.

Exposed:
    Implementation, ImplResult, ImplementationError, Pairing
    call_implementation(impl, x, context=None, *, allow_nonfinite=False) -> ImplResult   (runs, validates;
        ImplementationError on failure; with allow_nonfinite NaN/Inf outputs come back to be counted)
    unsupported_reason(impl, x) -> str | None
    unavailable_lines(unavailable) -> list[str]   the terminal's lines for the implementations not run (those
        lacking a GPU in one line)
    device_platform(device) -> (platform name | None, why none)
    pairing(impl, platform, why_none="") -> Pairing | None   the emulation a real row is compared with
    input_sm_scale(x) -> float                    the softmax scale an implementation is called with
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from zyfa.accuracy.inputs.attention_input import AttentionInput

from zyfa import checks as zyfa_checks
from zyfa.peers.common import NO_CUDA
from zyfa.quant import finite_screen
from zyfa.recipe_spec import get_recipe

__all__ = ["QUANTIZES", "ImplResult", "Implementation", "ImplementationError", "Pairing", "call_implementation",
           "device_platform", "input_sm_scale", "pairing", "unavailable_lines", "unsupported_reason"]

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
        name: registry name (``triton:zyfa``, ``cute:zyfa-hopper``, ``cudnn-fp8``, ``plugin:module:function``, ...).
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
        plugin: True for a user's kernel (:func:`zyfa.accuracy.implementations.plugins.load_plugin`).
        emulation: what its paired emulation is (:func:`pairing`): ``"recipe"`` (the recipe it claims) or
            ``"triton-kernel"`` (the recipe as our Triton kernel computes it, ``kernel_recipe``; our CuTe kernel
            computes the same version).
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

    - The recipe it claims on that platform (``zyfa`` -> ``zyfa@h200``); for ``triton:<recipe>`` and
      ``cute:<recipe>`` our kernels' own version of the recipe (:func:`zyfa.kernels.attention_fp8.kernel_recipe`).
      A spec that names its platform (``--kernel-recipe zyfa@mi355x``) keeps it.
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


# ---------------------------------------------------------------------------------------------- input limits

def input_sm_scale(x: AttentionInput) -> float:
    """The softmax scale of ``x``: its own, else 1 / sqrt(head dim)."""
    return float(x.sm_scale) if x.sm_scale is not None else 1.0 / math.sqrt(x.q.shape[-1])


def unsupported_reason(impl: Implementation, x: AttentionInput) -> str | None:
    """Why ``impl`` cannot take input ``x`` (a mask, a shape), or None."""
    return impl.limits(x) if impl.limits is not None else None


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

    def raised(e: BaseException) -> ImplementationError:
        if isinstance(e, ImplementationError):  # already named (a nested call): passed on as it is
            return e
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        wrapped_error = ImplementationError(f"{label} raised {type(e).__name__}: {msg}"[:500])
        wrapped_error.__cause__ = e
        return wrapped_error

    # The checks that ask the device (NaN/Inf screens, descales: zyfa.checks) are answered together when this call
    # ends, in one host sync, or with the caller's (a decode step's) when it defers them itself; the first failed one
    # raises what it would have raised at once, a failure inside the kernel as "kernel ... raised".
    with zyfa_checks.deferred():
        try:
            with zyfa_checks.wrapped(raised):
                res = impl.fn(x, dict(context or {}))
        except (ImplementationError, KeyboardInterrupt):
            raise
        except BaseException as e:  # noqa: BLE001 - the kernel's own failure (SystemExit too) becomes a failed row
            raise raised(e) from e
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

        def nonfinite_output() -> ImplementationError | None:
            n_bad = int((~torch.isfinite(out.float())).sum())
            if not n_bad:
                return None  # the screen's false alarm: a float32 sum that overflowed
            n_nan = int(torch.isnan(out.float()).sum())
            return ImplementationError(f"{label} returned {n_bad} non-finite output value(s) ({n_nan} NaN) "
                                       f"of {out.numel()}")

        if not allow_nonfinite:
            zyfa_checks.check(finite_screen([out]), nonfinite_output)
        lse = res.lse
        if lse is not None:
            if not isinstance(lse, torch.Tensor) or not lse.dtype.is_floating_point:
                raise ImplementationError(f"{label} returned an lse that is not a float tensor")
            if lse.dim() == 4 and lse.shape[-1] == 1:
                lse = lse.squeeze(-1)
            if tuple(lse.shape) != (b, h, s_q):
                raise ImplementationError(f"{label} returned lse of shape {tuple(lse.shape)}, expected {(b, h, s_q)}")
            if not allow_nonfinite:
                # an lse's -inf (a row that sees no key) leaves its sum non-NaN; a NaN anywhere makes it NaN
                nan_lse = torch.isnan(lse.float())
                zyfa_checks.check(~nan_lse.any(), lambda: ImplementationError(f"{label} returned NaN in its lse"))
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
