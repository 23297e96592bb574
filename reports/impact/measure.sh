#!/usr/bin/env bash
# The committed impact measurement: reports/impact/results*.jsonl -> impact.md, and the model-impact section of
# reports/study/report.{md,html}. Every command appends rows to its own --out file (--resume skips the rows
# already there), so a stop leaves usable rows and any stage can be re-run or extended (e.g. --windows 3).
# Concurrent runs write one file each; the renderers merge every reports/impact/results*.jsonl (a measurement
# found in several files counts once: the latest by date). Rows are never edited in place: the p_flushed_mean of
# session-1 rows (made before the emulator fix 2f53d66) is divided by the query heads at load time, with a note
# in the report (accuracy/impact.py: correct_p_flushed); rows to discard are moved to <file>.dropped with
# `zyfa impact --drop-rows` (below), after which a --resume run into that file measures them again.
set -euo pipefail
cd "$(dirname "$0")/../.."

# ---- session 1 (2026-11-29, contended 2-core CPU): 7 recipes -> results.jsonl
OUT=reports/impact/results.jsonl
R=zyfa,zyfa-exp2,ck,aiter,fa3,bf16,fp32
if [[ "${SESSION1:-0}" == 1 ]]; then
  # 1. window 0 of every model, every recipe, all layers swapped (~75 min there)
  python -m zyfa.cli impact --models smollm2,qwen25coder,gemma3 --recipes $R --tokens 2048 --windows 1 --text lee \
    --out $OUT
  # 2. per-layer sweep of SmolLM2 on window 0 (ran concurrently with 1, one thread; ~55 min there)
  python -m zyfa.cli impact --models smollm2 --recipes zyfa --tokens 2048 --windows 1 --text lee \
    --per-layer smollm2 --layer-recipes zyfa,aiter --out $OUT --resume --threads 1
  # 3. a second window for SmolLM2 and Gemma3 (ran concurrently, ~31 and ~19 min there)
  python -m zyfa.cli impact --models smollm2 --recipes $R --tokens 2048 --windows 2 --text lee --out $OUT --resume
  python -m zyfa.cli impact --models gemma3 --recipes $R --tokens 2048 --windows 2 --text lee --out $OUT --resume
fi
# Known about session 1 (the report says it too): the processes of 1 and 2 started before commit fdfa291, so
# their zyfa rows use the MAD offset 0 (now 1/16) and their fa3 rows an earlier Hopper accumulator model; all
# fa3 rows predate 435c315 (Hopper model: one truncation fewer). Session 2 measures every window row again.

# ---- session 2 (2026-11-30): all 17 named recipes (`zyfa recipes`), three models, 2 windows of 2048 tokens;
# two concurrent processes, one thread each, one file each
R17=fp32,bf16,zyfa,ck,aiter,zyfa-exp2,zyfa-fp32sum,zyfa-noscale,zyfa-pow2fixed,zyfa-tilescale,ck-blockscale,\
aiter-triton,triton-amd,zyfa-hopper,fa3,sage2,cudnn-fp8
python -m zyfa.cli impact --models smollm2,gemma3 --recipes $R17 --tokens 2048 --windows 2 --text lee \
  --out reports/impact/results_s2_a.jsonl --resume --threads 1 &
python -m zyfa.cli impact --models qwen25coder --recipes $R17 --tokens 2048 --windows 2 --text lee \
  --out reports/impact/results_s2_b.jsonl --resume --threads 1 &
wait

# per-layer sweeps with the current zyfa (MAD offset 1/16), concurrently with the runs above, one file each
# (SmolLM2: zyfa; its aiter sweep rows of session 1 are still current. Gemma 3: zyfa and aiter)
python -m zyfa.cli impact --models smollm2 --recipes zyfa --tokens 2048 --windows 1 --text lee \
  --per-layer smollm2 --layer-recipes zyfa --out reports/impact/results_s2_sweep.jsonl --resume --threads 1
python -m zyfa.cli impact --models gemma3 --recipes zyfa --tokens 2048 --windows 1 --text lee \
  --per-layer gemma3 --layer-recipes zyfa,aiter --out reports/impact/results_s2_sweep_gemma.jsonl --resume --threads 1
# a third window for every model and recipe (each started when its 2-window run above had finished)
python -m zyfa.cli impact --models smollm2,gemma3 --recipes $R17 --tokens 2048 --windows 3 --text lee \
  --out reports/impact/results_s2_a.jsonl --resume --threads 1 &
python -m zyfa.cli impact --models qwen25coder --recipes $R17 --tokens 2048 --windows 3 --text lee \
  --out reports/impact/results_s2_b.jsonl --resume --threads 1 &
wait

# ---- drop the session-1 fa3 rows of window 0 (earlier accumulator model; session 2 measured them again and the
# later row would be used anyway; done 2026-11-30 01:10). Never while a run appends to results.jsonl.
python -m zyfa.cli impact --drop-rows 'smollm2:fa3:0,qwen25coder:fa3:0,gemma3:fa3:0' --out $OUT \
  --reason "window 0 used the Hopper accumulator model before fdfa291; measured again in results_s2_*.jsonl"

# ---- render: impact.md from every results file, then the study report with its model-impact section
python -m zyfa.cli impact --render-only --out 'reports/impact/results*.jsonl'
python -m zyfa.cli report --results reports/study/results.jsonl --bench reports/bench_2026-11-30.json \
  --impact 'reports/impact/results*.jsonl' --out reports/study \
  --title 'ZYFA study: FP8 attention error on model captures and Gaussian inputs' --screenshot
