#!/usr/bin/env bash
# One call of the long-context session on the H200 (docs/LONGCTX.md, "Running the committed grid on the H200").
# Every call of the session runs this same command: it takes what this call's .stage/ brought (a model chunk, the
# manifest, the haystack text; the first call also .wheels/), joins each model whose parts are all there
# (scripts/stage_files.py: hash-checked, moved into place atomically), starts the background session once
# (scripts/longctx_h200_background.sh, from a private copy of the tree so later calls' copies cannot change its
# code under it), prints where it stands, and packs its state into $OUT/longctx-state.tar.xz.
#
#   ZYFA_GIT_COMMIT=<sha> bash scripts/longctx_h200_call.sh [SECONDS]
#
# STATE=DIR (default /tmp/lc): the session's folder; two sessions with different STATEs run side by side on one GPU.
# STAGE=DIR (default .stage): the folder this call's files came in (scripts/stage_files.py calls makes .stage-NN/ for
# call N before the first, so the calls need nothing done between them).
# SECONDS (first call only, default 1500): the session's deadline from now. WAIT=N: stay up to N seconds, until the
# background session has finished (the last calls). START="CMD": run CMD in the background from the private copy
# (e.g. a further zyfa longctx slice once the grid is done), logged to $STATE/extra-<n>.log.
set -u
cd "$(dirname "$0")/.."
export ZYFA_CACHE=${ZYFA_CACHE:-/tmp/zyfa-cache}
STATE=${STATE:-/tmp/lc}
STAGE=${STAGE:-.stage}
# where the parts gather over the calls and where the wheels go (both live as long as the machine)
PARTS=${PARTS:-/tmp/stage}
export SITE=${SITE:-/tmp/site}
# the background session's private copy of the tree: one per STATE, so that a second session beside the first
# (another plan, its own STATE) never replaces the code the first one runs from
SRC=$STATE-src
mkdir -p "$PARTS" "$STATE" "$ZYFA_CACHE/texts" "$SITE"
if ls .wheels/*.whl >/dev/null 2>&1 && [ ! -f "$SITE/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .wheels/*.whl 2>&1 | tail -2
  for pack in .wheels/*.tar.xz; do [ -e "$pack" ] && tar -xJf "$pack" -C "$SITE"; done
  touch "$SITE/.installed"
fi
for t in "$STAGE"/*.txt; do [ -e "$t" ] && cp "$t" "$ZYFA_CACHE/texts/"; done
# rows of a run an earlier session cut (a committed <out>.partial put into .stage/ as results-MODEL.jsonl.partial):
# the background session resumes them; only those of this run's plan (PLAN's hash; none without PLAN), since two
# plans of one model write files of one name (scripts/seed_state.py: another plan's file is left, with a line)
ls "$STAGE"/results-*.jsonl.partial >/dev/null 2>&1 && PYTHONPATH=. python3 scripts/seed_state.py "$STATE" \
  --from "$STAGE" --glob 'results-*.jsonl.partial' ${PLAN:+--plan "$PLAN"}
for f in "$STAGE"/*.part[0-9]*; do [ -e "$f" ] && cp "$f" "$PARTS"/; done
[ -f "$STAGE"/manifest.json ] && cp "$STAGE"/manifest.json "$PARTS"/
if [ -f "$PARTS"/manifest.json ]; then
  python3 scripts/stage_files.py join --parts "$PARTS" --into "$ZYFA_CACHE/models" 2>&1 | grep -v "parts missing"
fi
# a wheel too large for one call (the CuTe kernel's nvidia-cutlass-dsl-libs-cu13, 92 MB: scripts/stage_cute_wheels.py)
# comes in chunks under the same manifest as the model and is joined beside it; all such wheels are installed into
# /tmp/site together (scripts/install_staged_wheels.sh says why). Stage such chunks before the model's: a plan's grid
# starts as soon as its model is in place.
bash scripts/install_staged_wheels.sh "$ZYFA_CACHE/models" "$SITE"
if [ ! -f "$STATE/deadline" ]; then
  echo $(( $(date +%s) + ${1:-1500} )) >"$STATE/deadline"
  rm -rf "$SRC" && mkdir -p "$SRC"
  tar --exclude='./.stage*' --exclude=./.wheels --exclude=./.git -cf - . | tar -xf - -C "$SRC"
  (cd "$SRC" && setsid nohup bash scripts/longctx_h200_background.sh "$STATE" "$(cat "$STATE/deadline")" \
    >"$STATE/background.log" 2>&1 </dev/null &)
  echo "background session started; deadline in ${1:-1500} s"
fi
if [ -n "${START:-}" ]; then
  n=$(ls "$STATE"/extra-*.log 2>/dev/null | wc -l)
  (cd "$SRC" && PYTHONPATH=.:$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1 \
    setsid nohup bash -c "$START" \
    >"$STATE/extra-$n.log" 2>&1 </dev/null &)
  echo "started extra-$n: $START"
fi
# the program at the start of a command line (or after its folder): a bare pattern would also match this call's
# own shell, whose command line holds it (in START=...), and keep WAIT waiting to its end
running() {
  pgrep -f "(^|/)bash scripts/longctx_h200_background.sh" >/dev/null || pgrep -f "(^|/)python3 -m zyfa[.]cli" >/dev/null
}
if [ -n "${WAIT:-}" ]; then
  t0=$SECONDS
  while running && [ $((SECONDS - t0)) -lt "$WAIT" ]; do sleep 5; done
fi
echo "--- $(date -u +%T), $(( $(cat "$STATE/deadline") - $(date +%s) )) s to the deadline"
tail -n 12 "$STATE/background.log"
for f in "$STATE"/longctx-*.log "$STATE"/extra-*.log; do
  [ -e "$f" ] && { echo "--- $(basename "$f")"; grep -v "^\[longctx\].* L[0-9]* .*: exact" "$f" | tail -n 3;
                   grep "^\[longctx\]" "$f" | tail -n 2; }
done
for f in "$STATE"/results-*; do [ -e "$f" ] && echo "$(basename "$f"): $(wc -l <"$f") lines"; done
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
tar -cJf "${OUT:-/tmp}/longctx-state.tar.xz" -C "$STATE" --exclude=deadline . 2>/dev/null
