"""Gluon FP8 (e4m3fn) attention forward for Hopper (sm_90a) with the ``zyfa-hopper`` P handling.

Imported lazily (needs ``triton.experimental.gluon``); the wrapper and its validation live in
:mod:`zyfa.kernels.attention_gluon`. The ablation of ZYFA technique 2 (softmax overlapped with the matmuls) with
ZYFA's numerics: one kernel family, two schedules, selected by ``PINGPONG``:

* ``PINGPONG=0`` (:func:`attn_fwd_gluon_1wg`): one consumer warpgroup per program (64 query rows, 4 warps), K / Vᵀ
  double-buffered through TMA + mbarriers; the next tile's S = Q·Kᵀ wgmma is issued (async) before this tile's
  softmax, so it runs on the tensor cores while the warpgroup does the vector work. Several programs share an SM.
* ``PINGPONG=1`` (:func:`attn_fwd_gluon_pingpong`): ``gl.warp_specialize`` with two consumer warpgroups (64 rows
  each, one 128-row block per program) whose GEMM sections alternate through two ``turn`` mbarriers, and a 1-warp
  TMA producer filling a ``STAGES``-deep K / Vᵀ ring.

P handling, exactly as :mod:`zyfa.kernels._triton_fp8` with the ``zyfa-hopper`` plan (EXP_MAD, MAD_CVT=0,
MAD_T=0, P_SCALE=pow2_block per row, ROWSUM_ROUNDED, PV_MODE=4, RCP off, OUT bf16 RNE):

    m_new = max(m, c·max S);  t_max = c·max S − m_new;  e = min(floor(log2 448 − t_max), E_CAP)
    alpha = 2^(m − m_new) · 2^(e − e_old)                       (rescales l and acc)
    bits  = RNE_magic(clamp(S·8c + (bias + 8(e − m_new)), 0, 126))   (one fused FFMA per score; bias = 56 + 1/16
                                                                     − 1/2 for truncation)
    P8 = low byte of bits as e4m3fn;  l = l·alpha + Σ value(code)  (value = (bits << 20) as fp32 · 2^120)
    acc = acc·alpha + (P8 · V8)   (fresh tensor-core product per KV tile, added in fp32: flushed every tile)
    O = div_rn(acc, l) · v_descale (bf16 RNE);  LSE = ln 2 · (m + log2 l − e)

Layouts (contiguous): Q (b, h, s_q, 128), K (b, h_kv, s_k, 128), Vt (b, h_kv, 128, s_k) (V transposed once, K-major
for the P·V wgmma), O (b, h, s_q, 128) bf16, LSE (b, h, s_q) fp32. Non-causal, s_q and s_k multiples of 128.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

LOG2_448 = gl.constexpr(8.807354922057604)
MAGIC = gl.constexpr(12582912.0)  # 1.5 * 2^23: x + MAGIC leaves RNE(x) in the low mantissa bits
TWO_POW_120 = gl.constexpr(1.329227995784916e36)  # (code << 20) as fp32 is value(code) * 2^-120
LN2 = gl.constexpr(0.6931471805599453)

BLOCK_N = 128  # KV tile (keys per wgmma)
ROWS_PER_WG = 64  # query rows per consumer warpgroup
HEAD_DIM = 128


@gluon.jit
def _pow2i(k):
    """2^k for an integer-valued fp32 k in [-126, 127], exact, from the exponent bits."""
    return ((k.to(gl.int32) + 127) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _zyfa_p(s, m_i, e_i, c, c8, mad_bias, e_cap):
    """ZYFA P of one KV tile from raw scores s (no mask): returns (P8 codes, rounded row sum, alpha, m, e)."""
    m_tile = gl.max(s, 1) * c
    m_new = gl.maximum(m_i, m_tile)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)  # m_i = -inf (first tile) -> 0
    t_max = m_tile - m_use
    e_row = gl.minimum(gl.floor(LOG2_448 - t_max), e_cap)
    e_new = gl.where(t_max == float("-inf"), e_i, e_row)
    alpha = alpha * _pow2i(e_new - e_i)
    # fused MAD (MAD_T=0): one FFMA per score with a per-row bias
    row_bias = mad_bias + 8.0 * (e_new - m_use)
    x = s * c8 + row_bias[:, None]
    x = gl.minimum(gl.maximum(x, 0.0), 126.0)
    bits = (x + MAGIC).to(gl.int32, bitcast=True)  # low byte = RNE(x) (MAD_CVT=0)
    p8 = bits.to(gl.uint8).to(gl.float8e4nv, bitcast=True)
    vals = (bits << 20).to(gl.float32, bitcast=True)
    l_tile = gl.sum(vals, 1) * TWO_POW_120
    return p8, l_tile, alpha, m_new, e_new


@gluon.jit
def _epilogue(acc, l_i, m_i, e_i, vd, O, LSE, bh, row0, seq_q, o_l: gl.constexpr, D: gl.constexpr,
              BM: gl.constexpr):
    """O = div_rn(acc, l) · vd in bf16 (RNE), LSE = ln2 · (m + log2 l − e); rows >= seq_q not stored."""
    has = l_i > 0.0
    l_safe = gl.where(has, l_i, 1.0)
    m_fin = gl.where(m_i == float("-inf"), 0.0, m_i)
    lse = gl.where(has, (m_fin + gl.log2(l_safe) - e_i) * LN2, float("-inf"))
    l_o = gl.convert_layout(l_safe, gl.SliceLayout(1, o_l))
    has_o = gl.convert_layout(has, gl.SliceLayout(1, o_l))
    o = gl.div_rn(acc, l_o[:, None]) * vd
    o = gl.where(has_o[:, None], o, 0.0)
    rows = row0 + gl.arange(0, BM, gl.SliceLayout(1, o_l))
    cols = gl.arange(0, D, gl.SliceLayout(0, o_l))
    ptrs = O + bh.to(gl.int64) * seq_q * D + rows[:, None].to(gl.int64) * D + cols[None, :]
    gl.store(ptrs, o.to(gl.bfloat16), mask=rows[:, None] < seq_q)
    lse_rows = row0 + gl.arange(0, BM, gl.SliceLayout(1, o_l))
    gl.store(LSE + bh.to(gl.int64) * seq_q + lse_rows, gl.convert_layout(lse, gl.SliceLayout(1, o_l)),
             mask=lse_rows < seq_q)


@gluon.jit
def _scales(QD, KD, VD, sm_scale_log2e, bh, heads_q, heads_kv):
    """c = sm_scale·log2e·qd·kd, and vd, for program bh; also the kv head row bhk (GQA)."""
    b = bh // heads_q
    h = bh % heads_q
    bhk = b * heads_kv + h // (heads_q // heads_kv)
    qd = gl.load(QD + bh)
    kd = gl.load(KD + bhk)
    vd = gl.load(VD + bhk)
    c = sm_scale_log2e * qd * kd
    return c, vd, bhk


# ------------------------------------------------------------------------------------ PINGPONG = 0 (one warpgroup)

@gluon.jit
def _tile_1wg(s, acc, m_i, l_i, e_i, j, n, q_s, k_s, v_s, bars, k_desc, v_desc, c, c8, mad_bias, e_cap,
              zero_s, zero_o, p_l: gl.constexpr, o_l: gl.constexpr, BN: gl.constexpr, kv_bytes: gl.constexpr):
    """KV tile j with S_j = s given; returns S_{j+1} (its wgmma in flight during this tile's softmax)."""
    st = j % 2
    nst = 1 - st
    has_next = j + 1 < n
    # ---- issue S_{j+1} (async); on the last tile it reads a stale stage and is discarded
    mbarrier.wait(bars.index(1 + nst), ((j + 1) // 2) & 1, pred=has_next)
    s_tok = warpgroup_mma(q_s, k_s.index(nst).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    # ---- ZYFA P of S_j on the CUDA cores while the tensor cores compute S_{j+1}
    p8, l_tile, alpha, m_new, e_new = _zyfa_p(s, m_i, e_i, c, c8, mad_bias, e_cap)
    l_i = l_i * alpha + l_tile
    p8 = gl.convert_layout(p8, p_l)
    # ---- fresh P_j·V_j product (flushed into the fp32 acc below), then retire S_{j+1} and it
    pv_tok = warpgroup_mma(p8, v_s.index(st).permute((1, 0)), zero_o, use_acc=False, is_async=True)
    s_next = warpgroup_mma_wait(1, deps=[s_tok])
    pv = warpgroup_mma_wait(0, deps=[pv_tok])
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None] + pv
    # ---- stage st is free: prefetch tile j+2 into it
    has2 = j + 2 < n
    mbarrier.expect(bars.index(1 + st), kv_bytes, pred=has2)
    tma.async_copy_global_to_shared(k_desc, [(j + 2) * BN, 0], bars.index(1 + st), k_s.index(st), pred=has2)
    tma.async_copy_global_to_shared(v_desc, [0, (j + 2) * BN], bars.index(1 + st), v_s.index(st), pred=has2)
    return s_next, acc, m_new, l_i, e_new


@gluon.jit
def attn_fwd_gluon_1wg(Q, K, VT, O, LSE, QD, KD, VD, seq_q, seq_k, heads_q, heads_kv, sm_scale_log2e, mad_bias,
                       e_cap, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, UNROLL2: gl.constexpr):
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    c, vd, bhk = _scales(QD, KD, VD, sm_scale_log2e, bh, heads_q, heads_kv)
    c8 = c * 8.0
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 32])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=4)

    q_desc = tma.make_tensor_descriptor(Q + bh.to(gl.int64) * seq_q * D, [seq_q, D], [D, 1], [BM, D], smem)
    k_desc = tma.make_tensor_descriptor(K + bhk.to(gl.int64) * seq_k * D, [seq_k, D], [D, 1], [BN, D], smem)
    v_desc = tma.make_tensor_descriptor(VT + bhk.to(gl.int64) * D * seq_k, [D, seq_k], [seq_k, 1], [D, BN], smem)

    q_s = gl.allocate_shared_memory(gl.float8e4nv, [BM, D], smem)
    k_s = gl.allocate_shared_memory(gl.float8e4nv, [2, BN, D], smem)
    v_s = gl.allocate_shared_memory(gl.float8e4nv, [2, D, BN], smem)
    bars = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())  # Q, stage 0, stage 1
    for i in gl.static_range(3):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()

    n = seq_k // BN
    kv_bytes: gl.constexpr = 2 * BN * D
    mbarrier.expect(bars.index(0), BM * D)
    tma.async_copy_global_to_shared(q_desc, [pid_m * BM, 0], bars.index(0), q_s)
    for t in gl.static_range(2):
        mbarrier.expect(bars.index(1 + t), kv_bytes, pred=t < n)
        tma.async_copy_global_to_shared(k_desc, [t * BN, 0], bars.index(1 + t), k_s.index(t), pred=t < n)
        tma.async_copy_global_to_shared(v_desc, [0, t * BN], bars.index(1 + t), v_s.index(t), pred=t < n)

    mbarrier.wait(bars.index(0), 0)
    mbarrier.wait(bars.index(1), 0)
    zero_s = gl.zeros([BM, BN], gl.float32, s_l)
    zero_o = gl.zeros([BM, D], gl.float32, o_l)
    s = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), zero_s, use_acc=False)  # S_0 (prologue)

    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_l))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_l))
    e_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_l))
    acc = gl.zeros([BM, D], gl.float32, o_l)
    if UNROLL2:
        # two tiles per trip (n even): S alternates between two register sets
        for j2 in range(n // 2):
            s, acc, m_i, l_i, e_i = _tile_1wg(s, acc, m_i, l_i, e_i, 2 * j2, n, q_s, k_s, v_s, bars, k_desc,
                                              v_desc, c, c8, mad_bias, e_cap, zero_s, zero_o, p_l, o_l, BN,
                                              kv_bytes)
            s, acc, m_i, l_i, e_i = _tile_1wg(s, acc, m_i, l_i, e_i, 2 * j2 + 1, n, q_s, k_s, v_s, bars, k_desc,
                                              v_desc, c, c8, mad_bias, e_cap, zero_s, zero_o, p_l, o_l, BN,
                                              kv_bytes)
    else:
        for j in range(n):
            s, acc, m_i, l_i, e_i = _tile_1wg(s, acc, m_i, l_i, e_i, j, n, q_s, k_s, v_s, bars, k_desc, v_desc,
                                              c, c8, mad_bias, e_cap, zero_s, zero_o, p_l, o_l, BN, kv_bytes)

    for i in gl.static_range(3):
        mbarrier.invalidate(bars.index(i))
    _epilogue(acc, l_i, m_i, e_i, vd, O, LSE, bh, pid_m * BM, seq_q, o_l, D, BM)


# ------------------------------------------------------------------------------------ PINGPONG = 1 (two warpgroups)

@gluon.jit
def _pp_loader(Q, K, VT, seq_q, seq_k, heads_q, heads_kv, q_s, k_s, v_s, q_bar, full, empty):
    """Producer (1 warp): Q for both consumers, then the K / Vᵀ ring."""
    # tile sizes from the shared-memory shapes (constexprs do not pass through warp_specialize's arg tuples)
    BM: gl.constexpr = q_s.shape[1]
    D: gl.constexpr = q_s.shape[2]
    STAGES: gl.constexpr = k_s.shape[0]
    BN: gl.constexpr = k_s.shape[1]
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    bhk = (bh // heads_q) * heads_kv + (bh % heads_q) // (heads_q // heads_kv)
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    q_desc = tma.make_tensor_descriptor(Q + bh.to(gl.int64) * seq_q * D, [seq_q, D], [D, 1], [BM, D], smem)
    k_desc = tma.make_tensor_descriptor(K + bhk.to(gl.int64) * seq_k * D, [seq_k, D], [D, 1], [BN, D], smem)
    v_desc = tma.make_tensor_descriptor(VT + bhk.to(gl.int64) * D * seq_k, [D, seq_k], [seq_k, 1], [D, BN], smem)
    mbarrier.expect(q_bar, 2 * BM * D)
    tma.async_copy_global_to_shared(q_desc, [pid_m * 2 * BM, 0], q_bar, q_s.index(0))
    tma.async_copy_global_to_shared(q_desc, [pid_m * 2 * BM + BM, 0], q_bar, q_s.index(1))
    n = seq_k // BN
    for j in range(n):
        st = j % STAGES
        mbarrier.wait(empty.index(st), ((j // STAGES) & 1) ^ 1)  # fresh barrier: parity 1 passes
        mbarrier.expect(full.index(st), 2 * BN * D)
        tma.async_copy_global_to_shared(k_desc, [j * BN, 0], full.index(st), k_s.index(st))
        tma.async_copy_global_to_shared(v_desc, [0, j * BN], full.index(st), v_s.index(st))


@gluon.jit
def _pp_consumer(O, LSE, QD, KD, VD, seq_q, seq_k, heads_q, heads_kv, sm_scale_log2e, mad_bias, e_cap,
                 q_s, k_s, v_s, q_bar, full, empty, turn, cfg, WG: gl.constexpr):
    """Consumer warpgroup WG (0 = A, 1 = B): 64 query rows, GEMMs issued only in its turn.

    Iteration j: wait full[j], wait my turn -> issue S_j and the fresh product P_{j-1}·V_{j-1} (async) -> hand the
    turn over -> [LAG 2: wait(1) (S_j), release tile j-2, ZYFA P of S_j, wait(0), acc = acc·alpha_{j-1} + PV_{j-1}]
    or [LAG 1: wait(0), release tile j-1, acc = acc·alpha_{j-1} + PV_{j-1}, ZYFA P of S_j]. The accumulator update
    is the Triton kernel's acc·alpha_j + P_j·V_j, one tile later.
    """
    LAG: gl.constexpr = cfg.shape[0]
    BM: gl.constexpr = q_s.shape[1]
    D: gl.constexpr = q_s.shape[2]
    STAGES: gl.constexpr = k_s.shape[0]
    BN: gl.constexpr = k_s.shape[1]
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 32])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=4)
    PAR0: gl.constexpr = 1 - WG  # A's first turn wait (parity 1 on a fresh barrier) passes at once
    my_turn = turn.index(WG)
    other_turn = turn.index(1 - WG)
    qs = q_s.index(WG)
    n = seq_k // BN
    bh = gl.program_id(1)
    c, vd, bhk = _scales(QD, KD, VD, sm_scale_log2e, bh, heads_q, heads_kv)
    c8 = c * 8.0

    zero_s = gl.zeros([BM, BN], gl.float32, s_l)
    zero_o = gl.zeros([BM, D], gl.float32, o_l)
    acc = gl.zeros([BM, D], gl.float32, o_l)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_l))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_l))
    e_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_l))
    mbarrier.wait(q_bar, 0)
    # ---- tile 0: S_0 only
    mbarrier.wait(full.index(0), 0)
    mbarrier.wait(my_turn, PAR0)
    s_tok = warpgroup_mma(qs, k_s.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    mbarrier.arrive(other_turn)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    p8, l_tile, alpha, m_i, e_i = _zyfa_p(s, m_i, e_i, c, c8, mad_bias, e_cap)
    l_i = l_i * alpha + l_tile
    p8 = gl.convert_layout(p8, p_l)
    for j in range(1, n):
        st = j % STAGES
        pst = (j - 1) % STAGES
        mbarrier.wait(full.index(st), (j // STAGES) & 1)
        mbarrier.wait(my_turn, (j & 1) ^ PAR0)
        # ---- my GEMM section: S_j and the fresh P_{j-1}·V_{j-1}
        s_tok = warpgroup_mma(qs, k_s.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        pv_tok = warpgroup_mma(p8, v_s.index(pst).permute((1, 0)), zero_o, use_acc=False, is_async=True)
        mbarrier.arrive(other_turn)
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_l))
        if LAG == 2:
            # groups retire in order: S_j done => P_{j-2}·V_{j-2} done, tile j-2 is free
            s = warpgroup_mma_wait(1, deps=[s_tok])
            mbarrier.arrive(empty.index((j + STAGES - 2) % STAGES), pred=j >= 2)
            p8n, l_tile, alpha, m_i, e_i = _zyfa_p(s, m_i, e_i, c, c8, mad_bias, e_cap)
            l_i = l_i * alpha + l_tile
            p8n = gl.convert_layout(p8n, p_l)
            pv = warpgroup_mma_wait(0, deps=[pv_tok])
            acc = acc * alpha_o[:, None] + pv
        else:
            pv = warpgroup_mma_wait(0, deps=[pv_tok])
            s = warpgroup_mma_wait(0, deps=[s_tok])
            mbarrier.arrive(empty.index(pst))
            acc = acc * alpha_o[:, None] + pv
            p8n, l_tile, alpha, m_i, e_i = _zyfa_p(s, m_i, e_i, c, c8, mad_bias, e_cap)
            l_i = l_i * alpha + l_tile
            p8n = gl.convert_layout(p8n, p_l)
        p8 = p8n
    # ---- last P·V, in turn
    lst = (n - 1) % STAGES
    mbarrier.wait(my_turn, (n & 1) ^ PAR0)
    pv_tok = warpgroup_mma(p8, v_s.index(lst).permute((1, 0)), zero_o, use_acc=False, is_async=True)
    mbarrier.arrive(other_turn)
    pv = warpgroup_mma_wait(0, deps=[pv_tok])
    mbarrier.arrive(empty.index(lst))
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None] + pv
    _epilogue(acc, l_i, m_i, e_i, vd, O, LSE, bh, gl.program_id(0) * 2 * BM + WG * BM, seq_q, o_l, D, BM)


@gluon.jit
def _pp_consumer_a(O, LSE, QD, KD, VD, seq_q, seq_k, heads_q, heads_kv, sm_scale_log2e, mad_bias, e_cap,
                   q_s, k_s, v_s, q_bar, full, empty, turn, cfg):
    _pp_consumer(O, LSE, QD, KD, VD, seq_q, seq_k, heads_q, heads_kv, sm_scale_log2e, mad_bias, e_cap,
                 q_s, k_s, v_s, q_bar, full, empty, turn, cfg, 0)


@gluon.jit
def _pp_consumer_b(O, LSE, QD, KD, VD, seq_q, seq_k, heads_q, heads_kv, sm_scale_log2e, mad_bias, e_cap,
                   q_s, k_s, v_s, q_bar, full, empty, turn, cfg):
    _pp_consumer(O, LSE, QD, KD, VD, seq_q, seq_k, heads_q, heads_kv, sm_scale_log2e, mad_bias, e_cap,
                 q_s, k_s, v_s, q_bar, full, empty, turn, cfg, 1)


@gluon.jit
def attn_fwd_gluon_pingpong(Q, K, VT, O, LSE, QD, KD, VD, seq_q, seq_k, heads_q, heads_kv, sm_scale_log2e,
                            mad_bias, e_cap, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                            STAGES: gl.constexpr, LAG: gl.constexpr, REG_B: gl.constexpr, REG_LOAD: gl.constexpr):
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    q_s = gl.allocate_shared_memory(gl.float8e4nv, [2, BM, D], smem)
    k_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, D], smem)
    v_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, D, BN], smem)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    # constexprs do not pass through warp_specialize's argument tuples: LAG travels as this dummy's shape
    cfg = gl.allocate_shared_memory(gl.int8, [LAG, 16], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    fence_async_shared()
    cargs = (O, LSE, QD, KD, VD, seq_q, seq_k, heads_q, heads_kv, sm_scale_log2e, mad_bias, e_cap,
             q_s, k_s, v_s, q_bar, full, empty, turn, cfg)
    gl.warp_specialize([
        (_pp_consumer_a, cargs),
        (_pp_consumer_b, cargs),
        (_pp_loader, (Q, K, VT, seq_q, seq_k, heads_q, heads_kv, q_s, k_s, v_s, q_bar, full, empty)),
    ], [4, 1], [REG_B, REG_LOAD])


# ------------------------------------------------------------------------------------ configs and compile helpers

# PINGPONG=1 defaults: STAGES 4, LAG 2 measured best by the ping-pong prototype (H200; the kernel notebook in git
# history, reports/history.md; docs/KERNEL.md, "Tried and not kept")
PINGPONG_DEFAULTS = {"STAGES": 4, "LAG": 2, "REG_B": 240, "REG_LOAD": 24}
SIGNATURE = {"Q": "*fp8e4nv", "K": "*fp8e4nv", "VT": "*fp8e4nv", "O": "*bf16", "LSE": "*fp32", "QD": "*fp32",
             "KD": "*fp32", "VD": "*fp32", "seq_q": "i32", "seq_k": "i32", "heads_q": "i32", "heads_kv": "i32",
             "sm_scale_log2e": "fp32", "mad_bias": "fp32", "e_cap": "fp32"}


def kernel_and_constexprs(pingpong: bool, seq_k: int, config: dict | None = None):
    """(jit function, constexpr dict, rows per program) for one schedule."""
    cfg = dict(config or {})
    if pingpong:
        const = {"BM": ROWS_PER_WG, "BN": BLOCK_N, "D": HEAD_DIM, **PINGPONG_DEFAULTS}
        const.update({k: v for k, v in cfg.items() if k in PINGPONG_DEFAULTS})
        if const["LAG"] == 2 and const["STAGES"] < 3:
            raise ValueError("PINGPONG=1 with LAG=2 needs STAGES >= 3")
        return attn_fwd_gluon_pingpong, const, 2 * ROWS_PER_WG
    # UNROLL2=1 (two S register sets) spills with the per-tile flush's second accumulator (255 regs, 368 B stack
    # at sm_90a); UNROLL2=0 fits in 252 registers, no spills
    unroll = cfg.get("UNROLL2", 0)
    if unroll and (seq_k // BLOCK_N) % 2:
        raise ValueError("UNROLL2=1 needs an even number of KV tiles")
    const = {"BM": ROWS_PER_WG, "BN": BLOCK_N, "D": HEAD_DIM, "UNROLL2": int(unroll)}
    return attn_fwd_gluon_1wg, const, ROWS_PER_WG


def compile_sm90(pingpong: bool, config: dict | None = None, seq_k: int = 32768, ptx_options: str | None = None):
    """Compile for sm_90a without a GPU (Triton's bundled ptxas); returns the CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn, const, _ = kernel_and_constexprs(pingpong, seq_k, config)
    sig = dict(SIGNATURE, **{k: "constexpr" for k in const})
    src = GluonASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    opts = {"num_warps": 4, **({"ptx_options": ptx_options} if ptx_options else {})}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
