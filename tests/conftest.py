"""Shared test configuration: tests marked ``gpu`` skip with a reason when no CUDA GPU is present."""

from __future__ import annotations

import pytest
import torch


def _gpu_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device (gpu tests run on the H200)"
    major, _ = torch.cuda.get_device_capability()
    if major < 9:
        return f"needs compute capability 9.0 for FP8 tensor cores, found {torch.cuda.get_device_name()}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
