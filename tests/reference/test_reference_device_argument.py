"""The FP64 oracle computes where ``device`` says, and returns out and lse there, whatever the inputs' device.

On a CPU-only machine the other device is torch's "meta" device (shapes and dtypes, no data): every step of the
oracle runs there, so a step left on the inputs' device would raise (mixed devices) or return CPU tensors.
"""

from __future__ import annotations

import pytest
import torch
from zyfa.reference import attention_fp64


@pytest.mark.parametrize("kwargs", [{}, {"causal": True}, {"window": 2, "chunk_size": 2}])
def test_outputs_live_on_the_requested_device(kwargs):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 5, 8, generator=g)
    k = torch.randn(2, 2, 5, 8, generator=g)
    v = torch.randn(2, 2, 5, 6, generator=g)
    out, lse = attention_fp64(q, k, v, device="meta", **kwargs)
    assert out.device.type == "meta" and lse.device.type == "meta"
    assert out.shape == (2, 4, 5, 6) and lse.shape == (2, 4, 5)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    # device=None computes on the inputs' device
    out_cpu, lse_cpu = attention_fp64(q, k, v, **kwargs)
    assert out_cpu.device.type == "cpu" and lse_cpu.device.type == "cpu"
