"""The CuTe DSL FP8 kernel's epilogue (:mod:`zyfa.kernels._cute_fp8`): a consumer warpgroup's normalized output and
LSE, from its fp32 accumulator and row state, written to global memory. Imported lazily with the kernel (needs
nvidia-cutlass-dsl)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import Float32, Int32, Uint32

from zyfa.kernels._cute_ptx import div_by_rcp, div_rn, lg2, pack_bf16x2, rcp_rn

LN2 = 0.6931471805599453


@cute.jit
def store_output(acc_o: cute.Tensor, tOcO: cute.Tensor, m_i: cute.Tensor, l_i: cute.Tensor, e_i: cute.Tensor,
                 mO: cute.Tensor, mLSE: cute.Tensor, vd: Float32, bh: Int32, row0: Int32, thr: Int32,
                 s_q: cutlass.Constexpr, by_rcp: cutlass.Constexpr):
    """O = acc / l · vd in bf16 (0 where the row saw no key) into mO's rows below s_q, LSE = (m + log2 l - e)·ln 2
    (-inf there) into mLSE. ``by_rcp`` (the form's EPILOGUE 1): the quotients from one rcp.rn per row (div.rn's
    bits: :func:`~zyfa.kernels._cute_ptx.div_by_rcp`) and two adjacent columns per 32-bit store; else div.rn and a
    16-bit store per element."""
    l_safe = cute.make_rmem_tensor((2,), Float32)
    has = cute.make_rmem_tensor((2,), cutlass.Boolean)
    for r in cutlass.range_constexpr(2):
        has[r] = l_i[r] > Float32(0.0)
        l_safe[r] = Float32(1.0)
        if has[r]:
            l_safe[r] = l_i[r]
    if cutlass.const_expr(by_rcp):
        # one correctly rounded reciprocal per row, each quotient from it by Markstein's correction (div_rn's
        # bits: div_by_rcp), and two adjacent columns (registers 2g, 2g + 1) in one 32-bit store
        rl = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            rl[r] = rcp_rn(l_safe[r])
        mO2 = cute.recast_tensor(mO, Uint32)
        for g in cutlass.range_constexpr(cute.size(acc_o) // 2):
            r = g % 2
            row = row0 + tOcO[2 * g][0]
            o0 = div_by_rcp(acc_o[2 * g], l_safe[r], rl[r]) * vd
            o1 = div_by_rcp(acc_o[2 * g + 1], l_safe[r], rl[r]) * vd
            if not has[r]:
                o0 = Float32(0.0)
                o1 = Float32(0.0)
            if row < s_q:
                mO2[row, tOcO[2 * g][1] // 2, bh] = Uint32(pack_bf16x2(o0, o1))
    else:
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            r = (i // 2) % 2
            row = row0 + tOcO[i][0]
            o = div_rn(acc_o[i], l_safe[r]) * vd
            if not has[r]:
                o = Float32(0.0)
            if row < s_q:
                mO[row, tOcO[i][1], bh] = o.to(cutlass.BFloat16)
    if thr % 4 == 0:
        for r in cutlass.range_constexpr(2):
            row = row0 + tOcO[2 * r][0]
            m_fin = m_i[r]
            if m_fin == -Float32.inf:
                m_fin = Float32(0.0)
            lse = (m_fin + lg2(l_safe[r]) - e_i[r]) * Float32(LN2)
            if not has[r]:
                lse = -Float32.inf
            if row < s_q:
                mLSE[row, bh] = lse
