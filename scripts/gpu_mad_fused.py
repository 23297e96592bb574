"""H200: time zyfa-hopper with the exact-t MAD (MAD_T=1) against the fused multiply-add form (MAD_T=0).

PYTHONPATH=. python3 scripts/gpu_mad_fused.py   (32K tokens, head dim 128, 16 heads, batch 1)
"""

from __future__ import annotations

import math

from zyfa.bench import ClockSampler, flops, gaussian_qkv, timed
from zyfa.kernels.attention_fp8 import kernel_plan, launch, prepare_vt, quantize_for_kernel


def main() -> None:
    s, h, d = 32768, 16, 128
    q, k, v = gaussian_qkv(1, h, h, s, d, d)
    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, "zyfa-hopper")
    vt = prepare_vt(v8)
    sampler = ClockSampler()
    print("| recipe | causal | MAD_T | TFLOP/s | ms |\n|---|---|---|---|---|")
    for causal in (False, True):
        for mad_t in (1, 0):
            plan = kernel_plan("zyfa-hopper")

            def fn(plan=plan, causal=causal, mad_t=mad_t):
                return launch(q8, k8, vt, qd, kd, vd, plan=plan, seq_k=s, causal=causal,
                              sm_scale=1 / math.sqrt(d), window=None, config={"MAD_T": mad_t})

            ms, _ = timed(fn, 10, 40, sampler)
            tf = flops(1, h, s, s, d, d, causal) / ms / 1e9
            print(f"| zyfa-hopper | {causal} | {mad_t} | {tf:.0f} | {ms:.3f} |", flush=True)


if __name__ == "__main__":
    main()
