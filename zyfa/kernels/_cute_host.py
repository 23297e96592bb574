"""The host side of the CuTe DSL FP8 kernel (:mod:`zyfa.kernels._cute_fp8`): compile it for fixed shapes with fake
pointers (no GPU needed) and launch a compiled kernel on torch CUDA tensors. Imported lazily by the wrapper
(:mod:`zyfa.kernels.attention_cute`), since it needs nvidia-cutlass-dsl."""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_ptr
from cutlass.cutlass_dsl import Float32

from zyfa.kernels._cute_fp8 import CuteFp8Attention


def compile_kernel(*, b: int, h: int, h_kv: int, s_q: int, s_k: int, s_k_pad: int, d_qk: int, d_v: int,
                   causal: bool, mad_bias: float, e_cap: float, mad_cvt: int, mask_split: bool, bookkeeping: bool,
                   pv_overlap: int, m_safe: float, rowsum_mma: bool, pv_block: int,
                   epilogue_rcp: bool, persistent: bool, sms: int, options: str = ""):
    """Compile :class:`CuteFp8Attention` for these shapes with fake pointers (no GPU needed); returns the compiled
    callable (arguments: the eight pointers of ``__call__`` and sm_scale·log2 e; :func:`launch` passes them).
    ``mad_cvt``, ``mask_split``, ``bookkeeping``, ``pv_overlap``, ``pv_block``, ``epilogue_rcp``, ``persistent``: the
    kernel's form (:func:`zyfa.kernels.cute_plan.cute_config`; ``sms``: the persistent grid); ``m_safe``: the recipe's
    :func:`~zyfa.kernels.kernel_plan.mad_m_safe`."""

    kern = CuteFp8Attention(b=b, h=h, h_kv=h_kv, s_q=s_q, s_k=s_k, s_k_pad=s_k_pad, d_qk=d_qk, d_v=d_v,
                            causal=causal, mad_bias=mad_bias, e_cap=e_cap, mad_cvt=mad_cvt, mask_split=mask_split,
                            bookkeeping=bookkeeping, pv_overlap=pv_overlap, m_safe=m_safe, rowsum_mma=rowsum_mma,
                            pv_block=pv_block, epilogue_rcp=epilogue_rcp, persistent=persistent, sms=sms)
    gmem = cute.AddressSpace.gmem
    fp8 = cutlass.Float8E4M3FN
    ptrs = [make_ptr(fp8, 16, gmem, assumed_align=16), make_ptr(fp8, 16, gmem, assumed_align=16),
            make_ptr(fp8, 16, gmem, assumed_align=16), make_ptr(cutlass.BFloat16, 16, gmem, assumed_align=16),
            make_ptr(Float32, 16, gmem, assumed_align=16), make_ptr(Float32, 16, gmem, assumed_align=4),
            make_ptr(Float32, 16, gmem, assumed_align=4), make_ptr(Float32, 16, gmem, assumed_align=4)]
    return cute.compile(kern, *ptrs, Float32(1.0 / math.sqrt(d_qk)), options=options)


def launch(compiled, q, k, vt, out, lse, qd, kd, vd, sm_scale_log2e: float) -> None:
    """Run a kernel from :func:`compile_kernel` on torch CUDA tensors (contiguous; vt from ``prepare_vt(v,
    permute_k32=True)``, out bf16 and lse fp32 preallocated, descales fp32 per (batch, head) / (batch, kv head)),
    on the default stream."""
    gmem = cute.AddressSpace.gmem

    def ptr(t, dtype, align=16):
        return make_ptr(dtype, t.data_ptr(), gmem, assumed_align=align)

    fp8 = cutlass.Float8E4M3FN
    compiled(ptr(q, fp8), ptr(k, fp8), ptr(vt, fp8), ptr(out, cutlass.BFloat16), ptr(lse, Float32),
             ptr(qd, Float32, 4), ptr(kd, Float32, 4), ptr(vd, Float32, 4), Float32(sm_scale_log2e))
