#!/usr/bin/env bash
# The committed long-context measurement on one H200 (reports/longctx/), one resumable slice per call.
#
#   bash scripts/longctx_h200.sh STATE_DIR MAX_SECONDS [MODELS]
#
# The models' GGUF files travel in chunks (scripts/stage_files.py: the GPU machine takes 64 MiB per call) and are
# joined into $ZYFA_CACHE/models, hash-checked, before this runs; the haystack text (lee-v1.txt) is copied to
# $ZYFA_CACHE/texts. STATE_DIR holds the results between calls (a folder that lives as long as the machine); each
# call continues them (--resume) for at most MAX_SECONDS and copies them to $OUT. Rerun until it prints "wrote".
# The grid: 3 models x 9 implementations x 2 tasks x lengths 1K..32K (SmolLM2 to its 8K context) x 11 depths x
# 2 seeds, the models in bf16, layers a kernel refuses (cuDNN FP8's and FlashInfer's FA3 take no sliding window,
# Gemma 3's local layers) run by the model's own attention and recorded in each row.
set -u
STATE=${1:?state folder}
BUDGET=${2:-480}
MODELS=${3:-qwen25coder,gemma3,smollm2}
IMPLS=${IMPLS:-sdpa-fp32,stock,triton:zyfa-hopper,triton:zyfa,triton:fa3,triton:ck,triton:aiter,cudnn-fp8,flashinfer-fa3}
export ZYFA_CACHE=${ZYFA_CACHE:-/tmp/zyfa-cache} PYTHONPATH=.:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$STATE" "${OUT:-/tmp/out}"
python3 -m zyfa.cli longctx --models "$MODELS" --implementations "$IMPLS" --device cuda --dtype bf16 \
  --fallback stock --seeds 2 --batch-tokens 262144 --no-progress \
  --out "$STATE/results.jsonl" --resume --max-seconds "$BUDGET"
rc=$?
cp "$STATE"/results.jsonl* "${OUT:-/tmp/out}/" 2>/dev/null
ls -la "$STATE"
exit $rc
