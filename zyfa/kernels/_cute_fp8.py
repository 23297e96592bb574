"""CuTe DSL FP8 (e4m3fn) attention forward for the H200 (sm_90a) with the ``zyfa-hopper`` numerics: the kernel
itself. Imported lazily (needs nvidia-cutlass-dsl); :mod:`zyfa.kernels.attention_cute` is the wrapper.

STATUS: the wrapper's docstring (:mod:`zyfa.kernels.attention_cute`): where it ran and with what result.

What one CTA computes: 128 query rows of one (batch, head), as two 64-row tiles, against every KV tile of 128 keys
that any of its rows can see, per KV tile in the order of the Triton kernel's ``_softmax_pv_tile``
(``zyfa/kernels/_triton_fp8.py``; ``zyfa/emulator_tile.py`` has the same steps for the emulator):

1. S = Q8·K8ᵀ on the FP8 wgmma (m64n128k32, e4m3 x e4m3 -> f32), Q and K from shared memory.
2. Mask (bottom-right causal, keys past the end) to -inf; row max m_tile = max(S)·c, with
   c = (sm_scale·log2e·q_descale)·k_descale; m_new = max(m, m_tile); alpha = 2^(m - m_new).
3. P exponent per row and tile (pow2_block, technique 3): e = min(floor(log2 448 - t_max), p_block_max_log2),
   kept where the row has nothing unmasked; alpha times 2^(e_new - e).
4. P codes by technique 1 (the MAD): y = fma.rn.sat(s, 8c/128, (bias + 8(e - m))/128), clamped at 126/128 (left out
   where the CTA's bound shows it cannot bind: ``MAD_CVT`` 6), the code the low byte of y + 1.5·2^16 (the
   magic-number add). No exp2 per score: the only ex2 is alpha's, one per row.
5. Row sum of the rounded P, decoded from the codes ((code << 20) as fp32 times 2^120); or, with ``rowsum_mma``
   (recipe field ``rowsum='rounded_mma'``), P8·ones on an m64n8 wgmma in P·V's group (the ones tile in shared
   memory, written once), added into l at the flush: l = l·alpha + P·ones, the Triton kernel's order.
6. P·V on the FP8 wgmma with P from registers (the codes packed four to a register) and Vᵀ from shared memory, a
   fresh product each tile added into the fp32 accumulator (acc·alpha + P·V: ``accum_flush_tiles=1``). Vᵀ's keys
   come in :func:`zyfa.kernels.attention_fp8.k32_key_order` within each 32-key step (``prepare_vt(v,
   permute_k32=True)``), so each thread's S accumulator registers are already its P operand's keys: only a byte
   permutation inside the thread, no shuffle.

After the last tile (:func:`zyfa.kernels._cute_epilogue.store_output`): O = acc / l (div.rn's bits) times V's
descale, bf16 RNE; LSE = (m + log2 l - e)·ln 2.

Schedule (technique 2, ping-pong): 3 warpgroups. Warpgroup 0 is the producer (setmaxnreg down to 24; one warp issues
TMA loads: both Q tiles once, then K and Vᵀ tiles into two ``kv_stages``-deep shared-memory pipelines, mbarriers
with transaction counts). Warpgroups 1 and 2 are consumers (setmaxnreg up to 240), each owning one 64-row Q tile.
Each consumer step issues S_j = Q·K_j and P_{j-1}·V_{j-1} together, inside a turn given by two named barriers
(``bar.sync`` on its own, ``bar.arrive`` on the other's): while one warpgroup's wgmma run, the other does its
softmax. Both consumers walk the same KV tiles (the CTA's range); a tile that is fully masked for some row leaves
that row's state unchanged bit for bit (alpha 1, no code, e kept), as in the Triton kernel's shorter range. Causal
grids run the row blocks from the last (the most KV tiles) to the first, as the Triton kernel does.

Forms (compile-time, every one the same bits): :func:`zyfa.kernels.cute_plan.cute_config` says what each does.
At d_v 256, P_{j-1}·V_{j-1} runs first in the turn, in column blocks (:meth:`pv_chunked`), then S_j.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cutlass_dsl import Float32, Int32, Uint32

from zyfa.kernels._cute_epilogue import store_output
from zyfa.kernels._cute_ptx import keep_live
from zyfa.kernels._cute_schedule import BLOCK_N, CuteSchedule
from zyfa.kernels._cute_softmax import CuteSoftmax
from zyfa.kernels.cute_plan import PV_WHOLE_MAX
from zyfa.kernels.kernel_plan import FP8_MAX_SQ

BLOCK_M_WG = 64  # query rows per consumer warpgroup
NUM_CONSUMERS = 2
THREADS_PER_WG = 128
REGS_PRODUCER = 24
REGS_CONSUMER = 240
# named barriers (0 is __syncthreads): consumer warpgroup w waits on ORDER_BAR0 + w for its turn
ORDER_BAR0 = 1
# MAD_CVT values as the Triton kernel names them (zyfa.kernels.tuning; cute_plan.cute_config says what each does)
MAD_CVT_CLAMPED = 3
MAD_CVT_GUARDED = 6
# rowsum 'rounded_mma': P8·ones on the wgmma, m64n8 (the smallest N), every byte of the ones tile e4m3 1.0 (0x38)
ONES_N = 8
ONES_WORD = 0x38383838


class CuteFp8Attention(CuteSchedule, CuteSoftmax):
    """One compiled forward for fixed shapes (all static) and the ``zyfa-hopper`` numerics.

    Operands (global memory, contiguous): Q (b·h, s_q, d_qk), K (b·h_kv, s_k, d_qk), Vᵀ (b·h_kv, d_v, s_k_pad) from
    ``prepare_vt(v, permute_k32=True)``, O (b·h, s_q, d_v) bf16, LSE (b·h, s_q) fp32, descales qd (b·h), kd and vd
    (b·h_kv) fp32. ``__call__`` takes their pointers and sm_scale·log2(e) as fp32.
    """

    def __init__(self, *, b: int, h: int, h_kv: int, s_q: int, s_k: int, s_k_pad: int, d_qk: int, d_v: int,
                 causal: bool, mad_bias: float, e_cap: float, mad_cvt: int, mask_split: bool, bookkeeping: bool,
                 pv_overlap: int, m_safe: float, rowsum_mma: bool, pv_block: int,
                 epilogue_rcp: bool, persistent: bool, sms: int, kv_stages: int = 2):
        self.b, self.h, self.h_kv = b, h, h_kv
        self.s_q, self.s_k, self.s_k_pad, self.d_qk, self.d_v = s_q, s_k, s_k_pad, d_qk, d_v
        self.causal = causal
        self.mad_bias = float(mad_bias)
        self.e_cap = float(e_cap)
        self.mad_cvt = mad_cvt
        self.mask_split = bool(mask_split)
        self.bookkeeping = bool(bookkeeping)
        self.pv_overlap = int(pv_overlap)  # 0, 1 (every KV loop) or 2 (the loops without the mask's code)
        self.rowsum_mma = bool(rowsum_mma)
        self.epilogue_rcp = bool(epilogue_rcp)
        self.m_safe = float(m_safe)
        self.kv_stages = kv_stages
        self.pv_n = d_v if d_v <= PV_WHOLE_MAX else pv_block  # P·V's columns per wgmma and fresh accumulator
        self.pv_chunks = d_v // self.pv_n
        self.pv_buffers = 2 if self.pv_n < 64 else 1  # fresh accumulators of the blocks (pv_chunked)
        # PV_BLOCK's values and PV_OVERLAP's refusal above PV_WHOLE_MAX: cute_plan.cute_config and check_form
        self.group = h // h_kv
        self.block_m = BLOCK_M_WG * NUM_CONSUMERS
        self.block_n = BLOCK_N
        self.n_blocks_m = -(-s_q // self.block_m)
        # PERSISTENT: one CTA per SM (sms: the device's, checked by compile_for), each taking work items (row block,
        # head) pass by pass
        self.persistent = bool(persistent)
        self.n_items = self.n_blocks_m * b * h
        self.n_ctas = min(sms, self.n_items) if self.persistent else 1
        self.n_passes = -(-self.n_items // self.n_ctas)
        self.dtype = cutlass.Float8E4M3FN

    # ------------------------------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, q_ptr: cute.Pointer, k_ptr: cute.Pointer, vt_ptr: cute.Pointer, o_ptr: cute.Pointer,
                 lse_ptr: cute.Pointer, qd_ptr: cute.Pointer, kd_ptr: cute.Pointer, vd_ptr: cute.Pointer,
                 sm_scale_log2e: Float32):
        dq, dv, s_q, s_k, s_k_pad = self.d_qk, self.d_v, self.s_q, self.s_k, self.s_k_pad
        bh, bhk = self.b * self.h, self.b * self.h_kv
        mQ = cute.make_tensor(q_ptr, cute.make_layout((s_q, dq, bh), stride=(dq, 1, s_q * dq)))
        mK = cute.make_tensor(k_ptr, cute.make_layout((s_k, dq, bhk), stride=(dq, 1, s_k * dq)))
        mVt = cute.make_tensor(vt_ptr, cute.make_layout((dv, s_k_pad, bhk), stride=(s_k_pad, 1, dv * s_k_pad)))
        mO = cute.make_tensor(o_ptr, cute.make_layout((s_q, dv, bh), stride=(dv, 1, s_q * dv)))
        mLSE = cute.make_tensor(lse_ptr, cute.make_layout((s_q, bh), stride=(1, s_q)))
        mQD = cute.make_tensor(qd_ptr, cute.make_layout((bh,)))
        mKD = cute.make_tensor(kd_ptr, cute.make_layout((bhk,)))
        mVD = cute.make_tensor(vd_ptr, cute.make_layout((bhk,)))

        qk_mma = self.make_qk_mma()
        pv_mma = self.make_pv_mma()
        row = utils.LayoutEnum.ROW_MAJOR  # K-major A and B
        # Q: one 64-row tile per consumer warpgroup ("stage" w is warpgroup w's tile)
        sQ_layout = sm90_utils.make_smem_layout_a(row, (BLOCK_M_WG, BLOCK_N, dq), self.dtype, NUM_CONSUMERS)
        sK_layout = sm90_utils.make_smem_layout_b(row, (BLOCK_M_WG, BLOCK_N, dq), self.dtype, self.kv_stages)
        sV_layout = sm90_utils.make_smem_layout_b(row, (BLOCK_M_WG, dv, BLOCK_N), self.dtype, self.kv_stages)
        # rowsum_mma: the B operand of P8·ones, ONES_N columns of e4m3 ones (every byte 0x38, so the swizzle
        # does not matter when it is filled), written once before the pipelines start
        sOnes_layout = sm90_utils.make_smem_layout_b(row, (BLOCK_M_WG, ONES_N, BLOCK_N), self.dtype, 1)

        g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, mQ, cute.slice_(sQ_layout, (None, None, 0)),
                                                           (BLOCK_M_WG, dq))
        tma_k, tK = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, mK, cute.slice_(sK_layout, (None, None, 0)),
                                                           (BLOCK_N, dq))
        tma_v, tV = cute.nvgpu.cpasync.make_tiled_tma_atom(g2s, mVt, cute.slice_(sV_layout, (None, None, 0)),
                                                           (dv, BLOCK_N))
        self.q_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, 0))) * NUM_CONSUMERS
        self.k_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sK_layout, (None, None, 0)))
        self.v_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sV_layout, (None, None, 0)))

        @cute.struct
        class SharedStorage:
            q_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            k_mbar: cute.struct.MemRange[cutlass.Int64, self.kv_stages * 2]
            v_mbar: cute.struct.MemRange[cutlass.Int64, self.kv_stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sOnes: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sOnes_layout)], 1024]

        self.shared_storage = SharedStorage
        self.kernel(qk_mma, pv_mma, tma_q, tQ, tma_k, tK, tma_v, tV, mO, mLSE, mQD, mKD, mVD, sm_scale_log2e,
                    sQ_layout, sK_layout, sV_layout, sOnes_layout).launch(
            grid=(self.n_ctas, 1, 1) if self.persistent else (self.n_blocks_m, bh, 1),
            block=[THREADS_PER_WG * (1 + NUM_CONSUMERS), 1, 1], min_blocks_per_mp=1)

    # ------------------------------------------------------------------------------------------ the kernel
    @cute.kernel
    def kernel(self, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma, tma_q: cute.CopyAtom, tQ: cute.Tensor,
               tma_k: cute.CopyAtom, tK: cute.Tensor, tma_v: cute.CopyAtom, tV: cute.Tensor, mO: cute.Tensor,
               mLSE: cute.Tensor, mQD: cute.Tensor, mKD: cute.Tensor, mVD: cute.Tensor, sm_scale_log2e: Float32,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               sOnes_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bx, bh, _ = cute.arch.block_idx()
        mb = bx
        if cutlass.const_expr(self.causal):
            mb = self.n_blocks_m - 1 - bx  # the heavy (late) row blocks first, as the Triton kernel orders them
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // THREADS_PER_WG)
        bhk = self.kv_head(bh)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, NUM_CONSUMERS * THREADS_PER_WG // 32)
        q_pipe = pipeline.PipelineTmaAsync.create(barrier_storage=storage.q_mbar.data_ptr(), num_stages=1,
                                                  producer_group=producer, consumer_group=consumers,
                                                  tx_count=self.q_bytes, defer_sync=True)
        k_pipe = pipeline.PipelineTmaAsync.create(barrier_storage=storage.k_mbar.data_ptr(),
                                                  num_stages=self.kv_stages, producer_group=producer,
                                                  consumer_group=consumers, tx_count=self.k_bytes, defer_sync=True)
        v_pipe = pipeline.PipelineTmaAsync.create(barrier_storage=storage.v_mbar.data_ptr(),
                                                  num_stages=self.kv_stages, producer_group=producer,
                                                  consumer_group=consumers, tx_count=self.v_bytes, defer_sync=True)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        n_tiles, n_full = self.kv_range(mb)

        if cutlass.const_expr(self.rowsum_mma):
            words = cute.recast_tensor(storage.sOnes.get_tensor(cute.make_layout(cute.cosize(sOnes_layout))), Uint32)
            for i in cutlass.range_constexpr(-(-cute.size(words) // (THREADS_PER_WG * (1 + NUM_CONSUMERS)))):
                idx = tidx + i * THREADS_PER_WG * (1 + NUM_CONSUMERS)
                if idx < cute.size(words):
                    words[idx] = Uint32(ONES_WORD)
            cute.arch.fence_view_async_shared()  # generic-proxy stores, read by wgmma (the async proxy)

        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        if wg == 0:
            # ---------------------------------------------------------------- producer warpgroup
            cute.arch.setmaxregister_decrease(REGS_PRODUCER)
            if warp_idx == 0:
                gQ = cute.local_tile(tQ, (BLOCK_M_WG, self.d_qk), (None, 0, None))
                tQs, tQg = cute.nvgpu.cpasync.tma_partition(tma_q, 0, cute.make_layout(1),
                                                            cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
                gK = cute.local_tile(tK, (BLOCK_N, self.d_qk), (None, 0, None))
                tKs, tKg = cute.nvgpu.cpasync.tma_partition(tma_k, 0, cute.make_layout(1),
                                                            cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
                gV = cute.local_tile(tV, (self.d_v, BLOCK_N), (0, None, None))
                tVs, tVg = cute.nvgpu.cpasync.tma_partition(tma_v, 0, cute.make_layout(1),
                                                            cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
                loads = (q_pipe, k_pipe, v_pipe, tma_q, tQs, tQg, tma_k, tKs, tKg, tma_v, tVs, tVg)
                if cutlass.const_expr(self.persistent):
                    t0 = Int32(0)  # KV tiles of the CTA's earlier items: the pipelines' stages go on from there
                    for it in cutlass.range(self.n_passes, unroll=1):
                        g = self.item_index(bx, it)
                        if g < self.n_items:
                            mb_g, bh_g = self.item(g)
                            n_g, _ = self.kv_range(mb_g)
                            self.produce_item(loads, mb_g, bh_g, self.kv_head(bh_g), n_g, it, t0)
                            t0 = t0 + n_g
                else:
                    self.produce_item(loads, mb, bh, bhk, n_tiles, None, None)
        else:
            # ---------------------------------------------------------------- consumer warpgroups
            cute.arch.setmaxregister_increase(REGS_CONSUMER)
            w = wg - 1
            thr = tidx % THREADS_PER_WG
            qk_thr = qk_mma.get_slice(thr)
            pv_thr = pv_mma.get_slice(thr)
            tSrQ = qk_mma.make_fragment_A(qk_thr.partition_A(sQ))
            tSrK = qk_mma.make_fragment_B(qk_thr.partition_B(sK))
            tOrV = pv_mma.make_fragment_B(pv_thr.partition_B(sV))
            if cutlass.const_expr(self.pv_chunks > 1):  # one B fragment per column block of Vᵀ (its rows)
                tOrV = tuple(pv_mma.make_fragment_B(pv_thr.partition_B(
                    cute.local_tile(sV, (self.pv_n, BLOCK_N), (b, 0, None)))) for b in range(self.pv_chunks))
            acc_s = qk_thr.make_fragment_C(qk_thr.partition_shape_C((BLOCK_M_WG, BLOCK_N)))
            acc_pv = pv_thr.make_fragment_C(pv_thr.partition_shape_C((BLOCK_M_WG, self.pv_n)))
            if cutlass.const_expr(self.pv_chunks > 1):  # the column blocks' fresh products (pv_chunked)
                acc_pv = (acc_pv,) + tuple(pv_thr.make_fragment_C(pv_thr.partition_shape_C((BLOCK_M_WG, self.pv_n)))
                                           for _ in range(self.pv_buffers - 1))
            acc_o = pv_thr.make_fragment_C(pv_thr.partition_shape_C((BLOCK_M_WG, self.d_v)))
            # rowsum_mma: the tile's row sums as P8·ones (every column the same sum), fresh each tile like acc_pv
            tOrOnes = None
            acc_l = None
            if cutlass.const_expr(self.rowsum_mma):
                ones_mma = self.make_pv_mma(ONES_N)
                ones_thr = ones_mma.get_slice(thr)
                sOnes = storage.sOnes.get_tensor(sOnes_layout.outer, swizzle=sOnes_layout.inner)
                tOrOnes = ones_mma.make_fragment_B(ones_thr.partition_B(sOnes))
                acc_l = ones_thr.make_fragment_C(ones_thr.partition_shape_C((BLOCK_M_WG, ONES_N)))
            tOrP = pv_thr.make_fragment_A(pv_thr.partition_shape_A((BLOCK_M_WG, BLOCK_N)))
            p_u32 = cute.recast_tensor(tOrP, Uint32)
            # with pv_overlap, tile j's codes and alpha go here while P_{j-1}·V_{j-1} still reads p_u32
            p_next = p_u32
            if cutlass.const_expr(self.pv_overlap):
                p_next = cute.make_rmem_tensor(cute.size(p_u32), Uint32)
            # (row, key) of each S register within its tile; (row, column) of each O register
            tScS = qk_thr.partition_C(cute.make_identity_tensor((BLOCK_M_WG, BLOCK_N)))
            tOcO = pv_thr.partition_C(cute.make_identity_tensor((BLOCK_M_WG, self.d_v)))
            # per-thread row state for its two rows (r and r + 8): running max, sum, P exponent, pending alpha
            m_i = cute.make_rmem_tensor((2,), Float32)
            l_i = cute.make_rmem_tensor((2,), Float32)
            e_i = cute.make_rmem_tensor((2,), Float32)
            alpha = cute.make_rmem_tensor((2,), Float32)
            alpha_next = alpha
            if cutlass.const_expr(self.pv_overlap):
                alpha_next = cute.make_rmem_tensor((2,), Float32)
            frags = (q_pipe, k_pipe, v_pipe, tSrQ, tSrK, tOrV, tOrP, acc_s, acc_pv, acc_o, tScS, tOcO, p_u32,
                     p_next, m_i, l_i, e_i, alpha, alpha_next, tOrOnes, acc_l, w, thr)
            outs = (mO, mLSE, mQD, mKD, mVD, sm_scale_log2e)
            if cutlass.const_expr(self.persistent):
                # the turns go on from item to item: the first is warpgroup 0's, and warpgroup 0 takes the last
                # arrive of warpgroup 1 after the CTA's last item
                if w == 1:
                    cute.arch.barrier_arrive(barrier_id=ORDER_BAR0, number_of_threads=2 * THREADS_PER_WG)
                t0 = Int32(0)
                for it in cutlass.range(self.n_passes, unroll=1):
                    g = self.item_index(bx, it)
                    if g < self.n_items:
                        mb_g, bh_g = self.item(g)
                        n_g, full_g = self.kv_range(mb_g)
                        self.consume_item(frags, outs, mb_g, bh_g, self.kv_head(bh_g), n_g, full_g, it, t0)
                        t0 = t0 + n_g
                if w == 0:
                    cute.arch.barrier(barrier_id=ORDER_BAR0, number_of_threads=2 * THREADS_PER_WG)
            else:
                self.consume_item(frags, outs, mb, bh, bhk, n_tiles, n_full, None, None)

    @cute.jit
    def produce_item(self, loads, mb: Int32, bh: Int32, bhk: Int32, n_tiles: Int32, it, t0):
        """The TMA loads of one work item: its two Q tiles, then its K and Vᵀ tiles into the stage pipelines.
        ``it``/``t0`` (``PERSISTENT``): the CTA's items and KV tiles before this one (None: the CTA's only item)."""
        q_pipe, k_pipe, v_pipe, tma_q, tQs, tQg, tma_k, tKs, tKg, tma_v, tVs, tVg = loads
        if cutlass.const_expr(it is None):
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        else:
            q_state = self.stage(it, True, 1)
        q_pipe.producer_acquire(q_state)
        for w in cutlass.range_constexpr(NUM_CONSUMERS):
            cute.copy(tma_q, tQg[(None, mb * NUM_CONSUMERS + w, bh)], tQs[(None, w)],
                      tma_bar_ptr=q_pipe.producer_get_barrier(q_state))
        for j in cutlass.range(n_tiles, unroll=1):
            st = self.kv_stage(t0, j, True)
            k_pipe.producer_acquire(st)
            cute.copy(tma_k, tKg[(None, j, bhk)], tKs[(None, st.index)],
                      tma_bar_ptr=k_pipe.producer_get_barrier(st))
            v_pipe.producer_acquire(st)
            cute.copy(tma_v, tVg[(None, j, bhk)], tVs[(None, st.index)],
                      tma_bar_ptr=v_pipe.producer_get_barrier(st))

    @cute.jit
    def consume_item(self, frags, outs, mb: Int32, bh: Int32, bhk: Int32, n_tiles: Int32, n_full: Int32, it, t0):
        """One consumer warpgroup's work item: its 64 rows against the item's KV tiles, then O and LSE stored.
        ``it``/``t0`` as in :meth:`produce_item`; with them (``PERSISTENT``) Q's stage is released once the item's
        last S is done, so that the next item's Q loads under this one's last P·V and store, and the turns' first
        arrive and last wait are the caller's."""
        (q_pipe, k_pipe, v_pipe, tSrQ, tSrK, tOrV, tOrP, acc_s, acc_pv, acc_o, tScS, tOcO, p_u32, p_next, m_i, l_i,
         e_i, alpha, alpha_next, tOrOnes, acc_l, w, thr) = frags
        mO, mLSE, mQD, mKD, mVD, sm_scale_log2e = outs
        my_bar = ORDER_BAR0 + w
        other_bar = ORDER_BAR0 + 1 - w
        for r in cutlass.range_constexpr(2):
            m_i[r] = -Float32.inf
            l_i[r] = Float32(0.0)
            e_i[r] = Float32(0.0)
            alpha[r] = Float32(1.0)
        acc_o.fill(0.0)

        c = sm_scale_log2e * mQD[bh] * mKD[bhk]
        c8n = (c * Float32(8.0)) * Float32(0.0078125)
        row0 = mb * self.block_m + w * BLOCK_M_WG  # first query row of this warpgroup

        if cutlass.const_expr(it is None):
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        else:
            q_state = self.stage(it, False, 1)
        q_pipe.consumer_wait(q_state)

        if cutlass.const_expr(it is None):  # noqa: SIM102 - a compile-time test around a runtime one
            if w == 1:
                cute.arch.barrier_arrive(barrier_id=ORDER_BAR0, number_of_threads=2 * THREADS_PER_WG)
        if n_tiles > 0:
            # tile 0: S only
            k_state = self.kv_stage(t0, Int32(0), False)
            k_pipe.consumer_wait(k_state)
            cute.arch.barrier(barrier_id=my_bar, number_of_threads=2 * THREADS_PER_WG)
            self.s_alone(tSrQ, tSrK, acc_s, w, k_pipe, k_state, other_bar)
            self.softmax_tile(acc_s, tScS, p_u32, m_i, l_i, e_i, alpha, c, c8n, row0, Int32(0),
                              Int32(0) >= n_full)
            ops = (k_pipe, v_pipe, my_bar, other_bar, tSrQ, tSrK, tOrV, tOrP, acc_s, acc_pv, acc_o, tScS, p_u32,
                   m_i, l_i, e_i, alpha, c, c8n, row0, w, p_next, alpha_next, tOrOnes, acc_l, t0)
            if cutlass.const_expr(self.mask_split):
                # the tiles that every row of the CTA sees whole run without the mask's code; the others with it
                n_open = cutlass.max(cutlass.min(n_full, n_tiles), Int32(1))
                self.guarded_kv_loop(ops, c, Int32(1), n_open, n_full, False)
                self.kv_loop(ops, n_open, n_tiles, n_full, True, True)
            else:
                self.guarded_kv_loop(ops, c, Int32(1), n_tiles, n_full, None)
            if cutlass.const_expr(it is not None):
                q_pipe.consumer_release(q_state)  # every S of the item is done
            # the last tile's P·V
            v_state = self.kv_stage(t0, n_tiles - 1, False)
            v_pipe.consumer_wait(v_state)
            cute.arch.barrier(barrier_id=my_bar, number_of_threads=2 * THREADS_PER_WG)
            if cutlass.const_expr(self.pv_chunks > 1):
                self.pv_chunked(tOrP, tOrV, acc_pv, acc_o, alpha, l_i, v_state.index, tOrOnes, acc_l)
                cute.arch.barrier_arrive(barrier_id=other_bar, number_of_threads=2 * THREADS_PER_WG)
                v_pipe.consumer_release(v_state)
            else:
                cute.nvgpu.warpgroup.fence()
                self.gemm_pv(tOrP, tOrV, acc_pv, v_state.index, tOrOnes, acc_l)
                cute.nvgpu.warpgroup.commit_group()
                cute.arch.barrier_arrive(barrier_id=other_bar, number_of_threads=2 * THREADS_PER_WG)
                cute.nvgpu.warpgroup.wait_group(0)
                v_pipe.consumer_release(v_state)
                self.flush_pv(acc_o, acc_pv, alpha, l_i, acc_l)
        if cutlass.const_expr(it is not None):  # noqa: SIM102 - as above
            if n_tiles == 0:
                q_pipe.consumer_release(q_state)
        if cutlass.const_expr(it is None):  # noqa: SIM102 - as above
            if w == 0:
                # consume the other warpgroup's last arrive (its turns and ours then balance)
                cute.arch.barrier(barrier_id=ORDER_BAR0, number_of_threads=2 * THREADS_PER_WG)
        store_output(acc_o, tOcO, m_i, l_i, e_i, mO, mLSE, mVD[bhk], bh, row0, thr, self.s_q, self.epilogue_rcp)

    # ------------------------------------------------------------------------------------------ pieces
    @cute.jit
    def guarded_kv_loop(self, ops, c: Float32, lo: Int32, hi: Int32, n_full: Int32, masked):
        """:meth:`kv_loop` over tiles [lo, hi), without the clamp at code 126 where ``MAD_CVT`` is 6 and the CTA's
        bound d_qk·448²·c (``c``: its score scale) is within mad_m_safe (the Triton kernel's guard): the same codes."""
        if cutlass.const_expr(self.mad_cvt == MAD_CVT_GUARDED):
            if Float32(self.d_qk * FP8_MAX_SQ) * c <= Float32(self.m_safe):
                self.kv_loop(ops, lo, hi, n_full, masked, False)
            else:
                self.kv_loop(ops, lo, hi, n_full, masked, True)
        else:
            self.kv_loop(ops, lo, hi, n_full, masked, True)

    @cute.jit
    def kv_loop(self, ops, lo: Int32, hi: Int32, n_full: Int32, masked, clamp):
        """KV tiles [lo, hi) of a consumer warpgroup, tile j's turn issuing S_j and P_{j-1}·V_{j-1}, then flushing
        P_{j-1}·V_{j-1} and tile j's softmax. ``masked``: True (every tile through the mask), False (none: tiles
        every row sees whole), None (tile j when j >= n_full); ``clamp``: the fp32 min at code 126 (both
        compile-time). With ``pv_overlap`` 1 (2: only where ``masked`` is False) the matmuls are two wgmma groups;
        tile j's softmax runs once S_j is done (``wait_group(1)``), its codes and alpha into ``p_next`` and
        ``alpha_next`` while P_{j-1}·V_{j-1} reads ``p_u32``; that product is flushed with tile j-1's alpha, then tile
        j's move into place (same operations). Either way a loop ends with tile j's codes in ``p_u32`` and its alpha
        in ``alpha``, P_j·V_j not yet issued, so loops of either kind follow each other."""
        (k_pipe, v_pipe, my_bar, other_bar, tSrQ, tSrK, tOrV, tOrP, acc_s, acc_pv, acc_o, tScS, p_u32,
         m_i, l_i, e_i, alpha, c, c8n, row0, w, p_next, alpha_next, tOrOnes, acc_l, t0) = ops
        # PV_OVERLAP 2 leaves the masked loop out: there ptxas packs the tile's mask predicates into registers
        # inside the turn to keep them across the wait (docs/KERNEL.md, "Forms")
        overlap = self.pv_overlap == 1 or (self.pv_overlap == 2 and masked is False)
        for j in cutlass.range(lo, hi, unroll=1):
            # S_j and P_{j-1}·V_{j-1} in one turn
            k_state = self.kv_stage(t0, j, False)
            v_state = self.kv_stage(t0, j - 1, False)
            k_pipe.consumer_wait(k_state)
            v_pipe.consumer_wait(v_state)
            cute.arch.barrier(barrier_id=my_bar, number_of_threads=2 * THREADS_PER_WG)
            mask_j = j >= n_full if cutlass.const_expr(masked is None) else masked
            if cutlass.const_expr(self.pv_chunks > 1):
                # P_{j-1}·V_{j-1} in column blocks, each flushed as the next runs; then S_j into the registers the
                # products left (both at once would need 2 x 64 more than a consumer thread has)
                self.pv_chunked(tOrP, tOrV, acc_pv, acc_o, alpha, l_i, v_state.index, tOrOnes, acc_l)
                v_pipe.consumer_release(v_state)
                self.s_alone(tSrQ, tSrK, acc_s, w, k_pipe, k_state, other_bar)
                self.softmax_tile(acc_s, tScS, p_u32, m_i, l_i, e_i, alpha, c, c8n, row0, j, mask_j, clamp)
            else:
                cute.nvgpu.warpgroup.fence()
                self.gemm_qk(tSrQ, tSrK, acc_s, w, k_state.index)
                if cutlass.const_expr(overlap):
                    cute.nvgpu.warpgroup.commit_group()
                self.gemm_pv(tOrP, tOrV, acc_pv, v_state.index, tOrOnes, acc_l)
                cute.nvgpu.warpgroup.commit_group()
                cute.arch.barrier_arrive(barrier_id=other_bar, number_of_threads=2 * THREADS_PER_WG)
                if cutlass.const_expr(overlap):
                    cute.nvgpu.warpgroup.wait_group(1)
                    k_pipe.consumer_release(k_state)
                    self.softmax_tile(acc_s, tScS, p_next, m_i, l_i, e_i, alpha_next, c, c8n, row0, j, mask_j, clamp)
                    cute.nvgpu.warpgroup.wait_group(0)
                    v_pipe.consumer_release(v_state)
                    self.flush_pv(acc_o, acc_pv, alpha, l_i, acc_l)
                    for i in cutlass.range_constexpr(cute.size(p_u32)):
                        keep_live(p_u32[i])  # P_{j-1}'s codes live to here, so tile j's never share their registers
                        p_u32[i] = p_next[i]
                    for r in cutlass.range_constexpr(2):
                        alpha[r] = alpha_next[r]
                else:
                    cute.nvgpu.warpgroup.wait_group(0)
                    k_pipe.consumer_release(k_state)
                    v_pipe.consumer_release(v_state)
                    self.flush_pv(acc_o, acc_pv, alpha, l_i, acc_l)
                    self.softmax_tile(acc_s, tScS, p_u32, m_i, l_i, e_i, alpha, c, c8n, row0, j, mask_j, clamp)

    def kv_stage(self, t0, j: Int32, producer: bool) -> pipeline.PipelineState:
        """The K/Vᵀ pipelines' state for the item's KV tile j: :meth:`stage` of j, or of t0 + j after the CTA's
        t0 earlier tiles (``PERSISTENT``; ``t0`` None otherwise)."""
        return self.stage(j if cutlass.const_expr(t0 is None) else t0 + j, producer)

    def stage(self, j: Int32, producer: bool, stages: int = 0) -> pipeline.PipelineState:
        """The K/Vᵀ pipelines' state for KV tile j, derived from j (no state object carried through staged control
        flow): stage j mod kv_stages, phase the parity of j div kv_stages (the producer's starts flipped). With
        ``bookkeeping`` and a power-of-two kv_stages, a mask and a shift: the same values for j >= 0 as the floor
        division and modulo of a signed int, without their sign corrections. ``stages``: another pipeline's depth
        (Q's, 1, in ``PERSISTENT``)."""
        n = stages or self.kv_stages
        if cutlass.const_expr(self.bookkeeping and n & (n - 1) == 0):
            phase = (j >> (n.bit_length() - 1)) & 1
            index = j & (n - 1)
        else:
            phase = (j // n) % 2
            index = j % n
        if cutlass.const_expr(producer):
            phase = phase ^ 1
        return pipeline.PipelineState(n, j, index, phase)

    def make_qk_mma(self) -> cute.TiledMma:
        """S = Q·Kᵀ: one warpgroup, m64n128, e4m3 x e4m3 -> f32, both K-major from shared memory."""
        kmaj = cute.nvgpu.warpgroup.OperandMajorMode.K
        return sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, kmaj, kmaj, Float32, (1, 1, 1),
                                                 (BLOCK_M_WG, BLOCK_N))

    def make_pv_mma(self, n: int = 0) -> cute.TiledMma:
        """O = P·V: one warpgroup, m64n{pv_n} (d_v, or a column block of it), P (A) from registers, Vᵀ (B) K-major
        from shared memory. ``n``: another N for the same P (``ONES_N``: the row sum P8·ones of ``rowsum_mma``; an A
        operand's layout does not depend on N, so P's register fragment serves both)."""
        kmaj = cute.nvgpu.warpgroup.OperandMajorMode.K
        return sm90_utils.make_trivial_tiled_mma(self.dtype, self.dtype, kmaj, kmaj, Float32, (1, 1, 1),
                                                 (BLOCK_M_WG, n or self.pv_n), cute.nvgpu.warpgroup.OperandSource.RMEM)

    def s_alone(self, tSrQ, tSrK, acc_s, w, k_pipe, k_state, other_bar):
        """The end of a turn that issues S alone (tile 0, and at d 256 after P·V's column blocks): S = Q_w·K_stageᵀ
        issued and committed, the other warpgroup's turn handed over, S waited for and K's stage released."""
        cute.nvgpu.warpgroup.fence()
        self.gemm_qk(tSrQ, tSrK, acc_s, w, k_state.index)
        cute.nvgpu.warpgroup.commit_group()
        cute.arch.barrier_arrive(barrier_id=other_bar, number_of_threads=2 * THREADS_PER_WG)
        cute.nvgpu.warpgroup.wait_group(0)
        k_pipe.consumer_release(k_state)

    # The gemm helpers build their own TiledMma: its ACCUMULATE field is runtime state, and a value set inside one
    # staged loop body must not be read outside it.
    @cute.jit
    def gemm_qk(self, tSrQ: cute.Tensor, tSrK: cute.Tensor, acc_s: cute.Tensor, w: Int32,
                stage: Int32):
        """acc_s = Q_w · K_stageᵀ (a fresh accumulator)."""
        qk_mma = self.make_qk_mma()
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            qk_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, kb != 0)
            cute.gemm(qk_mma, acc_s, tSrQ[(None, None, kb, w)], tSrK[(None, None, kb, stage)], acc_s)

    @cute.jit
    def gemm_pv(self, tOrP: cute.Tensor, tOrV: cute.Tensor, acc_pv: cute.Tensor, stage: Int32, tOrOnes,
                acc_l, block: int = 0):
        """acc_pv = P · V_stage (a fresh accumulator: the tile's product, flushed into fp32 by flush_pv), or its
        column block ``block`` where d_v comes in blocks (:meth:`pv_chunked`); with ``rowsum_mma`` and ``tOrOnes``
        also acc_l = P · ones (fresh, in the same wgmma group), the tile's row sums on the unit."""
        pv_mma = self.make_pv_mma()
        for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            pv_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, kb != 0)
            v_frag = tOrV if cutlass.const_expr(self.pv_chunks == 1) else tOrV[block]
            cute.gemm(pv_mma, acc_pv, tOrP[(None, None, kb)], v_frag[(None, None, kb, stage)], acc_pv)
        if cutlass.const_expr(self.rowsum_mma and tOrOnes is not None):
            ones_mma = self.make_pv_mma(ONES_N)
            for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
                ones_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, kb != 0)
                cute.gemm(ones_mma, acc_l, tOrP[(None, None, kb)], tOrOnes[(None, None, kb, 0)], acc_l)

    @cute.jit
    def flush_pv(self, acc_o: cute.Tensor, acc_pv: cute.Tensor, alpha: cute.Tensor, l_i: cute.Tensor, acc_l,
                 block: int = 0):
        """acc = acc·alpha + P·V (per row alpha; register i of the m64 accumulator is row half (i // 2) % 2), over
        column block ``block`` of acc where d_v comes in blocks (acc's registers block by block, each in acc_pv's
        order); with ``rowsum_mma`` and ``acc_l`` also l = l·alpha + P·ones (registers 0 and 2 of acc_l: the
        thread's two rows, column 0), the Triton kernel's order for rowsum 'rounded_mma'."""
        n = cute.size(acc_pv)
        for i in cutlass.range_constexpr(n):
            acc_o[n * block + i] = acc_o[n * block + i] * alpha[(i // 2) % 2] + acc_pv[i]
        if cutlass.const_expr(self.rowsum_mma and acc_l is not None):
            for r in cutlass.range_constexpr(2):
                l_i[r] = l_i[r] * alpha[r] + acc_l[2 * r]

    @cute.jit
    def pv_chunked(self, tOrP: cute.Tensor, tOrV: cute.Tensor, acc_pv: tuple, acc_o: cute.Tensor,
                   alpha: cute.Tensor, l_i: cute.Tensor, stage: Int32, tOrOnes, acc_l):
        """P·V_stage for d_v > PV_WHOLE_MAX, flushed into acc (:meth:`flush_pv`, with alpha): the column blocks of
        pv_n one wgmma group each, through the fresh accumulators of ``acc_pv`` (two: block b flushed while block
        b + 1 runs; one: each block issued, waited for and flushed in turn); P·ones (``rowsum_mma``) in block 0's
        group, l updated at its flush. The same operations on every value as one whole product: a column's sum never
        meets another column's."""
        nbuf = len(acc_pv)
        for b in cutlass.range_constexpr(self.pv_chunks + 1):
            if cutlass.const_expr(b > 0 and nbuf == 1):
                cute.nvgpu.warpgroup.wait_group(0)
                self.flush_pv(acc_o, acc_pv[0], alpha, l_i, acc_l if b == 1 else None, b - 1)
            if cutlass.const_expr(b < self.pv_chunks):
                cute.nvgpu.warpgroup.fence()  # the flush of block b - nbuf read this accumulator's registers
                self.gemm_pv(tOrP, tOrV, acc_pv[b % nbuf], stage, tOrOnes if b == 0 else None, acc_l, b)
                cute.nvgpu.warpgroup.commit_group()
            if cutlass.const_expr(b > 0 and nbuf == 2):
                cute.nvgpu.warpgroup.wait_group(1 if b < self.pv_chunks else 0)
                self.flush_pv(acc_o, acc_pv[(b - 1) % 2], alpha, l_i, acc_l if b == 1 else None, b - 1)
