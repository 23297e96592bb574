"""GPU tests of the Gluon FP8 attention kernel (H200): ``zyfa-hopper`` numerics in both schedules.

For pingpong in (False, True) the kernel's relative L2 error against the FP64 oracle (on the dequantized inputs)
must be within 3% of the emulator's ``zyfa-hopper`` error, as test_attention_fp8_gpu.test_agrees_with_emulator
checks for the Triton kernel. Skipped without a Hopper GPU (tests/conftest.py).
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_attention_fp8_gpu import H1, _inputs, _seed
from zyfa.norms import rel_l2

pytestmark = pytest.mark.gpu

# b, h, h_kv, s_q, s_k, d_qk, d_v, causal, window (the layout of test_attention_fp8_gpu.SHAPES)
GLUON_SHAPES = {
    "hd128-1k": (1, 4, 4, 1024, 1024, 128, 128, False, None),
    "hd128-4k": (1, 2, 2, 4096, 4096, 128, 128, False, None),
    "hd128-gqa-b2-sq<sk": (2, 4, 2, 256, 640, 128, 128, False, None),
}


def _run_gluon(shape, seed, pingpong, config=None):
    from zyfa.reference.attention import attention_fp64

    from zyfa.emulator import emulate
    from zyfa.kernels.attention_fp8 import quantize_for_kernel
    from zyfa.kernels.attention_gluon import attention_fp8_gluon

    q, k, v = _inputs(shape, seed)
    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, H1)
    out, lse = attention_fp8_gluon(q8, k8, v8, qd, kd, vd, pingpong=pingpong, config=config)
    em = emulate(q, k, v, H1, causal=False)
    ref, _ = attention_fp64(em.q_deq, em.k_deq, em.v_deq, causal=False)
    return out, lse, em, ref


@pytest.mark.parametrize("shape_name", list(GLUON_SHAPES))
@pytest.mark.parametrize("pingpong", [False, True])
def test_gluon_agrees_with_emulator(pingpong, shape_name):
    shape = GLUON_SHAPES[shape_name]
    out, lse, em, ref = _run_gluon(shape, _seed(shape_name), pingpong)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    e_k, e_e = rel_l2(out, ref), rel_l2(em.out, ref)
    print(f"gluon pingpong={pingpong} {shape_name}: kernel {e_k:.5f} emulator {e_e:.5f} ratio {e_k / e_e:.4f}")
    assert 0.97 <= e_k / e_e <= 1.03, f"kernel error {e_k:.5f} vs emulator {e_e:.5f}"
    assert (lse.double() - em.lse.double()).abs().max().item() < 0.1


@pytest.mark.parametrize("config", [{"LAG": 1, "STAGES": 2}, {"LAG": 2, "STAGES": 3}])
def test_gluon_pingpong_variants_match_default(config):
    shape = GLUON_SHAPES["hd128-1k"]
    out0, lse0, *_ = _run_gluon(shape, 5, True)
    out1, lse1, *_ = _run_gluon(shape, 5, True, config=config)
    print(f"{config}: bit-identical to the default: {torch.equal(out0, out1) and torch.equal(lse0, lse1)}")
    d = (out0.float() - out1.float()).abs()
    assert d.max().item() <= 2 * 2**-7 * out0.float().abs().max().item()
    assert (lse0 - lse1).abs().max().item() < 1e-4


def test_gluon_matches_triton_kernel():
    """Same numerics as attention_fp8(recipe='zyfa-hopper'): outputs agree to a few bf16 ulps."""
    from zyfa.kernels.attention_fp8 import attention_fp8, quantize_for_kernel
    from zyfa.kernels.attention_gluon import attention_fp8_gluon

    q, k, v = _inputs(GLUON_SHAPES["hd128-1k"], 9)
    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, H1)
    o_t, l_t = attention_fp8(q8, k8, v8, recipe=H1, q_descale=qd, k_descale=kd, v_descale=vd)
    scale = o_t.float().abs().max().item()
    for pp in (False, True):
        o_g, l_g = attention_fp8_gluon(q8, k8, v8, qd, kd, vd, pingpong=pp)
        d = (o_g.float() - o_t.float()).abs().max().item()
        print(f"pingpong={pp}: max |gluon - triton| {d:.3g} (max |o| {scale:.3g}), "
              f"max lse diff {(l_g - l_t).abs().max().item():.3g}")
        assert d <= 4 * 2**-7 * scale
        assert (l_g - l_t).abs().max().item() < 1e-3
