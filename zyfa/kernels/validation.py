"""Checks on the Triton FP8 kernel's inputs, before Triton is imported: bad input gets a clear error on any machine
(CPU CI has no Triton). The order is types and dtypes, shapes, head dims, strides, descales, and last the device
(:func:`check_device`). Descales are brought to the forms the kernel reads: per (batch, head)
(:func:`descale_to_bh`), per query row or key (:func:`per_row_descale`), one per KV tile (:func:`k_descale_per_tile`),
one per program of rows (:func:`q_descale_per_program`), V's as its recipe says (:func:`v_descale_for`).
"""

from __future__ import annotations

import math

import torch

from zyfa import checks
from zyfa.kernels.kernel_plan import KernelPlan

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "SUPPORTED_QK_DIMS",
    "SUPPORTED_V_DIMS",
    "check_device",
    "check_fp8",
    "descale_to_bh",
    "k_descale_per_tile",
    "per_row_descale",
    "q_descale_per_program",
    "v_descale_for",
    "validate_inputs",
]

SUPPORTED_QK_DIMS = (64, 128, 192, 256)
SUPPORTED_V_DIMS = (64, 128, 256)
SUPPORTED_HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (192, 128))
_FP8 = torch.float8_e4m3fn

def descale_to_bh(d, name: str, b: int, h: int, h_kv: int, device) -> torch.Tensor:
    """A descale (float, one-element tensor, (b, h) / (b, h, 1, 1), or for q (b, h_kv)) -> (b, h) fp32."""
    if isinstance(d, bool):
        raise TypeError(f"{name} must be a float or a tensor, got bool")
    if isinstance(d, (int, float)):
        if not math.isfinite(d) or d <= 0:
            raise ValueError(f"{name} must be a positive finite number, got {d}")
        return torch.full((b, h), float(d), dtype=torch.float32, device=device)
    if not isinstance(d, torch.Tensor):
        raise TypeError(f"{name} must be a float or a torch.Tensor, got {type(d).__name__}")
    if not d.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got {d.dtype}")
    if d.device != torch.device(device) and not (d.device.type == torch.device(device).type == "cuda"):
        raise ValueError(f"{name} is on {d.device}, the inputs on {device}")
    x = d.detach().to(device=device, dtype=torch.float32)
    if x.numel() == 1:
        x = x.reshape(1, 1).expand(b, h)
    else:
        shape = tuple(x.shape)
        if len(shape) == 4 and shape[2:] == (1, 1):
            x = x.reshape(shape[0], shape[1])
        if x.dim() != 2 or x.shape[0] != b or x.shape[1] not in (h, h_kv):
            raise ValueError(f"{name} must be one scalar or of shape ({b}, {h}) or ({b}, {h}, 1, 1), "
                             f"got {shape}")
        if x.shape[1] != h:  # q descale per (batch, kv head): its GQA group shares one (FA3's shape)
            x = x.repeat_interleave(h // h_kv, dim=1)
    x = x.contiguous()
    _positive_finite(x, name)
    return x


def _positive_finite(x: torch.Tensor, name: str) -> None:
    """ValueError unless every value of ``x`` is positive and finite: a host sync, unless :mod:`zyfa.checks`
    defers it (attention_fp8 answers its three descales' checks together)."""
    checks.check(torch.all((x > 0) & (x < math.inf)),  # NaN fails both comparisons
                 lambda: ValueError(f"{name} must be positive and finite"))


def per_row_descale(d, name: str, b: int, heads: int, seq: int, device):
    """A per-row (Q) or per-key (K) descale (b, heads, seq) or (b, heads, seq, 1) -> (b, heads, seq) fp32, or None
    when ``d`` has another form (handled by :func:`descale_to_bh`)."""
    if not isinstance(d, torch.Tensor) or isinstance(d, bool) or not d.dtype.is_floating_point:
        return None
    shape = tuple(d.shape)
    if not (len(shape) == 3 or (len(shape) == 4 and shape[3] == 1 and shape[2] > 1)):
        return None
    if shape[:3] != (b, heads, seq):
        raise ValueError(f"{name} per {'query row' if name == 'q_descale' else 'key'} must be of shape "
                         f"({b}, {heads}, {seq}) or ({b}, {heads}, {seq}, 1), got {shape}")
    return _checked_descale(d, name, device, (b, heads, seq))


def _checked_descale(d: torch.Tensor, name: str, device, shape: tuple[int, ...]) -> torch.Tensor:
    """``d`` as a contiguous fp32 tensor of ``shape`` on ``device``; ValueError (one line) for another device
    or a value that is not positive and finite."""
    if d.device != torch.device(device) and not (d.device.type == torch.device(device).type == "cuda"):
        raise ValueError(f"{name} is on {d.device}, the inputs on {device}")
    x = d.detach().to(device=device, dtype=torch.float32).reshape(shape).contiguous()
    _positive_finite(x, name)
    return x


def k_descale_per_tile(kd: torch.Tensor, block_n: int, name: str = "k_descale") -> torch.Tensor:
    """Per-key K (or V) descales (b, h_kv, s_k) -> one per KV tile of ``block_n`` keys (b, h_kv,
    ceil(s_k / block_n)), what the kernel reads with per-block K (V) descales. ValueError when a tile holds more
    than one value (a descale block that is not a multiple of the kernel's ``block_n``)."""
    s_k = kd.shape[2]
    tiles = kd[:, :, ::block_n].contiguous()
    if not torch.equal(tiles.repeat_interleave(block_n, dim=2)[:, :, :s_k], kd):
        raise ValueError(f"{name} varies within a KV tile of {block_n} keys: the kernel takes one descale per "
                         f"tile (per-block descales need scale_block_kv a multiple of block_n={block_n})")
    return tiles


def q_descale_per_program(qd: torch.Tensor, block_m: int) -> torch.Tensor | None:
    """Per-row Q descales (b, h, s_q) -> one per program of ``block_m`` rows (b, h, ceil(s_q / block_m)) when every
    program's rows share one value (Q blocks a multiple of the kernel's BLOCK_M), else None (the kernel then reads
    one value per row)."""
    s_q = qd.shape[2]
    progs = qd[:, :, ::block_m].contiguous()
    return progs if torch.equal(progs.repeat_interleave(block_m, dim=2)[:, :, :s_q], qd) else None


def v_descale_for(d, plan: KernelPlan, b: int, h_kv: int, s_k: int, d_v: int, block_n: int, device) -> torch.Tensor:
    """V's descale in the form the recipe's ``v_scale`` needs: (b, h_kv); per channel (b, h_kv, d_v) from
    (b, h_kv, d_v) or (b, h_kv, 1, d_v); per KV tile (b, h_kv, ceil(s_k / block_n)) from per-key (b, h_kv, s_k) or
    (b, h_kv, s_k, 1). A float or one-element tensor is one value everywhere."""
    one = d is None or isinstance(d, (int, float)) or (isinstance(d, torch.Tensor) and d.numel() == 1)
    if plan.vd_mode == 0 or one:
        vd = descale_to_bh(1.0 if d is None else d, "v_descale", b, h_kv, h_kv, device)
        if plan.vd_mode == 1:
            return vd[:, :, None].expand(b, h_kv, d_v).contiguous()
        if plan.vd_mode == 2:
            return vd[:, :, None].expand(b, h_kv, -(-s_k // block_n)).contiguous()
        return vd
    if plan.vd_mode == 2:
        vd = per_row_descale(d, "v_descale", b, h_kv, s_k, device)
        if vd is None:
            raise ValueError(f"v_descale for v_scale='block' must be one value or per key: ({b}, {h_kv}, {s_k}) or "
                             f"({b}, {h_kv}, {s_k}, 1), got {tuple(getattr(d, 'shape', ()))}")
        return k_descale_per_tile(vd, block_n, "v_descale")
    shape = tuple(getattr(d, "shape", ()))
    if not isinstance(d, torch.Tensor) or not d.dtype.is_floating_point or shape not in (
            (b, h_kv, d_v), (b, h_kv, 1, d_v)):
        raise ValueError(f"v_descale for v_scale='channel' must be one value or per channel: ({b}, {h_kv}, {d_v}) or "
                         f"({b}, {h_kv}, 1, {d_v}), got {shape if shape else type(d).__name__}")
    return _checked_descale(d, "v_descale", device, (b, h_kv, d_v))


def validate_inputs(q, k, v, causal, sm_scale, window):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(x.shape)}")
    b, h, s_q, d_qk = q.shape
    _, h_kv, s_k, _ = k.shape
    d_v = v.shape[3]
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"batch mismatch: q {b}, k {k.shape[0]}, v {v.shape[0]}")
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ValueError(f"k and v must share batch, heads and seq: k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[3] != d_qk:
        raise ValueError(f"q and k head dims differ: {d_qk} vs {k.shape[3]}")
    if h_kv < 1 or h % h_kv:
        raise ValueError(f"q heads ({h}) must be a multiple of kv heads ({h_kv})")
    if s_q < 1 or s_k < 1 or b < 1:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if d_qk not in SUPPORTED_QK_DIMS or d_v not in SUPPORTED_V_DIMS:
        raise ValueError(f"unsupported head dims (d_qk={d_qk}, d_v={d_v}): the kernel takes d_qk in "
                         f"{SUPPORTED_QK_DIMS} and d_v in {SUPPORTED_V_DIMS} (tested: {SUPPORTED_HEAD_DIMS})")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides {x.stride()}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    if sm_scale is not None and (not isinstance(sm_scale, (int, float)) or isinstance(sm_scale, bool)
                                 or not math.isfinite(sm_scale) or sm_scale <= 0):
        raise ValueError(f"sm_scale must be a positive finite number or None, got {sm_scale!r}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    return b, h, h_kv, s_q, s_k, d_qk, d_v


def check_fp8(q, k, v, descales):
    bad = [n for n, x in (("q", q), ("k", k), ("v", v)) if x.dtype != _FP8]
    if bad:
        dtypes = ", ".join(f"{n}={x.dtype}" for n, x in (("q", q), ("k", k), ("v", v)))
        hint = ("; descales were given, so quantize the inputs to float8_e4m3fn first" if any(
            d is not None for d in descales) else "")
        raise TypeError(f"attention_fp8 takes torch.float8_e4m3fn q, k, v with descales (got {dtypes}){hint}; "
                        "for float inputs use attention_fp8_quantized(q, k, v, recipe=...), which quantizes "
                        "them as the recipe says")


def check_device(q):
    if q.device.type != "cuda":
        raise ValueError(f"attention_fp8 runs on a CUDA GPU (Hopper, sm_90); the inputs are on {q.device}. "
                         "For CPU results use zyfa.emulator.emulate")
    major, minor = torch.cuda.get_device_capability(q.device)
    if major != 9:
        raise ValueError(f"attention_fp8 needs a Hopper GPU (compute capability 9.x) for FP8 wgmma; "
                         f"{torch.cuda.get_device_name(q.device)} is {major}.{minor}")
