"""Compile the FP8 attention kernel for sm_90a without a GPU (Triton's bundled ptxas) and count SASS ops.

Needs triton (3.6.x, as on the H200: `pip install triton==3.6.0`); no GPU, no CUDA toolkit.
Usage: python scripts/inspect_sass.py [--recipe zyfa] [--dqk 128 --dv 128] [--causal] [--ws] [--no-tma]
       [--mad-t 0|1] [--pipeline-qk 0|1] [--p-perm 0|1] [--maxnreg N] [--block-m 64 --warps 4] [--dump file.sass]
       [--const NAME=INT ...]   (any other constexpr of the kernel: DV_SPLIT, PV_MODE, VD_MODE, QD_ROW, ...)
       [--unaligned]
The arguments carry the hints the launch's specialization gives on the GPU (16-byte-aligned tensors, sequence
lengths that are multiples of 16), so registers and code match the binary the H200 runs.
Prints registers, spills, shared memory and an instruction histogram (QGMMA, MUFU.EX2, F2I, F2FP, I2F ...).
``--dump FILE`` writes the SASS: compiling before and after a change and comparing the dumps shows whether a
refactor changed the binary (docs/kernel_notes.md, 'Reproduce').
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


ALIGNED_ARGS = ("Q", "K", "VT", "O", "LSE", "QD", "KD", "VD", "ONES", "seq_q", "seq_k", "seq_k_pad")


def compile_variant(recipe="zyfa", dqk=128, dv=128, causal=False, window=False, ws=False, tma=True,
                    block_m=128, num_warps=8, num_stages=2, mad_cvt=0, overrides=None, maxnreg=None, aligned=True):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from zyfa.kernels import _triton_fp8 as K
    from zyfa.kernels.attention_fp8 import kernel_plan

    plan = kernel_plan(recipe)
    d1, d2 = (128, 64) if dqk == 192 else (dqk, 0)
    out_ty = "*fp32" if plan.out_mode == 2 else "*bf16"
    sig = {"Q": "*fp8e4nv", "K": "*fp8e4nv", "VT": "*fp8e4nv", "O": out_ty, "LSE": "*fp32", "QD": "*fp32",
           "KD": "*fp32", "VD": "*fp32", "ONES": "*fp8e4nv",
           "seq_q": "i32", "seq_k": "i32", "seq_k_pad": "i32", "heads_q": "i32",
           "heads_kv": "i32", "window": "i32", "sm_scale_log2e": "fp32", "mad_bias": "fp32", "mad_m_safe": "fp32"}
    const = dict(CAUSAL=causal or window, WINDOW=window, BLOCK_M=block_m, BLOCK_N=plan.block_n, D1=d1, D2=d2,
                 DV=dv, EXP_MAD=plan.exp_mad, MAD_CVT=mad_cvt, P_SCALE=plan.p_scale, E_FIXED=plan.e_fixed,
                 TILE_GRAN=plan.tile_gran, E_CAP=plan.e_cap, ROWSUM_ROUNDED=plan.rowsum_rounded,
                 QK_K32=plan.qk_k32, PV_MODE=plan.pv_mode, FLUSH=max(plan.flush, 1), RCP=plan.rcp,
                 OUT_MODE=plan.out_mode, TMA=tma, WS=ws, DEBUG=0, MAD_T=1, P_PERM=1, DV_SPLIT=1)
    if overrides:
        const.update(overrides)
    for k_ in const:
        sig[k_] = "constexpr"
    names = K.attn_fwd_fp8.arg_names
    # what the launch's specialization tells the compiler on the GPU: 16-byte-aligned tensors and sequence lengths
    # that are multiples of 16 (the bench's and most real ones); without these hints the Q, O and LSE accesses are
    # not vectorised and the kernel reports 255 registers where the launch on the H200 has 162
    attrs = {} if not aligned else {(names.index(n),): [["tt.divisibility", 16]] for n in ALIGNED_ARGS}
    src = ASTSource(fn=K.attn_fwd_fp8, signature=sig, constexprs={(names.index(k_),): v_ for k_, v_ in const.items()},
                    attrs=attrs)
    t0 = time.time()
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": num_warps, "num_stages": num_stages,
                                 **({"maxnreg": maxnreg} if maxnreg else {})})
    return ck, time.time() - t0


def sass_histogram(cubin: bytes):
    import triton
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    sass = subprocess.run([cuobjdump, "--dump-sass", path], capture_output=True, text=True).stdout
    res = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True).stdout
    sass = res + sass
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m:
            ops[m.group(1).split(".")[0]] += 1
    return sass, ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="zyfa")
    ap.add_argument("--dqk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window", action="store_true")
    ap.add_argument("--ws", action="store_true")
    ap.add_argument("--no-tma", action="store_true")
    ap.add_argument("--block-m", type=int, default=128)
    ap.add_argument("--warps", type=int, default=8)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--mad-cvt", type=int, default=0)
    ap.add_argument("--mad-t", type=int, default=1, help="1 exact t (emulator form), 0 one fused FFMA")
    ap.add_argument("--pipeline-qk", type=int, default=0, help="1: S of the next tile issued before the softmax")
    ap.add_argument("--maxnreg", type=int, default=None)
    ap.add_argument("--p-perm", type=int, default=1, help="1: P columns / V keys reordered per 32-key step")
    ap.add_argument("--dump", default=None, help="write the SASS here")
    ap.add_argument("--unaligned", action="store_true",
                    help="no 16-byte alignment hints (the form of this script before they were added: 255 "
                         "registers at hd128 where the H200's launch has 162)")
    ap.add_argument("--const", action="append", default=[], metavar="NAME=INT",
                    help="another kernel constexpr, e.g. --const DV_SPLIT=2 --const PV_MODE=2 --const VD_MODE=1")
    a = ap.parse_args()
    extra = {}
    for item in a.const:
        name, eq, val = item.partition("=")
        try:
            if not eq:
                raise ValueError
            extra[name.strip()] = int(val)
        except ValueError:
            ap.error(f"--const takes NAME=INT, got {item!r}")
    ck, dt = compile_variant(a.recipe, a.dqk, a.dv, a.causal, a.window, a.ws, not a.no_tma, a.block_m, a.warps,
                             a.stages, a.mad_cvt,
                             {"MAD_T": a.mad_t, "PIPELINE_QK": a.pipeline_qk, "P_PERM": a.p_perm, **extra}, a.maxnreg,
                             aligned=not a.unaligned)
    sass, ops = sass_histogram(ck.asm["cubin"])
    if a.dump:
        with open(a.dump, "w") as f:
            f.write(sass)
    md = ck.metadata
    res = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", sass)
    print(f"compiled in {dt:.1f}s  {a.recipe} dqk={a.dqk} causal={a.causal} ws={a.ws} BM={a.block_m} "
          f"w={a.warps} st={a.stages} cvt={a.mad_cvt} mad_t={a.mad_t} pipe={a.pipeline_qk} maxnreg={a.maxnreg} "
          f"p_perm={a.p_perm}{''.join(f' {k}={v}' for k, v in extra.items())}  "
          f"REG/STACK/SHARED/LOCAL={res.groups() if res else '?'} shared={md.shared}")
    keys = ["QGMMA", "HGMMA", "WARPGROUP", "MUFU", "F2I", "I2F", "F2F", "F2FP", "FFMA", "FMUL", "FADD", "FMNMX",
            "PRMT", "SHF", "LOP3", "IMAD", "SHFL", "LDL", "STL", "SYNCS", "UTMALDG", "LDGSTS", "BAR", "STS", "LDS",
            "LDSM", "STSM"]
    print("  ".join(f"{k}={ops.get(k, 0)}" for k in keys))


if __name__ == "__main__":
    main()
