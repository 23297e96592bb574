"""GPU tests: every built-in real implementation against its recipe's emulation (H200).

Every built-in of the registry, our CuTe kernel (``cute:zyfa-hopper``) with our Triton kernel's recipes and the
peers; an input an implementation does not take (its ``limits``: e.g. the CuTe kernel's sliding windows) is skipped
with the reason.

Inputs: the shipped captures (datasets/*.h5; two layers each, first 1024 tokens, two or three query heads)
and Gaussian inputs. For each (implementation, input) the real kernel's rel-L2 error against the FP64 oracle
(on the dequantized inputs its recipe's quantizer produces; BF16-rounded inputs for SDPA) must be within 3%
of the emulation's error on the same reference. Where it is not, the test fails, unless the cause is measured:
a named alternative recipe (a single field changed) brings the ratio within 3%, or, for FP8 kernels with more
error than their emulation, Hopper's FP8 Q·K accumulation (which the emulator does not model, issue 13) alone
moves the output by at least 5% of the emulation's error (:func:`_qk_hopper_shift`, an independent model here).
Then it xfails naming that cause and the measured numbers. ``NO_CLAIM`` implementations are compared but not
held to 3%, with the reason.

Each measurement is appended to the JSON lines file named by ``ZYFA_REAL_KERNELS_LOG`` (if set), the raw
material of the committed report. Skipped without a Hopper GPU (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import pytest
import torch
from zyfa.accuracy.scoring.tolerances import KERNEL_VS_EMULATION, NO_CLAIM_BAND

from tests.load_file import load_script
from zyfa.norms import rel_l2, rel_l2_from_terms, rel_l2_terms

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
# the fp32 baseline (sdpa-fp32) against FP64: fp32 rounding is about 1e-7; a real fault is far above this
FP32_MAX_REL_L2 = 1e-5
MAX_TOKENS = 1024
CAPTURE_LAYERS = {  # file -> (layers, query heads): a full-attention and a later layer; Gemma 3: sliding + full
    "smollm2-lee-2048.h5": ([0, 14], [0, 1, 2]),
    "qwen25coder-pydoc-2048.h5": ([0, 23], [0, 1]),
    "gemma3-shakespeare-2048.h5": ([1, 5], [0]),
}
GAUSSIAN = [
    dict(seq=1024, heads_q=4, heads_kv=2, head_dim=128, causal=True),
    dict(seq=1024, heads_q=4, heads_kv=4, head_dim=64, causal=False),
    dict(seq=777, heads_q=2, heads_kv=1, head_dim=256, causal=True),
    dict(seq=1024, heads_q=4, heads_kv=4, head_dim=128, outlier_frac=0.001, outlier_scale=10.0),
]
# A cause we can name: the recipe with one field changed. If the claimed recipe misses 3% and this one meets
# it, the test xfails with the cause and both ratios.
ALTERNATIVES = {
    "cudnn-fp8": [("cudnn-fp8:accumulator=fp32", "cuDNN's P·V accumulation is fp32, the recipe assumes Hopper's")],
    "cudnn-fp8:oracle-scale": [("cudnn-fp8:accumulator=fp32",
                                "cuDNN's P·V accumulation is fp32, the recipe assumes Hopper's")],
}
# Paired for the report's comparison, but with no 3% claim against the bf16 recipe: PyTorch's flash backend (FA2)
# runs its split-KV forward on these small launches, each KV split its own softmax (P rounded against the split's
# own row max), combined through LSEs, which the bf16 recipe does not model (docs/real_kernels.md). Checked here
# instead: its ratio is that of a BF16 kernel (NO_CLAIM_BAND), and its output is the split-KV model's of
# scripts/explain_sdpa_flash.py (FA2_MODEL_MAX_REL_L2 apart, ratios within FA2_MODEL_RATIO_TOL).
NO_CLAIM = {"sdpa-bf16:flash": "FA2's split-KV forward (each split's P rounded against its own row max)"}
# Measured on the study's Gaussian inputs at fd80411: the model 3.6e-05 to 2.0e-04 from FA2's output, ratios within
# 2e-4 of FA2's; the bounds keep a margin of 2.5x and 25x.
FA2_MODEL_MAX_REL_L2 = 5e-4
FA2_MODEL_RATIO_TOL = 5e-3


def _fa2_split_kv_model(x, sm_scale: float):
    """scripts/explain_sdpa_flash.py's model of FA2's forward on x, at the split count FA2 picks for this launch
    on this GPU (its SM count): (bf16 output on the CPU, splits)."""
    esf = load_script("explain_sdpa_flash")
    sms = torch.cuda.get_device_properties(x.q.device).multi_processor_count
    return esf.fa2_forward(x.q, x.k, x.v, sm_scale=sm_scale, causal=bool(x.causal), num_sms=sms)


def _input_keys():
    """Cheap parametrization ids (nothing loaded at collection): Gaussian specs by index, captures by layer."""
    keys = [f"gaussian{i}" for i in range(len(GAUSSIAN))]
    for fname, (layers, _) in CAPTURE_LAYERS.items():
        keys += [f"{fname}:L{layer}" for layer in layers]
    return keys


@cache
def _load(key: str):
    from zyfa.accuracy.inputs.attention_input import GaussianSpec, capture_inputs, make_gaussian

    if key.startswith("gaussian"):
        x = make_gaussian(GaussianSpec(**GAUSSIAN[int(key[len("gaussian"):])]))
    else:
        fname, _, layer = key.partition(":L")
        path = ROOT / "datasets" / fname
        if not path.is_file():
            pytest.skip(f"capture {fname} not shipped in this checkout")
        x = capture_inputs(path, layers=[int(layer)], heads=CAPTURE_LAYERS[fname][1], max_tokens=MAX_TOKENS)[0]
    return x.to("cuda")


def _impl_names():
    from zyfa.accuracy.implementations.registry import builtin_names

    return builtin_names()


@cache
def _oracle(key: str):
    from zyfa.reference.attention import attention_fp64

    x = _load(key)
    return attention_fp64(x.q, x.k, x.v, causal=x.causal, window=x.window, sm_scale=x.sm_scale)


@cache
def _emulation(key: str, spec: str):
    from zyfa.reference.attention import attention_fp64

    from zyfa.emulator import emulate
    from zyfa.recipe_spec import get_recipe

    x = _load(key)
    r = spec if not isinstance(spec, str) else get_recipe(spec)  # a spec, or a Recipe (a pairing's)
    em = emulate(x.q, x.k, x.v, r, causal=x.causal, window=x.window, sm_scale=x.sm_scale)
    ref = attention_fp64(em.q_deq, em.k_deq, em.v_deq, causal=x.causal, window=x.window, sm_scale=x.sm_scale)
    return em, ref


HOPPER_BITS = 13  # the Hopper accumulator model's mantissa bits (Platform.accum_bits of h200)
QK_CAUSE_MIN = 0.05  # Q·K truncation alone moves the output by >= 5% of the emulation's error: a named cause


@cache
def _qk_hopper_shift(key: str, spec: str) -> float:
    """rel-L2 by which Hopper's FP8 Q·K accumulation alone moves the FP64 output on this input.

    An independent model, here in the test: each 32-wide step of Q8·K8ᵀ (exact FP8 products) is aligned to
    its largest product and truncated to HOPPER_BITS bits below it, as the emulator models P·V (the emulator
    takes Q·K as exact fp32: issue 13). Both score matrices then go through an FP64 softmax and P·V on the
    dequantized V. Per query head, so the product tensor stays small.
    """
    from zyfa.emulator import quantize_inputs
    from zyfa.recipe_spec import get_recipe

    x = _load(key)
    qi = quantize_inputs(x.q, x.k, x.v, get_recipe(spec))
    b, h, s_q, d = x.q.shape
    g = h // x.k.shape[1]
    sm = x.sm_scale if x.sm_scale is not None else d ** -0.5

    def per_head(t, dsc, heads):
        t = t.double()
        dsc = dsc.double().reshape(dsc.shape[0], dsc.shape[1], -1, 1)  # (b, heads, 1 or one per token, 1)
        return t, dsc.repeat_interleave(heads // dsc.shape[1], dim=1) if dsc.shape[1] != heads else dsc

    qv, qd = per_head(qi.q_values, qi.q_descale, h)
    kv, kd = per_head(qi.k_values, qi.k_descale, x.k.shape[1])
    vd = (qi.v_values.double() * qi.v_descale.double()).repeat_interleave(g, dim=1)
    i = torch.arange(s_q, device=x.q.device)[:, None] + (x.k.shape[2] - s_q)
    j = torch.arange(x.k.shape[2], device=x.q.device)[None, :]
    keep = (j <= i) if x.causal or x.window is not None else torch.ones_like(j <= i)
    if x.window is not None:
        keep = keep & (j > i - x.window)
    num = den = 0.0
    for bi in range(b):
        for hi in range(h):
            q1, k1 = qv[bi, hi], kv[bi, hi // g]
            exact = q1 @ k1.T
            trunc = torch.zeros_like(exact)
            for c0 in range(0, d, 32):
                prod = q1[:, None, c0:c0 + 32] * k1[None, :, c0:c0 + 32]
                amax = prod.abs().amax(-1, keepdim=True)
                ulp = torch.exp2(torch.floor(torch.log2(amax.clamp(min=1e-300))) - HOPPER_BITS)
                trunc += torch.where(amax > 0, torch.trunc(prod / ulp) * ulp, 0.0).sum(-1)
            scale = qd[bi, hi] * kd[bi, hi // g].transpose(-1, -2) * sm  # (1 or s_q, 1 or s_k): block descales
            o = [torch.softmax((m * scale).masked_fill(~keep, float("-inf")), -1) @ vd[bi, hi]
                 for m in (exact, trunc)]
            err_sq, ref_sq = rel_l2_terms(o[1], o[0]).tolist()
            num, den = num + err_sq, den + ref_sq
    return rel_l2_from_terms(num, den)


def _log(record: dict) -> None:
    path = os.environ.get("ZYFA_REAL_KERNELS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


@pytest.mark.parametrize("key", _input_keys())
@pytest.mark.parametrize("impl_name", _impl_names())
def test_real_within_3pct_of_emulation(impl_name, key):
    from zyfa.accuracy.implementations.base import ImplementationError, call_implementation
    from zyfa.accuracy.implementations.registry import get_implementation

    impl = get_implementation(impl_name)
    ok, why = impl.available()
    assert ok, f"{impl_name} is not available on this GPU machine: {why}"
    x = _load(key)
    input_name = x.name
    reason = impl.limits(x) if impl.limits else None
    base = {"implementation": impl_name, "recipe": impl.recipe, "input": input_name,
            "device_name": torch.cuda.get_device_name()}
    if reason:
        _log({**base, "status": "unsupported", "reason": reason})
        pytest.skip(f"{impl_name} on {input_name}: {reason}")
    ref_orig = _oracle(key)
    try:
        res = call_implementation(impl, x, {"oracle_out_amax": float(ref_orig[0].abs().max())})
    except ImplementationError as e:
        _log({**base, "status": "failed", "error": str(e)})
        raise
    # compared with the emulation of what it computes on this device (accuracy.implementations.base.pairing: the
    # recipe on the h200 platform, our kernel's own version of it, cuDNN's oracle output scale), as the study does
    from zyfa.accuracy.implementations.base import device_platform, pairing

    from zyfa.formats import round_to_fp8

    pair = pairing(impl, *device_platform(x.q.device))
    base["paired_spec"] = pair.spec
    if pair.scale_o == "oracle":  # emulated with an fp32 output, then rounded to e4m3fn at the oracle's scale
        em, ref = _emulation(key, pair.recipe.replace(name=f"{pair.recipe.name}:out_format=fp32", out_format="fp32"))
        scale = torch.tensor(448.0 / float(ref_orig[0].abs().max()), dtype=torch.float32, device=em.out.device)
        em_out = round_to_fp8(em.out.float() * scale, "e4m3fn") / scale
    else:
        em, ref = _emulation(key, pair.recipe)
        em_out = em.out
    e_real, e_emu = rel_l2(res.out, ref[0]), rel_l2(em_out, ref[0])
    ratio = e_real / e_emu
    rec = {**base, "status": "ok", "real_deq_rel_l2": e_real, "emu_deq_rel_l2": e_emu, "ratio": ratio,
           "real_orig_rel_l2": rel_l2(res.out, ref_orig[0]), "emu_orig_rel_l2": rel_l2(em.out, ref_orig[0]),
           "real_vs_emu_rel_l2": rel_l2(res.out, em_out.double()),
           **{k: v for k, v in res.info.items() if isinstance(v, (str, int, float, type(None)))}}
    if res.lse is not None:
        finite = torch.isfinite(ref[1])
        rec["real_lse_max_abs_err"] = float((res.lse.double() - ref[1])[finite].abs().max())
    print(f"{impl_name} {input_name}: real {e_real:.5f} emulation ({pair.spec}) {e_emu:.5f} ratio {ratio:.4f}")
    if impl.recipe == "fp32":  # an fp32 baseline: both errors are fp32 rounding, their ratio is noise
        _log(rec)
        assert e_real < FP32_MAX_REL_L2 and e_emu < FP32_MAX_REL_L2, (
            f"{impl_name} on {input_name}: real {e_real:.2e}, emulation {e_emu:.2e}, above fp32 rounding")
        return
    if impl_name in NO_CLAIM:
        rec["no_claim"] = NO_CLAIM[impl_name]
        sm = x.sm_scale if x.sm_scale is not None else x.q.shape[-1] ** -0.5
        model, splits = _fa2_split_kv_model(x, sm)
        rec.update(fa2_splits=splits, fa2_model_vs_real_rel_l2=rel_l2(res.out.cpu(), model),
                   fa2_model_ratio=rel_l2(model, ref[0].cpu()) / e_emu)
        _log(rec)
        assert NO_CLAIM_BAND.contains(ratio), f"{impl_name} on {input_name}: ratio {ratio:.4f}"
        assert rec["fa2_model_vs_real_rel_l2"] <= FA2_MODEL_MAX_REL_L2, (
            f"{impl_name} on {input_name}: the split-KV model ({splits} splits) is "
            f"{rec['fa2_model_vs_real_rel_l2']:.2e} from FA2's output")
        assert abs(rec["fa2_model_ratio"] - ratio) <= FA2_MODEL_RATIO_TOL, (
            f"{impl_name} on {input_name}: model ratio {rec['fa2_model_ratio']:.4f}, FA2 {ratio:.4f}")
        return
    if KERNEL_VS_EMULATION.contains(ratio):
        _log(rec)
        return
    for spec, cause in ALTERNATIVES.get(impl_name, []):
        em2, ref2 = _emulation(key, spec)
        r2 = rel_l2(res.out, ref2[0]) / rel_l2(em2.out, ref2[0])
        rec.setdefault("alternatives", []).append({"recipe": spec, "ratio": r2, "cause": cause})
        if KERNEL_VS_EMULATION.contains(r2):
            rec["xfail_cause"] = cause
            _log(rec)
            pytest.xfail(f"{impl_name} on {input_name}: ratio {ratio:.4f} to {impl.recipe}; {cause}: "
                         f"ratio {r2:.4f} to {spec}")
    if impl.quantizes == "recipe" and ratio > 1:
        shift = _qk_hopper_shift(key, impl.recipe)
        rec["qk_hopper_shift"], rec["qk_shift_over_emu"] = shift, shift / e_emu
        if shift / e_emu >= QK_CAUSE_MIN:
            cause = (f"the H200's FP8 Q·K wgmma accumulation (the test's own align-and-truncate model): it "
                     f"alone moves the output by {shift:.2e}, {shift / e_emu:.2f} of the emulation's error")
            rec["xfail_cause"] = cause
            _log(rec)
            pytest.xfail(f"{impl_name} on {input_name}: ratio {ratio:.4f}; {cause}")
    _log(rec)
    pytest.fail(f"{impl_name} on {input_name}: real error {e_real:.5f} vs emulation {e_emu:.5f} "
                f"(ratio {ratio:.4f}, outside {KERNEL_VS_EMULATION})")
