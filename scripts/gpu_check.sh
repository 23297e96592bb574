#!/usr/bin/env bash
# The GPU check: every GPU test, then the benchmark, in one call on an H200. From the repository root:
#
#   bash scripts/gpu_check.sh [--out DIR] [--no-tests] [--no-bench] [--shards 'K1;K2;...'] [--pytest-args '...']
#                             [--bench-args '...'] [--warm-args '...'] [--test-timeout S] [--bench-timeout S]
#                             [--wheels DIR]
#
# Writes DIR/gpu_tests.txt (the pytest log) and DIR/bench.json + DIR/bench.md (zyfa bench); without --out, the
# committed reports/tests/gpu_tests.txt and reports/bench/bench.{json,md} are replaced; on a machine whose
# results come back through a folder, pass --out that folder and copy the three files into reports/ after.
#   --no-tests / --no-bench   skip a stage
#   --shards 'K1;K2;...'      run the GPU tests as parallel pytest processes, one per -k expression (compiling
#                             kernels is CPU-bound; default: the four shards below). --shards '' = one process
#   --pytest-args '...'       extra pytest arguments, e.g. '-x', or '-n 8' where pytest-xdist is installed
#                             (then pass --shards '' too)
#   --bench-args '...'        extra zyfa bench arguments, e.g. '--shapes hd128 --seqlens 32768'
#   --warm-args '...'         arguments of the cache warm-up (scripts/warm_triton_cache.py), e.g. the bench's
#                             '--recipes A;B --recipes-other same --shapes hd128' (default: the bench's defaults)
#   --test-timeout S          wall-clock cap of the test stage (default 330 s)
#   --bench-timeout S         wall-clock cap of the bench stage (default 420 s)
#   --budget S                wall-clock cap of the whole call (default 570 s, under a 10-minute device limit):
#                             the bench gets what is left of it, at most --bench-timeout
#   --wheels DIR              wheels to install with --no-deps into /tmp/site first (default .whl: the cuDNN
#                             frontend wheel, for the cuDNN FP8 peer; without it that peer is left out), and
#                             *.tar.xz packs to unpack there (FlashInfer's FA3 FP8, scripts/build_flashinfer_fa3.py)
# ZYFA_GIT_COMMIT=<sha> names the commit in the results where the copy has no .git or a stale one (a device copy
# of the working tree may keep the .git of an earlier call: pass it there always).
# While the tests run, scripts/warm_triton_cache.py compiles the bench's kernel variants in the background.
# Every stage runs under its own timeout and a failing stage never stops the next; the exit status is the
# test stage's.
set -u
cd "$(dirname "$0")/.."

OUT=
TESTS=1
BENCH=1
SHARDS='agrees_with_emulator;key_permuted or saturating;tensor_core_row_sum or pipelined or exact_t;not (agrees_with_emulator or key_permuted or saturating or tensor_core_row_sum or pipelined or exact_t)'
PYTEST_ARGS=''
BENCH_ARGS=''
WARM_ARGS=''
TEST_TIMEOUT=330
BENCH_TIMEOUT=420
BUDGET=570
WHEELS=.whl
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --no-tests) TESTS=0; shift ;;
    --no-bench) BENCH=0; shift ;;
    --shards) SHARDS=$2; shift 2 ;;
    --pytest-args) PYTEST_ARGS=$2; shift 2 ;;
    --warm-args) WARM_ARGS=$2; shift 2 ;;
    --bench-args) BENCH_ARGS=$2; shift 2 ;;
    --test-timeout) TEST_TIMEOUT=$2; shift 2 ;;
    --bench-timeout) BENCH_TIMEOUT=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -u$/{/^set -u$/!p}' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
TESTS_OUT=${OUT:-reports/tests}
BENCH_OUT=${OUT:-reports/bench}
mkdir -p "$TESTS_OUT" "$BENCH_OUT"
T0=$(date +%s)
stage() { echo "=== $(date -u +%H:%M:%S) (+$(( $(date +%s) - T0 )) s) $*"; }

stage "environment"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl >/dev/null 2>&1 || echo "wheel install from $WHEELS failed: the cuDNN FP8 peer may be missing"
fi
# packed packages (scripts/build_flashinfer_fa3.py: FlashInfer's FA3 FP8 prefill, built for sm_90a)
for pack in "$WHEELS"/*.tar.xz; do
  [ -e "$pack" ] || continue
  mkdir -p /tmp/site && tar -xJf "$pack" -C /tmp/site || echo "unpacking $pack failed"
done
export PYTHONPATH=.:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# nvidia-cutlass-dsl (the CuTe kernel; scripts/stage_cute_wheels.py) installed with --target: its .pth, which
# adds dsl_packages to the path, is not read there
[ -d /tmp/site/nvidia_cutlass_dsl/dsl_packages ] && export PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages
export ZYFA_GIT_COMMIT=${ZYFA_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
echo "commit $ZYFA_GIT_COMMIT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1

WARM=
if [ "$BENCH" = 1 ]; then
  stage "Triton cache warm-up of the bench variants (background)"
  # shellcheck disable=SC2086
  timeout 300 python3 scripts/warm_triton_cache.py $WARM_ARGS >/tmp/gpu_check_warm.txt 2>&1 &
  WARM=$!
fi

STATUS=0
if [ "$TESTS" = 1 ]; then
  stage "GPU tests -> $TESTS_OUT/gpu_tests.txt"
  LOG="$TESTS_OUT/gpu_tests.txt"
  {
    echo "# GPU tests on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
    echo
    echo "Commit $ZYFA_GIT_COMMIT, $(date -u +%Y-%m-%dT%H:%M:%SZ): bash scripts/gpu_check.sh (pytest -m gpu tests)"
    echo
  } >"$LOG.tmp"
  if [ -n "$SHARDS" ]; then
    IFS=';' read -ra SH <<< "$SHARDS"
    PIDS=()
    for i in "${!SH[@]}"; do
      # shellcheck disable=SC2086
      timeout "$TEST_TIMEOUT" python3 -m pytest -m gpu tests -q -rA -p no:cacheprovider -k "${SH[$i]}" \
        $PYTEST_ARGS >"/tmp/gpu_check_shard$i.txt" 2>&1 &
      PIDS+=($!)
    done
    for i in "${!SH[@]}"; do
      wait "${PIDS[$i]}" || STATUS=1
      { echo "## shard $i: -k '${SH[$i]}'"; cat "/tmp/gpu_check_shard$i.txt"; echo; } >>"$LOG.tmp"
      rm -f "/tmp/gpu_check_shard$i.txt"
    done
  else
    # shellcheck disable=SC2086
    timeout "$TEST_TIMEOUT" python3 -m pytest -m gpu tests -q -rA -p no:cacheprovider $PYTEST_ARGS \
      >>"$LOG.tmp" 2>&1 || STATUS=1
  fi
  mv "$LOG.tmp" "$LOG"
  grep -E "(passed|failed|skipped|error).* in [0-9.]+s" "$LOG" | tail -8
  grep -E "^FAILED|^ERROR" "$LOG" | head -20
fi

if [ "$BENCH" = 1 ]; then
  stage "waiting for the warm-up"
  wait "$WARM" 2>/dev/null
  tail -1 /tmp/gpu_check_warm.txt
  grep -c "^FAIL" /tmp/gpu_check_warm.txt | sed 's/^/warm-up failures: /'
  BT=$(( BUDGET - ($(date +%s) - T0) ))
  [ "$BT" -gt "$BENCH_TIMEOUT" ] && BT=$BENCH_TIMEOUT
  [ "$BT" -lt 30 ] && BT=30
  stage "zyfa bench -> $BENCH_OUT/bench.json, $BENCH_OUT/bench.md (at most $BT s)"
  # shellcheck disable=SC2086
  timeout "$BT" python3 -m zyfa.cli bench --warmup 10 --rep 50 --out "$BENCH_OUT/bench.json" --overwrite \
    $BENCH_ARGS 2>&1 | grep -v Warning | grep -v "return F.scaled" | tail -5
fi
stage "done"
exit $STATUS
