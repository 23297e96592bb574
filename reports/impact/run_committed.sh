#!/usr/bin/env bash
# The committed impact measurement (reports/impact/results.jsonl -> impact.md), as it was run on a contended
# 2-core CPU (2026-11-29): each command appends rows (--resume skips rows already there), so a stop leaves
# usable rows and any stage can be re-run or extended (e.g. --windows 3) later.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=reports/impact/results.jsonl
R=zyfa,zyfa-exp2,ck,aiter,fa3,bf16,fp32
# 1. window 0 of every model, every recipe, all layers swapped (~75 min here)
python -m zyfa.cli impact --models smollm2,qwen25coder,gemma3 --recipes $R --tokens 2048 --windows 1 --text lee \
  --out $OUT
# 2. per-layer sweep of SmolLM2 on window 0 (ran concurrently with 1, one thread; ~55 min here)
python -m zyfa.cli impact --models smollm2 --recipes zyfa --tokens 2048 --windows 1 --text lee \
  --per-layer smollm2 --layer-recipes zyfa,aiter --out $OUT --resume --threads 1
# 3. a second window for SmolLM2 and Gemma3 (CIs over windows; these two ran concurrently, ~31 and ~19 min here)
python -m zyfa.cli impact --models smollm2 --recipes $R --tokens 2048 --windows 2 --text lee --out $OUT --resume
python -m zyfa.cli impact --models gemma3 --recipes $R --tokens 2048 --windows 2 --text lee --out $OUT --resume
# 4. not run yet (time): Qwen's second window, and a third window for every model
# more windows, when there is time:
#   python -m zyfa.cli impact --models smollm2,qwen25coder,gemma3 --recipes $R --tokens 2048 --windows 3 \
#     --text lee --out $OUT --resume
