"""The softmax of one KV tile in the CuTe DSL FP8 kernel (zyfa/kernels/_cute_fp8.py, steps 2-5 of its docstring):
the mask, the row max and alpha, the power-of-two P exponent (technique 3), P's MAD codes (technique 1) packed as
the P·V operand, and the row sum of the rounded P. A mixin of :class:`zyfa.kernels._cute_fp8.CuteFp8Attention`,
whose fields it reads (the recipe's bias and exponent cap, the mask's shape, the forms). Needs nvidia-cutlass-dsl."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import Float32, Int32, Uint32

from zyfa.kernels._cute_ptx import code_value, ex2, floor_f32, mad_code, mad_code_unclamped, pack4, pow2i
from zyfa.kernels.kernel_plan import LOG2_448

TWO_POW_120 = 1.329227995784916e36


class CuteSoftmax:
    """softmax_tile and mask_tile, for a class with ``causal``, ``s_q``, ``s_k``, ``block_n``, ``mad_bias``,
    ``e_cap``, ``bookkeeping`` and ``rowsum_mma``."""

    @cute.jit
    def softmax_tile(self, acc_s: cute.Tensor, tScS: cute.Tensor, p_u32: cute.Tensor, m_i: cute.Tensor,
                     l_i: cute.Tensor, e_i: cute.Tensor, alpha: cute.Tensor, c: Float32, c8n: Float32, row0: Int32,
                     j: Int32, masked, clamp=True):
        """One KV tile's softmax in the Triton kernel's order (module docstring, steps 2-5): updates m, l, e, sets
        alpha (applied to acc by flush_pv when this tile's P·V is added) and writes P's codes into p_u32.
        ``masked``: a runtime flag, or True / False known at compile time (False: no mask code at all);
        ``clamp``: the fp32 min at code 126 in each code (compile-time; left out only where it cannot bind)."""
        n = cute.size(acc_s)
        if cutlass.const_expr(isinstance(masked, bool)):
            if cutlass.const_expr(masked):
                self.mask_tile(acc_s, tScS, row0, j)
        else:
            if masked:
                self.mask_tile(acc_s, tScS, row0, j)
        row_bias_n = cute.make_rmem_tensor((2,), Float32)
        for r in cutlass.range_constexpr(2):
            mx = acc_s[2 * r]
            for i in cutlass.range_constexpr(n):
                if cutlass.const_expr((i // 2) % 2 == r and i != 2 * r):
                    mx = cute.arch.fmax(mx, acc_s[i])
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=1))
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=2))
            m_tile = mx * c
            m_new = cute.arch.fmax(m_i[r], m_tile)
            m_use = m_new
            if m_new == -Float32.inf:
                m_use = Float32(0.0)
            a = ex2(m_i[r] - m_use)
            t_max = m_tile - m_use
            e_row = cute.arch.fmin(floor_f32(Float32(LOG2_448) - t_max), Float32(self.e_cap))
            e_new = e_row
            if t_max == -Float32.inf:
                e_new = e_i[r]
            alpha[r] = a * pow2i(e_new - e_i[r])
            row_bias_n[r] = (Float32(self.mad_bias) + Float32(8.0) * (e_new - m_use)) * Float32(0.0078125)
            m_i[r] = m_new
            e_i[r] = e_new
        # codes, packed as the P operand: k-block s, register q = row half + 2·(16-key half) holds the codes of
        # S registers base, base+1, base+4, base+5 with base = 16s + 8·(q // 2) + 2·(q % 2) (Vᵀ in k32 key order)
        code = mad_code if cutlass.const_expr(clamp) else mad_code_unclamped
        # with ``bookkeeping`` sums[r] starts at the row's first group of four, not at 0 + it: the same value, as
        # 0 + x = x for every x >= +0 (a sum of code values)
        sums = cute.make_rmem_tensor((2,), Float32)
        if cutlass.const_expr(not self.bookkeeping):
            sums[0] = Float32(0.0)
            sums[1] = Float32(0.0)
        for s in cutlass.range_constexpr(n // 16):
            for q in cutlass.range_constexpr(4):
                r = q % 2
                base = 16 * s + 8 * (q // 2) + 2 * r
                b0 = code(acc_s[base], c8n, row_bias_n[r])
                b1 = code(acc_s[base + 1], c8n, row_bias_n[r])
                b2 = code(acc_s[base + 4], c8n, row_bias_n[r])
                b3 = code(acc_s[base + 5], c8n, row_bias_n[r])
                if cutlass.const_expr(not self.rowsum_mma):  # else P·ones on the unit (gemm_pv, flush_pv)
                    group = (code_value(b0) + code_value(b1)) + (code_value(b2) + code_value(b3))
                    if cutlass.const_expr(s == 0 and q < 2 and self.bookkeeping):
                        sums[r] = group
                    else:
                        sums[r] = sums[r] + group
                p_u32[4 * s + q] = Uint32(pack4(b0, b1, b2, b3))
        if cutlass.const_expr(not self.rowsum_mma):
            for r in cutlass.range_constexpr(2):
                t = sums[r]
                t = t + cute.arch.shuffle_sync_bfly(t, offset=1)
                t = t + cute.arch.shuffle_sync_bfly(t, offset=2)
                l_i[r] = l_i[r] * alpha[r] + t * Float32(TWO_POW_120)

    @cute.jit
    def mask_tile(self, acc_s: cute.Tensor, tScS: cute.Tensor, row0: Int32, j: Int32):
        """-inf where key j·128 + column is past the keys or, causal, past the row's bottom-right diagonal."""
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            key = j * self.block_n + tScS[i][1]
            ok = key < self.s_k
            if cutlass.const_expr(self.causal):
                ok = ok & (key <= row0 + tScS[i][0] + (self.s_k - self.s_q))
            if not ok:
                acc_s[i] = -Float32.inf
