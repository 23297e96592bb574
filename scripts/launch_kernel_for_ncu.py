"""Launch our kernel a few times on Gaussian inputs, for Nsight Compute to profile one launch.

On the H200, from the repository root (`--clock-control none`: leave the GPU's clocks as they are):

    ncu --clock-control none -k regex:attn_fwd_fp8 -s 2 -c 1 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \\
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio' \\
        python3 scripts/launch_kernel_for_ncu.py --recipe zyfa-hopper --seq 16384

``-s 2 -c 1`` skips the two warm-up launches and profiles the third. The last launch also runs alone between
cudaProfilerStart and cudaProfilerStop, so ``ncu --profile-from-start off`` (no ``-k``/``-s``/``-c``) profiles
just its kernels. What it showed is in the kernel notebook in git history (reports/history.md).

``--peer cudnn-fp8`` or ``--peer flashinfer-fa3`` launches that peer instead, on the same Gaussian inputs (the
bench's adapters; the cuDNN frontend wheel, or FlashInfer's pack, installed into /tmp/site). Their kernel names
are their own: profile them with ``--profile-from-start off`` (``scripts/profile_kernels_ncu.sh`` does).
``--cute`` launches our CuTe DSL kernel
(zyfa/kernels/attention_cute.py) under ``--recipe`` on the same inputs, quantized as for the Triton kernel
(nvidia-cutlass-dsl importable: docs/KERNEL.md).
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
    ap.add_argument("--peer", default=None, choices=("cudnn-fp8", "flashinfer-fa3"),
                    help="launch this peer on the same inputs instead of our kernel")
    ap.add_argument("--cute", action="store_true", help="launch our CuTe DSL kernel instead of the Triton one")
    ap.add_argument("--cute-form", default="", metavar="KEY=N,...",
                    help="the CuTe kernel's form (zyfa.kernels.cute_plan.cute_config), e.g. PV_OVERLAP=1")
    a = ap.parse_args()
    if a.cute and a.peer:
        ap.error("--cute and --peer each replace our Triton kernel: give one")
    if a.launches < 1:
        ap.error("--launches must be at least 1 (the last one is the one profiled)")
    form = {}
    for item in filter(None, a.cute_form.split(",")):
        key, _, value = item.partition("=")
        if not value.strip().isdigit():
            ap.error(f"--cute-form: {item!r} is not KEY=N")
        form[key.strip()] = int(value)
    if form and not a.cute:
        ap.error("--cute-form needs --cute")
    import math

    import torch

    from zyfa.bench.cases import gaussian_kernel_call
    fn, (q, k, v) = gaussian_kernel_call(a.shape, a.seq, a.causal, a.recipe, None)
    sm_scale = 1 / math.sqrt(q.shape[-1])
    if a.peer:  # prepared once as the bench prepares it (zyfa.peers.registry), then launched
        from zyfa.peers.registry import prepare
        try:
            fn = prepare(a.peer, q, k, v, causal=a.causal, sm_scale=sm_scale).call
        except (RuntimeError, ValueError) as e:  # not installed here, or refuses this input: its reason, one line
            print(f"launch_kernel_for_ncu: {a.peer}: {e}", file=sys.stderr)
            return 2
    if a.cute:  # prepared once (checks, compile, Vᵀ, buffers), then launched
        from zyfa.kernels.attention_cute import prepare_cute_call
        from zyfa.kernels.attention_fp8 import quantize_for_kernel
        q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, a.recipe)
        try:
            fn = prepare_cute_call(q8, k8, v8, recipe=a.recipe, causal=a.causal, sm_scale=sm_scale, q_descale=qd,
                                   k_descale=kd, v_descale=vd, config=form or None)[0]
        except ValueError as e:  # a form the kernel does not have: its reason, one line
            print(f"launch_kernel_for_ncu: --cute-form: {e}", file=sys.stderr)
            return 2
    for _ in range(a.launches - 1):
        fn()
    torch.cuda.synchronize()
    # the last call alone between cudaProfilerStart / Stop: `ncu --profile-from-start off` profiles just its kernels
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
