"""What the peer adapters share: availability checks (device, package, the release whose numerics were read) and the
descale layouts per-head kernels take, and :class:`Prepared`, what every peer's ``prepare(...)`` returns.

Exposed: ``NO_CUDA``, ``Prepared``, ``cuda_check``, ``package_check``, ``all_checks``, ``dist_version``,
``read_release``, ``per_head_descales``, ``expand_kv``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["NO_CUDA", "Prepared", "all_checks", "cuda_check", "dist_version", "expand_kv", "package_check",
           "per_head_descales", "read_release"]

# The reason an implementation that needs a GPU gives on a machine without one (the CLIs fold these into one line)
NO_CUDA = "no CUDA device"


@dataclass(frozen=True)
class Prepared:
    """One peer prepared once for one input (inputs quantized and laid out, graphs built): "prepare once, call many".

    ``call()`` launches the kernel once (what a benchmark times; it returns whatever the kernel returns);
    ``output()`` is the last call's output as (b, h, s_q, d_v), dequantized where the kernel writes FP8 (a later
    call overwrites it: read it before calling again); ``lse()`` the last call's natural-log LSE (b, h, s_q), where
    the peer gives one; ``details`` what a result row records (an output-scale choice, versions)."""

    call: Callable[[], Any]
    output: Callable[[], torch.Tensor]
    lse: Callable[[], torch.Tensor] | None = None
    details: dict[str, Any] = field(default_factory=dict)


def cuda_check(min_major: int = 0, exact_major: int | None = None) -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, NO_CUDA
    major, minor = torch.cuda.get_device_capability()
    name = torch.cuda.get_device_name()
    if exact_major is not None and major != exact_major:
        return False, f"needs compute capability {exact_major}.x, {name} is {major}.{minor}"
    if major < min_major:
        return False, f"needs compute capability >= {min_major}.0, {name} is {major}.{minor}"
    return True, ""


def package_check(module: str, dist: str) -> tuple[bool, str]:
    if importlib.util.find_spec(module) is None:
        return False, f"package {dist} is not installed (import {module} not found)"
    return True, ""


def all_checks(*checks: Callable[[], tuple[bool, str]]) -> Callable[[], tuple[bool, str]]:
    def check() -> tuple[bool, str]:
        for c in checks:
            ok, why = c()
            if not ok:
                return ok, why
        return True, ""

    return check


def dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_release(dist: str, versions: tuple[str, ...], what: str) -> tuple[bool, str]:
    """Whether the installed ``dist`` is one of the releases whose numerics were read (prefix match)."""
    version = dist_version(dist) or "?"
    if not version.startswith(versions):
        return False, (f"{dist} {version}: {what} numerics were read for {', '.join(versions)} only "
                       "(docs/real_kernels.md)")
    return True, ""


def per_head_descales(qi, b: int, h: int, h_kv: int):
    """The recipe quantizer's descales as kernels with per-head descales take them (AMD's Triton forward,
    FlashInfer's FA3): (b, h) for Q (a per-KV-head Q descale repeated over its GQA group), (b, h_kv) for K and V,
    contiguous fp32."""

    def bh(dsc, heads):
        dsc = dsc.float().reshape(dsc.shape[0], dsc.shape[1])
        if dsc.shape[1] != heads:
            dsc = dsc.repeat_interleave(heads // dsc.shape[1], dim=1)
        return dsc.expand(b, heads).contiguous()

    return bh(qi.q_descale, h), bh(qi.k_descale, h_kv), bh(qi.v_descale, h_kv)


def expand_kv(t: torch.Tensor, h: int) -> torch.Tensor:
    g = h // t.shape[1]
    return t if g == 1 else t.repeat_interleave(g, dim=1)
