"""scripts/launch_kernel_for_ncu.py (what scripts/profile_kernels_ncu.sh profiles) on the GPU: a peer that cannot run
here is refused in one line naming it and why, exit 2, no traceback; our kernel's launch runs (gpu marker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zyfa.peers.registry import get_peer

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "launch_kernel_for_ncu.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), "--seq", "256", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (gpu tests run on the H200)")
def test_our_kernel_launches_and_an_unavailable_peer_is_one_line():
    assert _run("--launches", "1").returncode == 0
    missing = [p for p in ("flashinfer-fa3", "cudnn-fp8") if not get_peer(p).check()[0]]
    if not missing:
        pytest.skip("every peer of the script is installed here: nothing to refuse")
    r = _run("--peer", missing[0])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and r.stderr.startswith(
        f"launch_kernel_for_ncu: {missing[0]}: ")
