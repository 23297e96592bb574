"""FP8 attention forward on the H200 through our CuTe DSL kernel (:mod:`zyfa.kernels._cute_fp8`): the wrapper.

STATUS: ran on a GPU: tests/kernels/test_cute_kernel_gpu.py: 165 passed, 4 skipped on one H100 (7 December, commit
0a93678; the H100 is sm_90 as the H200; reports/tests/gpu_tests.txt), its output within the h200 emulation's bounds
on every case and on every layer it takes of the four shipped captures, head dim 256 included, and every form (the
default epilogue's one reciprocal per row, P·V's column blocks at d 256, the persistent form, PV_OVERLAP 0, 1 and 2)
the same bits as the others.
It is registered as ``cute:<spec>`` beside ``triton:<spec>``
(:mod:`zyfa.accuracy.implementations.builtins`; the specs :func:`cute_plan` takes, paired with the h200 emulation),
and the bench runs it when asked (``zyfa bench --cute-recipes``; docs/KERNEL.md, "The CuTe DSL kernel"). It is
compiled for each shape (``compile_for``, no GPU needed), so the commands that decode greedily refuse it
(:data:`~zyfa.kernels.cute_plan.NOT_FOR_DECODING`).

:func:`attention_cute` takes FP8 Q/K/V with descales as :func:`zyfa.kernels.attention_fp8.attention_fp8` does and
returns (out bf16, lse fp32 natural log); :func:`attention_cute_quantized` quantizes float inputs first with
:func:`~zyfa.kernels.attention_fp8.quantize_for_kernel` (the emulator's quantizer). Scope: the ``zyfa-hopper``
numerics (fused MAD codes, per-row power-of-two P exponent, rounded row sum decoded from the codes or, with
``rowsum=rounded_mma``, taken on the tensor core as P8·ones, accumulator flushed every KV tile,
division, bf16 RNE; per-tensor or per-head descales), head dims 64, 128, 256 and MLA's 192/128 (:data:`CUTE_HEAD_DIMS`),
causal (bottom-right) or not, GQA, any lengths. Everything else is refused in one line naming the field, and every
check runs before cutlass is imported, so a CPU machine gets the same errors. Compiled kernels are cached per
(shapes, recipe, causal, form; the SM count where the form is persistent).
"""

from __future__ import annotations

import math

import torch

from zyfa.kernels.attention_fp8 import prepare_vt, quantize_for_kernel
from zyfa.kernels.cute_plan import (
    CUTE_HEAD_DIMS,
    CUTE_RECIPE,
    H200_SMS,
    check_form,
    check_head_dims,
    cute_config,
    cute_plan,
)
from zyfa.kernels.kernel_plan import LOG2E, KernelPlan, mad_m_safe
from zyfa.kernels.validation import check_device, check_fp8, descale_to_bh, validate_inputs
from zyfa.recipes import Recipe

__all__ = ["CUTE_HEAD_DIMS", "CUTE_RECIPE", "attention_cute", "attention_cute_quantized", "compile_for",
           "cute_plan", "cute_plugin", "prepare_cute_call"]

KEY_PAD = 32  # Vᵀ's keys are padded to a multiple of 32 (prepare_vt with permute_k32=True)
_COMPILED: dict = {}


def _key(b, h, h_kv, s_q, s_k, d_qk, d_v, causal, plan: KernelPlan, cfg: dict, sms: int):
    return (b, h, h_kv, s_q, s_k, d_qk, d_v, bool(causal), plan.mad_bias, plan.e_cap, plan.rowsum_rounded,
            tuple(sorted(cfg.items())), sms if cfg["PERSISTENT"] else None)


def compile_for(*, b: int, h: int, h_kv: int, s_q: int, s_k: int, d_qk: int, d_v: int, causal: bool,
                recipe: Recipe | str = CUTE_RECIPE, config: dict | None = None, options: str = "",
                sms: int = H200_SMS):
    """Compile (or fetch from the cache) the kernel for these shapes and recipe; needs no GPU. ``config`` overrides
    the kernel's form (:func:`~zyfa.kernels.cute_plan.cute_config`: ``MAD_CVT``, ``MASK_SPLIT``, ``BOOKKEEPING``,
    ``PV_OVERLAP``, ``PV_BLOCK``, ``EPILOGUE``, ``PERSISTENT``; every form gives the same bits;
    :data:`~zyfa.kernels.cute_plan.CUTE_FIRST_FORM` is the one that first ran). ``sms``: the device's SM count,
    the grid of the ``PERSISTENT`` form (:func:`prepare_cute_call` passes the device's).
    ``options`` go to ``cute.compile`` (e.g. ``"--keep-ptx --keep-cubin --dump-dir=DIR"`` writes both into DIR; a
    call with options is not cached). ValueError for a recipe, form, head dims or shapes the kernel does not take;
    ImportError (one line) when the CuTe DSL is not importable."""
    plan = cute_plan(recipe)
    cfg = cute_config(plan, config, causal=causal, d_v=d_v)
    check_head_dims(d_qk, d_v)
    check_form(cfg, d_v)
    for name, x in (("b", b), ("h", h), ("h_kv", h_kv), ("s_q", s_q), ("s_k", s_k)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a positive int, got {x!r}")
    if h % h_kv:
        raise ValueError(f"q heads ({h}) must be a multiple of kv heads ({h_kv})")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if isinstance(sms, bool) or not isinstance(sms, int) or sms < 1:
        raise ValueError(f"sms must be a positive int, got {sms!r}")
    key = _key(b, h, h_kv, s_q, s_k, d_qk, d_v, causal, plan, cfg, sms)
    if key in _COMPILED and not options:
        return _COMPILED[key]
    try:
        from zyfa.kernels import _cute_host
    except ImportError as e:  # the DSL is an optional dependency (docs/KERNEL.md: scripts/stage_cute_wheels.py)
        raise ImportError(f"the CuTe FP8 kernel needs nvidia-cutlass-dsl==4.8.1 ({e})") from None
    compiled = _cute_host.compile_kernel(b=b, h=h, h_kv=h_kv, s_q=s_q, s_k=s_k, s_k_pad=-(-s_k // KEY_PAD) * KEY_PAD,
                                         d_qk=d_qk, d_v=d_v, causal=causal, mad_bias=plan.mad_bias, e_cap=plan.e_cap,
                                         mad_cvt=cfg["MAD_CVT"], mask_split=bool(cfg["MASK_SPLIT"]),
                                         bookkeeping=bool(cfg["BOOKKEEPING"]),
                                         pv_overlap=cfg["PV_OVERLAP"], m_safe=mad_m_safe(plan),
                                         rowsum_mma=plan.rowsum_rounded == 2, pv_block=cfg["PV_BLOCK"],
                                         epilogue_rcp=bool(cfg["EPILOGUE"]), persistent=bool(cfg["PERSISTENT"]),
                                         sms=sms, options=options)
    if not options:
        _COMPILED[key] = compiled
    return compiled


def prepare_cute_call(q, k, v, *, recipe: Recipe | str = CUTE_RECIPE, causal: bool = False,
                      sm_scale: float | None = None, q_descale=None, k_descale=None, v_descale=None,
                      config: dict | None = None):
    """Everything :func:`attention_cute` does before the launch, once: the checks, the compile (cached), Vᵀ, the
    descales and the output buffers. Returns (launch, prepare_vt_again, out, lse): ``launch()`` runs the kernel
    into ``out`` and ``lse`` (what a bench times), ``prepare_vt_again()`` redoes V's transpose (its cost, timed
    apart, as for the Triton kernel). Arguments as :func:`attention_cute`."""
    b, h, h_kv, s_q, s_k, d_qk, d_v = validate_inputs(q, k, v, causal, sm_scale, None)
    check_fp8(q, k, v, (q_descale, k_descale, v_descale))
    check_head_dims(d_qk, d_v)
    check_form(cute_config(cute_plan(recipe), config, causal=causal, d_v=d_v), d_v)
    dev = q.device
    qd = descale_to_bh(1.0 if q_descale is None else q_descale, "q_descale", b, h, h_kv, dev)
    kd = descale_to_bh(1.0 if k_descale is None else k_descale, "k_descale", b, h_kv, h_kv, dev)
    vd = descale_to_bh(1.0 if v_descale is None else v_descale, "v_descale", b, h_kv, h_kv, dev)
    check_device(q)
    sm = 1.0 / math.sqrt(d_qk) if sm_scale is None else float(sm_scale)
    compiled = compile_for(b=b, h=h, h_kv=h_kv, s_q=s_q, s_k=s_k, d_qk=d_qk, d_v=d_v, causal=causal, recipe=recipe,
                           config=config, sms=torch.cuda.get_device_properties(q.device).multi_processor_count)

    from zyfa.kernels import _cute_host

    q = q.contiguous()
    k = k.contiguous()
    vt = prepare_vt(v, permute_k32=True)  # (b, h_kv, d_v, ceil(s_k / 32)·32), keys in k32_key_order per 32
    out = torch.empty((b, h, s_q, d_v), dtype=torch.bfloat16, device=dev)
    lse = torch.empty((b, h, s_q), dtype=torch.float32, device=dev)

    def launch():
        _cute_host.launch(compiled, q, k, vt, out, lse, qd, kd, vd, sm * LOG2E)
        return out, lse

    return launch, (lambda: prepare_vt(v, permute_k32=True)), out, lse


def attention_cute(q, k, v, *, recipe: Recipe | str = CUTE_RECIPE, causal: bool = False,
                   sm_scale: float | None = None, q_descale=None, k_descale=None, v_descale=None,
                   config: dict | None = None):
    """FP8 attention forward on the H200 by the CuTe DSL kernel (its status: module docstring).

    Args:
        q: (b, h, s_q, d_qk) torch.float8_e4m3fn; k: (b, h_kv, s_k, d_qk); v: (b, h_kv, s_k, d_v), h % h_kv == 0;
            (d_qk, d_v) one of :data:`CUTE_HEAD_DIMS`. Last dim contiguous (other strides are copied to contiguous).
        recipe: ``zyfa-hopper`` or a spec whose numerics are the same (:func:`cute_plan` names what else it refuses).
        causal: bottom-right aligned when s_q != s_k. sm_scale: default 1/sqrt(d_qk).
        q_descale, k_descale, v_descale: float, one-element tensor or per (batch, head) ((b, h) for q, also (b, h_kv);
            (b, h_kv) for k and v), as attention_fp8 takes them; default 1.0.
        config: the kernel's form (:func:`compile_for`); every form gives the same bits.
    Returns:
        (out, lse): out (b, h, s_q, d_v) bf16, lse (b, h, s_q) fp32 natural log; a row that sees no key gets out 0
        and lse -inf.
    """
    launch, _vt, _out, _lse = prepare_cute_call(q, k, v, recipe=recipe, causal=causal, sm_scale=sm_scale,
                                                q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                                                config=config)
    return launch()


def attention_cute_quantized(q, k, v, *, recipe: Recipe | str = CUTE_RECIPE, causal: bool = False,
                             sm_scale: float | None = None):
    """Quantize float q, k, v as ``recipe`` says (:func:`~zyfa.kernels.attention_fp8.quantize_for_kernel`, the
    emulator's quantizer) and run :func:`attention_cute`."""
    validate_inputs(q, k, v, causal, sm_scale, None)
    check_head_dims(q.shape[3], v.shape[3])
    cute_plan(recipe)
    check_device(q)
    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, recipe)
    return attention_cute(q8, k8, v8, recipe=recipe, causal=causal, sm_scale=sm_scale, q_descale=qd,
                          k_descale=kd, v_descale=vd)


def cute_plugin(q, k, v, *, causal: bool, sm_scale: float, window: int | None = None):
    """The kernel under the plug-in contract (docs/CONTRACTS.md, ``zyfa bench --kernel``): float inputs quantized as
    ``zyfa-hopper`` says, then :func:`attention_cute`; the time includes the quantization. No sliding window."""
    if window is not None:
        raise ValueError(f"the CuTe FP8 kernel has no sliding window (window={window!r})")
    return attention_cute_quantized(q, k, v, recipe=CUTE_RECIPE, causal=causal, sm_scale=sm_scale)
