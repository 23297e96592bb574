"""scripts/launch_kernel_for_ncu.py's arguments, on a CPU: a bad --cute-form is refused in one line before torch
loads (exit 2, argparse's usage and the reason)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "launch_kernel_for_ncu.py"


@pytest.mark.parametrize("args,reason", [
    (["--cute", "--cute-form", "PV_OVERLAP=yes"], "--cute-form: 'PV_OVERLAP=yes' is not KEY=N"),
    (["--cute-form", "PV_OVERLAP=1"], "--cute-form needs --cute"),
    (["--cute", "--peer", "cudnn-fp8"], "--cute and --peer each replace our Triton kernel: give one"),
])
def test_bad_arguments_are_one_line(args, reason):
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith(reason)
