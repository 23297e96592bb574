"""The fitted H200 FP8 accumulator (zyfa.platforms.truncating_mma) against mmaemu's Hopper model.

mmaemu (``pip install mmaemu``, in the dev extra) emulates cuBLAS FP8 GEMMs of an H100 PCIe; its instruction model
``mmaemu.model.dot(..., preset="hopper")`` was fitted there independently of ours (which was fitted on our H200
through Triton). Measured with ``python3 scripts/compare_mmaemu.py`` (docs/PLATFORMS.md, "Compared with published
models"): both reproduce every output of the committed H200 recording bit for bit (its e4m3fn, e5m2 and mixed
experiments, ours with each format's smallest normal exponent as ``min_exp``), and they agree bit for bit on
random e4m3fn operands, with and without an incoming accumulator. The one difference found is checked below:
an accumulator under 2^-136 entering a step whose products are all zero (never recorded on the H200).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from zyfa.platforms import stepwise_mma, truncating_mma

mmaemu = pytest.importorskip("mmaemu", reason="mmaemu is not installed (pip install mmaemu; it is in the dev extra)")
from mmaemu.model import dot  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "wgmma_h200_sample.npz"
_Z = np.load(SAMPLE)
_META = json.loads(bytes(_Z["meta"]).decode())
EXPERIMENTS = {e["name"]: e for e in _META["experiments"]}
# each experiment's operand formats (A's, B's; e4m3fn where the meta names none): torch dtype, smallest normal exponent
_FORMATS = {"e4m3fn": (torch.float8_e4m3fn, -6), "e5m2": (torch.float8_e5m2, -14)}


def _mmaemu_chain(a8: torch.Tensor, b8: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
    """mmaemu's Hopper instruction model on a8 [M, K] x b8 [N, K]^T from c (None: +0), one chain over K."""
    m, k = a8.shape
    n = b8.shape[0]
    return dot(a8[:, None, :].expand(m, n, k).contiguous(), b8[None, :, :].expand(m, n, k).contiguous(), c,
               preset="hopper")


def _ours(a8: torch.Tensor, b8: torch.Tensor, c: torch.Tensor | None,
          min_exp: tuple[int, int] = (-6, -6)) -> torch.Tensor:
    return truncating_mma(a8.float(), b8.float().T, c, 13, min_exp=min_exp)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32)


def _every_finite_byte(shape: tuple[int, int], g: torch.Generator) -> torch.Tensor:
    finite = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    return finite[torch.randint(0, len(finite), shape, generator=g)].view(torch.float8_e4m3fn)


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_mmaemu_and_ours_reproduce_every_h200_output(name):
    exp = EXPERIMENTS[name]
    (dta, min_a), (dtb, min_b) = (_FORMATS[f] for f in exp.get("formats") or ("e4m3fn", "e4m3fn"))
    a8 = torch.from_numpy(_Z[f"{name}.a"][0]).view(dta)
    b8 = torch.from_numpy(_Z[f"{name}.b"][0]).view(dtb)
    c = torch.from_numpy(_Z[f"{name}.c"][0]) if exp["c"] != "none" else None
    d = torch.from_numpy(_Z[f"{name}.d"][0])
    if exp["flush_each_step"]:  # mmaemu has no per-step flush: its step from +0, added in fp32 in k order
        mm = sum(_mmaemu_chain(a8[:, k0:k0 + 32], b8[:, k0:k0 + 32], None) for k0 in range(0, a8.shape[1], 32))
        ours = stepwise_mma(a8.float(), b8.float().T, 13, min_exp=(min_a, min_b))
    else:
        mm, ours = _mmaemu_chain(a8, b8, c), _ours(a8, b8, c, (min_a, min_b))
    assert torch.equal(_bits(mm), _bits(d)), f"{name}: mmaemu differs from the H200 on {int((mm != d).sum())}"
    assert torch.equal(_bits(ours), _bits(d)), f"{name}: ours differs from the H200 on {int((ours != d).sum())}"


@pytest.mark.parametrize("k", [32, 64, 128, 1024])
def test_mmaemu_equals_ours_on_random_operands(k):
    """Every finite e4m3fn byte (both zeros, subnormals, +-448) with an accumulator from 2^-40 to 2^40, and
    Gaussian operands with one of similar size: bit for bit (measured 100% on 64 x 64 per case)."""
    g = torch.Generator().manual_seed(k)
    m = 16 if k < 1024 else 8
    a, b = _every_finite_byte((m, k), g), _every_finite_byte((m, k), g)
    wide = torch.randn(m, m, generator=g) * torch.exp2(torch.randint(-40, 41, (m, m), generator=g).float())
    assert torch.equal(_bits(_mmaemu_chain(a, b, wide)), _bits(_ours(a, b, wide)))
    a = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn)
    similar = torch.randn(m, m, generator=g) * 16 * k**0.5
    for c in (None, similar):
        assert torch.equal(_bits(_mmaemu_chain(a, b, c)), _bits(_ours(a, b, c)))


def test_mmaemu_gemm_schedules_are_ours_chained_or_chunked():
    """mmaemu.accumulate (cuBLAS on the H100 PCIe, unsplit): fast accumulation is one chain (truncating_mma over
    all of K); slow accumulation restarts the chain every 128 elements and adds the chains in fp32, which is not
    our kernel's flush every 32 (stepwise_mma; 1.4% identical at K = 1024 on 64 x 64)."""
    g = torch.Generator().manual_seed(1)
    m, k = 16, 1024
    a = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn)
    fast = mmaemu.accumulate(a, b, use_fast_accum=True, profile="hopper", splitk=1)
    slow = mmaemu.accumulate(a, b, use_fast_accum=False, profile="hopper", splitk=1)
    assert torch.equal(_bits(fast), _bits(_ours(a, b, None)))
    chunked = sum(_ours(a[:, k0:k0 + 128], b[:, k0:k0 + 128], None) for k0 in range(0, k, 128))
    assert torch.equal(_bits(slow), _bits(chunked))
    assert float((slow == stepwise_mma(a.float(), b.float().T, 13)).double().mean()) < 0.2


# An incoming accumulator C and a step of 32 zero products: E is C's exponent. Down to 2^-136 both models return C
# truncated to 13 bits below its leading bit (C itself for these powers of two). Below, ours computes the quantum
# 2^(E-13) in fp32, where it underflows to 0, and returns NaN; mmaemu computes in float64, clamps E at -132 and the
# result's exponent at -126, so it keeps C down to 2^-139 and returns +0 below. The H200 was not recorded there.
_TINY = torch.exp2(-torch.arange(126, 150, dtype=torch.float32))


def _zero_step(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = torch.cat([c, -c])[:, None]
    a = torch.zeros(c.shape[0], 32, dtype=torch.float8_e4m3fn)
    b = torch.ones(1, 32).to(torch.float8_e4m3fn)
    return _mmaemu_chain(a, b, c), _ours(a, b, c)


def test_tiny_accumulator_over_zero_products_agrees_down_to_2_pow_minus_136():
    mm, ours = _zero_step(_TINY[_TINY >= 2.0**-136])
    assert torch.equal(_bits(mm), _bits(ours))
    c = torch.cat([_TINY, -_TINY])
    mm = _zero_step(_TINY)[0].flatten()
    assert torch.equal(mm[c.abs() >= 2.0**-139], c[c.abs() >= 2.0**-139])  # mmaemu keeps C down to 2^-139
    assert torch.equal(_bits(mm[c.abs() < 2.0**-139]), torch.zeros(20, dtype=torch.int32))  # and gives +0 below


def test_tiny_accumulator_over_zero_products_below_2_pow_minus_136():
    """Below 2^-136 the quantum 2^(E-14) is under fp32's smallest step 2^-149: ours clamps it there (every fp32
    value is a multiple of 2^-149), so C passes unchanged, never NaN; mmaemu keeps C down to 2^-139 and gives +0
    below. The H200 was not recorded there; the two agree down to 2^-139."""
    tiny = _TINY[_TINY < 2.0**-136]
    mm, ours = _zero_step(tiny)
    c = torch.cat([tiny, -tiny])[:, None]
    assert torch.equal(_bits(ours), _bits(c))  # C through unchanged, sign kept
    keep = c.abs() >= 2.0**-139
    assert torch.equal(_bits(mm[keep]), _bits(ours[keep]))
    assert not torch.equal(_bits(mm[~keep]), _bits(ours[~keep]))  # mmaemu's +0 below 2^-139
