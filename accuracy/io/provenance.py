"""Provenance of a run: which code (:func:`zyfa.capture.version.git_state`), which libraries, which device, when, and
the command line.

No hostname, user name or install path is recorded, so result files can be shared.

Exposed functions:
    provenance(extra=None) -> dict
    device_name(device="cpu") -> str
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from zyfa.capture.version import git_state

from zyfa import __version__ as zyfa_version

__all__ = ["device_name", "provenance"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: str | torch.device = "cpu") -> str:
    """The CUDA device's name for a CUDA device, else the CPU model."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(dev)
    return _cpu_model()


def provenance(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON-serializable record of the environment of this run; ``extra`` keys are added last."""
    commit, dirty = git_state()
    cuda = torch.cuda.is_available()
    rec: dict[str, Any] = {
        "zyfa_version": zyfa_version,
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu": _cpu_model(),
        "cpu_count": _cpu_count(),
        "cuda_device": torch.cuda.get_device_name() if cuda else None,
        "torch_cuda": torch.version.cuda,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "argv": [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv else [],  # program name without its path
    }
    try:
        # lazy: scipy is heavy, and recorded as None where it is missing
        import scipy

        rec["scipy"] = scipy.__version__
    except ImportError:
        rec["scipy"] = None
    if extra:
        rec.update(extra)
    return rec


def _cpu_count() -> int | None:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use, not the host's
    except (AttributeError, OSError):
        return os.cpu_count()
