"""Launch our kernel a few times on Gaussian inputs, for Nsight Compute to profile one launch.

On the H200, from the repository root (`--clock-control none`: leave the GPU's clocks as they are):

    ncu --clock-control none -k regex:attn_fwd_fp8 -s 2 -c 1 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \\
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio' \\
        python3 scripts/launch_kernel_for_ncu.py --recipe zyfa-hopper --seq 16384

``-s 2 -c 1`` skips the two warm-up launches and profiles the third. docs/kernel_notes.md has what it showed.
"""
import argparse
import os
import sys

sys.path.insert(0, os.getcwd())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="zyfa-hopper")
    ap.add_argument("--shape", default="hd128", choices=("hd64", "hd128", "hd256", "mla"))
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--launches", type=int, default=3)
    a = ap.parse_args()
    import torch

    from zyfa.bench import gaussian_kernel_call
    fn, _ = gaussian_kernel_call(a.shape, a.seq, a.causal, a.recipe)
    for _ in range(a.launches):
        fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
