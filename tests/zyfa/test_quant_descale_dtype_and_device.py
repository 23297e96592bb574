"""``quantize``'s descale: float32 ``amax / max_normal`` correctly rounded, whatever torch's default dtype, and on
CUDA the IEEE quotient on the input's device (not a multiply by an fp32 reciprocal, which is what CUDA computes
when the divisor is a CPU scalar tensor).

The expected descales come from float64 by hand: for float32 a and b, fp32(float64(a) / float64(b)) is the
correctly rounded float32 quotient (53 >= 2·24 + 2 bits, so the double rounding is harmless).
"""

from __future__ import annotations

import pytest
import torch

from zyfa.formats import FORMATS
from zyfa.quant import quantize


def _heads_with_amaxes(amax: torch.Tensor) -> torch.Tensor:
    """(1, n, 2, 4) float32 whose head i has amax ``amax[i]`` (the other values smaller, some negative)."""
    x = torch.linspace(-0.9, 0.9, 8, dtype=torch.float64).reshape(1, 1, 2, 4)
    x = (x * amax.double().reshape(1, -1, 1, 1)).float()
    x[:, :, 1, 3] = -amax  # the largest magnitude, negative: amax is of |x|
    return x


def _amaxes(n: int = 512) -> torch.Tensor:
    g = torch.Generator().manual_seed(17)
    return (torch.rand(n, generator=g, dtype=torch.float64) * 1000 + 1e-3).float()


def _quotient(amax: torch.Tensor, max_normal: float) -> torch.Tensor:
    return (amax.double() / max_normal).float()


@pytest.mark.parametrize("default", [torch.float64, torch.float16, torch.bfloat16])
def test_descale_is_the_fp32_quotient_whatever_the_default_dtype(default):
    amax = _amaxes(64)
    x = _heads_with_amaxes(amax)
    old = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        got = {name: quantize(x, name, "head")[1] for name in FORMATS}
    finally:
        torch.set_default_dtype(old)
    for name, descale in got.items():
        assert descale.dtype == torch.float32 and descale.shape == (1, 64, 1, 1)
        assert torch.equal(descale.flatten(), _quotient(amax, FORMATS[name].max_normal)), name


def test_these_amaxes_tell_a_quotient_from_a_reciprocal_multiply():
    """The CUDA test below can only catch a reciprocal multiply if some amax / max_normal differs from
    amax · fp32(1 / max_normal): checked here in float64 by hand (fp32 products are exact in float64)."""
    amax = _amaxes()
    for fmt in FORMATS.values():
        one = torch.tensor(1.0, dtype=torch.float32)
        recip = (one / torch.tensor(fmt.max_normal, dtype=torch.float32)).double()
        by_recip = (amax.double() * recip).float()
        assert (by_recip != _quotient(amax, fmt.max_normal)).sum() > len(amax) // 10, fmt.name


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
def test_descale_on_cuda_is_the_ieee_quotient_on_the_input_device(granularity):
    amax = _amaxes()
    x = _heads_with_amaxes(amax)  # per token block of 2 tokens = per head here
    for name, fmt in FORMATS.items():
        x_q, descale = quantize(x.cuda(), name, granularity, block_size=2)
        assert descale.device.type == "cuda" and x_q.device.type == "cuda" and descale.dtype == torch.float32
        want = _quotient(amax.max().reshape(1), fmt.max_normal) if granularity == "tensor" else _quotient(
            amax, fmt.max_normal)
        assert torch.equal(descale.cpu().flatten(), want), (name, granularity)
        x_q_cpu, descale_cpu = quantize(x, name, granularity, block_size=2)
        assert torch.equal(descale.cpu(), descale_cpu) and torch.equal(x_q.cpu(), x_q_cpu), (name, granularity)
