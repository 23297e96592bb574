"""zyfa.formats.round_to_fp8_fast (torch's native FP8 cast after a clamp, the hot paths' rounding: P in the
emulator's tile loop, Q/K/V in zyfa.quant.quantize) against round_to_fp8 (our own arithmetic), bit for bit, on
every finite bfloat16 value and on every tie between neighbouring FP8 values with its float32 neighbours; on the CPU
and, where there is one, on CUDA, whose cast is a kernel of its own."""

from __future__ import annotations

import pytest
import torch

from zyfa.formats import decode_fp8, round_to_fp8, round_to_fp8_fast
from zyfa.quant import quantize

FORMATS = ["e4m3fn", "e4m3fnuz", "e5m2"]


def _probes(fmt: str) -> torch.Tensor:
    """Every finite bf16 value as float32, and per pair of neighbouring FP8 values their midpoint (the tie RNE breaks
    to even) and the float32 values just below and above it, both signs, plus values past the format's max."""
    bf16 = torch.arange(-(2 ** 15), 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    bf16 = bf16[torch.isfinite(bf16)]
    vals = decode_fp8(torch.arange(256, dtype=torch.int32).to(torch.uint8), fmt)
    vals = torch.unique(vals[torch.isfinite(vals) & (vals >= 0)])  # sorted
    mid = (vals[:-1].double() + vals[1:].double()) / 2  # exact in float32: FP8 values have few mantissa bits
    mid = mid.float()
    around = torch.cat([mid, torch.nextafter(mid, torch.full_like(mid, -1)), torch.nextafter(mid, mid * 2 + 1)])
    top = vals[-1]
    past = torch.tensor([top * 1.01, top * 1.0625, top * 2, 3e38])
    pos = torch.cat([around, past])
    return torch.cat([bf16, pos, -pos, torch.tensor([0.0, -0.0])])


def _check(device: str) -> None:
    for fmt in FORMATS:
        x = _probes(fmt).to(device)
        fast, ours = round_to_fp8_fast(x, fmt), round_to_fp8(x, fmt, saturate=True)
        same = fast.view(torch.int32) == ours.view(torch.int32)
        bad = ~same
        assert bool(same.all()), (f"{fmt} on {device}: {int(bad.sum())} differ, e.g. {x[bad][:3].tolist()} -> "
                                  f"{fast[bad][:3].tolist()} vs {ours[bad][:3].tolist()}")


def test_fast_cast_is_ours_bit_for_bit_on_the_cpu():
    _check("cpu")


@pytest.mark.gpu
def test_fast_cast_is_ours_bit_for_bit_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (gpu tests run on the H200)")
    _check("cuda")


@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
def test_quantize_rounds_as_our_arithmetic_does(granularity):
    """quantize's float32 path goes through the fast cast: its values are round_to_fp8 of the scaled input."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 3, 70, 64, generator=g) * torch.exp2(torch.randint(-12, 12, (2, 3, 70, 1), generator=g)))
    x = x.bfloat16()
    values, descale = quantize(x, "e4m3fn", granularity, block_size=16)
    per_token = descale.repeat_interleave(16, dim=2)[:, :, :70] if granularity == "block" else descale
    ref = round_to_fp8(x.float() / per_token, "e4m3fn", saturate=True)
    assert torch.equal(values.view(torch.int32), ref.view(torch.int32))
