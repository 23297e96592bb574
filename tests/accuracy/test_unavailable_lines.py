"""The implementations a machine cannot run are summarised, the GPU ones in one line."""

from __future__ import annotations

import pytest
import torch
from zyfa.accuracy.implementations.base import unavailable_lines

from zyfa.cli import main
from zyfa.peers.common import NO_CUDA


def test_gpu_implementations_fold_into_one_line_and_other_reasons_keep_theirs():
    lines = unavailable_lines({"triton:zyfa": NO_CUDA, "cudnn-fp8": NO_CUDA, "flash-attn-triton-amd": "package x",
                               "flashinfer-fa3": "package x", "sdpa-bf16:flash": NO_CUDA})
    assert lines == ["no GPU: 3 GPU implementations skipped (triton:zyfa, cudnn-fp8, sdpa-bf16:flash)",
                     "not run: flash-attn-triton-amd, flashinfer-fa3: package x"]
    assert unavailable_lines({"cudnn-fp8": NO_CUDA}) == ["no GPU: 1 GPU implementation skipped (cudnn-fp8)"]
    assert unavailable_lines({}) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU implementations run on a machine with a GPU")
def test_a_cpu_run_prints_one_no_gpu_line(capsys):
    assert main(["accuracy", "--seq", "16", "--heads", "1", "--head-dim", "64", "--recipes", "bf16",
                 "--implementations", "all", "--device", "cpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("no GPU: ") for line in out.splitlines()) == 1
    assert "not run: triton:zyfa: no CUDA device" not in out
