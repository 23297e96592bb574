#!/usr/bin/env bash
# Real kernels beside their emulations, on the H200. Run from the repo root on the GPU machine with the wheels
# of .wheels/ carried (flash-attn built without its CUDA extension, nvidia-cudnn-frontend; made by
# scripts/build_real_kernel_wheels.sh; FlashInfer's FA3 FP8 pack and apache-tvm-ffi, made by
# scripts/build_flashinfer_fa3.py; docs/real_kernels.md):
#   bash scripts/gpu_real_kernels.sh        (writes under $OUT)
# 1. which built-in implementations are available there, and why not;
# 2. the GPU tests tests/kernels/test_real_implementations_gpu.py (each real kernel within 3% of its emulation
#    on the shipped captures and Gaussian inputs), one JSON line per measurement in $OUT/real_kernels.jsonl;
# 3. where `zyfa accuracy` has --implementations: result rows of every available implementation beside its
#    recipe on a capture and a Gaussian input ($OUT/accuracy_real_*.jsonl), the raw material of the report;
# 4. zyfa bench at hd128 with the real peers, AMD's Triton FP8 forward included ($OUT/bench_real_peers.*).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
  2>&1 | tail -3
for pack in .wheels/*.tar.xz; do  # FlashInfer's FA3 FP8 prefill (scripts/build_flashinfer_fa3.py)
  [ -e "$pack" ] && tar -xJf "$pack" -C /tmp/site
done
export PYTHONPATH=.:/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu_env.txt"
python3 - <<'EOF' 2>&1 | tee "$OUT/real_kernels_available.txt"
import importlib.metadata as md, torch
from zyfa.accuracy.implementations.registry import builtin_names, get_implementation
for dist in ("torch", "triton", "flash-attn", "nvidia-cudnn-frontend", "flashinfer-python", "apache-tvm-ffi"):
    try:
        print(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist} not installed")
print("cudnn backend", torch.backends.cudnn.version(), "| device", torch.cuda.get_device_name())
for name in builtin_names():
    ok, why = get_implementation(name).available()
    print(f"{name:28s} {'available' if ok else 'NOT available: ' + why}")
EOF
rm -f "$OUT/real_kernels.jsonl"
set -o pipefail
ZYFA_REAL_KERNELS_LOG="$OUT/real_kernels.jsonl" timeout ${TEST_TIMEOUT:-300} \
  python3 -m pytest -m gpu tests/kernels/test_real_implementations_gpu.py -q -rA -p no:cacheprovider -n ${WORKERS:-4} \
  ${TEST_ARGS:-} 2>&1 | tee "$OUT/real_kernels_tests.txt" | grep -E "PASSED|FAILED|XFAIL|SKIPPED|ERROR|passed|failed" \
  | tail -${TEST_TAIL:-60}
set +o pipefail
if python3 -m zyfa.cli accuracy --help 2>/dev/null | grep -q -- "--implementations"; then
  timeout ${ACC_TIMEOUT:-80} python3 -m zyfa.cli accuracy --inputs datasets/smollm2-lee-2048.h5 --layers 0,14 \
    --max-tokens 1024 --recipes zyfa-hopper,triton-amd,cudnn-fp8,bf16 --implementations available \
    --kernel examples/fp8_torch_attention.py:attention --kernel-recipe zyfa-hopper --device cuda --no-progress \
    --out "$OUT/accuracy_real_smollm2.jsonl" 2>&1 | tail -30
  timeout ${ACC_TIMEOUT:-80} python3 -m zyfa.cli accuracy --inputs gaussian --seq 2048 --heads 8 --kv-heads 2 \
    --causal --recipes zyfa-hopper,triton-amd,cudnn-fp8,bf16 --implementations available --device cuda \
    --no-progress --out "$OUT/accuracy_real_gaussian.jsonl" 2>&1 | tail -30
fi
# 4. speed beside the real peers at one shape (hd128, 8K and 16K tokens, both masks)
timeout ${BENCH_TIMEOUT:-100} python3 -m zyfa.cli bench --shapes hd128 --seqlens 8192,16384 --captured none \
  --recipes zyfa-hopper --recipes-other same --peers sdpa-bf16:cudnn,sdpa-bf16:flash,cudnn-fp8,flash-attn-triton-amd,flashinfer-fa3 \
  --warmup 10 --rep 40 --out "$OUT/bench_real_peers.json" 2>&1 | grep -v Warning | tail -12
ls -la "$OUT"
