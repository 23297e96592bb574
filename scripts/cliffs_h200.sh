#!/usr/bin/env bash
# The length-cliff sweep (zyfa cliffs, docs/CLIFFS.md) on one H200: our Triton kernel under every recipe it honours
# (accuracy.implementations.registry.builtin_names(): the triton:* names), cuDNN FP8, FA3 through FlashInfer, AMD's Triton
# FP8 forward (flash-attn) and SDPA BF16 on cuDNN, at head dim 128 and 64, causal and not, s_q = s_k and chunked
# prefill (the last 128 query rows against all L keys). From the repository root on the GPU machine:
#
#   bash scripts/cliffs_h200.sh OUT_DIR
#
# Writes OUT_DIR/hd128/ and OUT_DIR/hd64/: one zyfa cliffs folder per group of kernels (GROUP/cliffs.jsonl, .png,
# .md) and the groups rendered together (cliffs.md, cliffs.png: zyfa cliffs --render a.jsonl,b.jsonl,...), and
# OUT_DIR/cliffs_h200.log. Kernels this machine lacks (a package, the GPU) are listed as not run, with the reason.
#
# Budget: about 6 minutes on one H200 (16 CPU cores). At these sizes every call is launch- and Python-bound, so
# the kernels run as parallel zyfa cliffs processes (per head dim: our kernel's recipes in 5 groups, cuDNN FP8,
# SDPA-cuDNN, FlashInfer FA3, AMD's Triton forward), each computing the FP64 oracle once per (length, mask, shape)
# for its own kernels. Inputs: Gaussian, batch 1, 2 query heads on 1 KV head (GQA 2:1), seed 0.
# Measured on the H200 (2026-12-02, all groups at once): a group of ~3 of our kernel's recipes makes about 13
# rows/s at head dim 128 and 16 at 64 (compiles included: each recipe compiles per mask, head dim and length
# class), cuDNN FP8 about 4.5 rows/s and SDPA-cuDNN 6 (both build a cuDNN graph for every new length), AMD's
# Triton forward 0.25-0.4 (it compiles again for every new length). So the lengths are subsets of zyfa cliffs'
# default ranges (1..1024 step 1, then +-64 around m*2^k > 1024 for m = 64, 128, 176, 224 up to 32768), COARSER
# than the default:
#   - our kernel and FlashInfer FA3: 1..128 step 1, then +-16 at step 4 around every multiple of 128 up to 1024
#     and around each of the 15 default window centres (step 4 keeps the 8 neighbours within +-16 the jump rule
#     needs): 326 lengths, 1048 points (2 masks; the chunk shape at L > 128), ~3.4K rows per group: ~4.5-5 min;
#   - cuDNN FP8 and SDPA-cuDNN: 1..128 step 1, 136..1024 step 8 (NaN rows and refusals only: too sparse for
#     jumps), and the same +-16 step 4 windows around the 15 centres: 371 lengths, 1228 rows each: 3.5-5 min;
#   - AMD's Triton forward: 112..144 step 4, and 1, 2, 3, 16, 17, 64, 65, 1024, 1025, 4096, 4097, 32768: 21
#     lengths, 60 rows: 2.5-4.5 min.
# About 39K kernel calls in all (41K with FlashInfer); the whole script about 5.5 minutes plus the machine's
# start. Each process runs under its own timeout (GROUP_TIMEOUT, default 330 s) with --resume: a group cut short
# keeps its rows in GROUP/cliffs.jsonl.partial (rendered all the same), and calling the script again with the
# same OUT_DIR continues it. The full default ranges of zyfa cliffs (2895 lengths) take about ten such calls.
#
# Environment overrides: HEADS (2), KV_HEADS (1), HEAD_DIMS ("128 64"), GROUP_TIMEOUT (330), LENGTHS_TRITON,
# LENGTHS_CUDNN, LENGTHS_AMD (zyfa cliffs --lengths specs), WHEELS (.wheels: installed with --no-deps into
# /tmp/site first, with the *.tar.xz FlashInfer packs of scripts/build_flashinfer_fa3.py, as gpu_real_kernels.sh).
set -u
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/cliffs_h200.sh OUT_DIR}
mkdir -p "$OUT" || { echo "cliffs_h200.sh: cannot create $OUT" >&2; exit 2; }
LOG="$OUT/cliffs_h200.log"
export PYTHONUNBUFFERED=1
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
WHEELS=${WHEELS:-.wheels}
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl 2>&1 | tail -3
  for pack in "$WHEELS"/*.tar.xz; do [ -e "$pack" ] && tar -xJf "$pack" -C /tmp/site; done
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
HEADS=${HEADS:-2}
KV_HEADS=${KV_HEADS:-1}
T=${GROUP_TIMEOUT:-330}
# the triton:* names in five groups, one per line
TRITON_GROUPS=$(python3 -c "
from zyfa.accuracy.implementations.registry import builtin_names
names = [n for n in builtin_names() if n.startswith('triton:')]
print('\n'.join(','.join(names[i::5]) for i in range(min(5, len(names)))))")
CENTRES_4=$(python3 -c "
from zyfa.accuracy.cliffs.sweep import default_centres, format_lengths
print(format_lengths(sorted({n for c in default_centres() for n in range(c - 16, c + 17, 4) if n <= 32768})))")
TILES_4=$(python3 -c "
from zyfa.accuracy.cliffs.sweep import format_lengths
print(format_lengths(sorted({n for m in range(128, 1025, 128) for n in range(m - 16, m + 17, 4) if n > 128})))")
LENGTHS_TRITON=${LENGTHS_TRITON:-1-128,$TILES_4,$CENTRES_4}
LENGTHS_CUDNN=${LENGTHS_CUDNN:-1-128,136-1024:8,$CENTRES_4}
LENGTHS_AMD=${LENGTHS_AMD:-112-144:4,1,2,3,16,17,64,65,1024,1025,4096,4097,32768}
{
  echo "cliffs_h200.sh $(date -u +%FT%TZ) commit ${ZYFA_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null)}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1
} | tee "$LOG"

run_group() {  # head dim, group name, implementations, lengths
  local dir="$OUT/hd$1/$2"
  mkdir -p "$OUT/hd$1"
  local t0=$SECONDS
  timeout "$T" python3 -m zyfa.cli cliffs --implementations "$3" --head-dim "$1" --heads "$HEADS" \
    --kv-heads "$KV_HEADS" --mask both --shapes both --chunk 128 --lengths "$4" --device cuda --no-progress \
    --out "$dir" --resume >"$dir.log" 2>&1
  local rc=$?
  echo "hd$1 $2 ($3): exit $rc after $((SECONDS - t0)) s$([ -f "$dir/cliffs.jsonl.partial" ] && echo \
    ", unfinished: call the script again with $OUT to resume")" >>"$LOG"
}

for hd in ${HEAD_DIMS:-128 64}; do
  i=0
  while read -r group; do
    i=$((i + 1))
    run_group "$hd" "triton$i" "$group" "$LENGTHS_TRITON" &
  done <<<"$TRITON_GROUPS"
  run_group "$hd" cudnn cudnn-fp8 "$LENGTHS_CUDNN" &
  run_group "$hd" sdpa sdpa-bf16:cudnn "$LENGTHS_CUDNN" &
  run_group "$hd" flashinfer flashinfer-fa3 "$LENGTHS_TRITON" &
  run_group "$hd" amd flash-attn-triton-amd "$LENGTHS_AMD" &
done
wait
status=0
for hd in ${HEAD_DIMS:-128 64}; do
  files=$(for d in "$OUT/hd$hd"/*/; do  # a finished group's file, else what a cut one has kept
    if [ -f "$d/cliffs.jsonl" ]; then echo "$d/cliffs.jsonl"; elif [ -f "$d/cliffs.jsonl.partial" ]; then
      echo "$d/cliffs.jsonl.partial"; fi; done | paste -sd, -)
  if [ -z "$files" ]; then
    echo "hd$hd: no group finished" | tee -a "$LOG"
    status=1
    continue
  fi
  python3 -m zyfa.cli cliffs --render "$files" --out "$OUT/hd$hd" 2>&1 | tee -a "$LOG"
done
grep -h "^not run\|error" "$OUT"/hd*/*.log 2>/dev/null | sort -u | tee -a "$LOG"
exit "$status"
