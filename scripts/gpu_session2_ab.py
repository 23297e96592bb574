"""H200 A/B timings for session 2 (scripts/gpu_session2.sh): zyfa-hopper at 32K tokens, batch 1.

hd128 (16 heads), causal and not: PIPELINE_QK {0, 1} x MAD_T {0, 1} x maxnreg {none, 168}; then hd64 (32 heads),
hd256 (8 heads) and MLA 192/128 (16 heads) with the default launch config, its MAD_T=1 ablation, and (MLA) the
register cap. Every variant is wrapped: a compile or launch failure is printed and the run goes on. Each row
is printed as it completes (Markdown) and appended to <out>/ab.jsonl with registers and spills.

Session 3 (``--set session3``): the MAD conversion, MAD_CVT 0 (fp32 clamps) / 3 (fma.rn.sat + fp32 clamp at 126)
/ 5 (fma.rn.sat + packed u16x2 clamp, the new default) with the fused MAD, 0 / 4 (no clamp at 126) with exact t,
the register cap, and P_PERM 0 (P shuffled into the wgmma operand layout) at hd128; the default against P_PERM 0
and against the session-2 kernel (MAD_CVT 0, P_PERM 0) at MLA, hd256 (and PV_MODE 2 there) and hd64.

PYTHONPATH=. python3 scripts/gpu_session2_ab.py --out $OUT [--rep 60] [--only hd128] [--set session3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from zyfa.bench import ClockSampler, flops, gaussian_qkv, timed  # noqa: E402
from zyfa.kernels import attention_fp8 as A  # noqa: E402

RECIPE = "zyfa-hopper"
MMA = "zyfa-hopper:rowsum=rounded_mma"
S = 32768
NOCAP = 0  # maxnreg 0: no register cap (overrides the default cap)


def hd128_variants():
    for causal in (False, True):
        for pipe in (0, 1):
            for mad_t in (0, 1):
                for cap in (NOCAP, 168):
                    yield "hd128", causal, {"PIPELINE_QK": pipe, "MAD_T": mad_t, "maxnreg": cap}


def other_variants():
    for shape in ("mla", "hd256", "hd64"):
        for causal in (False, True):
            yield shape, causal, {}  # the default config
            yield shape, causal, {"MAD_T": 1}
            if shape == "mla":
                yield shape, causal, {"maxnreg": 168}
            if shape == "hd256":
                yield shape, causal, {"PIPELINE_QK": 1}


def session3b_variants():
    """The same-run repeat: MAD_CVT 3 against 5 interleaved, PV_MODE 4 against 2 at hd256."""
    for causal in (False, True):
        for _ in range(3):
            for cvt in (3, 5):
                yield "hd128", causal, {"MAD_CVT": cvt}
    for shape in ("mla", "hd64"):
        for causal in (False, True):
            for cvt in (3, 5):
                yield shape, causal, {"MAD_CVT": cvt}
    for causal in (False, True):
        for pv in (2, 4):
            yield "hd256", causal, {"PV_MODE": pv}
        yield "mla", causal, {"maxnreg": 168}
        yield "hd64", causal, {"maxnreg": 0}


def session3c_variants():
    """hd64: the register cap (default 168) against none, interleaved, three times."""
    for causal in (False, True):
        for _ in range(3):
            for cap in (168, NOCAP):
                yield "hd64", causal, {"maxnreg": cap}


def session3d_variants():
    """Technique 3's rounded row sum on the tensor core (recipe override rowsum=rounded_mma) against the
    shift-and-add sum, every shape, interleaved, plus its register cap at hd128 causal and MAD_T=1 (exact t)."""
    for shape in ("hd128", "mla", "hd256", "hd64"):
        for causal in (False, True):
            for _ in range(2 if shape == "hd128" else 1):
                yield shape, causal, {}
                yield shape, causal, {"recipe": MMA}
    for causal in (False, True):
        yield "hd128", causal, {"recipe": MMA, "maxnreg": 0 if causal else 168}
        yield "hd128", causal, {"recipe": MMA, "MAD_T": 1}


def session3_variants():
    for causal in (False, True):
        for cvt in (0, 3, 5):
            yield "hd128", causal, {"MAD_T": 0, "MAD_CVT": cvt}
        for cvt in (0, 4):
            yield "hd128", causal, {"MAD_T": 1, "MAD_CVT": cvt}
        yield "hd128", causal, {"maxnreg": 0 if causal else 168}
        yield "hd128", causal, {"P_PERM": 0}
        yield "hd128", causal, {"MAD_CVT": 0, "P_PERM": 0}  # the session-2 kernel
    for shape in ("mla", "hd256", "hd64"):
        for causal in (False, True):
            yield shape, causal, {}
            yield shape, causal, {"P_PERM": 0}
            yield shape, causal, {"MAD_CVT": 0, "P_PERM": 0}
            if shape == "hd256":
                yield shape, causal, {"PV_MODE": 2}


def variants(set_name: str, only: str = ""):
    if set_name == "session3":
        return list(session3_variants())
    if set_name == "session3b":
        return list(session3b_variants())
    if set_name == "session3c":
        return list(session3c_variants())
    if set_name == "session3d":
        return list(session3d_variants())
    return list(hd128_variants()) + ([] if only == "hd128" else list(other_variants()))


SHAPES = {"hd64": (64, 64, 32), "hd128": (128, 128, 16), "hd256": (256, 256, 8), "mla": (192, 128, 16)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rep", type=int, default=60)
    ap.add_argument("--only", default="", help="hd128 = only the hd128 matrix")
    ap.add_argument("--set", default="session2", help="which variant matrix",
                    choices=("session2", "session3", "session3b", "session3c", "session3d"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    jl = open(os.path.join(a.out, "ab.jsonl"), "a")  # noqa: SIM115 - appended row by row, closed at exit
    sampler = ClockSampler()
    print(f"# A/B {RECIPE} (or the row's recipe), {S} tokens, batch 1 (TFLOP/s, do_bench median, warmup "
          f"{a.warmup} rep {a.rep} ms)")
    print("| shape | causal | recipe | config (over the default) | launch config | TFLOP/s | ms | regs | spills "
          "| SM MHz |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    todo = variants(a.set, a.only)
    cur_shape, ops = None, None
    t_start = time.time()
    for shape, causal, over in todo:
        d_qk, d_v, h = SHAPES[shape]
        recipe = over.get("recipe", RECIPE)  # same quantization: both recipes are per-tensor zyfa-hopper variants
        plan = A.kernel_plan(recipe)
        over = {k_: v_ for k_, v_ in over.items() if k_ != "recipe"}
        row = {"shape": shape, "causal": causal, "override": over, "recipe": recipe, "s": S, "h": h}
        try:
            if shape != cur_shape:
                ops = None
                import torch

                torch.cuda.empty_cache()
                q, k, v = gaussian_qkv(1, h, h, S, d_qk, d_v)
                q8, k8, v8, qd, kd, vd = A.quantize_for_kernel(q, k, v, RECIPE)
                del q, k, v
                ops = (q8, k8, A.prepare_vt(v8), qd, kd, vd)
                vt_plain = A.prepare_vt(v8, permute_k32=False)
                cur_shape = shape
            cfg, mad_cvt, _ = A.resolve_config(d_qk, d_v, causal, plan, over)
            row["launch_config"] = {k_: v_ for k_, v_ in cfg.items() if k_ not in ("TMA", "WS")}
            row["launch_config"]["MAD_CVT"] = mad_cvt

            run_ops = ops if cfg["P_PERM"] else (ops[0], ops[1], vt_plain, *ops[3:])

            def fn(over=over, causal=causal, d_qk=d_qk, ops=run_ops, plan=plan):
                return A.launch(*ops, plan=plan, seq_k=S, causal=causal, sm_scale=1 / math.sqrt(d_qk),
                                window=None, config=over)

            ms, clk = timed(fn, a.warmup, a.rep, sampler)
            kern = A.LAST_LAUNCH.get("kernel")
            row.update(ms=ms, tflops=flops(1, h, S, S, d_qk, d_v, causal) / ms / 1e9,
                       n_regs=getattr(kern, "n_regs", None), n_spills=getattr(kern, "n_spills", None),
                       sm_clock_mhz=clk.get("sm_clock_mhz"))
            lc = ",".join(f"{k_}={v_}" for k_, v_ in row["launch_config"].items())
            print(f"| {shape} | {causal} | {recipe} | {json.dumps(over)} | {lc} | {row['tflops']:.1f} | {ms:.3f} | "
                  f"{row['n_regs']} | {row['n_spills']} | {row['sm_clock_mhz'] or 0:.0f} |", flush=True)
        except Exception as e:  # noqa: BLE001 - one failing variant must not stop the run
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            print(f"| {shape} | {causal} | {recipe} | {json.dumps(over)} | - | FAILED: {row['error'][:200]} | | | | |",
                  flush=True)
            traceback.print_exc(limit=2, file=sys.stderr)
        jl.write(json.dumps(row) + "\n")
        jl.flush()
    print(f"# A/B done in {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
