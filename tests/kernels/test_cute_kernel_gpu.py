"""GPU tests of the CuTe DSL FP8 kernel (H200) against its emulation on the h200 platform: the first run of a kernel
that has so far only been compiled (docs/KERNEL.md, "The CuTe DSL kernel").

For each case the kernel's relative L2 error against the FP64 oracle (on the dequantized inputs) must lie within
accuracy.scoring.tolerances.KERNEL_VS_H200_EMULATION of the h200 emulation's error, as our Triton kernel's must
(tests/kernels/test_attention_fp8_gpu.py), and the two outputs must agree as closely as its Hopper-accumulator bound
(AGREE_BOUNDS there). Needs the CuTe DSL importable (skipped with the reason otherwise) and a Hopper GPU
(tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from zyfa.accuracy.scoring.tolerances import KERNEL_VS_H200_EMULATION

from tests.kernels.test_attention_fp8_gpu import AGREE_BOUNDS, H1, H1_MMA
from zyfa.norms import rel_l2

pytestmark = pytest.mark.gpu

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

# b, h, h_kv, s_q, s_k, d_qk, d_v, causal: GQA, lengths on and off the 128-row / 128-key tiles, s_q < s_k and
# s_q > s_k, MLA's two head dims, and d 256 (P·V in column blocks)
CASES = {
    "hd128-1k": (1, 4, 4, 1024, 1024, 128, 128, False),
    "hd128-1k-causal": (1, 4, 4, 1024, 1024, 128, 128, True),
    "hd128-gqa-odd": (1, 4, 2, 333, 333, 128, 128, False),
    "hd128-causal-gqa-odd": (1, 4, 1, 300, 300, 128, 128, True),
    "hd128-b2-129": (2, 2, 2, 129, 129, 128, 128, False),
    "hd128-causal-sq<sk": (1, 2, 2, 100, 333, 128, 128, True),
    "hd128-causal-sq>sk": (1, 2, 2, 333, 100, 128, 128, True),
    "hd128-tiny": (1, 2, 2, 3, 17, 128, 128, True),
    "hd64-gqa-odd": (1, 4, 2, 333, 333, 64, 64, False),
    "hd64-causal": (1, 2, 2, 500, 500, 64, 64, True),
    "mla-causal": (1, 2, 2, 257, 257, 192, 128, True),
    "mla-gqa-odd": (1, 4, 2, 333, 333, 192, 128, False),
    "hd256-causal": (1, 2, 2, 300, 300, 256, 256, True),
    "hd256-gqa-odd": (1, 4, 2, 333, 333, 256, 256, False),
}
# More work items (128 query rows of one head) than an H100 or H200 has SMs (132), the last pass part-full: the
# PERSISTENT form's CTAs take several items each (272 items: passes of 132, 132 and 8; 144: 132 and 12). Compared
# with the default form only (its bits), not with the emulation.
MULTIPASS = {
    "hd128-causal-multipass": (2, 8, 4, 2100, 2100, 128, 128, True),
    "hd64-multipass": (1, 16, 8, 1100, 1100, 64, 64, False),
}


# Every case once in a child process first, under a time limit: a kernel that hangs (a barrier or mbarrier that
# never completes) or takes its process down then fails these tests with that reason instead of stopping the whole
# GPU run (scripts/gpu_check.sh runs every gpu test in one pytest).
SMOKE_SECONDS = 300
_SMOKE = """
import sys, torch
from tests.kernels.test_cute_kernel_gpu import CASES, H1, H1_MMA, MULTIPASS, _case_inputs
from zyfa.kernels.attention_cute import attention_cute, attention_cute_quantized
from zyfa.kernels.attention_fp8 import quantize_for_kernel
for recipe in (H1, H1_MMA):
    for name in CASES:
        q, k, v, causal = _case_inputs(name)
        attention_cute_quantized(q, k, v, recipe=recipe, causal=causal)
        torch.cuda.synchronize()
        print("ran", recipe, name, flush=True)
for name in [*CASES, *MULTIPASS]:
    q, k, v, causal = _case_inputs(name)
    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, H1)
    attention_cute(q8, k8, v8, recipe=H1, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd,
                   config={"PERSISTENT": 1})
    torch.cuda.synchronize()
    print("ran persistent", name, flush=True)
"""


@pytest.fixture(scope="module")
def cute_runs():
    """The kernel ran every case in a child process within SMOKE_SECONDS; else each test of this file fails with what
    the child did (a hang, a crash, an error) and the rest of the GPU tests go on."""
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl (CuTe DSL) is not importable")
    root = Path(__file__).resolve().parents[2]
    try:
        r = subprocess.run([sys.executable, "-c", _SMOKE], cwd=root, capture_output=True, text=True,
                           timeout=SMOKE_SECONDS)
    except subprocess.TimeoutExpired as e:
        done = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"the CuTe kernel did not finish its cases in {SMOKE_SECONDS} s (a hang?); ran: "
                    f"{done.split()[1::3] if done else 'none'}")
    if r.returncode != 0:
        pytest.fail(f"the CuTe kernel's child process exited {r.returncode}: {r.stderr.strip()[-800:]}")


def _case_inputs(name):
    b, h, h_kv, s_q, s_k, d_qk, d_v, causal = CASES[name] if name in CASES else MULTIPASS[name]
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(name.encode()) % 1000)
    q = torch.randn((b, h, s_q, d_qk), generator=g, device="cuda")
    k = torch.randn((b, h_kv, s_k, d_qk), generator=g, device="cuda") * 1.5
    v = torch.randn((b, h_kv, s_k, d_v), generator=g, device="cuda")
    return q, k, v, causal


@pytest.mark.parametrize("recipe", [H1, H1_MMA], ids=["rowsum-decoded", "rowsum-mma"])
@pytest.mark.parametrize("name", list(CASES))
def test_cute_kernel_agrees_with_its_h200_emulation(name, recipe, cute_runs):
    """The kernel against its h200 emulation, with technique 3's row sum decoded from the codes (H1) and taken on
    the tensor core as P8·ones (H1_MMA, the unit's truncating accumulator modelled by the emulator)."""
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl (CuTe DSL) is not importable")
    from zyfa.reference.attention import attention_fp64

    from zyfa.emulator import emulate
    from zyfa.kernels.attention_cute import attention_cute_quantized

    q, k, v, causal = _case_inputs(name)
    out, lse = attention_cute_quantized(q, k, v, recipe=recipe, causal=causal)
    torch.cuda.synchronize()
    em = emulate(q, k, v, recipe, causal=causal, platform="h200")
    ref, ref_lse = attention_fp64(em.q_deq, em.k_deq, em.v_deq, causal=causal)
    assert torch.isfinite(out.float()).all()
    e_k, e_e = rel_l2(out, ref), rel_l2(em.out, ref)
    apart = rel_l2(out, em.out)
    print(f"cute {recipe} {name}: kernel {e_k:.5f} emulation {e_e:.5f} ratio {e_k / e_e:.4f}; outputs {apart:.2e} "
          f"apart = {apart / e_e:.3f} x error")
    assert KERNEL_VS_H200_EMULATION.contains(e_k / e_e), f"kernel error {e_k:.5f} vs h200 emulation {e_e:.5f}"
    assert apart <= AGREE_BOUNDS["matrix_unit"][0] * e_e
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(em.lse))
    assert (lse[fin].double() - em.lse[fin].double()).abs().max().item() < 0.1


@pytest.mark.parametrize("capture", ["qwen25coder-1.5b-pydoc-1024.h5", "qwen25coder-pydoc-2048.h5",
                                     "smollm2-lee-2048.h5", "gemma3-shakespeare-2048.h5"])
def test_cute_kernel_agrees_with_its_h200_emulation_on_every_capture_layer(capture, cute_runs):
    """Every layer of a shipped capture the kernel takes (hd128 with QKV-bias K outliers, hd64, Gemma 3's global
    hd256 layers; its sliding-window layers are left out: the kernel has no window), first 1024 tokens, all heads,
    the band of the Triton kernel's capture test; the failures are listed together."""
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl (CuTe DSL) is not importable")
    from pathlib import Path

    from zyfa.accuracy.inputs.attention_input import capture_inputs
    from zyfa.reference.attention import attention_fp64

    from zyfa.emulator import emulate
    from zyfa.kernels.attention_cute import attention_cute_quantized

    path = Path(__file__).resolve().parents[2] / "datasets" / capture
    misses, ran = [], 0
    for x in capture_inputs(path, max_tokens=1024):
        if x.window is not None:
            continue
        ran += 1
        q, k, v = x.q.cuda(), x.k.cuda(), x.v.cuda()
        out, _lse = attention_cute_quantized(q, k, v, recipe=H1, causal=x.causal, sm_scale=x.sm_scale)
        torch.cuda.synchronize()
        em = emulate(q, k, v, H1, causal=x.causal, sm_scale=x.sm_scale, platform="h200")
        ref, _ = attention_fp64(em.q_deq, em.k_deq, em.v_deq, causal=x.causal, sm_scale=x.sm_scale)
        e_k, e_e = rel_l2(out, ref), rel_l2(em.out, ref)
        print(f"cute {H1} {x.name}: kernel {e_k:.5f} emulation {e_e:.5f} ratio {e_k / e_e:.4f}")
        if not KERNEL_VS_H200_EMULATION.contains(e_k / e_e):
            misses.append(f"{x.name}: ratio {e_k / e_e:.4f}")
    assert ran and not misses, f"{len(misses)} of {ran} layers outside {KERNEL_VS_H200_EMULATION}: " + "; ".join(misses)


@pytest.mark.parametrize("recipe", [H1, H1_MMA], ids=["rowsum-decoded", "rowsum-mma"])
def test_cute_kernel_matches_the_triton_kernel(recipe, cute_runs):
    """The same numerics as attention_fp8(recipe=recipe): outputs a few bf16 ulps apart at most."""
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl (CuTe DSL) is not importable")
    from zyfa.kernels.attention_cute import attention_cute
    from zyfa.kernels.attention_fp8 import attention_fp8, quantize_for_kernel

    q, k, v, causal = _case_inputs("hd128-causal-gqa-odd")
    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, recipe)
    o_t, l_t = attention_fp8(q8, k8, v8, recipe=recipe, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
    o_c, l_c = attention_cute(q8, k8, v8, recipe=recipe, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
    torch.cuda.synchronize()
    scale = o_t.float().abs().max().item()
    d = (o_c.float() - o_t.float()).abs().max().item()
    print(f"{recipe}: max |cute - triton| {d:.3g} (max |o| {scale:.3g}), bit-identical {torch.equal(o_c, o_t)}")
    assert d <= 4 * 2**-7 * scale
    fin = torch.isfinite(l_t)
    assert torch.equal(fin, torch.isfinite(l_c))
    assert (l_c[fin] - l_t[fin]).abs().max().item() < 1e-3


# Every form of the kernel (zyfa.kernels.cute_plan.cute_config) gives the same output and LSE bit for bit. Scale 40 on
# q and k pushes the CTA's bound d_qk·448²·c past mad_m_safe, so the default form runs its clamped loop there; at
# scale 1 it runs the loop without the clamp. Here the default against the first form (cc8e3cc) and against the
# overlapped loop (PV_OVERLAP, whose order of the same operations differs most: 1 where the default is 0, non-causal,
# 0 where it is 1, causal up to d_v 128; and 2, the overlap in the unmasked loops only; at d 256, where it is refused,
# P·V in blocks of 32 through two accumulators instead of the default's 64 through one), and against the epilogue's
# div.rn per element (EPILOGUE 0; the default divides by one reciprocal per row with Markstein's correction), and
# against one CTA per SM taking work items pass by pass (PERSISTENT 1; the MULTIPASS cases give each CTA several);
# each switch alone is checked at hd128 by scripts/ab_kernel_variants.py --set cute-forms before it times them.
FORM_CASES = ["hd128-1k", "hd128-1k-causal", "hd128-gqa-odd", "hd128-causal-gqa-odd", "hd128-causal-sq<sk",
              "hd128-causal-sq>sk", "hd64-causal", "mla-causal", "mla-gqa-odd", "hd256-causal", "hd256-gqa-odd",
              *MULTIPASS]


@pytest.mark.parametrize("other", ["first", "pv-overlap", "pv-overlap-unmasked", "epilogue-div", "persistent"])
@pytest.mark.parametrize("scale", [1.0, 40.0])
@pytest.mark.parametrize("name", FORM_CASES)
def test_cute_forms_give_the_same_bits(name, scale, other, cute_runs):
    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl (CuTe DSL) is not importable")
    from zyfa.kernels.attention_cute import attention_cute
    from zyfa.kernels.attention_fp8 import quantize_for_kernel
    from zyfa.kernels.cute_plan import CUTE_FIRST_FORM, cute_config, cute_plan
    from zyfa.kernels.kernel_plan import FP8_MAX_SQ, LOG2E, mad_m_safe

    q, k, v, causal = _case_inputs(name)
    if other == "pv-overlap-unmasked" and v.shape[3] > 128:
        pytest.skip("PV_OVERLAP is refused above d_v 128 (its form test there is PV_BLOCK 32)")
    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q * scale, k * scale, v, H1)
    # every CTA's bound (per head descales) on the side of mad_m_safe the scale is meant for
    bound = q.shape[3] * FP8_MAX_SQ * (1 / q.shape[3] ** 0.5) * LOG2E * qd.float().reshape(-1) * kd.float().reshape(
        kd.shape[0], -1).repeat_interleave(q.shape[1] // k.shape[1], dim=1).reshape(-1)
    m_safe = mad_m_safe(cute_plan(H1))
    assert bool((bound <= m_safe).all()) if scale == 1.0 else bool((bound > m_safe).all()), bound
    kw = {"recipe": H1, "causal": causal, "q_descale": qd, "k_descale": kd, "v_descale": vd}
    form = (CUTE_FIRST_FORM if other == "first" else {"EPILOGUE": 0} if other == "epilogue-div"
            else {"PERSISTENT": 1} if other == "persistent"
            else {"PV_OVERLAP": 2} if other == "pv-overlap-unmasked"
            else {"PV_OVERLAP": 0 if causal else 1} if v.shape[3] <= 128 else {"PV_BLOCK": 32})
    o_ref, l_ref = attention_cute(q8, k8, v8, config=form, **kw)
    mask = {"causal": causal, "d_v": v.shape[3]}
    assert cute_config(cute_plan(H1), **mask) != cute_config(cute_plan(H1), form, **mask)
    o, lse = attention_cute(q8, k8, v8, **kw)  # the default form
    torch.cuda.synchronize()
    assert torch.equal(o.view(torch.int16), o_ref.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), l_ref.view(torch.int32))
