"""Triton FP8 (e4m3fn) attention forward for Hopper: the kernel itself. Imported lazily (needs triton).

One kernel, every supported recipe: the numerics switches are ``tl.constexpr`` so each recipe compiles to
its own specialised binary. See :mod:`zyfa.kernels.attention_fp8` for the wrapper, the recipe mapping and
the validation, and docs/KERNEL.md for what it computes, the measured launch choices and the SASS checks.

Layouts (all contiguous): Q (b, h, s_q, d_qk), K (b, h_kv, s_k, d_qk), Vt (b, h_kv, d_v, s_k_pad): V is
transposed once before the kernel so the P·V wgmma reads V K-major (Hopper's FP8 wgmma takes K-major
operands only), O (b, h, s_q, d_v) bf16 or fp32, LSE (b, h, s_q) fp32 natural log.

Notation as in docs/DESIGN.md: S = Q8·K8ᵀ (raw FP8 products), c = sm_scale·qd·kd·log2(e), m = running row max of
c·S, t = c·S − m (log2 probability), e = the power-of-two P exponent.
"""

from __future__ import annotations

import triton
import triton.language as tl

# P-scale modes (P_SCALE constexpr)
PS_NONE, PS_FMAX, PS_POW2, PS_POW2_BLOCK = 0, 1, 2, 3
# MAD integer conversions (MAD_CVT constexpr): 0: magic-number add after two fp32 clamps (the reference form);
# 3: fma.rn.sat of x/128 (the FFMA clamps at 0 itself), then the magic add, with the clamp at 126 as an fp32 min;
# 4: the same, the clamp left out where it provably cannot bind (attention_fp8.mad_codes_bounded); 6: left out in
# the programs where a bound on the row maxima shows that no code can pass 126 (the runtime flag `guarded`, one
# branch per tile), else the fp32 min of 3; the same bits as 3 either way.
CVT_SAT_MAGIC = tl.constexpr(3)  # 4 (no clamp at 126) is the sat case that is neither 3 nor 6
CVT_SAT_MAGIC_GUARDED = tl.constexpr(6)
# 448^2: |q·k| <= DQK·448^2 for e4m3fn operands, so every row max of s·c is at most DQK·448^2·c in magnitude
FP8_MAX_SQ = tl.constexpr(200704.0)
# P·V accumulation (PV_MODE constexpr): hardware chain never flushed; Triton partial accumulator flushed every
# k=32 (max_num_imprecise_acc=32); flushed every tile (max_num_imprecise_acc=BLOCK_N); manual every FLUSH tiles;
# flushed every tile by a fresh product added in fp32 (same numerics as PV_TILE, other code).
PV_CHAIN, PV_K32, PV_TILE, PV_EVERY_N, PV_TILE_ADD = 0, 1, 2, 3, 4
# Output formats (OUT_MODE constexpr)
OUT_BF16_RNE, OUT_BF16_TRUNC, OUT_FP32 = 0, 1, 2

LOG2_448 = tl.constexpr(8.807354922057604)
MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: x + MAGIC leaves RNE(x) in the low mantissa bits for |x| < 2^22
MAGIC_SAT = tl.constexpr(98304.0)  # 1.5 * 2^16: y + MAGIC_SAT leaves RNE(128·y) in the low byte for y in [0, 1]
# 2^120: (code << 20) read as fp32 is value(code) * 2^-120, subnormal codes included
TWO_POW_120 = tl.constexpr(1.329227995784916e36)


@triton.jit
def _mul_rn(a, b):
    """mul.rn.f32: a·b rounded on its own (never fused into a following add), as the emulator's fl(s·c)."""
    return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _code_value_sum(codes):
    """Row sums of the e4m3fn values of int32 codes (bits 8-19 zero): (code << 20) read as fp32 is
    value(code)·2^-120, subnormal codes included."""
    return tl.sum((codes << 20).to(tl.float32, bitcast=True), 1) * TWO_POW_120


@triton.jit
def _fma_sat(a, b, c):
    """fma.rn.sat.f32 (one FFMA.SAT): a·b + c rounded once, then clamped to [0, 1] (NaN -> 0)."""
    return tl.inline_asm_elementwise("fma.rn.sat.f32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _e4m3_codes_u8(p):
    """e4m3fn codes of fp32 p (RNE, saturating at 448) from the conversion instruction, four to a register: two
    cvt.rn.satfinite.e4m3x2.f32, the instruction of Triton's own cast, but a tensor of codes of its own, apart from
    the FP8 tensor the P·V dot reads (see the exp2 row sum in _softmax_pv_tile)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; "
        "mov.b32 $0, {lo, hi}; }",
        "=r,r,r,r,r", [p], dtype=tl.uint8, is_pure=True, pack=4)


@triton.jit
def _pow2i(k):
    """2^k for an integer-valued fp32 k in [-126, 127], exact, built from the exponent bits."""
    return ((k.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _load_kv(desc_or_ptr, row0, col0, n_rows, ROWS: tl.constexpr, COLS: tl.constexpr, stride_row,
             TMA: tl.constexpr):
    """A (ROWS, COLS) tile at (row0, col0); rows >= n_rows read as 0 (TMA zero-fills out of bounds)."""
    if TMA:
        return desc_or_ptr.load([row0, col0])
    else:
        r = row0 + tl.arange(0, ROWS)
        c = col0 + tl.arange(0, COLS)
        ptrs = desc_or_ptr + r[:, None].to(tl.int64) * stride_row + c[None, :]
        return tl.load(ptrs, mask=r[:, None] < n_rows, other=0.0)


@triton.jit
def _qk_tile(q1, q2, k1_src, k2_src, start_n, seq_k,
             BLOCK_N: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, DQK: tl.constexpr,
             QK_K32: tl.constexpr, TMA: tl.constexpr):
    """S = Q8 · K8ᵀ for the KV tile at start_n (raw FP8 products, fp32 / Hopper accumulator)."""
    k1 = _load_kv(k1_src, start_n, 0, seq_k, BLOCK_N, D1, DQK, TMA)
    if QK_K32:
        s = tl.dot(q1, k1.T, max_num_imprecise_acc=32)
    else:
        s = tl.dot(q1, k1.T)
    if D2 > 0:
        if TMA:
            k2 = k2_src.load([start_n, 0])
        else:
            k2 = _load_kv(k2_src, start_n, D1, seq_k, BLOCK_N, D2, DQK, TMA)
        if QK_K32:
            s = tl.dot(q2, k2.T, s, max_num_imprecise_acc=32)
        else:
            s = tl.dot(q2, k2.T, s)
    return s


@triton.jit
def _pv_update(acc, p8, v, alpha, vd_src, start_n, BLOCK_N: tl.constexpr, PV_MODE: tl.constexpr,
               VD_TILE: tl.constexpr):
    """acc·α + P8·V for one accumulator (all of O's columns, or one half with DV_SPLIT 2), by PV_MODE 0, 1, 2, 4.

    With VD_TILE (per-block V descales) each tile's P·V is a fresh product (fp32 every k=32 step for the fp32
    recipes, the tensor-core accumulator for one tile otherwise), scaled by the tile's V descale, then added.
    """
    if VD_TILE:
        if PV_MODE == 1:
            pv = tl.dot(p8, v, max_num_imprecise_acc=32)
        else:
            pv = tl.dot(p8, v)
        acc = acc * alpha[:, None] + pv * tl.load(vd_src + start_n // BLOCK_N)
    elif PV_MODE == 0:
        acc = acc * alpha[:, None]
        acc = tl.dot(p8, v, acc)
    elif PV_MODE == 1:
        acc = acc * alpha[:, None]
        acc = tl.dot(p8, v, acc, max_num_imprecise_acc=32)
    elif PV_MODE == 2:
        acc = acc * alpha[:, None]
        acc = tl.dot(p8, v, acc, max_num_imprecise_acc=BLOCK_N)
    else:
        # PV_MODE 4, flush every tile written out: a fresh tensor-core product added into the fp32 accumulator
        pv = tl.dot(p8, v)
        acc = acc * alpha[:, None] + pv
    return acc


@triton.jit
def _softmax_pv_tile(s, start_n, acc, acc_tc, a_prod, l_i, m_i, e_i, vt_src, ones_src,
                     pos_m, row_ok, seq_k, seq_k_pad, window, c, c8, mad_bias, guarded,
                     MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DV: tl.constexpr,
                     EXP_MAD: tl.constexpr, MAD_CVT: tl.constexpr, P_SCALE: tl.constexpr,
                     TILE_GRAN: tl.constexpr, E_CAP: tl.constexpr, ROWSUM_ROUNDED: tl.constexpr,
                     PV_MODE: tl.constexpr, FLUSH: tl.constexpr,
                     TMA: tl.constexpr, DEBUG: tl.constexpr, MAD_T: tl.constexpr, P_PERM: tl.constexpr = 0,
                     kd_src=None, QD_ROW: tl.constexpr = 0, KD_TILE: tl.constexpr = 0,
                     vd_src=None, VD_TILE: tl.constexpr = 0, DV_SPLIT: tl.constexpr = 1,
                     vt_in=None, vt_hi_in=None):
    """Mask, online max, P in e4m3fn (MAD or exp2), row sum, and O += P8 · V8 for one KV tile with scores s.

    vt_in (and vt_hi_in with DV_SPLIT 2): Vᵀ's tile, when the caller loaded it beside K's at the top of the
    iteration (VT_EARLY); else (None) it is loaded here, after the softmax.

    DV_SPLIT 2: O's columns in two halves, acc = columns [0, DV/2) and acc_tc = [DV/2, DV), each half's P·V a
    dot of its own (any PV_MODE but 3, whose acc_tc is the unflushed accumulator). Every output element is the
    same arithmetic as with one dot (a column of P·V does not depend on the others); only the per-tile fresh
    product is half as large in registers.
    """
    if KD_TILE:
        c = c * tl.load(kd_src + start_n // BLOCK_N)
        c8 = c * 8.0
    if QD_ROW == 1:
        cs = c[:, None]
        c8s = c8[:, None]
    else:
        cs = c
        c8s = c8
    offs_n = tl.arange(0, BLOCK_N)
    if MASKED:
        kpos = start_n + offs_n
        valid = kpos[None, :] < seq_k
        if CAUSAL or WINDOW:
            valid = valid & (kpos[None, :] <= pos_m[:, None])
        if WINDOW:
            valid = valid & (kpos[None, :] > pos_m[:, None] - window)
        s = tl.where(valid, s, float("-inf"))
    # ---- online max (c > 0, so max(c·S) = c·max(S))
    m_tile = tl.max(s, 1) * c
    m_new = tl.maximum(m_i, m_tile)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_use)  # m_i = -inf -> 0
    # ---- P exponent e (log2 of the P scale)
    if P_SCALE == 3:
        t_max = m_tile - m_use
        e_row = tl.minimum(tl.floor(LOG2_448 - t_max), E_CAP)
        if TILE_GRAN:
            e_row = tl.where((t_max == float("-inf")) | (~row_ok), float("inf"), e_row)
            e_min = tl.min(e_row, 0)
            e_row = tl.zeros_like(e_row) + e_min
            e_new = tl.where(e_row == float("inf"), e_i, e_row)
        else:
            e_new = tl.where(t_max == float("-inf"), e_i, e_row)
        alpha = alpha * _pow2i(e_new - e_i)
    else:
        e_new = e_i
    # ---- P in e4m3fn, and the row sum
    if EXP_MAD and MAD_CVT >= CVT_SAT_MAGIC:
        # bits = clamp(R(8·(t + e) + 56 + offset), 0, 126), with y = x/128 from one fma.rn.sat: scaling by 2^-7
        # commutes with the rounding, so RNE(128·y) = RNE(x) bit for bit, and the FFMA's saturation is the clamp
        # at 0. The clamp at 126: one fp32 min, or none where it provably cannot bind (MAD_T=1 and
        # kernel_plan.mad_codes_bounded, or the program's bound under MAD_CVT 6): fewer FMNMX per score
        # (docs/KERNEL.md).
        if MAD_T == 0:
            row_bias = mad_bias + 8.0 * (e_new - m_use)
            y = _fma_sat(s, tl.full(s.shape, 1.0, tl.float32) * (c8s * 0.0078125),
                         tl.broadcast_to((row_bias * 0.0078125)[:, None], s.shape))
        else:
            t = _mul_rn(s, tl.full(s.shape, 1.0, tl.float32) * cs) - m_use[:, None]
            y = _fma_sat(t, tl.full(s.shape, 0.0625, tl.float32),
                         tl.broadcast_to(((mad_bias + 8.0 * e_new) * 0.0078125)[:, None], s.shape))
        if MAD_CVT == CVT_SAT_MAGIC:
            y = tl.minimum(y, 0.984375)  # 126/128
        elif MAD_CVT == CVT_SAT_MAGIC_GUARDED:  # noqa: SIM102 - a constexpr test around a runtime one
            # below 126.5 the clamp changes nothing that RNE does not (x in (126, 126.5] rounds to 126), so where
            # the program's bound holds it is left out: the same codes as MAD_CVT 3, bit for bit
            if guarded == 0:
                y = tl.minimum(y, 0.984375)
        bits = (y + MAGIC_SAT).to(tl.int32, bitcast=True)  # low byte = RNE(128·y); bits 8-19 are zero
        p8 = bits.to(tl.uint8).to(tl.float8e4nv, bitcast=True)
        if ROWSUM_ROUNDED == 1:
            l_tile = _code_value_sum(bits)
        elif ROWSUM_ROUNDED == 0:
            l_tile = tl.sum(tl.math.exp2(s * cs + (e_new - m_use)[:, None]), 1)
    elif EXP_MAD:
        # bits = clamp(R(8·(t + e) + 56 + offset), 0, 126)
        if MAD_T == 0:
            # one FFMA with a per-row bias: fastest, but t is not exactly 0 at the row max (the product
            # s·c is not rounded before m is subtracted), which moves the max across a rounding boundary
            row_bias = mad_bias + 8.0 * (e_new - m_use)
            x = s * c8s + row_bias[:, None]
        else:
            # t exactly as the emulator: y = fl(s·c) (mul.rn: never fused), t = y − m (exact 0 at the max)
            t = _mul_rn(s, tl.full(s.shape, 1.0, tl.float32) * cs) - m_use[:, None]
            x = t * 8.0 + (mad_bias + 8.0 * e_new)[:, None]
        x = tl.minimum(tl.maximum(x, 0.0), 126.0)
        bits = (x + MAGIC).to(tl.int32, bitcast=True)  # low byte = RNE(x)
        if DEBUG % 2 == 1:
            # diagnostic route: decode the code to its fp32 value, then the (exact) hardware cast
            p8 = ((bits << 20).to(tl.float32, bitcast=True) * TWO_POW_120).to(tl.float8e4nv)
        else:
            p8 = bits.to(tl.uint8).to(tl.float8e4nv, bitcast=True)
        if ROWSUM_ROUNDED == 1 and DEBUG // 2 == 1:
            l_tile = tl.sum(p8.to(tl.float32), 1)
        elif ROWSUM_ROUNDED == 1:
            l_tile = _code_value_sum(bits)
        elif ROWSUM_ROUNDED == 0:
            p = tl.math.exp2(s * cs + (e_new - m_use)[:, None])
            l_tile = tl.sum(p, 1)
    else:
        if P_SCALE == 1:
            p = tl.math.exp2(s * cs - m_use[:, None]) * 448.0
        else:
            p = tl.math.exp2(s * cs + (e_new - m_use)[:, None])
        # The rounded row sum must not read P's FP8 tensor back: read back from p8 (a bitcast to its codes, or a
        # conversion to fp32), the tensor that also feeds the P·V dot, Triton 3.6 compiled a wrong row sum on the
        # H200 (the output right up to that factor): under a sliding window, with pointer loads (TMA off) at every
        # length, and with TMA at one key or two query rows against one key (docs/KERNEL.md, "A compile fault").
        if ROWSUM_ROUNDED == 1:
            # the codes from a conversion of their own, P's tensor a bitcast of them, the sum decoded from the
            # codes: the MAD branch's form (fewer instructions than re-rounding p)
            codes = _e4m3_codes_u8(p)
            p8 = codes.to(tl.float8e4nv, bitcast=True)
            l_tile = _code_value_sum(codes.to(tl.int32))
        else:
            p8 = p.to(tl.float8e4nv)
            if ROWSUM_ROUNDED == 0:
                l_tile = tl.sum(p, 1)
    # ---- O += P8 · V8 (V read K-major from Vt)
    DVH: tl.constexpr = DV // DV_SPLIT
    if vt_in is None:
        vt_in = _vt_tile(vt_src, start_n, seq_k_pad, 0, DVH, BLOCK_N, TMA)
    v = vt_in.T
    if DV_SPLIT == 2:
        if vt_hi_in is None:
            vt_hi_in = _vt_tile(vt_src, start_n, seq_k_pad, DVH, DVH, BLOCK_N, TMA)
        v_hi = vt_hi_in.T
    if P_PERM:
        # P·V sums over keys, so it may take them in any order that V's rows share. Within each 32-key wgmma
        # step, reorder P's columns so that its accumulator registers already sit where the FP8 A operand wants
        # them (key 32s+16h+4t+2a+b <- column 32s+16h+8a+2t+b): the layout change before the P·V wgmma costs
        # no shuffles; prepare_vt(permute_k32=True) reorders V's keys the same way (FA3 permutes V likewise).
        p8 = tl.reshape(tl.permute(tl.reshape(p8, (BLOCK_M, BLOCK_N // 32, 2, 2, 4, 2)), (0, 1, 2, 4, 3, 5)),
                        (BLOCK_M, BLOCK_N))
    if ROWSUM_ROUNDED == 2:
        # technique 3's sum of the rounded P on the tensor core: P8 · ones (16 columns, each the row sum), a
        # fresh accumulator every tile; 4 small wgmma instead of a shift and an add per score. The ones come by
        # TMA (a register constant would be stored to shared memory every iteration)
        if TMA:
            ones = ones_src.load([0, 0])
        else:
            ones = tl.load(ones_src + tl.arange(0, 16)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :])
        l_tile = tl.dot(p8, ones.T)
    if PV_MODE == 3:
        acc_tc = acc_tc * alpha[:, None]
        a_prod = a_prod * alpha
        acc_tc = tl.dot(p8, v, acc_tc)
        if (start_n // BLOCK_N) % FLUSH == FLUSH - 1:
            acc = acc * a_prod[:, None] + acc_tc
            acc_tc = tl.zeros_like(acc_tc)
            a_prod = tl.full(a_prod.shape, 1.0, tl.float32)
    else:
        acc = _pv_update(acc, p8, v, alpha, vd_src, start_n, BLOCK_N, PV_MODE, VD_TILE)
        if DV_SPLIT == 2:
            acc_tc = _pv_update(acc_tc, p8, v_hi, alpha, vd_src, start_n, BLOCK_N, PV_MODE, VD_TILE)
    if ROWSUM_ROUNDED == 2:
        l_i = l_i * alpha[:, None] + l_tile  # (BLOCK_M, 16), equal columns; reduced once in the epilogue
    else:
        l_i = l_i * alpha + l_tile
    m_i = m_new
    e_i = e_new
    return acc, acc_tc, a_prod, l_i, m_i, e_i


@triton.jit
def _attn_tiles(acc, acc_tc, a_prod, l_i, m_i, e_i,
                q1, q2, k1_src, k2_src, vt_src, ones_src,
                lo, hi, pos_m, row_ok, seq_k, seq_k_pad, window, c, c8, mad_bias, guarded,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                D1: tl.constexpr, D2: tl.constexpr, DQK: tl.constexpr, DV: tl.constexpr,
                EXP_MAD: tl.constexpr, MAD_CVT: tl.constexpr, P_SCALE: tl.constexpr, E_FIXED: tl.constexpr,
                TILE_GRAN: tl.constexpr, E_CAP: tl.constexpr, ROWSUM_ROUNDED: tl.constexpr,
                QK_K32: tl.constexpr, PV_MODE: tl.constexpr, FLUSH: tl.constexpr,
                TMA: tl.constexpr, DEBUG: tl.constexpr, MAD_T: tl.constexpr, P_PERM: tl.constexpr = 0,
                kd_src=None, QD_ROW: tl.constexpr = 0, KD_TILE: tl.constexpr = 0,
                vd_src=None, VD_TILE: tl.constexpr = 0, DV_SPLIT: tl.constexpr = 1, VT_EARLY: tl.constexpr = 0):
    """KV tiles [lo, hi) of one row block (lo a multiple of BLOCK_N)."""
    DVH: tl.constexpr = DV // DV_SPLIT
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        vt_in = None
        vt_hi_in = None
        if VT_EARLY:
            vt_in = _vt_tile(vt_src, start_n, seq_k_pad, 0, DVH, BLOCK_N, TMA)
            if DV_SPLIT == 2:
                vt_hi_in = _vt_tile(vt_src, start_n, seq_k_pad, DVH, DVH, BLOCK_N, TMA)
        s = _qk_tile(q1, q2, k1_src, k2_src, start_n, seq_k, BLOCK_N, D1, D2, DQK, QK_K32, TMA)
        acc, acc_tc, a_prod, l_i, m_i, e_i = _softmax_pv_tile(
            s, start_n, acc, acc_tc, a_prod, l_i, m_i, e_i, vt_src, ones_src,
            pos_m, row_ok, seq_k, seq_k_pad, window, c, c8, mad_bias, guarded,
            MASKED, CAUSAL, WINDOW, BLOCK_M, BLOCK_N, DV, EXP_MAD, MAD_CVT, P_SCALE, TILE_GRAN, E_CAP,
            ROWSUM_ROUNDED, PV_MODE, FLUSH, TMA, DEBUG, MAD_T, P_PERM=P_PERM,
            kd_src=kd_src, QD_ROW=QD_ROW, KD_TILE=KD_TILE, vd_src=vd_src, VD_TILE=VD_TILE,
            DV_SPLIT=DV_SPLIT, vt_in=vt_in, vt_hi_in=vt_hi_in)
    return acc, acc_tc, a_prod, l_i, m_i, e_i


@triton.jit
def _vt_tile(vt_src, start_n, seq_k_pad, row0: tl.constexpr, DVH: tl.constexpr, BLOCK_N: tl.constexpr,
             TMA: tl.constexpr):
    """Rows [row0, row0 + DVH) of Vᵀ's KV tile at start_n (TMA descriptor or pointer)."""
    if TMA:
        return vt_src.load([row0, start_n])
    else:
        return _load_vt(vt_src + row0 * seq_k_pad, start_n, seq_k_pad, DVH, BLOCK_N)


@triton.jit
def _load_vt(vt_ptr, start_n, seq_k_pad, DV: tl.constexpr, BLOCK_N: tl.constexpr):
    r = tl.arange(0, DV)
    cols = start_n + tl.arange(0, BLOCK_N)
    ptrs = vt_ptr + r[:, None].to(tl.int64) * seq_k_pad + cols[None, :]
    return tl.load(ptrs, mask=cols[None, :] < seq_k_pad, other=0.0)


@triton.jit
def _normalise_o(acc, l_safe, has, vd, BLOCK_M: tl.constexpr, VD_MODE: tl.constexpr, RCP: tl.constexpr):
    """acc / l · vd for some of O's columns (acc: their fp32 accumulator; vd: V's scalar descale, or with VD_MODE 1
    the descales of these columns; unused with VD_MODE 2, whose descales are in acc already); 0 on empty rows."""
    if VD_MODE == 2:
        if RCP:
            o = acc * tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), l_safe)[:, None]
        else:
            o = tl.math.div_rn(acc, l_safe[:, None])
    elif VD_MODE == 1:  # per channel, after the normalisation (the emulator's order)
        if RCP:
            o = acc * tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), l_safe)[:, None] * vd[None, :]
        else:
            o = tl.math.div_rn(acc, l_safe[:, None]) * vd[None, :]
    elif RCP:
        o = acc * (tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), l_safe) * vd)[:, None]
    else:
        o = tl.math.div_rn(acc, l_safe[:, None]) * vd
    return tl.where(has[:, None], o, 0.0)


@triton.jit
def _write_o(O, bh, seq_q, offs_m, o, col0, row_ok, DV: tl.constexpr, DVH: tl.constexpr, OUT_MODE: tl.constexpr):
    """O[:, col0:col0+DVH] = o in the output format: bf16 rounded to nearest (0), bf16 truncated (1), fp32 (2)."""
    offs_dv = col0 + tl.arange(0, DVH)
    o_ptrs = O + bh.to(tl.int64) * seq_q * DV + offs_m[:, None].to(tl.int64) * DV + offs_dv[None, :]
    if OUT_MODE == 0:
        tl.store(o_ptrs, o.to(tl.bfloat16), mask=row_ok[:, None])
    elif OUT_MODE == 1:
        ob = (o.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        tl.store(o_ptrs, ob, mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, o, mask=row_ok[:, None])


@triton.jit
def attn_fwd_fp8(Q, K, VT, O, LSE, QD, KD, VD, ONES,
                 seq_q, seq_k, seq_k_pad, heads_q, heads_kv, window, sm_scale_log2e, mad_bias, mad_m_safe,
                 CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 D1: tl.constexpr, D2: tl.constexpr, DV: tl.constexpr,
                 EXP_MAD: tl.constexpr, MAD_CVT: tl.constexpr, P_SCALE: tl.constexpr, E_FIXED: tl.constexpr,
                 TILE_GRAN: tl.constexpr, E_CAP: tl.constexpr, ROWSUM_ROUNDED: tl.constexpr,
                 QK_K32: tl.constexpr, PV_MODE: tl.constexpr, FLUSH: tl.constexpr,
                 RCP: tl.constexpr, OUT_MODE: tl.constexpr, TMA: tl.constexpr,
                 DEBUG: tl.constexpr = 0, MAD_T: tl.constexpr = 1,
                 P_PERM: tl.constexpr = 0, QD_ROW: tl.constexpr = 0, KD_TILE: tl.constexpr = 0,
                 VD_MODE: tl.constexpr = 0, DV_SPLIT: tl.constexpr = 1, VT_EARLY: tl.constexpr = 0):
    DQK: tl.constexpr = D1 + D2
    DVH: tl.constexpr = DV // DV_SPLIT  # DV_SPLIT 2: O in two column halves (acc, acc_tc), see _softmax_pv_tile
    num_m = tl.cdiv(seq_q, BLOCK_M)
    start_m = num_m - 1 - tl.program_id(0)  # heavy (late, causal) row blocks first
    bh = tl.program_id(1)
    b = bh // heads_q
    h = bh % heads_q
    hk = h // (heads_q // heads_kv)
    bhk = b * heads_kv + hk

    q_base = Q + bh.to(tl.int64) * seq_q * DQK
    k_base = K + bhk.to(tl.int64) * seq_k * DQK
    vt_base = VT + bhk.to(tl.int64) * DV * seq_k_pad

    # Q descale: one per (batch, head); with QD_ROW 1 one per query row (QD (b, h, seq_q)); with QD_ROW 2 one per
    # program, i.e. per BLOCK_M rows (QD (b, h, cdiv(seq_q, BLOCK_M)): Q blocks a multiple of BLOCK_M, still a
    # scalar c, so the per-score code is the per-head one); K descale: one per
    # (batch, kv head), or with KD_TILE one per KV tile (KD (b, h_kv, cdiv(seq_k, BLOCK_N)), multiplied into c
    # tile by tile in _softmax_pv_tile). c = (sm_scale·log2e·qd)·kd in that order, as the emulator rounds it.
    if QD_ROW == 2:
        qd = tl.load(QD + bh.to(tl.int64) * tl.cdiv(seq_q, BLOCK_M) + start_m)
    elif QD_ROW == 1:
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        qd = tl.load(QD + bh.to(tl.int64) * seq_q + rows, mask=rows < seq_q, other=1.0)
    else:
        qd = tl.load(QD + bh)
    if KD_TILE:
        kd_src = KD + bhk.to(tl.int64) * tl.cdiv(seq_k, BLOCK_N)
    else:
        kd_src = KD
        kd = tl.load(KD + bhk)
    # V descale: one per (batch, kv head) (VD_MODE 0), one per channel (1: VD (b, h_kv, DV), applied to the
    # output's columns), or one per KV tile (2: VD (b, h_kv, cdiv(seq_k, BLOCK_N)), applied to each tile's P·V)
    VD_TILE: tl.constexpr = VD_MODE == 2
    if VD_TILE:
        vd_src = VD + bhk.to(tl.int64) * tl.cdiv(seq_k, BLOCK_N)
    else:
        vd_src = VD
    if VD_MODE == 1:  # the descales of O's first DVH columns (all of them unless DV_SPLIT 2)
        vd = tl.load(VD + bhk.to(tl.int64) * DV + tl.arange(0, DVH))
    elif VD_MODE != 2:
        vd = tl.load(VD + bhk)
    else:
        vd = 1.0
    if KD_TILE:
        c = sm_scale_log2e * qd
    else:
        c = sm_scale_log2e * qd * kd
    c8 = c * 8.0
    if MAD_CVT == CVT_SAT_MAGIC_GUARDED:
        # at or below mad_m_safe (kernel_plan.mad_m_safe) the fused MAD's codes stay below 126.5
        guarded = (DQK * FP8_MAX_SQ * c <= mad_m_safe).to(tl.int32)
    else:
        guarded = 0

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    off = seq_k - seq_q  # bottom-right alignment: query i sits at key position i + off
    pos_m = offs_m + off
    row_ok = offs_m < seq_q

    # ---- Q tile(s): loaded once
    offs_d1 = tl.arange(0, D1)
    q1 = tl.load(q_base + offs_m[:, None].to(tl.int64) * DQK + offs_d1[None, :],
                 mask=offs_m[:, None] < seq_q, other=0.0)
    if D2 > 0:
        offs_d2 = D1 + tl.arange(0, D2)
        q2 = tl.load(q_base + offs_m[:, None].to(tl.int64) * DQK + offs_d2[None, :],
                     mask=offs_m[:, None] < seq_q, other=0.0)
    else:
        q2 = q1

    if TMA:
        k1_src = tl.make_tensor_descriptor(k_base, shape=[seq_k, DQK], strides=[DQK, 1],
                                           block_shape=[BLOCK_N, D1])
        if D2 > 0:
            k2_src = tl.make_tensor_descriptor(k_base + D1, shape=[seq_k, D2], strides=[DQK, 1],
                                               block_shape=[BLOCK_N, D2])
        else:
            k2_src = k1_src
        vt_src = tl.make_tensor_descriptor(vt_base, shape=[DV, seq_k_pad], strides=[seq_k_pad, 1],
                                           block_shape=[DVH, BLOCK_N])
        ones_src = tl.make_tensor_descriptor(ONES, shape=[16, BLOCK_N], strides=[BLOCK_N, 1],
                                             block_shape=[16, BLOCK_N])
    else:
        k1_src = k_base
        k2_src = k_base
        vt_src = vt_base
        ones_src = ONES

    # ---- KV range this row block can see; three segments: window edge (masked), full tiles, diagonal/tail
    p0 = start_m * BLOCK_M + off
    p1 = p0 + BLOCK_M - 1
    if CAUSAL or WINDOW:
        hi = tl.minimum(seq_k, p1 + 1)
    else:
        hi = seq_k
    hi = tl.maximum(hi, 0)
    if WINDOW:
        lo = tl.maximum(0, p0 - window + 1)
        lo = (lo // BLOCK_N) * BLOCK_N
        full_lo = tl.maximum(p1 - window + 1, 0)
        full_lo = tl.cdiv(full_lo, BLOCK_N) * BLOCK_N
    else:
        lo = 0
        full_lo = 0
    lo = tl.minimum(lo, hi)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    if CAUSAL or WINDOW:
        full_hi = ((p0 + 1) // BLOCK_N) * BLOCK_N
        full_hi = tl.minimum(full_hi, (seq_k // BLOCK_N) * BLOCK_N)
    else:
        full_hi = (seq_k // BLOCK_N) * BLOCK_N
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    if ROWSUM_ROUNDED == 2:
        l_i = tl.zeros([BLOCK_M, 16], tl.float32)
    else:
        l_i = tl.zeros([BLOCK_M], tl.float32)
    if P_SCALE == 3:
        e_i = tl.zeros([BLOCK_M], tl.float32)
    else:
        e_i = tl.full([BLOCK_M], E_FIXED, tl.float32)
    acc = tl.zeros([BLOCK_M, DVH], tl.float32)
    if PV_MODE == 3 or DV_SPLIT == 2:
        acc_tc = tl.zeros([BLOCK_M, DVH], tl.float32)
    else:
        acc_tc = tl.zeros([1, 1], tl.float32)
    a_prod = tl.full([BLOCK_M], 1.0, tl.float32)

    # The three segments in order: the window's masked left edge (sliding window only), the full tiles (unmasked),
    # the masked diagonal/tail. tl.static_range unrolls the loop when the kernel is compiled, so each segment keeps
    # its own constexpr MASKED: the same code as three written-out calls (SASS identical, docs/KERNEL.md "Checks").
    for seg in tl.static_range(3):
        if seg == 0:
            seg_lo = lo
            seg_hi = full_lo
        elif seg == 1:
            seg_lo = full_lo
            seg_hi = full_hi
        else:
            seg_lo = full_hi
            seg_hi = hi
        if seg != 0 or WINDOW:
            acc, acc_tc, a_prod, l_i, m_i, e_i = _attn_tiles(
                acc, acc_tc, a_prod, l_i, m_i, e_i, q1, q2, k1_src, k2_src, vt_src, ones_src,
                seg_lo, seg_hi, pos_m, row_ok, seq_k, seq_k_pad, window, c, c8, mad_bias, guarded,
                seg != 1, CAUSAL, WINDOW, BLOCK_M, BLOCK_N, D1, D2, DQK, DV,
                EXP_MAD, MAD_CVT, P_SCALE, E_FIXED, TILE_GRAN, E_CAP, ROWSUM_ROUNDED,
                QK_K32, PV_MODE, FLUSH, TMA, DEBUG, MAD_T, P_PERM=P_PERM,
                kd_src=kd_src, QD_ROW=QD_ROW, KD_TILE=KD_TILE, vd_src=vd_src, VD_TILE=VD_TILE,
                DV_SPLIT=DV_SPLIT, VT_EARLY=VT_EARLY)
    if PV_MODE == 3:
        acc = acc * a_prod[:, None] + acc_tc

    # ---- epilogue: O = acc / l · vd (l in the same P scale as acc), LSE = ln2·(m + log2 l − e)
    if ROWSUM_ROUNDED == 2:
        l_i = tl.max(l_i, 1)
    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    o = _normalise_o(acc, l_safe, has, vd, BLOCK_M, VD_MODE, RCP)
    m_fin = tl.where(m_i == float("-inf"), 0.0, m_i)
    lse = tl.where(has, (m_fin + tl.math.log2(l_safe) - e_i) * 0.6931471805599453, float("-inf"))
    _write_o(O, bh, seq_q, offs_m, o, 0, row_ok, DV, DVH, OUT_MODE)
    if DV_SPLIT == 2:  # the second half of O's columns, from acc_tc
        if VD_MODE == 1:
            vd = tl.load(VD + bhk.to(tl.int64) * DV + DVH + tl.arange(0, DVH))
        o = _normalise_o(acc_tc, l_safe, has, vd, BLOCK_M, VD_MODE, RCP)
        _write_o(O, bh, seq_q, offs_m, o, DVH, row_ok, DV, DVH, OUT_MODE)
    tl.store(LSE + bh.to(tl.int64) * seq_q + offs_m, lse, mask=offs_m < seq_q)


_ALLOCATOR_SET = False


def ensure_allocator() -> None:
    """Device-side tensor descriptors need a global scratch allocator (Triton >= 3.4)."""
    global _ALLOCATOR_SET
    if _ALLOCATOR_SET:
        return
    import torch

    def _alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device="cuda")

    triton.set_allocator(_alloc)
    _ALLOCATOR_SET = True
