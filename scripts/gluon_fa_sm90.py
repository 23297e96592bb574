"""Prototype (not used by zyfa): FP8 attention forward in Gluon with the softmax overlapped with the next QK wgmma.

What plain Triton could not express on sm_90 (docs/kernel_notes.md, session 2): a wgmma left in flight while the
same warpgroup runs the softmax. Gluon's ``warpgroup_mma(..., is_async=True)`` / ``warpgroup_mma_wait`` make the
issue and the wait explicit. One warpgroup, 64 query rows, 128-key tiles, head dim 128, non-causal, seq_k a
multiple of 128; K and Vᵀ tiles double-buffered through TMA and mbarriers. Iteration j:

    wait K/V tile j+1 -> issue S_{j+1} = Q K_{j+1}ᵀ (async) -> softmax of S_j on the CUDA cores (overlaps it)
    -> rescale O, issue O += P_j V_j (async) -> wait(1): S_{j+1} done -> wait(0): O done -> refill the stage

P in e4m3fn with a fixed 2^8 scale (fa3's numerics; the ZYFA MAD would slot in where exp2 is). Usage:

    python scripts/gluon_fa_sm90.py --compile [--unroll2 0|1] [--ptxas -O1]   # sm_90a cubin, no GPU needed:
                                                  # registers and the wgmma / MUFU order in the SASS
    python scripts/gluon_fa_sm90.py --run       # H200: check against SDPA, time at 32K (hd128, 16 heads)

Finding (session 2): the PTX has S_{j+1}'s wgmma issued before the softmax as written, but ptxas 12.8 at its
default -O3 sinks it below the softmax (S_j and S_{j+1} share R88-R151: 173 registers, no overlap); with
-O1 the four k-steps of S_{j+1} are interleaved with the softmax's MUFU.EX2 (the overlap this file is for).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


@gluon.jit
def _tile_step(s, o, m_i, l_i, j, n, q_s, k_s, v_s, bars, k_desc, v_desc, c, zero_s,
               p_l: gl.constexpr, o_l: gl.constexpr, BN: gl.constexpr, kv_bytes: gl.constexpr):
    """KV tile j with S_j = s given; returns S_{j+1} (its wgmma in flight during this tile's softmax)."""
    st = j % 2
    nst = 1 - st
    has_next = j + 1 < n
    # ---- issue S_{j+1} (async); on the last tile it reads a stale stage and is discarded
    mbarrier.wait(bars.index(1 + nst), ((j + 1) // 2) & 1, pred=has_next)
    s_tok = warpgroup_mma(q_s, k_s.index(nst).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    # ---- softmax of S_j on the CUDA cores while the tensor cores compute S_{j+1}
    m_new = gl.maximum(m_i, gl.max(s, 1) * c)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * c - m_new[:, None]) * 256.0
    l_i = l_i * alpha + gl.sum(p, 1)
    p8 = gl.convert_layout(p.to(gl.float8e4nv), p_l)
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
    # ---- O += P_j V_j (async), then retire S_{j+1} (issued first, so wait(1) covers it) and O
    o_tok = warpgroup_mma(p8, v_s.index(st).permute((1, 0)), o, is_async=True)
    s_next = warpgroup_mma_wait(1, deps=[s_tok])
    o = warpgroup_mma_wait(0, deps=[o_tok])  # (an fp8 register operand cannot be a dep: bitwidth 8)
    # ---- stage st is free: prefetch tile j+2 into it
    has2 = j + 2 < n
    mbarrier.expect(bars.index(1 + st), kv_bytes, pred=has2)
    tma.async_copy_global_to_shared(k_desc, [(j + 2) * BN, 0], bars.index(1 + st), k_s.index(st), pred=has2)
    tma.async_copy_global_to_shared(v_desc, [0, (j + 2) * BN], bars.index(1 + st), v_s.index(st), pred=has2)
    return s_next, o, m_new, l_i


@gluon.jit
def gluon_attn_fwd(Q, K, VT, O, seq_q, seq_k, c,
                   BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, UNROLL2: gl.constexpr):
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 32])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=4)

    q_desc = tma.make_tensor_descriptor(Q + bh.to(gl.int64) * seq_q * D, [seq_q, D], [D, 1], [BM, D], smem)
    k_desc = tma.make_tensor_descriptor(K + bh.to(gl.int64) * seq_k * D, [seq_k, D], [D, 1], [BN, D], smem)
    v_desc = tma.make_tensor_descriptor(VT + bh.to(gl.int64) * D * seq_k, [D, seq_k], [seq_k, 1], [D, BN], smem)

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
    s = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), zero_s, use_acc=False)  # S_0 (prologue)

    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_l))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_l))
    o = gl.zeros([BM, D], gl.float32, o_l)
    if UNROLL2:
        # two tiles per trip (n even): S alternates between two register sets, so the S_{j+1} wgmma never
        # writes the registers the softmax of S_j is still reading (no loop-carried anti-dependence)
        for j2 in range(n // 2):
            s, o, m_i, l_i = _tile_step(s, o, m_i, l_i, 2 * j2, n, q_s, k_s, v_s, bars, k_desc, v_desc, c,
                                        zero_s, p_l, o_l, BN, kv_bytes)
            s, o, m_i, l_i = _tile_step(s, o, m_i, l_i, 2 * j2 + 1, n, q_s, k_s, v_s, bars, k_desc, v_desc, c,
                                        zero_s, p_l, o_l, BN, kv_bytes)
    else:
        for j in range(n):
            s, o, m_i, l_i = _tile_step(s, o, m_i, l_i, j, n, q_s, k_s, v_s, bars, k_desc, v_desc, c,
                                        zero_s, p_l, o_l, BN, kv_bytes)

    for i in gl.static_range(3):
        mbarrier.invalidate(bars.index(i))
    o = o / gl.convert_layout(l_i, gl.SliceLayout(1, o_l))[:, None]
    rows = pid_m * BM + gl.arange(0, BM, gl.SliceLayout(1, o_l))
    cols = gl.arange(0, D, gl.SliceLayout(0, o_l))
    ptrs = O + bh.to(gl.int64) * seq_q * D + rows[:, None].to(gl.int64) * D + cols[None, :]
    gl.store(ptrs, o.to(gl.bfloat16), mask=rows[:, None] < seq_q)


CONST = {"BM": 64, "BN": 128, "D": 128, "UNROLL2": 1}


def compile_sm90(ptx_options=None):
    import re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from scripts.gpu_compile_sm90 import sass_histogram

    sig = {"Q": "*fp8e4nv", "K": "*fp8e4nv", "VT": "*fp8e4nv", "O": "*bf16", "seq_q": "i32", "seq_k": "i32",
           "c": "fp32", **{k: "constexpr" for k in CONST}}
    fn = gluon_attn_fwd
    src = GluonASTSource(fn=fn, signature=sig,
                         constexprs={(fn.arg_names.index(k),): v for k, v in CONST.items()})
    opts = {"num_warps": 4, **({"ptx_options": ptx_options} if ptx_options else {})}
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    sass, ops = sass_histogram(ck.asm["cubin"])
    with open("/tmp/gluon_fa.sass", "w") as f:
        f.write(sass)
    res = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", sass)
    print("REG/STACK/SHARED/LOCAL", res.groups() if res else "?", "shared", ck.metadata.shared)
    print("  ".join(f"{k}={ops.get(k, 0)}" for k in ("QGMMA", "WARPGROUP", "MUFU", "FFMA", "FMNMX", "F2FP", "LDL",
                                                     "STL", "SYNCS", "UTMALDG")))
    # the order of wgmma issue / wait / softmax in the main loop
    for line in sass.splitlines():
        if re.search(r"QGMMA|WARPGROUP|MUFU.EX2|BRA|SYNCS.PHASECHK", line):
            print(line.strip()[:110])
    return ck


def run_h200(s=32768, h=16):
    """Correctness against SDPA and TFLOP/s, for UNROLL2 0/1 and ptxas -O3 (default) / -O1."""
    import torch
    import triton

    from zyfa.bench import flops, gaussian_qkv
    from zyfa.kernels._triton_fp8 import ensure_allocator

    ensure_allocator()
    d = CONST["D"]
    q, k, v = gaussian_qkv(1, h, h, s, d, d)
    q8, k8 = q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn)
    v8 = v.to(torch.float8_e4m3fn)
    vt8 = v8.transpose(-1, -2).contiguous()
    ref = torch.nn.functional.scaled_dot_product_attention(q8.to(torch.bfloat16), k8.to(torch.bfloat16),
                                                           v8.to(torch.bfloat16)).float()
    c = 1 / math.sqrt(d) * 1.4426950408889634
    for unroll in (1, 0):
        for ptx_opt in (None, "-O1"):
            o = torch.zeros((1, h, s, d), dtype=torch.bfloat16, device="cuda")
            const = dict(CONST, UNROLL2=unroll)
            extra = {"ptx_options": ptx_opt} if ptx_opt else {}

            def fn(o=o, const=const, extra=extra):
                gluon_attn_fwd[(s // const["BM"], h)](q8, k8, vt8, o, s, s, c, num_warps=4, **const, **extra)
                return o

            tag = f"gluon prototype UNROLL2={unroll} ptxas {ptx_opt or '-O3'}"
            try:
                fn()
                torch.cuda.synchronize()
                err = ((o.float() - ref).norm() / ref.norm()).item()
                ms = triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")
                print(f"{tag}: hd{d} s={s} h={h}: rel L2 vs SDPA (bf16 of the same FP8 inputs) {err:.4f}, "
                      f"{flops(1, h, s, s, d, d, False) / ms / 1e9:.1f} TFLOP/s ({ms:.3f} ms)", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{tag}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--unroll2", type=int, default=1, help="1: two tiles per loop trip (needs seq_k % 256 == 0)")
    ap.add_argument("--ptxas", default=None, help="extra ptxas options for --compile, e.g. -O1")
    a = ap.parse_args()
    CONST["UNROLL2"] = a.unroll2
    if a.compile:
        compile_sm90(a.ptxas)
    if a.run:
        run_h200()
