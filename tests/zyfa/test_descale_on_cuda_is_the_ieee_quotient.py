"""On CUDA, the emulator's INT8 and per-channel descales are the IEEE quotient amax / top (gpu marker: runs on the
H200, skipped elsewhere).

zyfa/emulator.py's _descale divides by a tensor on amax's own device because PyTorch on CUDA divides by a CPU
scalar as a multiply by its reciprocal, which is 1 ulp off the correctly rounded quotient for some amax: CPU and
GPU descales (and so every code of their group) would then differ. The expectation is computed in float64 on the
CPU and rounded once to float32: the correctly rounded fp32 quotient (float64 has more than 2·24 + 2 bits, so the
double rounding of a quotient is harmless).
"""

from __future__ import annotations

import pytest
import torch

from zyfa.emulator import quantize_inputs
from zyfa.recipe_spec import get_recipe

pytestmark = pytest.mark.gpu


def test_int8_block_and_v_channel_descales_on_cuda_are_the_correctly_rounded_quotients():
    """sage2: INT8 Q with one descale per 64-token block (amax / 127) and e4m3fn V with one per channel
    (amax / 448). 256 Q blocks and 512 V channels: for several of them amax · fp32(1/top) is not the quotient (checked
    here, so the comparison can tell the two apart)."""
    r = get_recipe("sage2")
    g = torch.Generator().manual_seed(8)
    q = torch.randn(1, 64, 256, 64, generator=g) * 3
    k = torch.randn(1, 1, 256, 64, generator=g)
    v = torch.randn(1, 1, 256, 512, generator=g) * 3
    qi = quantize_inputs(q.cuda(), k.cuda(), v.cuda(), r)
    block = r.scale_block_q
    q_amax = q.abs().reshape(1, 64, 256 // block, block * 64).amax(-1, keepdim=True)
    v_amax = v.abs().amax(dim=2, keepdim=True)
    for amax, top, got in ((q_amax, 127.0, qi.q_descale[:, :, ::block].cpu()), (v_amax, 448.0, qi.v_descale.cpu())):
        want = (amax.double() / top).float()
        assert (amax * torch.tensor(1.0 / top, dtype=torch.float32) != want).any()  # a reciprocal would show
        assert got.shape == want.shape and torch.equal(got, want)
