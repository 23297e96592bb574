#!/usr/bin/env bash
# The length-cliff sweep (zyfa cliffs, docs/CLIFFS.md) on one H200, over our Triton kernel under every recipe it
# honours (accuracy.implementations.builtin_names(): the triton:* names), cuDNN FP8, FA3 through FlashInfer, AMD's
# Triton FP8 forward (flash-attn) and SDPA BF16 on cuDNN, at head dim 128 and 64, causal and not, s_q = s_k and
# chunked prefill (the last 128 query rows against all L keys). From the repository root on the GPU machine:
#
#   bash scripts/cliffs_h200.sh OUT_DIR
#
# Writes OUT_DIR/hd128/ and OUT_DIR/hd64/, each cliffs.jsonl + cliffs.png + cliffs.md (zyfa cliffs --out), and
# OUT_DIR/cliffs_h200.log. Kernels this machine lacks (a package, the GPU) are listed as not run, with the reason.
#
# Budget: about 6 minutes on one H200. Each length's work is kept small: batch 1, 2 query heads on 1 KV head (GQA
# 2:1), Gaussian inputs, FP64 oracle once per (length, mask, shape) shared by every kernel. Lengths: 1..1024 step
# 1 at head dim 128 (step 2 at head dim 64), then the default windows +-64 around m*2^k > 1024 (m = 64, 128, 176,
# 224, up to 32768) at a COARSER step than zyfa cliffs' default (step 4, so the jump rule still sees 8 neighbours
# within +-16; every window centre itself is measured). Rows: about (1024 + 465) lengths x 2 masks x ~1.9 shapes x
# 20 kernels = ~113K kernel calls at head dim 128, half that at 64.
# Every zyfa cliffs call runs with --resume under its own timeout, so a run cut short by the device limit is
# continued by calling the script again with the same OUT_DIR (the rows already made are kept and skipped).
#
# Environment overrides: HEADS (2), KV_HEADS (1), COARSE_STEP (4), LENGTHS_128 / LENGTHS_64 (zyfa cliffs --lengths
# specs; default the ranges above), IMPLS (comma-separated implementations), HEAD_DIMS ("128 64"),
# TIMEOUT_128 / TIMEOUT_64 (seconds per call; default 230 / 120), WHEELS (.wheels: installed with --no-deps into
# /tmp/site first, with the *.tar.xz FlashInfer packs of scripts/build_flashinfer_fa3.py, as gpu_real_kernels.sh).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/cliffs_h200.sh OUT_DIR}
mkdir -p "$OUT" || { echo "cliffs_h200.sh: cannot create $OUT" >&2; exit 2; }
LOG="$OUT/cliffs_h200.log"
export PYTHONUNBUFFERED=1
WHEELS=${WHEELS:-.wheels}
export PYTHONPATH=.
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl 2>&1 | tail -3
  for pack in "$WHEELS"/*.tar.xz; do [ -e "$pack" ] && tar -xJf "$pack" -C /tmp/site; done
  export PYTHONPATH=.:/tmp/site
fi
HEADS=${HEADS:-2}
KV_HEADS=${KV_HEADS:-1}
STEP=${COARSE_STEP:-4}
IMPLS=${IMPLS:-$(python3 -c "
from accuracy.implementations import builtin_names
print(','.join([n for n in builtin_names() if n.startswith('triton:')]
               + ['cudnn-fp8', 'flashinfer-fa3', 'flash-attn-triton-amd', 'sdpa-bf16:cudnn']))")}
# the default windows above 1024 at step $STEP (zyfa cliffs' own default ranges, coarser)
WINDOWS=$(python3 -c "
from accuracy.cliffs import default_lengths, format_lengths
print(format_lengths([n for n in default_lengths(coarse_step=$STEP) if n > 1024]))")
LENGTHS_128=${LENGTHS_128:-1-1024,$WINDOWS}
LENGTHS_64=${LENGTHS_64:-1-1024:2,$WINDOWS}
{
  echo "cliffs_h200.sh $(date -u +%FT%TZ) commit ${ZYFA_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null)}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
  echo "implementations: $IMPLS"
} | tee "$LOG"
status=0
for hd in ${HEAD_DIMS:-128 64}; do
  if [ "$hd" = 64 ]; then lengths=$LENGTHS_64; limit=${TIMEOUT_64:-120}; else lengths=$LENGTHS_128; limit=${TIMEOUT_128:-230}; fi
  t0=$(date +%s)
  timeout "$limit" python3 -m zyfa.cli cliffs --implementations "$IMPLS" --head-dim "$hd" --heads "$HEADS" \
    --kv-heads "$KV_HEADS" --mask both --shapes both --chunk 128 --lengths "$lengths" --device cuda --no-progress \
    --out "$OUT/hd$hd" --resume 2>&1 | tee -a "$LOG" | tail -40
  rc=${PIPESTATUS[0]}
  echo "hd$hd: exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
  if [ "$rc" != 0 ]; then
    status=$rc
    [ -f "$OUT/hd$hd/cliffs.jsonl.partial" ] && echo "hd$hd: unfinished; call the script again with $OUT to resume" \
      | tee -a "$LOG"
  fi
done
exit "$status"
