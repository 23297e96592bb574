#!/usr/bin/env bash
# Nsight Compute launch statistics and stall profile of our kernel and of the FP8 peers, on the H200, same inputs.
# With the peers' wheels and packs in DIR (as for scripts/gpu_check.sh --wheels; default: the repository's .wheels):
#
#   bash scripts/profile_kernels_ncu.sh [--wheels DIR] [--out DIR] [--shape hd128] [--seq 16384] [--causal]
#                                       [--targets zyfa-hopper,cute-zyfa-hopper,cudnn-fp8,flashinfer-fa3]
#                                       [--cute-form PV_OVERLAP=1] [--recipe zyfa-hopper:rowsum=rounded_mma]
#
# --wheels DIR with no wheel in it (e.g. a missing folder) installs nothing: the run uses what /tmp/site holds, and
# nothing is reinstalled under a job that runs from there. --targets: which of the four; --cute-form: the CuTe
# kernel's form (scripts/launch_kernel_for_ncu.py --cute-form); --recipe: the recipe spec our two kernels run
# (default zyfa-hopper; the peers run their own numerics).
#
# Writes OUT/ncu_<target>.txt (OUT: --out, else the current directory) for zyfa-hopper (our Triton kernel), our CuTe
# DSL kernel (cute-zyfa-hopper; skipped with a line when nvidia-cutlass-dsl is not importable), cuDNN FP8 and FA3's FP8 kernel (FlashInfer): grid, block, registers, shared
# memory, cluster, occupancy, speed of light, the pipes' utilisation (ComputeWorkloadAnalysis: tensor, XU, ALU, FMA; and each pipe's share of issued instructions), the
# instruction counts (InstructionStats), memory traffic (MemoryWorkloadAnalysis: L2 hit rate, DRAM throughput),
# warp states and scheduler statistics of each kernel of the last of three
# calls (the first two warm up; a peer may launch more
# than one kernel per call: the attention kernel is the long one). The clocks are left as they are
# (--clock-control none), so durations are the bench's.
set -u
OUT=$PWD  # the caller's directory, unless --out names another
WHEELS=''
SHAPE=hd128
SEQ=16384
CAUSAL=''
TARGETS=zyfa-hopper,cute-zyfa-hopper,cudnn-fp8,flashinfer-fa3
CUTE_FORM=''
RECIPE=zyfa-hopper
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --shape) SHAPE=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;;
    --causal) CAUSAL=--causal; shift ;;
    --targets) TARGETS=$2; shift 2 ;;
    --cute-form) CUTE_FORM=$2; shift 2 ;;
    --recipe) RECIPE=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -u$/{/^set -u$/!p}' "$0"; exit 0 ;;
    *) echo "profile_kernels_ncu.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT" 2>/dev/null && OUT=$(cd "$OUT" && pwd) || { echo "profile_kernels_ncu.sh: cannot write to $OUT" >&2
                                                            exit 2; }
case "$WHEELS" in /*|'') ;; *) WHEELS=$PWD/$WHEELS ;; esac
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-$PWD/.wheels}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ -x "$NCU" ] || { echo "profile_kernels_ncu.sh: ncu not found" >&2; exit 2; }
ls "$WHEELS"/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site "$WHEELS"/*.whl
for pack in "$WHEELS"/*.tar.xz; do
  [ -e "$pack" ] && mkdir -p /tmp/site && tar -xJf "$pack" -C /tmp/site
done
export PYTHONPATH=.:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# nvidia-cutlass-dsl (the CuTe kernel; scripts/stage_cute_wheels.py) installed with --target: its .pth, which
# adds dsl_packages to the path, is not read there
[ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ] && export PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages
SECTIONS=(--section LaunchStats --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section InstructionStats --section WarpStateStats --section SchedulerStats)
# one regular expression (a name it matches nothing for is no error): the stall reasons, each pipe's share of issued
# instructions, the tensor pipe's (gmma) active cycles and the instructions issued
METRICS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|sm__inst_executed_pipe_(alu|fma|fmaheavy|xu|uniform)\.avg\.pct_of_peak_sustained_active|sm__pipe_tensor_op_gmma_cycles_active\.avg\.pct_of_peak_sustained_active|smsp__inst_executed\.sum'

for target in ${TARGETS//,/ }; do
  peer=()
  case "$target" in
    zyfa-hopper) peer=(--recipe "$RECIPE") ;;
    cute-zyfa-hopper)
      python3 -c 'import cutlass.cute' 2>/dev/null || { echo "== $target: skipped (nvidia-cutlass-dsl not importable)"
                                                       continue; }
      peer=(--cute --recipe "$RECIPE" ${CUTE_FORM:+--cute-form "$CUTE_FORM"}) ;;
    *) peer=(--peer "$target") ;;
  esac
  echo "== $target ($SHAPE, $SEQ tokens, ${CAUSAL:-non-causal}${peer[*]:+; ${peer[*]}})"
  # the kernels of the last call only (launch_kernel_for_ncu.py brackets it with cudaProfilerStart / Stop)
  timeout 120 "$NCU" --clock-control none --profile-from-start off "${SECTIONS[@]}" \
    --metrics "$METRICS" \
    python3 scripts/launch_kernel_for_ncu.py --shape "$SHAPE" --seq "$SEQ" "${peer[@]}" $CAUSAL \
    > "$OUT/ncu_$target.txt" 2>&1
  echo "rc=$? $(grep -c 'Duration' "$OUT/ncu_$target.txt") kernels profiled"
done
