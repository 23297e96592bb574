"""Compile the FP8 attention kernel for sm_90a without a GPU (Triton's bundled ptxas) and count SASS ops.

Needs triton (3.6.x, as on the H200: `pip install triton==3.6.0`); no GPU, no CUDA toolkit.
Usage: python scripts/inspect_sass.py [--recipe zyfa-hopper] [--dqk 128 --dv 128] [--causal] [--window]
       [--block-m 64 --warps 4] [--stages N] [--maxnreg N] [--mad-cvt N] [--mad-t 0|1]
       [--p-perm 0|1] [--no-tma] [--const NAME=INT ...] [--dump file.sass] [--unaligned]
Without launch flags it compiles the binary the wrapper launches for that recipe and shape
(``attention_fp8.resolve_config``: the default config, then any flag given as an override, e.g.
``--maxnreg 0`` for no register cap, ``--const DV_SPLIT=1``). The arguments carry the hints the launch's
specialization gives on the GPU (16-byte-aligned tensors, sequence lengths that are multiples of 16), so registers
and code match the binary the H200 runs.
Prints the resolved config, registers, spills, shared memory, an instruction histogram (QGMMA, MUFU.EX2, F2I,
F2FP, I2F ...) and whether ptxas serialized the wgmma (its advisory C7514, which Triton does not show).
``--dump FILE`` writes the SASS: compiling before and after a change and comparing the dumps shows
whether a refactor changed the binary (docs/KERNEL.md, 'Checks').
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


def compile_variant(recipe="zyfa-hopper", dqk=128, dv=128, causal=False, window=False, config=None, aligned=True):
    """Compile the kernel as :func:`zyfa.kernels.attention_fp8.launch` would for this recipe, shape and config
    overrides (per-head descales); returns (compiled kernel, the resolved config, seconds)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from zyfa.kernels import _triton_fp8 as K
    from zyfa.kernels import attention_fp8 as A

    plan = A.kernel_plan(recipe)
    cfg, mad_cvt, _bias = A.resolve_config(dqk, dv, causal, plan, config)
    const = A.launch_constexprs(plan, cfg, mad_cvt, dqk, dv, causal, window)
    out_ty = "*fp32" if plan.out_mode == 2 else "*bf16"
    sig = {"Q": "*fp8e4nv", "K": "*fp8e4nv", "VT": "*fp8e4nv", "O": out_ty, "LSE": "*fp32", "QD": "*fp32",
           "KD": "*fp32", "VD": "*fp32", "ONES": "*fp8e4nv",
           "seq_q": "i32", "seq_k": "i32", "seq_k_pad": "i32", "heads_q": "i32",
           "heads_kv": "i32", "window": "i32", "sm_scale_log2e": "fp32", "mad_bias": "fp32", "mad_m_safe": "fp32"}
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
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=A.launch_options(cfg))
    return ck, {**cfg, "MAD_CVT": mad_cvt}, time.time() - t0


def _triton_tool(name: str) -> str:
    """The path of a CUDA tool Triton bundles (ptxas, cuobjdump)."""
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def sass_histogram(cubin: bytes):
    cuobjdump = _triton_tool("cuobjdump")
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


def wgmma_serialized(ck) -> str | None:
    """ptxas's advisory C7514 for this compile, or None: run the bundled ptxas again with -v on the kernel's PTX
    (with the compile's register cap).

    ptxas serializes every wgmma of a kernel (each QGMMA group waited before the next is issued) when it cannot
    keep them in flight, e.g. where other instructions read a wgmma's accumulator between its issue and its wait
    (docs/KERNEL.md: the per-tile flush at d <= 192); Triton does not show the advisory."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ck.asm["ptx"])
        maxnreg = getattr(ck.metadata, "maxnreg", None)
        cap = [f"--maxrregcount={maxnreg}"] if maxnreg else []
        r = subprocess.run([_triton_tool("ptxas"), "-arch=sm_90a", "-v", *cap, path, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    for line in (r.stdout + r.stderr).splitlines():
        if "C7514" in line:
            return line.split("Potential Performance Loss:", 1)[-1].strip()
    return None


def main():
    ap = argparse.ArgumentParser(description="Compile the kernel for sm_90a (no GPU) and count its SASS "
                                 "instructions; launch flags override the wrapper's default config.")
    ap.add_argument("--recipe", default="zyfa-hopper")
    ap.add_argument("--dqk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--window", action="store_true")
    ap.add_argument("--no-tma", action="store_true")
    ap.add_argument("--block-m", type=int, default=None, help="query rows per program (default: the wrapper's)")
    ap.add_argument("--warps", type=int, default=None)
    ap.add_argument("--stages", type=int, default=None)
    ap.add_argument("--mad-cvt", type=int, default=None)
    ap.add_argument("--mad-t", type=int, default=None, help="1 exact t (emulator form), 0 one fused FFMA")
    ap.add_argument("--maxnreg", type=int, default=None, help="register cap; 0 for none")
    ap.add_argument("--p-perm", type=int, default=None, help="1: P columns / V keys reordered per 32-key step")
    ap.add_argument("--dump", default=None, help="write the SASS here")
    ap.add_argument("--unaligned", action="store_true",
                    help="no 16-byte alignment hints (the form of this script before they were added: 255 "
                         "registers at hd128 where the H200's launch has 162)")
    ap.add_argument("--const", action="append", default=[], metavar="NAME=INT",
                    help="another config key or kernel constexpr, e.g. --const DV_SPLIT=2 --const PV_MODE=2")
    a = ap.parse_args()
    config = {}
    for key, val in (("BLOCK_M", a.block_m), ("num_warps", a.warps), ("num_stages", a.stages),
                     ("MAD_CVT", a.mad_cvt), ("MAD_T", a.mad_t), ("maxnreg", a.maxnreg), ("P_PERM", a.p_perm)):
        if val is not None:
            config[key] = val
    if a.no_tma:
        config["TMA"] = False
    for item in a.const:
        name, eq, val = item.partition("=")
        try:
            if not eq:
                raise ValueError
            config[name.strip()] = int(val)
        except ValueError:
            ap.error(f"--const takes NAME=INT, got {item!r}")
    try:
        ck, cfg, dt = compile_variant(a.recipe, a.dqk, a.dv, a.causal, a.window, config, aligned=not a.unaligned)
    except ValueError as e:
        ap.exit(2, f"inspect_sass: {e}\n")
    sass, ops = sass_histogram(ck.asm["cubin"])
    if a.dump:
        with open(a.dump, "w") as f:
            f.write(sass)
    md = ck.metadata
    res = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", sass)
    shown = {k: v for k, v in sorted(cfg.items()) if k != "TMA" or not v}
    print(f"compiled in {dt:.1f}s  {a.recipe} dqk={a.dqk} dv={a.dv} causal={a.causal} window={a.window}  "
          f"config {shown}  REG/STACK/SHARED/LOCAL={res.groups() if res else '?'} shared={md.shared}")
    keys = ["QGMMA", "HGMMA", "WARPGROUP", "MUFU", "F2I", "I2F", "F2F", "F2FP", "FFMA", "FMUL", "FADD", "FMNMX",
            "PRMT", "SHF", "LOP3", "IMAD", "SHFL", "LDL", "STL", "SYNCS", "UTMALDG", "LDGSTS", "BAR", "STS", "LDS",
            "LDSM", "STSM"]
    print("  ".join(f"{k}={ops.get(k, 0)}" for k in keys))
    why = wgmma_serialized(ck)
    print(f"wgmma serialized by ptxas: {'yes (' + why + ')' if why else 'no'}")


if __name__ == "__main__":
    main()
