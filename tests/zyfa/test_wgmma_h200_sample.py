"""The fitted Hopper FP8 accumulator (zyfa.platforms.truncating_mma, stepwise_mma) against what the H200 computed.

tests/data/wgmma_h200_sample.npz is the first 64x64 block of every experiment of a recording made on our H200
with ``python3 scripts/record_wgmma_accumulation.py --out wgmma.npz`` (Triton 3.6 FP8 ``tl.dot``, one wgmma
k = 32 step per dot; the experiments and the file's layout are in that script's docstring), cut down with
``python3 scripts/fit_wgmma_accumulation.py wgmma.npz --sample-out tests/data/wgmma_h200_sample.npz``.

Checked here: the library reproduces every recorded output bit for bit; so does the rule written out below in
float64 from its description (so the description in docs/PLATFORMS.md is the rule); and each of its two parts is
needed: without either, or with the rule before this fit, signed experiments stop matching.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from zyfa.platforms import stepwise_mma, truncating_mma

pytestmark = pytest.mark.usefixtures("one_thread")

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "wgmma_h200_sample.npz"


def _load():
    z = np.load(SAMPLE)
    meta = json.loads(bytes(z["meta"]).decode())
    return meta, {e["name"]: (e, {f: z[f"{e['name']}.{f}"] for f in "abcd"}) for e in meta["experiments"]}


META, DATA = _load()
NAMES = list(DATA)
SIGNED = [n for n in NAMES if not n.startswith("pos_")]


def _values(codes: np.ndarray) -> np.ndarray:
    return torch.from_numpy(codes).view(torch.float8_e4m3fn).double().numpy()


def _rule(exp: dict, arrays: dict, operand_exponents: bool = True, normalise: bool = True) -> np.ndarray:
    """The H200's FP8 accumulation as docs/PLATFORMS.md states it, in float64 (exact here), one k = 32 step at a
    time: E = the largest of the non-zero products' exponents, each taken as ea + eb (e4m3fn exponent field - 7,
    -6 for a subnormal), and the accumulator's own exponent; every term truncated toward zero to a multiple of
    2^(E-13) and summed; the sum truncated toward zero to 13 bits below max(its own leading bit, E).

    ``operand_exponents=False``: products at their own exponent floor(log2 |p|) instead; ``normalise=False``:
    no final truncation. Both False is the rule used before this fit."""
    a8, b8 = arrays["a"], arrays["b"]
    a, b = _values(a8), _values(b8)
    fa, fb = (x.astype(np.int64) >> 3 & 15 for x in (a8, b8))
    ea, eb = np.where(fa == 0, -6, fa - 7), np.where(fb == 0, -6, fb - 7)

    def lg(x):
        return np.where(x == 0, -999, np.frexp(x)[1] - 1)

    def step(sl, c):
        p = a[:, :, None, sl] * b[:, None, :, sl]
        ep = ea[:, :, None, sl] + eb[:, None, :, sl] if operand_exponents else lg(p)
        e = np.where(p == 0, -999, ep).max(-1)
        if c is not None:
            e = np.maximum(e, lg(c))
        q = np.ldexp(1.0, e - 13)
        s = (np.trunc(p / q[..., None]).sum(-1) + (0 if c is None else np.trunc(c / q))) * q
        if normalise:
            qs = np.ldexp(1.0, np.maximum(lg(s), e) - 13)
            s = np.trunc(s / qs) * qs
        return np.where(e == -999, 0.0, s).astype(np.float32).astype(np.float64)

    k = a.shape[-1]
    if exp["flush_each_step"]:
        out = np.zeros(arrays["d"].shape, np.float32)
        for k0 in range(0, k, 32):
            out = out + step(slice(k0, k0 + 32), None).astype(np.float32)
        return out.astype(np.float64)
    c = arrays["c"].astype(np.float64) if exp["c"] != "none" else None
    for k0 in range(0, k, 32):
        c = step(slice(k0, k0 + 32), c)
    return c


def _library(exp: dict, arrays: dict) -> torch.Tensor:
    a = torch.from_numpy(arrays["a"]).view(torch.float8_e4m3fn).float()
    bt = torch.from_numpy(arrays["b"]).view(torch.float8_e4m3fn).float().transpose(-1, -2)
    if exp["flush_each_step"]:
        return stepwise_mma(a, bt, 13)
    return truncating_mma(a, bt, torch.from_numpy(arrays["c"]) if exp["c"] != "none" else None, 13)


def test_the_sample_is_the_h200_recording():
    assert META["device"] == "NVIDIA H200" and META["capability"] == [9, 0]
    assert len(NAMES) == 17 and {"signed_k32_n2", "signed_k32_n1_c", "signed_k128_flush", "pos_k1024"} <= set(NAMES)
    for exp, arrays in DATA.values():
        assert arrays["a"].shape == arrays["b"].shape == (1, 64, exp["k"])
        assert arrays["c"].shape == arrays["d"].shape == (1, 64, 64) and arrays["d"].dtype == np.float32
        assert (arrays["c"] != 0).any() == (exp["c"] != "none")


@pytest.mark.parametrize("name", NAMES)
def test_library_reproduces_every_h200_output(name):
    exp, arrays = DATA[name]
    got = _library(exp, arrays)
    d = torch.from_numpy(arrays["d"])
    assert got.dtype == torch.float32
    mismatched = int((got != d).sum())
    assert mismatched == 0, f"{name}: {mismatched} of {d.numel()} outputs differ from the H200's"
    assert torch.equal(got.view(torch.int32), d.view(torch.int32))  # bit for bit, zeros' signs included


@pytest.mark.parametrize("name", NAMES)
def test_the_rule_as_documented_reproduces_every_h200_output(name):
    exp, arrays = DATA[name]
    np.testing.assert_array_equal(_rule(exp, arrays), arrays["d"].astype(np.float64), err_msg=name)


def test_each_part_of_the_rule_is_needed():
    """The old rule, and the new one without either part, miss outputs on signed data (positive data cannot tell
    them apart: every one of them reproduces pos_k32 and pos_k1024)."""
    for ops, norm in ((False, False), (True, False), (False, True)):
        frac = {n: float(np.mean(_rule(*DATA[n], operand_exponents=ops, normalise=norm) == DATA[n][1]["d"]))
                for n in NAMES}
        assert frac["pos_k32"] == frac["pos_k1024"] == 1.0, (ops, norm)
        assert min(frac[n] for n in SIGNED) < 0.9, (ops, norm, frac)
        assert sum(frac[n] < 1.0 for n in SIGNED) >= 5, (ops, norm, frac)
