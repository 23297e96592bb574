"""Scaled FP8 quantization of attention inputs: per tensor, per (batch, head), or per block of tokens.

The scale convention is the one FP8 attention kernels take as arguments (FA3's ``descale_q/k/v``, CK and
AITER's per-tensor or block scales): ``descale = amax / fmt.max_normal`` (1.0 where amax == 0), the kernel
sees ``x_q = round_to_fp8(x / descale)`` (RNE, saturating) and multiplies products back by the descales.
The largest magnitude of each group lands exactly on max_normal (448 for e4m3fn), so nothing overflows.

Exposed: GRANULARITIES, quantize, dequantize, expand_block_descale.
"""

from __future__ import annotations

import math

import torch

from zyfa.formats import FP8Format, get_format, round_to_fp8, round_to_fp8_fast

__all__ = ["GRANULARITIES", "dequantize", "expand_block_descale", "finite_screen", "nonfinite_error", "quantize"]

GRANULARITIES = ("tensor", "head", "block")


def nonfinite_error(x: torch.Tensor) -> ValueError | None:
    """:func:`quantize`'s refusal of an ``x`` holding NaN/Inf (one count: a host sync on a GPU), or None."""
    bad = int((~torch.isfinite(x)).sum())
    return ValueError(f"quantize: x holds {bad} NaN/Inf value(s); FP8 scaling needs a finite amax") if bad else None


def finite_screen(xs) -> torch.Tensor:
    """A 0-d bool tensor (no host sync): True guarantees every element of every tensor in ``xs`` (one device) is
    finite in float32; False means look closer, with a count: a NaN or Inf, or only a float32 sum that overflowed.

    One float32 sum per tensor: a NaN or Inf element makes its sum NaN or Inf. Three kernels and a comparison, where
    ``torch.isfinite(x).all()`` is five kernels per tensor, in every layer of every decode step.
    """
    sums = torch.stack([x.sum(dtype=torch.float32) for x in xs])
    return (sums.abs() < math.inf).all()  # NaN compares False


def _check_4d(x: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{what}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{what}: expected a 4-D tensor (batch, heads, seq, head_dim), got shape {tuple(x.shape)}")


def _check_block_size(block_size: int) -> int:
    if isinstance(block_size, bool) or int(block_size) != block_size or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    return int(block_size)


def quantize(
    x: torch.Tensor, fmt: FP8Format | str, granularity: str = "tensor", *, block_size: int = 128,
    check_finite: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale ``x`` into the FP8 range per group and round it (RNE, saturating).

    Args:
        x: (b, h, s, d) float16/bfloat16/float32/float64, finite.
        fmt: the FP8 format (or its name, e.g. "e4m3fn").
        granularity: "tensor": one scale; "head": one per (batch, head); "block": one per (batch, head,
            block of ``block_size`` consecutive tokens); the last block may be short.
        block_size: tokens per block (granularity "block" only).
        check_finite: count NaN/Inf in ``x`` (a host sync on a GPU). False only for a caller that has found x
            finite itself (``zyfa.emulator.quantize_inputs`` checks Q, K and V with one sync).

    Returns:
        x_q: (b, h, s, d) float32, values exactly representable in ``fmt``.
        descale: float32, broadcastable to x for "tensor" (1, 1, 1, 1) and "head" (b, h, 1, 1); for "block"
            (b, h, ceil(s / block_size), 1), which ``expand_block_descale`` turns into (b, h, s, 1).
            ``x ~ x_q * descale`` (see ``dequantize``).

    Raises:
        ValueError: x not 4-D, not floating point, or holding NaN/Inf; unknown granularity or format.
    """
    _check_4d(x, "quantize")
    if not x.dtype.is_floating_point or x.element_size() == 1:
        raise ValueError(f"quantize: x must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"quantize: unknown granularity {granularity!r}; expected one of {GRANULARITIES}")
    fmt = get_format(fmt)
    error = nonfinite_error(x) if check_finite else None
    if error is not None:
        raise error
    # Compute in fp32 (exact for 16-bit inputs); float64 inputs stay float64 until the one FP8 rounding.
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    x = x.to(work)
    b, h, s, d = x.shape
    if granularity == "tensor":
        amax = x.abs().amax().reshape(1, 1, 1, 1) if x.numel() else x.new_zeros(1, 1, 1, 1)
    elif granularity == "head":
        amax = x.abs().amax(dim=(2, 3), keepdim=True) if s * d else x.new_zeros(b, h, 1, 1)
    else:
        block_size = _check_block_size(block_size)
        nblocks = math.ceil(s / block_size)
        pad = nblocks * block_size - s
        # zero padding never raises a block's amax
        padded = torch.nn.functional.pad(x.abs(), (0, 0, 0, pad))
        amax = padded.reshape(b, h, nblocks, block_size * d).amax(dim=-1, keepdim=True)
    # a tensor divisor: on CUDA a CPU-scalar divisor becomes a multiply by its reciprocal (not the IEEE quotient);
    # filled on the device, not copied from the host (a copy from pageable memory is a host sync on CUDA)
    top = torch.full((), fmt.max_normal, dtype=torch.float32, device=amax.device)
    descale = (amax.to(torch.float32) / top).to(torch.float32)
    # amax == 0 gives 1.0; so does an amax so tiny (< max_normal * 2**-150) that the division underflows.
    descale = torch.where(descale > 0, descale, 1.0)
    per_token = expand_block_descale(descale, s, block_size) if granularity == "block" else descale
    scaled = x / per_token.to(work)
    # float32: torch's cast, a third of the kernels (bit for bit the same); float64 keeps its one rounding
    x_q = round_to_fp8_fast(scaled, fmt) if work == torch.float32 else round_to_fp8(scaled, fmt, saturate=True)
    return x_q, descale


def expand_block_descale(descale: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """(b, h, nblocks, 1) block descales -> (b, h, seq_len, 1): token i gets block i // block_size's."""
    _check_4d(descale, "expand_block_descale")
    block_size = _check_block_size(block_size)
    nblocks = math.ceil(seq_len / block_size)
    if descale.shape[2] != nblocks or descale.shape[3] != 1:
        raise ValueError(
            f"expand_block_descale: descale shape {tuple(descale.shape)} does not match seq_len={seq_len}, "
            f"block_size={block_size} (expected (b, h, {nblocks}, 1))"
        )
    return descale.repeat_interleave(block_size, dim=2)[:, :, :seq_len]


def dequantize(x_q: torch.Tensor, descale: torch.Tensor, *, block_size: int = 128) -> torch.Tensor:
    """``x_q * descale`` in float32, expanding (b, h, nblocks, 1) block descales over tokens first.

    Args:
        x_q: (b, h, s, d) FP8 values (float32, or a torch float8 tensor).
        descale: as returned by ``quantize``.
        block_size: the block size ``quantize`` used (only for block descales).
    """
    _check_4d(x_q, "dequantize")
    _check_4d(descale, "dequantize")
    s = x_q.shape[2]
    if descale.shape[2] not in (1, s):
        descale = expand_block_descale(descale, s, block_size)
    return x_q.to(torch.float32) * descale.to(torch.float32)
