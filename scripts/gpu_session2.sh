#!/usr/bin/env bash
# Session 2 on the H200, one call under a hard 10-minute cap. From the repo root on the device:
#   ZYFA_GIT_COMMIT=<sha> bash scripts/gpu_session2.sh      (carry .whl for cuDNN FP8; writes under $OUT)
# Session 3: AB_SET=session3 GLUON=0 (the MAD-conversion / P_PERM A/B matrix; no Gluon prototype), TEST_SHARDS
# ('k1;k2;k3': parallel pytest processes, one per -k expression), TEST_TIMEOUT (s), BENCH_END (s after start),
# EXTRA_RECIPES (';'-separated, appended to both bench recipe lists).
# Stages, each under its own `timeout` and tee'd under $OUT (a failing stage never stops the next):
#   0 cuDNN frontend wheel -> /tmp/site                               (~10 s)
#   1 Triton cache warm-up of every A/B and bench variant, in parallel worker processes, in the background
#     while the GPU tests run (256-token inputs: same specialization, so later runs load the kernels)
#   2 GPU tests (pytest -m gpu tests/kernels)        -> gpu_tests_<date>.txt        (<= 230 s)
#   3 A/B timings (scripts/gpu_session2_ab.py)       -> ab.md, ab.jsonl, ab_err.txt (<= 110 s)
#   4 zyfa bench, all shapes, 8K/16K/32K, peers       -> bench_<date>.{json,md}, bench_log.txt (to 505 s)
#   5 Gluon prototype (scripts/gluon_fa_sm90.py --run): softmax/QK overlap, ptxas -O3 vs -O1 -> gluon.txt (to 555 s)
set -u
T0=$(date +%s)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
D=$(date -u +%Y-%m-%d)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
stage() { echo "=== $(date -u +%H:%M:%S) (+$(( $(date +%s) - T0 )) s) $*" | tee -a "$OUT/stages.txt"; }

stage "0 install cuDNN frontend wheel"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >"$OUT/pip.txt" 2>&1 || echo "wheel install failed (cuDNN FP8 peer will be missing): see pip.txt" | tee -a "$OUT/stages.txt"
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
echo "ZYFA_GIT_COMMIT=${ZYFA_GIT_COMMIT:-unset}" | tee "$OUT/commit.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv 2>&1 | tee "$OUT/gpu_env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 \
  | tee -a "$OUT/gpu_env.txt"

HD128_RECIPES="zyfa-hopper;zyfa;zyfa:accumulator=hopper_fp8;zyfa-exp2:accumulator=hopper_fp8,accum_flush_tiles=1;zyfa-fp32sum:accumulator=hopper_fp8,accum_flush_tiles=1;ck:accumulator=hopper_fp8,accum_flush_tiles=1;aiter:accumulator=hopper_fp8,accum_flush_tiles=1;fa3;fa3:accum_flush_tiles=1"
OTHER_RECIPES="zyfa-hopper;zyfa;zyfa-exp2:accumulator=hopper_fp8,accum_flush_tiles=1;ck:accumulator=hopper_fp8,accum_flush_tiles=1;fa3"
if [ -n "${EXTRA_RECIPES:-}" ]; then HD128_RECIPES="$HD128_RECIPES;$EXTRA_RECIPES"; OTHER_RECIPES="$OTHER_RECIPES;$EXTRA_RECIPES"; fi

stage "1 cache warm-up (background)"
timeout 200 python3 scripts/gpu_session2_warm.py --set "${AB_SET:-session2}" --workers 12 --recipes "$HD128_RECIPES" \
  --recipes-other "$OTHER_RECIPES" >"$OUT/warm.txt" 2>&1 &
WARM=$!

stage "2 GPU tests"
if [ -n "${TEST_SHARDS:-}" ]; then
  # TEST_SHARDS='k-expr;k-expr;...': one pytest process per -k expression, in parallel (compiles are CPU-bound)
  IFS=';' read -ra SH <<< "$TEST_SHARDS"
  PIDS=()
  for i in "${!SH[@]}"; do
    timeout "${TEST_TIMEOUT:-230}" python3 -m pytest -m gpu tests/kernels -q -rA -p no:cacheprovider -k "${SH[$i]}" \
      >"$OUT/gpu_tests_shard$i.txt" 2>&1 &
    PIDS+=($!)
  done
  wait "${PIDS[@]}"
  for i in "${!SH[@]}"; do echo "### shard $i: -k '${SH[$i]}'"; cat "$OUT/gpu_tests_shard$i.txt"; done \
    >"$OUT/gpu_tests_$D.txt"
  rm -f "$OUT"/gpu_tests_shard*.txt
else
  timeout "${TEST_TIMEOUT:-230}" python3 -m pytest -m gpu tests/kernels -q -rA -p no:cacheprovider 2>&1 \
    | tee "$OUT/gpu_tests_$D.txt" | tail -15
fi
grep -E "^(=+ )?[0-9]+ (passed|failed)|passed|failed|error" "$OUT/gpu_tests_$D.txt" | grep -v "^PASSED\|^FAILED" \
  | tail -6 | tee -a "$OUT/stages.txt"
grep -E "^FAILED" "$OUT/gpu_tests_$D.txt" | head -20 | tee -a "$OUT/stages.txt"

stage "wait for the warm-up"
wait $WARM 2>/dev/null
tail -2 "$OUT/warm.txt" | tee -a "$OUT/stages.txt"
grep -c "^FAIL" "$OUT/warm.txt" | sed 's/^/warm-up failures: /' | tee -a "$OUT/stages.txt"

stage "3 A/B timings"
AB=$(left 330); [ "$AB" -gt 110 ] && AB=110; [ "$AB" -lt 20 ] && AB=20
timeout "$AB" python3 scripts/gpu_session2_ab.py --set "${AB_SET:-session2}" --out "$OUT" --rep 60 2>"$OUT/ab_err.txt" | tee "$OUT/ab.md"

stage "4 zyfa bench"
BT=$(left "${BENCH_END:-505}"); [ "$BT" -lt 30 ] && BT=30
timeout "$BT" python3 -m zyfa.cli bench --warmup 10 --rep 50 --shapes hd128,mla,hd256,hd64 \
  --recipes "$HD128_RECIPES" --recipes-other "$OTHER_RECIPES" --out "$OUT" 2>&1 \
  | grep -v Warning | grep -v "return F.scaled" | tee "$OUT/bench_log.txt" | tail -5
stage "5 Gluon prototype"
GT=$(left 555)
if [ "${GLUON:-1}" != 1 ]; then
  echo "skipped: GLUON=${GLUON:-1}" | tee "$OUT/gluon.txt"
elif [ "$GT" -ge 15 ]; then
  timeout "$GT" python3 scripts/gluon_fa_sm90.py --run 2>&1 | grep -v Warning | tee "$OUT/gluon.txt" | tail -20
else
  echo "skipped: $GT s left" | tee "$OUT/gluon.txt"
fi
stage "done"
