"""Prototype (not used by zyfa): FP8 attention forward in Gluon, two consumer warpgroups in ping-pong (sm_90a).

Technique 2 of the ZYFA paper, FA3-style: while warpgroup A runs its softmax on the CUDA cores, warpgroup B issues
its wgmmas, and vice versa. Same numerics as ``scripts/gluon_fa_sm90.py`` (hd128, non-causal, P in e4m3fn with a
fixed 2^8 scale, exp2 softmax, seq multiple of 256). One CTA = 128 query rows = two consumers of 64 rows each,
sharing every K / Vᵀ tile.

Design (a), ``gl.warp_specialize`` (variant ``ws``):
  * default partition: consumer A (4 warps, rows 0-63 of the CTA's block);
  * worker 0: consumer B (4 warps, rows 64-127);
  * worker 1: TMA producer (1 warp): Q once, then K_j / Vᵀ_j into a STAGES-deep ring (``full`` / ``empty``
    mbarriers; ``empty`` has count 2, one arrival per consumer).
Per iteration j a consumer does

    wait full[j] -> wait turn[me] -> issue S_j = Q K_jᵀ, O += P_{j-1} V_{j-1} (both async) -> arrive turn[other]
    -> wgmma_wait(1): S_j done -> softmax of S_j (overlaps the other consumer's wgmmas and its own P·V)
    -> wgmma_wait(0): O done -> arrive empty[j-1] -> O *= alpha_j

``turn[0]`` / ``turn[1]`` (count 1) give the strict issue order A, B, A, B, ... : the two consumers' GEMM
sections alternate, each one's softmax sits in the other's GEMM window.

Usage:
    python scripts/gluon_pingpong_sm90.py --compile [--stages 3 --lag 2] [--ptxas=-O1]  # sm_90a, no GPU
    PYTHONPATH=. python scripts/gluon_pingpong_sm90.py --run                      # H200: check + time
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import traceback

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

LINES: list[str] = []
CURRENT = {"tag": "start"}  # what is running, for the watchdog


def say(msg: str) -> None:
    print(msg, flush=True)
    LINES.append(msg)


@gluon.jit
def _pp_loader(Q, K, VT, seq_q, seq_k, q_s, k_s, v_s, q_bar, full, empty):
    """Producer (1 warp): Q for both consumers, then the K / Vᵀ ring."""
    # tile sizes from the shared-memory shapes (constexprs do not pass through warp_specialize's arg tuples)
    BM: gl.constexpr = q_s.shape[1]
    D: gl.constexpr = q_s.shape[2]
    STAGES: gl.constexpr = k_s.shape[0]
    BN: gl.constexpr = k_s.shape[1]
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    q_desc = tma.make_tensor_descriptor(Q + bh.to(gl.int64) * seq_q * D, [seq_q, D], [D, 1], [BM, D], smem)
    k_desc = tma.make_tensor_descriptor(K + bh.to(gl.int64) * seq_k * D, [seq_k, D], [D, 1], [BN, D], smem)
    v_desc = tma.make_tensor_descriptor(VT + bh.to(gl.int64) * D * seq_k, [D, seq_k], [seq_k, 1], [D, BN], smem)
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
def _pp_consumer(O, seq_q, seq_k, c, q_s, k_s, v_s, q_bar, full, empty, turn, cfg, WG: gl.constexpr):
    """Consumer warpgroup WG (0 = A, 1 = B): 64 query rows, GEMMs issued only in its turn."""
    LAG: gl.constexpr = cfg.shape[0]  # 1: release tile j-1 after this trip's wait(0); 2: tile j-2 after wait(1)
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

    zero_s = gl.zeros([BM, BN], gl.float32, s_l)
    o = gl.zeros([BM, D], gl.float32, o_l)
    mbarrier.wait(q_bar, 0)
    # ---- tile 0: S_0 only
    mbarrier.wait(full.index(0), 0)
    mbarrier.wait(my_turn, PAR0)
    s_tok = warpgroup_mma(qs, k_s.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    mbarrier.arrive(other_turn)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    m_i = gl.max(s, 1) * c
    p = gl.exp2(s * c - m_i[:, None]) * 256.0
    l_i = gl.sum(p, 1)
    p8 = gl.convert_layout(p.to(gl.float8e4nv), p_l)
    for j in range(1, n):
        st = j % STAGES
        pst = (j - 1) % STAGES
        mbarrier.wait(full.index(st), (j // STAGES) & 1)
        mbarrier.wait(my_turn, (j & 1) ^ PAR0)
        # ---- my GEMM section: S_j and O += P_{j-1} V_{j-1}
        s_tok = warpgroup_mma(qs, k_s.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        o_tok = warpgroup_mma(p8, v_s.index(pst).permute((1, 0)), o, is_async=True)
        mbarrier.arrive(other_turn)
        # ---- softmax of S_j: runs while the other warpgroup's GEMMs (and my P·V) are on the tensor cores
        s = warpgroup_mma_wait(1, deps=[s_tok])
        if LAG == 2:  # wgmma groups retire in order: S_j done => P_{j-2} V_{j-2} done, tile j-2 is free
            mbarrier.arrive(empty.index((j + STAGES - 2) % STAGES), pred=j >= 2)
        m_new = gl.maximum(m_i, gl.max(s, 1) * c)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s * c - m_new[:, None]) * 256.0
        l_i = l_i * alpha + gl.sum(p, 1)
        p8n = gl.convert_layout(p.to(gl.float8e4nv), p_l)
        o = warpgroup_mma_wait(0, deps=[o_tok])
        if LAG == 1:
            mbarrier.arrive(empty.index(pst))
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        p8 = p8n
        m_i = m_new
    # ---- last P·V, in turn
    lst = (n - 1) % STAGES
    mbarrier.wait(my_turn, (n & 1) ^ PAR0)
    o_tok = warpgroup_mma(p8, v_s.index(lst).permute((1, 0)), o, is_async=True)
    mbarrier.arrive(other_turn)
    o = warpgroup_mma_wait(0, deps=[o_tok])
    mbarrier.arrive(empty.index(lst))

    o = o / gl.convert_layout(l_i, gl.SliceLayout(1, o_l))[:, None]
    bh = gl.program_id(1)
    rows = gl.program_id(0) * 2 * BM + WG * BM + gl.arange(0, BM, gl.SliceLayout(1, o_l))
    cols = gl.arange(0, D, gl.SliceLayout(0, o_l))
    ptrs = O + bh.to(gl.int64) * seq_q * D + rows[:, None].to(gl.int64) * D + cols[None, :]
    gl.store(ptrs, o.to(gl.bfloat16), mask=rows[:, None] < seq_q)


@gluon.jit
def _pp_consumer_a(O, seq_q, seq_k, c, q_s, k_s, v_s, q_bar, full, empty, turn, cfg):
    _pp_consumer(O, seq_q, seq_k, c, q_s, k_s, v_s, q_bar, full, empty, turn, cfg, 0)


@gluon.jit
def _pp_consumer_b(O, seq_q, seq_k, c, q_s, k_s, v_s, q_bar, full, empty, turn, cfg):
    _pp_consumer(O, seq_q, seq_k, c, q_s, k_s, v_s, q_bar, full, empty, turn, cfg, 1)


@gluon.jit
def gluon_pingpong_fwd(Q, K, VT, O, seq_q, seq_k, c,
                       BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                       REG_B: gl.constexpr, REG_LOAD: gl.constexpr, LAG: gl.constexpr):
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
    cargs = (O, seq_q, seq_k, c, q_s, k_s, v_s, q_bar, full, empty, turn, cfg)
    gl.warp_specialize([
        (_pp_consumer_a, cargs),
        (_pp_consumer_b, cargs),
        (_pp_loader, (Q, K, VT, seq_q, seq_k, q_s, k_s, v_s, q_bar, full, empty)),
    ], [4, 1], [REG_B, REG_LOAD])


CONST = {"BM": 64, "BN": 128, "D": 128, "STAGES": 2, "REG_B": 240, "REG_LOAD": 24, "LAG": 1}
VARIANTS = {  # name -> (constexpr overrides, ptxas options); LAG=2 needs STAGES >= 3
    "ws STAGES=2 LAG=1": ({"STAGES": 2, "LAG": 1}, None),
    "ws STAGES=3 LAG=1": ({"STAGES": 3, "LAG": 1}, None),
    "ws STAGES=3 LAG=2": ({"STAGES": 3, "LAG": 2}, None),
    "ws STAGES=4 LAG=2": ({"STAGES": 4, "LAG": 2}, None),
    "ws STAGES=3 LAG=2 ptxas -O1": ({"STAGES": 3, "LAG": 2}, "-O1"),
}


def compile_sm90(const, ptx_options=None, dump="/tmp/gluon_pingpong.sass", show=True):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from scripts.gpu_compile_sm90 import sass_histogram

    sig = {"Q": "*fp8e4nv", "K": "*fp8e4nv", "VT": "*fp8e4nv", "O": "*bf16", "seq_q": "i32", "seq_k": "i32",
           "c": "fp32", **{k: "constexpr" for k in const}}
    fn = gluon_pingpong_fwd
    src = GluonASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    opts = {"num_warps": 4, **({"ptx_options": ptx_options} if ptx_options else {})}
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    sass, ops = sass_histogram(ck.asm["cubin"])
    with open(dump, "w") as f:
        f.write(sass)
    with open(dump.replace(".sass", ".ptx"), "w") as f:
        f.write(ck.asm["ptx"])
    if not show:
        return ck
    res = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", sass)
    print("REG/STACK/SHARED/LOCAL", res.groups() if res else "?", "shared", ck.metadata.shared,
          "num_warps", ck.metadata.num_warps)
    setm = sorted(set(re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ck.asm["ptx"])))
    print("setmaxnreg in PTX:", setm)
    print("  ".join(f"{k}={ops.get(k, 0)}" for k in ("QGMMA", "WARPGROUP", "MUFU", "FFMA", "FMNMX", "F2FP", "LDL",
                                                     "STL", "SYNCS", "UTMALDG", "USETMAXREG")))
    for line in sass_regions(sass):
        print(line)
    return ck


_EV = [("QGMMA", "QGMMA"), ("WARPGROUP.ARRIVE", "ARRIVE"), ("WARPGROUP.DEPBAR", "DEPBAR"), ("MUFU.EX2", "EX2"),
       ("SYNCS.ARRIVE", "MB.ARRIVE"), ("SYNCS.PHASECHK", "MB.WAIT"), ("UTMALDG", "TMA"), ("USETMAXREG", "SETMAXREG"),
       ("BAR.SYNC", "BAR.SYNC"), ("EXIT", "EXIT")]


def sass_regions(sass: str) -> list[str]:
    """Split the SASS at USETMAXREG (one region per partition), then per region: highest register used, LDL/STL,
    and the event sequence (runs collapsed: QGMMA x4, EX2 x66, ...), back edges marked as 'LOOP->addr'."""
    body = [ln for ln in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
    regions, cur = [], []
    for ln in body:
        if "USETMAXREG" in ln:
            regions.append(cur)
            cur = []
        cur.append(ln)
    regions.append(cur)
    out = []
    for i, reg in enumerate(regions):
        text = "\n".join(reg)
        rmax = max((int(x) for x in re.findall(r"\bR(\d+)\b", text)), default=-1)
        if not re.search(r"QGMMA|MUFU|UTMALDG", text):
            continue
        setm = re.search(r"USETMAXREG\.\S+ (?:UP0, )?(0x[0-9a-f]+)", reg[0])
        evs = []
        for ln in reg:
            m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?);", ln)
            if not m:
                continue
            addr, ins = int(m.group(1), 16), m.group(2)
            name = next((short for key, short in _EV if key in ins), None)
            bm = re.search(r"BRA (0x[0-9a-f]+)", ins)
            if bm and int(bm.group(1), 16) < addr and "PHASECHK" not in evs[-1:][0] if evs else False:
                name = f"LOOP->{bm.group(1)}"
            if name is None:
                continue
            if name == "DEPBAR":
                name = "DEPBAR " + ins.split()[-1]
            if evs and evs[-1][0] == name:
                evs[-1][1] += 1
            else:
                evs.append([name, 1])
        seq = " | ".join(n if c == 1 else f"{n} x{c}" for n, c in evs)
        nreg = int(setm.group(1), 16) if setm else "-"
        out.append(f"region {i} (setmaxnreg {nreg}): max reg R{rmax} -> {rmax + 1} regs, "
                   f"LDL {text.count('LDL')} STL {text.count('STL')}, QGMMA {text.count('QGMMA')}, "
                   f"EX2 {text.count('MUFU.EX2')}\n  {seq}")
    return out


def _check_and_time(tag, fn, o, ref, s, h, d):
    import torch
    import triton

    from zyfa.bench import flops

    CURRENT["tag"] = f"{tag} s={s}"
    print(f"[running {tag} s={s}]", file=sys.stderr, flush=True)
    try:
        o.zero_()
        fn()
        torch.cuda.synchronize()
        err = ((o.float() - ref).norm() / ref.norm()).item()
        ok = "PASS" if err < 0.04 else "FAIL"
        msg = f"{tag}: hd{d} s={s} h={h}: rel L2 vs SDPA (bf16 of the same FP8 inputs) {err:.4f} {ok}"
        if s >= 16384:
            ms = triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")
            msg += f", {flops(1, h, s, s, d, d, False) / ms / 1e9:.1f} TFLOP/s ({ms:.3f} ms)"
        say(msg)
        return ms if s >= 16384 else None
    except Exception as e:  # noqa: BLE001
        tb = traceback.format_exc().strip().splitlines()
        say(f"{tag}: s={s}: FAILED {type(e).__name__}: {str(e)[:300]} | {' / '.join(tb[-4:])[:400]}")
        return None


def _run_size(s, h, base):
    """One size: inputs, SDPA reference, the 1-WG baseline, then every ping-pong variant."""
    import torch

    from zyfa.bench import gaussian_qkv

    d = CONST["D"]
    c = 1 / math.sqrt(d) * 1.4426950408889634
    q, k, v = gaussian_qkv(1, h, h, s, d, d)
    q8, k8, v8 = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    vt8 = v8.transpose(-1, -2).contiguous()
    ref = torch.nn.functional.scaled_dot_product_attention(q8.to(torch.bfloat16), k8.to(torch.bfloat16),
                                                           v8.to(torch.bfloat16)).float()
    o = torch.zeros((1, h, s, d), dtype=torch.bfloat16, device="cuda")
    times = {}
    # same-run baseline: the single-warpgroup prototype, UNROLL2=1, ptxas -O3
    bconst = dict(base.CONST, UNROLL2=1)

    def fb():
        base.gluon_attn_fwd[(s // bconst["BM"], h)](q8, k8, vt8, o, s, s, c, num_warps=4, **bconst)
        return o

    times["base"] = _check_and_time("baseline gluon_fa_sm90 1-WG UNROLL2=1 ptxas -O3", fb, o, ref, s, h, d)
    for name, (over, ptx_opt) in VARIANTS.items():
        const = dict(CONST, **over)
        extra = {"ptx_options": ptx_opt} if ptx_opt else {}

        def fv(const=const, extra=extra):
            gluon_pingpong_fwd[(s // (2 * const["BM"]), h)](q8, k8, vt8, o, s, s, c, num_warps=4, **const, **extra)
            return o

        times[name] = _check_and_time(f"pingpong {name}", fv, o, ref, s, h, d)
    if times.get("base"):
        ratios = ", ".join(f"{k_}: {times['base'] / t_:.3f}x" for k_, t_ in times.items() if t_ and k_ != "base")
        say(f"s={s}: speed vs same-run 1-WG baseline (>1 = faster): {ratios or 'n/a'}")


def run_h200(sizes=(4096, 32768), h=16):
    import torch

    from scripts import gluon_fa_sm90 as base
    from zyfa.kernels._triton_fp8 import ensure_allocator

    ensure_allocator()  # global scratch for the in-kernel TMA descriptors
    say(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for s in sizes:
        try:
            _run_size(s, h, base)
        except Exception as e:  # noqa: BLE001
            say(f"s={s}: FAILED {type(e).__name__}: {str(e)[:300]}")
        torch.cuda.empty_cache()


def _write_out():
    out = os.environ.get("OUT")
    if out and LINES:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "gluon_pingpong.txt"), "w") as f:
            f.write("\n".join(LINES) + "\n")


def _watchdog(seconds):
    """A hung kernel (mbarrier deadlock) cannot be interrupted: after `seconds`, report what ran and exit."""
    import threading

    def fire():
        say(f"WATCHDOG: no finish after {seconds} s, hung in: {CURRENT['tag']}")
        _write_out()
        os._exit(3)

    tm = threading.Timer(seconds, fire)
    tm.daemon = True
    tm.start()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--run", action="store_true")
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--lag", type=int, default=2, help="2: release K/V tile j-2 after wait(1) (STAGES >= 3)")
    ap.add_argument("--reg-b", type=int, default=CONST["REG_B"])
    ap.add_argument("--reg-load", type=int, default=CONST["REG_LOAD"])
    ap.add_argument("--ptxas", default=None, help="extra ptxas options for --compile, e.g. -O1")
    ap.add_argument("--watchdog", type=float, default=85.0, help="--run: exit after this many seconds")
    a = ap.parse_args()
    if a.run and a.watchdog > 0:
        _watchdog(a.watchdog)
    try:
        if a.compile:
            compile_sm90(dict(CONST, STAGES=a.stages, REG_B=a.reg_b, REG_LOAD=a.reg_load, LAG=a.lag), a.ptxas)
        if a.run:
            run_h200()
    finally:
        _write_out()


if __name__ == "__main__":
    main()
