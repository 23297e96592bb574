#!/usr/bin/env bash
# Final H200 call: GPU tests, ablation timings, full benchmark. Run from the repo root on the device:
#   bash scripts/gpu_final.sh   (needs .whl carried for cuDNN FP8; writes under $OUT)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1
export PYTHONPATH=.:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
D=$(date -u +%Y-%m-%d)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv | tee $OUT/gpu_env.txt
timeout ${TEST_TIMEOUT:-230} python3 -m pytest -m gpu tests/kernels -q -rA -p no:cacheprovider ${TEST_ARGS:-} \
  2>&1 | tee $OUT/gpu_tests_$D.txt | tail -${TEST_TAIL:-8}
timeout ${ABL_TIMEOUT:-90} python3 scripts/gpu_mad_timing.py 2>&1 | tee $OUT/ablations.txt
timeout ${BENCH_TIMEOUT:-300} python3 -m zyfa.cli bench --warmup 10 --rep 50 --out $OUT 2>&1 \
  | grep -v Warning | grep -v "return F.scaled" | tee $OUT/bench_log.txt | tail -5
