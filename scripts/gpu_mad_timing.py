"""Ablations at 32K tokens (batch 1): technique 1's variants at hd128 (fused single-FFMA MAD, MAD_T=0, vs exact
t, MAD_T=1; magic-number conversion vs cvt), register cap, and the P·V flush code at hd256."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from zyfa.bench import ClockSampler, flops, gaussian_qkv, timed  # noqa: E402
from zyfa.kernels.attention_fp8 import kernel_plan, launch, prepare_vt, quantize_for_kernel  # noqa: E402

H1 = "zyfa:accumulator=hopper_fp8,accum_flush_tiles=1"
H0 = "zyfa:accumulator=hopper_fp8"
s = 32768
CASES = {
    128: [(H1, {"MAD_T": 1}), (H1, {"MAD_T": 0}), (H1, {"MAD_T": 1, "MAD_CVT": 1}), (H1, {"MAD_T": 0, "MAD_CVT": 1}),
          (H1, {"MAD_T": 1, "maxnreg": 168}), (H0, {"MAD_T": 0}), ("zyfa-exp2:accumulator=hopper_fp8", {}),
          ("fa3", {})],
    256: [(H1, {}), (H1, {"PV_MODE": 2}), (H1, {"MAD_T": 0}), (H0, {}), (H0, {"MAD_T": 0}),
          ("zyfa-exp2:accumulator=hopper_fp8", {})],
}
for d, cases in CASES.items():
    h = 2048 // d
    q, k, v = gaussian_qkv(1, h, h, s, d, d)
    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, H1)
    vt = prepare_vt(v8)
    for causal in (False, True):
        for spec, cfg in cases:
            plan = kernel_plan(spec)

            def fn(plan=plan, cfg=cfg, causal=causal, d=d, ops=(q8, k8, vt, qd, kd, vd)):
                return launch(*ops, plan=plan, seq_k=s, causal=causal, sm_scale=1 / math.sqrt(d),
                              window=None, config=cfg)
            try:
                ms, clk = timed(fn, 10, 50, ClockSampler())
                print(f"d={d} causal={causal} {spec} {cfg}: {flops(1, h, s, s, d, d, causal) / ms / 1e9:.1f} TFLOP/s "
                      f"(SM {clk.get('sm_clock_mhz') or 0:.0f} MHz)", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"d={d} causal={causal} {spec} {cfg}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
