"""CPU tests that compile the CuTe FP8 kernel for sm_90a (no GPU) and check properties of its PTX that could fail.

Needs nvidia-cutlass-dsl 4.8.1 importable (skipped with the reason otherwise; docs/KERNEL.md has the environment).
Each compile takes a few seconds (hd128, 1.5-3.5 s on 2 busy cores).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from zyfa.kernels.attention_cute import compile_for

# the DSL reads its target when it is imported; a CPU machine has no GPU to ask
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl (CuTe DSL) is not importable: set PYTHONPATH to its "
                                           "install (docs/KERNEL.md, 'The CuTe DSL kernel')")

# b, h, h_kv, s_q, s_k: GQA, lengths not a multiple of the 128-row / 128-key tiles
SHAPE = {"b": 1, "h": 4, "h_kv": 2, "s_q": 300, "s_k": 333}


DIMS = {"hd128": (128, 128), "mla": (192, 128)}


@pytest.fixture(scope="module", params=[("hd128", False), ("hd128", True), ("mla", True)],
                ids=["hd128-non-causal", "hd128-causal", "mla-causal"])
def compiled(request, tmp_path_factory):
    """(head dims, the PTX) of the kernel (compiled with --keep-ptx, written into a temporary directory)."""
    out = tmp_path_factory.mktemp("cute_ptx")
    d_qk, d_v = DIMS[request.param[0]]
    compile_for(**SHAPE, d_qk=d_qk, d_v=d_v, causal=request.param[1],
                options=f"--keep-ptx --keep-cubin --dump-dir={out}")
    files = sorted(Path(out).glob("*.ptx"))
    assert len(files) == 1, files
    assert sorted(Path(out).glob("*.sm_90a.cubin")), "no sm_90a cubin written"
    return (d_qk, d_v), files[0].read_text()


@pytest.fixture(scope="module")
def ptx(compiled):
    return compiled[1]


def test_targets_sm90a(ptx):
    assert re.search(r"^\.target\s+sm_90a", ptx, re.M)


def test_fp8_wgmma_for_both_matmuls(compiled):
    (d_qk, d_v), ptx = compiled
    wgmma = [ln for ln in ptx.splitlines() if "wgmma.mma_async" in ln]
    assert wgmma and all(".e4m3.e4m3" in ln and ".f32." in ln for ln in wgmma)
    # S = Q·Kᵀ: both operands from shared memory (two descriptors); P·V: P from four registers
    qk = [ln for ln in wgmma if re.search(r"\}, %rd\d+, %rd\d+,", ln)]
    pv = [ln for ln in wgmma if re.search(r"\}, \{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+,", ln)]
    assert qk and pv and len(qk) + len(pv) == len(wgmma)
    # 64 rows per warpgroup; S: 128 keys, O: d_v columns
    assert all("m64n128k32" in ln for ln in qk) and all(f"m64n{d_v}k32" in ln for ln in pv)
    # each matmul issued in two places (the first tile, the loop); a k-step per 32 of the contraction (d_qk, 128 keys)
    assert len(qk) == 2 * d_qk // 32 and len(pv) == 2 * 128 // 32


def test_producer_consumer_register_split(ptx):
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)


def test_pingpong_named_barriers(ptx):
    assert re.search(r"bar\.sync\s+%r\d+, 256;", ptx)  # a consumer waits for its turn (barrier id in a register)
    assert re.search(r"bar\.arrive\s+%r\d+, 256;", ptx)  # and hands the turn to the other
    assert re.search(r"cp\.async\.bulk\.tensor", ptx)  # TMA loads
    assert re.search(r"mbarrier\.arrive\.expect_tx", ptx)


def test_p_off_the_mufu(ptx):
    """Technique 1: P's codes by the MAD (fma.rn.sat, the magic add), no exp2 per score. The only ex2 is alpha's,
    one per row (2 per thread) in each of the two places the softmax is emitted."""
    assert len(re.findall(r"ex2\.approx", ptx)) <= 4
    assert len(re.findall(r"fma\.rn\.sat\.f32", ptx)) == 2 * 64  # 64 scores per thread, two places
    assert "0f47C00000" in ptx  # 1.5·2^16, the magic-number add
    assert len(re.findall(r"prmt\.b32", ptx)) == 2 * 16 * 3  # 16 P registers, 3 byte permutes each


def test_output_and_lse(ptx):
    assert "div.rn.f32" in ptx and "cvt.rn.bf16.f32" in ptx and "lg2.approx.f32" in ptx
