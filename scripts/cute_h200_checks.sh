#!/usr/bin/env bash
# The CuTe DSL kernel's GPU checks and timings on the H200 (issue 43) as one background job, so that a session's
# device time goes to them while its calls stage other files (the long-context grid's model):
#
#   setsid nohup bash scripts/cute_h200_checks.sh DIR >DIR.log 2>&1 </dev/null &
#
# Needs nvidia-cutlass-dsl in /tmp/site (scripts/stage_cute_wheels.py; scripts/longctx_h200_call.sh installs it from
# staged chunks) beside the peers' wheels (cuDNN's frontend, FlashInfer's FA3 pack), and datasets/ in the tree (the
# capture tests). Runs from a private copy of the tree (DIR/src: a later call's copy cannot change it under the job),
# the timed steps first, while the GPU has nothing else to do; DIR/timed marks their end (start other GPU work only
# then), DIR/done the job's:
#   bench     zyfa bench: our kernels and the peers at every shape, 32K, both masks, 5 interleaved repeats (the
#             command of reports/bench/cute.md, with hd256 and FlashInfer's FA3); DIR/cute.json and DIR/cute.md
#   ab-*      scripts/ab_kernel_variants.py --set cute-hd256 / cute-rowsum / cute-persistent / cute-masked-overlap
#             (ab-masked at 4096 tokens, ab-masked32k at 32768, 10 rounds each, as its rule asks): each same-bits form
#             checked bit for bit against the default, then 5 rounds against cuDNN FP8 (cute-rowsum: 10, the rounds
#             its PV_OVERLAP rule asks for) (DIR/ab-*/ab_kernel_variants.txt)
#   ncu       scripts/profile_kernels_ncu.sh: the CuTe kernel (rowsum=rounded_mma) and cuDNN FP8, hd128, causal
#   ncu-persistent  the same profile of the CuTe kernel's PERSISTENT form (L2 hit rate and DRAM throughput against
#             the default's: is its causal loss the order's, whose passes span every head?)
#   gpu-tests the CuTe kernel's GPU tests and the cuDNN FP8 peer's
# Each step's output goes to DIR/<step>.txt as it runs, one line per step into the log. ZYFA_GIT_COMMIT names the
# tree's commit in the bench's provenance. DRY_RUN=1 prints each step's command instead of running it (the CPU test,
# tests/test_cute_h200_checks.py, parses them). STEP_SECONDS (default 900): each step's limit.
# STEPS="bench gpu-tests ...": which steps run, in that order (default all, in the order above; a short session
# puts gpu-tests second, so that the checks come back before the A/B sets and the profile).
set -u
DIR=${1:?usage: cute_h200_checks.sh DIR}
ALL_STEPS="bench ab-hd256 ab-rowsum ab-persistent ab-masked ab-masked32k ncu ncu-persistent gpu-tests"
# STEPS: which steps, in which order (default ALL_STEPS); checked before anything is written
STEPS=${STEPS:-$ALL_STEPS}
for s in $STEPS; do
  case " $ALL_STEPS " in *" $s "*) ;; *) echo "cute_h200_checks.sh: unknown step '$s' (steps: $ALL_STEPS)" >&2; exit 2 ;; esac
done
mkdir -p "$DIR"
step() {
  local name=$1; shift
  if [ -n "${DRY_RUN:-}" ]; then echo "$name: $*"; return 0; fi
  echo "[$(date -u +%T)] $name: $*"
  timeout "${STEP_SECONDS:-900}" "$@" >"$DIR/$name.txt" 2>&1
  echo "[$(date -u +%T)] $name: exit $?"
}
if [ -z "${DRY_RUN:-}" ]; then
  rm -rf "$DIR/src" && mkdir -p "$DIR/src"
  tar --exclude='./.stage*' --exclude=./.wheels --exclude=./.git -cf - . | tar -xf - -C "$DIR/src"
  cd "$DIR/src" || exit 1
  mkdir -p reports/bench
fi
export PYTHONPATH=.:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
run_step() {
  case $1 in
    bench)
      step bench python3 -m zyfa bench --shapes hd64,hd128,hd256,mla --seqlens 32768 --causal both \
        --recipes zyfa-hopper --recipes-other same --cute-recipes 'zyfa-hopper;zyfa-hopper:rowsum=rounded_mma' \
        --peers cudnn-fp8,flashinfer-fa3,sdpa-bf16:cudnn --captured none --repeats 5 --out reports/bench/cute.json
      [ -z "${DRY_RUN:-}" ] && cp reports/bench/cute.json reports/bench/cute.md "$DIR/" 2>/dev/null ;;
    ab-hd256) step ab-hd256 python3 scripts/ab_kernel_variants.py --set cute-hd256 --rounds 5 --out "$DIR/ab-hd256" ;;
    ab-rowsum)
      step ab-rowsum python3 scripts/ab_kernel_variants.py --set cute-rowsum --rounds 10 --out "$DIR/ab-rowsum" ;;
    ab-persistent)
      step ab-persistent python3 scripts/ab_kernel_variants.py --set cute-persistent --rounds 5 --out "$DIR/ab-persistent" ;;
    ab-masked)
      step ab-masked python3 scripts/ab_kernel_variants.py --set cute-masked-overlap --rounds 10 --seq 4096 \
        --out "$DIR/ab-masked" ;;
    ab-masked32k)
      step ab-masked32k python3 scripts/ab_kernel_variants.py --set cute-masked-overlap --rounds 10 --seq 32768 \
        --out "$DIR/ab-masked32k" ;;
    ncu)
      step ncu bash scripts/profile_kernels_ncu.sh --wheels /tmp/none --targets cute-zyfa-hopper,cudnn-fp8 \
        --recipe zyfa-hopper:rowsum=rounded_mma --causal --out "$DIR/profile" ;;
    ncu-persistent)
      step ncu-persistent bash scripts/profile_kernels_ncu.sh --wheels /tmp/none --targets cute-zyfa-hopper \
        --recipe zyfa-hopper:rowsum=rounded_mma --cute-form PERSISTENT=1 --causal --out "$DIR/profile-persistent" ;;
    gpu-tests)
      step gpu-tests python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/kernels/test_cute_kernel_gpu.py \
        tests/zyfa/test_cudnn_fp8_graph_cache_gpu.py ;;
  esac
}
left=$STEPS
for s in $STEPS; do
  run_step "$s"
  left=${left#"$s"}; left=${left# }
  # DIR/timed once no timing step is left to run (gpu-tests times nothing)
  if [ -z "${DRY_RUN:-}" ] && [ ! -e "$DIR/timed" ] && [ -z "$(echo " $left " | grep -E ' (bench|ab-[a-z0-9]+|ncu[a-z-]*) ')" ]; then
    touch "$DIR/timed"
  fi
done
[ -z "${DRY_RUN:-}" ] && touch "$DIR/done"
exit 0
