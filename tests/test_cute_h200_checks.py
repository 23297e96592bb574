"""scripts/cute_h200_checks.sh (the CuTe kernel's GPU job) on a CPU with DRY_RUN=1: every step's command is one the
tools accept (the bench's flags through its own checks, the A/B sets, the profile script's options, the test files),
so no device call is lost to a typo."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
from pathlib import Path

from tests.load_file import load_script
from zyfa.bench.args import add_arguments, check_args

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "cute_h200_checks.sh"), str(tmp_path / "job")],
                          env={**os.environ, "DRY_RUN": "1", **env}, capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


def _steps(tmp_path, **env) -> dict[str, list[str]]:
    out = _run(tmp_path, **env)
    assert out.returncode == 0, out.stderr
    steps = {}
    for line in out.stdout.splitlines():
        name, _, cmd = line.partition(": ")
        steps[name] = shlex.split(cmd)
    return steps


def test_every_step_is_a_command_the_tools_take(tmp_path):
    steps = _steps(tmp_path)
    assert list(steps) == ["bench", "ab-hd256", "ab-rowsum", "ab-persistent", "ab-masked", "ab-masked32k", "ncu",
                           "ncu-persistent", "gpu-tests"]
    assert not (tmp_path / "job" / "timed").exists()  # a dry run marks nothing
    bench = steps["bench"]
    assert bench[:4] == ["python3", "-m", "zyfa", "bench"]
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(bench[4:])
    check_args(args)  # raises on a flag the bench refuses
    assert set(args.shapes.split(",")) == {"hd64", "hd128", "hd256", "mla"} and args.repeats >= 5
    ab = load_script("ab_kernel_variants")
    for name in ("ab-hd256", "ab-rowsum", "ab-persistent", "ab-masked", "ab-masked32k"):
        cmd = steps[name]
        assert cmd[1] == "scripts/ab_kernel_variants.py" and cmd[cmd.index("--set") + 1] in ab.SETS
    for name in ("ncu", "ncu-persistent"):
        ncu = steps[name]
        usage = (ROOT / ncu[1]).read_text()
        for flag in (a for a in ncu[2:] if a.startswith("--")):
            assert f"{flag})" in usage, flag  # an option the profile script's argument loop takes
    form = steps["ncu-persistent"][steps["ncu-persistent"].index("--cute-form") + 1]
    assert form == "PERSISTENT=1"
    tests = [a for a in steps["gpu-tests"] if a.startswith("tests/")]
    assert tests and all((ROOT / t).is_file() for t in tests)


def test_steps_run_in_the_order_asked(tmp_path):
    assert list(_steps(tmp_path, STEPS="bench gpu-tests ab-rowsum")) == ["bench", "gpu-tests", "ab-rowsum"]


def test_an_unknown_step_is_refused_before_anything_is_written(tmp_path):
    out = _run(tmp_path, STEPS="bench gpu-test")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "cute_h200_checks.sh: unknown step 'gpu-test' (steps: bench ab-hd256 ab-rowsum ab-persistent ab-masked "
        "ab-masked32k ncu ncu-persistent gpu-tests)"]
    assert not (tmp_path / "job").exists()
