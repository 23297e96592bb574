"""Launch our kernel a few times on Gaussian inputs, for Nsight Compute to profile one launch.

On the H200, from the repository root (`--clock-control none`: leave the GPU's clocks as they are):

    ncu --clock-control none -k regex:attn_fwd_fp8 -s 2 -c 1 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \\
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio' \\
        python3 scripts/launch_kernel_for_ncu.py --recipe zyfa-hopper --seq 16384

``-s 2 -c 1`` skips the two warm-up launches and profiles the third. docs/kernel_notes.md has what it showed.
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.getcwd())

SHAPES = {"hd64": (64, 64, 32), "hd128": (128, 128, 16), "hd256": (256, 256, 8), "mla": (192, 128, 16)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="zyfa-hopper")
    ap.add_argument("--shape", default="hd128", choices=sorted(SHAPES))
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--launches", type=int, default=3)
    a = ap.parse_args()
    import torch

    from zyfa.bench import gaussian_qkv
    from zyfa.kernels import attention_fp8 as A
    d_qk, d_v, heads = SHAPES[a.shape]
    q, k, v = gaussian_qkv(1, heads, heads, a.seq, d_qk, d_v, seed=0)
    r = A.recipe_from_spec(a.recipe)
    q8, k8, v8, qd, kd, vd = A.quantize_for_kernel(q, k, v, r)
    vt = A.prepare_vt(v8, permute_k32=A.vt_key_order_for(None))
    plan = A.kernel_plan(r)
    for _ in range(a.launches):
        A.launch(q8, k8, vt, qd, kd, vd, plan=plan, seq_k=a.seq, causal=a.causal, sm_scale=1 / math.sqrt(d_qk),
                 window=None)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
