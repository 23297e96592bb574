#!/usr/bin/env bash
# The long-context session on one H200, run in the background while later calls bring the models' chunks
# (docs/LONGCTX.md, "Running the committed grid on the H200"). The first call starts it and returns:
#
#   setsid nohup bash scripts/longctx_h200_background.sh STATE DEADLINE_EPOCH >STATE/background.log 2>&1 </dev/null &
#
# What it does, in order, logging to stdout:
#   1. compiles the Triton kernel variants the grid launches (scripts/warm_longctx_kernels.py, 12 processes);
#   2. starts, beside the grid, the GPU tests that need no capture file (STATE/gpu_tests.txt) and FlashInfer FA3's
#      cliff sweep at head dim 64 (STATE/cliffs-flashinfer-hd64/, the lengths of scripts/cliffs_h200.sh);
#   3. for each model of MODELS, as soon as its GGUF file is in $ZYFA_CACHE/models (stage_files.py join moves it
#      there atomically, hash-checked), starts its grid: `zyfa longctx` into STATE/results-MODEL.jsonl with --resume
#      and --max-seconds up to DEADLINE_EPOCH less a margin. The models run at once, one process each (each loads
#      its GGUF on the CPU while the others use the GPU); rows' "seconds" are therefore not speeds.
# Nothing here waits past DEADLINE_EPOCH; a cut grid keeps its rows in STATE/results-MODEL.jsonl.partial and the
# same command continues it. Environment: IMPLS, MODELS, SEEDS (2), BATCH_TOKENS (262144), ZYFA_CACHE.
# PLAN=studies/X.toml runs a study plan instead of the grid (`zyfa longctx --plan PLAN --models M`, one process per
# model; MODELS then defaults to the plan's, GENERATE=N adds --generate N, which a plan that sets its own generate
# refuses unless equal); WARM_RECIPES picks the kernels compiled
# first; SIDE=0 leaves out the GPU tests and the cliff sweep.
set -u
cd "$(dirname "$0")/.."
STATE=${1:?usage: longctx_h200_background.sh STATE DEADLINE_EPOCH}
DEADLINE=${2:?usage: longctx_h200_background.sh STATE DEADLINE_EPOCH}
PLAN=${PLAN:-}
if [ -n "$PLAN" ] && [ -z "${MODELS:-}" ]; then
  MODELS=$(python3 -c "from zyfa.accuracy.scoring.plan import load_plan; print(' '.join(load_plan('$PLAN').models))")
fi
MODELS=${MODELS:-smollm2 gemma3 qwen25coder}
IMPLS=${IMPLS:-sdpa-fp32,stock,triton:zyfa-hopper,triton:zyfa,triton:fa3,triton:ck,triton:aiter,cudnn-fp8,flashinfer-fa3}
export ZYFA_CACHE=${ZYFA_CACHE:-/tmp/zyfa-cache} PYTHONUNBUFFERED=1
# /tmp/site: the carried wheels (longctx_h200_call.sh); nvidia-cutlass-dsl (cute:zyfa-hopper) installed there with
# --target, whose .pth (adding dsl_packages to the path) is not read, so its folder is named here, present or not yet
SITE=${SITE:-/tmp/site}
export PYTHONPATH=.:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$STATE"
log() { echo "$(date -u +%T) $*"; }
left() { echo $((DEADLINE - $(date +%s))); }

log "start: $(left) s to the deadline; commit ${ZYFA_GIT_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
t0=$SECONDS
timeout $(( $(left) > 400 ? 400 : $(left) )) python3 scripts/warm_longctx_kernels.py --workers 12 \
  --recipes "${WARM_RECIPES:-zyfa-hopper,zyfa,fa3,ck,aiter}" --models "$MODELS" >"$STATE/warm.log" 2>&1
log "kernels warmed in $((SECONDS - t0)) s: $(grep -c '^ok' "$STATE/warm.log") ok, $(grep -c '^FAIL' "$STATE/warm.log") failed"

[ "${SIDE:-1}" = 0 ] || (
  t1=$SECONDS
  timeout 900 python3 -m pytest -m gpu -n 6 -q -p no:cacheprovider tests \
    --ignore=tests/kernels/test_real_implementations_gpu.py --ignore=tests/kernels/test_attention_fp8_gpu.py \
    --ignore=tests/accuracy/test_inputs_draws_hash_and_capture_round_trip.py >"$STATE/gpu_tests.txt" 2>&1
  log "GPU tests: exit $? after $((SECONDS - t1)) s: $(tail -1 "$STATE/gpu_tests.txt")"
) &

[ "${SIDE:-1}" = 0 ] || (
  LENGTHS=$(python3 -c "
from zyfa.accuracy.cliffs.sweep import default_centres, format_lengths
c = {n for c in default_centres() for n in range(c - 16, c + 17, 4) if n <= 32768}
t = {n for m in range(128, 1025, 128) for n in range(m - 16, m + 17, 4) if n > 128}
print('1-128,' + format_lengths(sorted(t | c)))")
  t2=$SECONDS
  timeout $(( $(left) > 600 ? 600 : $(left) )) python3 -m zyfa.cli cliffs --implementations flashinfer-fa3 \
    --head-dim 64 --heads 2 --kv-heads 1 --mask both --shapes both --chunk 128 --lengths "$LENGTHS" --device cuda \
    --no-progress --out "$STATE/cliffs-flashinfer-hd64" --resume >"$STATE/cliffs-flashinfer-hd64.log" 2>&1
  log "FlashInfer cliffs hd64: exit $? after $((SECONDS - t2)) s"
) &

for m in $MODELS; do
  f=$(python3 -c "from zyfa.capture.models import MODELS; print(MODELS['$m'].file_name)")
  while [ ! -f "$ZYFA_CACHE/models/$f" ]; do
    if [ "$(left)" -lt 90 ]; then log "$m: its file never came; not run"; continue 2; fi
    sleep 2
  done
  log "$m: model in place, grid starts with $(left) s left"
  if [ -n "$PLAN" ]; then
    grid=(--plan "$PLAN" ${GENERATE:+--generate "$GENERATE"})  # a plan's own generate = N applies without it
  else
    grid=(--implementations "$IMPLS" --dtype bf16 --fallback stock --seeds "${SEEDS:-2}")
  fi
  (
    python3 -m zyfa.cli longctx --models "$m" "${grid[@]}" --device cuda \
      --batch-tokens "${BATCH_TOKENS:-262144}" --no-progress \
      --out "$STATE/results-$m.jsonl" --resume --max-seconds $(( $(left) - 60 )) >"$STATE/longctx-$m.log" 2>&1
    log "$m: zyfa longctx exit $?"
  ) &
done
wait
log "all done with $(left) s left"
