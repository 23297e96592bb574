#!/usr/bin/env bash
# How the committed impact measurement was made: reports/impact/results_*.jsonl -> impact.md, and the model-impact
# section of the study report. Every command appends rows to its own --out file (--resume skips the rows already
# there), so a stop leaves usable rows and any stage can be re-run or extended (e.g. --windows 4). Concurrent runs
# write one file each; the renderers merge every reports/impact/results*.jsonl (a measurement found in several
# files counts once: the latest by date). Rows are never edited in place: the p_flushed_mean of the first rows
# (made before the emulator fix 2f53d66) is divided by the query heads at load time, with a note in the report;
# rows to discard are moved to <file>.dropped with `zyfa impact --drop-rows` (below), after which a --resume run
# into that file measures them again. The commands recorded inside the rows name the files as they were called
# then (results.jsonl, results_s2_*.jsonl); reports/history.md maps the old names to these.
# CPU only, hours on 2 cores. Run from anywhere: bash reports/impact/measure.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
D=reports/impact

# ---- results_7_recipes.jsonl: the first measurement (2026-11-29, contended 2-core CPU), 7 recipes.
# Superseded by the all-recipe files below except for SmolLM2's per-layer aiter rows; kept for those and for
# the record. Set SEVEN_RECIPES=1 to measure it again.
OUT=$D/results_7_recipes.jsonl
R=zyfa,zyfa-exp2,ck,aiter,fa3,bf16,fp32
if [[ "${SEVEN_RECIPES:-0}" == 1 ]]; then
  # window 0 of every model, every recipe, all layers swapped (~75 min there)
  python -m zyfa.cli impact --models smollm2,qwen25coder,gemma3 --recipes $R --tokens 2048 --windows 1 --text lee \
    --out $OUT --resume
  # per-layer sweep of SmolLM2 on window 0 (ran concurrently with the above, one thread; ~55 min there)
  python -m zyfa.cli impact --models smollm2 --recipes zyfa --tokens 2048 --windows 1 --text lee \
    --per-layer smollm2 --layer-recipes zyfa,aiter --out $OUT --resume --threads 1
  # a second window for SmolLM2 and Gemma3 (ran concurrently, ~31 and ~19 min there)
  python -m zyfa.cli impact --models smollm2 --recipes $R --tokens 2048 --windows 2 --text lee --out $OUT --resume
  python -m zyfa.cli impact --models gemma3 --recipes $R --tokens 2048 --windows 2 --text lee --out $OUT --resume
fi
# Known about these rows (the report says it too): the first two runs started before commit fdfa291, so their
# zyfa rows use the MAD offset 0 (now 1/16) and their fa3 rows an earlier Hopper accumulator model; all their
# fa3 rows predate 435c315 (Hopper model: one truncation fewer). The files below measure every window again.

# ---- every named recipe (`zyfa recipes`) on the three models, 3 held-out windows of 2048 tokens;
# two concurrent processes, one thread each, one file each
R17=fp32,bf16,zyfa,ck,aiter,zyfa-exp2,zyfa-fp32sum,zyfa-noscale,zyfa-pow2fixed,zyfa-tilescale,ck-blockscale,\
aiter-triton,triton-amd,zyfa-hopper,fa3,sage2,cudnn-fp8
python -m zyfa.cli impact --models smollm2,gemma3 --recipes $R17 --tokens 2048 --windows 3 --text lee \
  --out $D/results_smollm2_gemma3.jsonl --resume --threads 1 &
python -m zyfa.cli impact --models qwen25coder --recipes $R17 --tokens 2048 --windows 3 --text lee \
  --out $D/results_qwen25coder.jsonl --resume --threads 1 &
wait

# ---- per-layer sweeps (one layer swapped at a time) with the current zyfa (MAD offset 1/16), one file each
# (SmolLM2: zyfa; its aiter sweep rows in results_7_recipes.jsonl are still current. Gemma 3: zyfa and aiter)
python -m zyfa.cli impact --models smollm2 --recipes zyfa --tokens 2048 --windows 1 --text lee \
  --per-layer smollm2 --layer-recipes zyfa --out $D/results_per_layer_smollm2.jsonl --resume --threads 1
python -m zyfa.cli impact --models gemma3 --recipes zyfa --tokens 2048 --windows 1 --text lee \
  --per-layer gemma3 --layer-recipes zyfa,aiter --out $D/results_per_layer_gemma3.jsonl --resume --threads 1

# ---- the first measurement's fa3 rows of window 0 used an earlier accumulator model: dropped (2026-11-30 01:10;
# the later rows would win anyway). Never while a run appends to that file.
if [[ "${SEVEN_RECIPES:-0}" == 1 ]]; then
  python -m zyfa.cli impact --drop-rows 'smollm2:fa3:0,qwen25coder:fa3:0,gemma3:fa3:0' --out $OUT \
    --reason "window 0 used the Hopper accumulator model before fdfa291; measured again in the all-recipe files"
fi

# ---- the quantization schemes (docs/QUANTIZATION.md), 3 held-out windows on the three models (2026-12-01; the
# first 3 SmolLM2 rows on 2026-11-30, resumed with --resume; about 40-70 s a row on 2 cores). The rows were written
# to .impact_work/results_quantization.jsonl (the path their recorded command names) and the file copied here.
python -m zyfa.cli impact --models smollm2,qwen25coder,gemma3 \
  --recipes zyfa+smooth,zyfa+block+smooth,zyfa+hadamard,zyfa+block,zyfa+block+hadamard --tokens 2048 --windows 3 \
  --text lee --out $D/results_quantization.jsonl --resume

# ---- recipes whose emulation changed after their rows above (2026-12-01): ck and ck-blockscale round the output to
# nearest even (was truncation); sage2, zyfa-hopper, fa3 and cudnn-fp8 run the H200's fitted FP8 accumulator on Q.K
# and P.V (fa3 also FA3's tile_size.h tiles). Measured again into their own file, which supersedes the older rows
# when rendered (latest by date). Rows written to .impact_work/results_emulation_changes.jsonl (the path their
# recorded command names) and the file copied here; the hopper-model rows are slow on a CPU (4-8 minutes a row).
python -m zyfa.cli impact --models smollm2,qwen25coder,gemma3 --recipes ck,ck-blockscale,sage2 --tokens 2048 \
  --windows 3 --text lee --out $D/results_emulation_changes.jsonl --resume
python -m zyfa.cli impact --models smollm2,qwen25coder,gemma3 --recipes zyfa-hopper --tokens 2048 \
  --windows 3 --text lee --out $D/results_emulation_changes.jsonl --resume
python -m zyfa.cli impact --models smollm2,qwen25coder,gemma3 --recipes fa3,cudnn-fp8 --tokens 2048 \
  --windows 3 --text lee --out $D/results_emulation_changes.jsonl --resume

# ---- fa3 with FA3's KV order (the last tile first, as its mainloop does; commit 63828c4, 2026-12-01): its rows
# above measured the forward order and are superseded by these (latest by date). Written to .impact_work/ and the
# file copied here.
python -m zyfa.cli impact --models smollm2,qwen25coder,gemma3 --recipes fa3 --tokens 2048 \
  --windows 3 --text lee --out $D/results_fa3_kv_reverse.jsonl --resume

# ---- Qwen2.5-Coder-1.5B (head dim 128) on the H200 (2026-12-04, commit e578be6, 340 s): 6 real implementations and 6
# emulations in every layer, 8 held-out windows of the pydoc text of the machine's Python 3.12. Run beside the
# HumanEval slices (scripts/humaneval_h200.sh) from scripts/longctx_h200_call.sh's START, written to /tmp/lc/ there
# (the path its recorded command names) and the file copied here. Needs CUDA and the cuDNN frontend wheel.
if [[ "${H200:-0}" == 1 ]]; then
  python -m zyfa.cli impact --models qwen25coder-1.5b \
    --implementations sdpa-bf16:cudnn,triton:zyfa,triton:zyfa-hopper,triton:ck,triton:fa3,cudnn-fp8 \
    --recipes bf16,zyfa,ck,fa3,triton-amd,aiter --text pydoc --tokens 2048 --windows 8 --device cuda \
    --out $D/results_qwen25coder-1.5b.jsonl --resume
fi

# ---- render impact.md from every results file; the study (zyfa study) renders the same section into its report
python -m zyfa.cli impact --render-only --out "$D/results*.jsonl"
