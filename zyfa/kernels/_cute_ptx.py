"""The inline-PTX scalar operations of the CuTe DSL FP8 kernel (zyfa/kernels/_cute_fp8.py): the MAD code of a score,
its value for the row sum, the byte packing of P, and the exact fp32 ops (ex2, lg2, div.rn, floor, 2^k) the kernel
needs in a fixed instruction form. Each is one asm block, so nothing is reassociated or fused across its steps. Needs
nvidia-cutlass-dsl (imported by the kernel module only)."""

from __future__ import annotations

from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import Float32, Int32, T, dsl_user_op


def _asm(ret_type, args, ptx: str, constraints: str, loc=None, ip=None):
    return llvm.inline_asm(ret_type, [a.ir_value(loc=loc, ip=ip) for a in args], ptx, constraints,
                           has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def mad_code(s, c8n, rbn, *, loc=None, ip=None) -> Int32:
    """The MAD code of one score as an int32 whose low byte is the e4m3fn code (bits 8-19 zero): y = fma.rn.sat(s,
    c8n, rbn) (the clamp at 0 and NaN -> 0), min(y, 126/128), then y + 1.5·2^16 read as int32. One asm block so that
    nothing is reassociated or fused across the steps (the Triton kernel's MAD_CVT 3 form, bit for bit)."""
    return Int32(_asm(T.i32(), [Float32(s), Float32(c8n), Float32(rbn)],
                      "{ .reg .f32 y; fma.rn.sat.f32 y, $1, $2, $3; min.f32 y, y, 0f3F7C0000; "
                      "add.rn.f32 y, y, 0f47C00000; mov.b32 $0, y; }", "=r,f,f,f", loc, ip))


@dsl_user_op
def mad_code_unclamped(s, c8n, rbn, *, loc=None, ip=None) -> Int32:
    """:func:`mad_code` without the min at 126/128: the same code wherever 128·y < 126.5, which the caller must
    guarantee (MAD_CVT 6: y <= 126/128 + 0.375/128 by kernel_plan.mad_m_safe's bound). One asm block, as there."""
    return Int32(_asm(T.i32(), [Float32(s), Float32(c8n), Float32(rbn)],
                      "{ .reg .f32 y; fma.rn.sat.f32 y, $1, $2, $3; add.rn.f32 y, y, 0f47C00000; mov.b32 $0, y; }",
                      "=r,f,f,f", loc, ip))


@dsl_user_op
def code_value(bits, *, loc=None, ip=None) -> Float32:
    """value(code)·2^-120: (bits << 20) read as fp32 (subnormal codes included)."""
    return Float32(_asm(T.f32(), [Int32(bits)], "{ .reg .b32 t; shl.b32 t, $1, 20; mov.b32 $0, t; }", "=f,r",
                        loc, ip))


@dsl_user_op
def pack4(b0, b1, b2, b3, *, loc=None, ip=None) -> Int32:
    """The low bytes of four int32 as one register, b0 lowest (two prmt for the pairs, one to join them)."""
    return Int32(_asm(T.i32(), [Int32(b0), Int32(b1), Int32(b2), Int32(b3)],
                      "{ .reg .b32 lo, hi; prmt.b32 lo, $1, $2, 0x0040; prmt.b32 hi, $3, $4, 0x0040; "
                      "prmt.b32 $0, lo, hi, 0x5410; }", "=r,r,r,r,r", loc, ip))


@dsl_user_op
def ex2(x, *, loc=None, ip=None) -> Float32:
    """ex2.approx.f32, the instruction of Triton's tl.math.exp2 (alpha only: one per row and tile)."""
    return Float32(_asm(T.f32(), [Float32(x)], "ex2.approx.f32 $0, $1;", "=f,f", loc, ip))


@dsl_user_op
def lg2(x, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [Float32(x)], "lg2.approx.f32 $0, $1;", "=f,f", loc, ip))


@dsl_user_op
def div_rn(a, b, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [Float32(a), Float32(b)], "div.rn.f32 $0, $1, $2;", "=f,f,f", loc, ip))


@dsl_user_op
def rcp_rn(x, *, loc=None, ip=None) -> Float32:
    """1/x rounded to nearest even (rcp.rn.f32, IEEE): the per-row factor of :func:`div_by_rcp`."""
    return Float32(_asm(T.f32(), [Float32(x)], "rcp.rn.f32 $0, $1;", "=f,f", loc, ip))


@dsl_user_op
def div_by_rcp(a, b, rb, *, loc=None, ip=None) -> Float32:
    """a / b rounded to nearest even from rb = rcp_rn(b), in three instructions: q = a·rb, then Markstein's
    correction q + (a - q·b)·rb (the remainder exact in one fma). With rb correctly rounded and q within an ulp of a/b,
    the correction rounds to the correctly rounded quotient (Markstein 1990), so this equals div.rn.f32 wherever no
    step overflows or goes subnormal and a is not -0 (-0 / b gives +0 here): the kernel's acc / l, whose acc is never
    -0 and whose quotient lies far inside the normal range."""
    return Float32(_asm(T.f32(), [Float32(a), Float32(b), Float32(rb)],
                        "{ .reg .f32 q, e; mul.rn.f32 q, $1, $3; neg.f32 e, q; fma.rn.f32 e, e, $2, $1; "
                        "fma.rn.f32 $0, e, $3, q; }", "=f,f,f,f", loc, ip))


@dsl_user_op
def pack_bf16x2(lo, hi, *, loc=None, ip=None) -> Int32:
    """Two fp32 rounded to bf16 (nearest even, each as cvt.rn.bf16.f32 would) in one register, lo in the low half:
    one 32-bit store for two adjacent columns."""
    return Int32(_asm(T.i32(), [Float32(lo), Float32(hi)], "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", loc, ip))


@dsl_user_op
def floor_f32(x, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [Float32(x)], "cvt.rmi.f32.f32 $0, $1;", "=f,f", loc, ip))


@dsl_user_op
def pow2i(k, *, loc=None, ip=None) -> Float32:
    """2^k for an integer-valued fp32 k in [-126, 127], from the exponent bits."""
    return Float32(_asm(T.f32(), [Float32(k)],
                        "{ .reg .s32 i; cvt.rzi.s32.f32 i, $1; add.s32 i, i, 127; shl.b32 i, i, 23; "
                        "mov.b32 $0, i; }", "=f,f", loc, ip))


@dsl_user_op
def keep_live(x, *, loc=None, ip=None) -> Int32:
    """x, through an empty asm block with side effects that reads it: the value stays in its registers up to this
    point. After a ``wgmma.wait_group`` it keeps a register operand of the retired wgmma from sharing registers with
    values computed while that wgmma ran (without it, LLVM ends the operand's life at the wgmma's issue and may put the
    next tile's P codes in the same registers, and ptxas then serializes every wgmma of the kernel)."""
    return Int32(llvm.inline_asm(T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], "", "=r,0", has_side_effects=True,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))
