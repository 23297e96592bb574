"""A plug-in that computes nothing: an output of zeros of the contract's shape, on the inputs' device.

For timing what surrounds a kernel's call (``scripts/plugin_overhead.py``: the worker process's transfer and
checks), not for measuring error: it fails the conformance probes.
"""

from __future__ import annotations

import torch


def attention(q, k, v, *, causal: bool, sm_scale: float, window: int | None):
    """Zeros of shape (b, h, s_q, d_v) in fp32."""
    return torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float32, device=q.device)
