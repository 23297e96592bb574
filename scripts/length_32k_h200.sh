#!/usr/bin/env bash
# The 32K condition of studies/accumulator-operator-length.toml on the GPU machine: the capture of layers 0-2 of
# Qwen2.5-Coder-1.5B at 32768 tokens of pydoc, then the plan's `zyfa accuracy` line on cuda (about 6.5 hours on the
# 2-core CPU). Started once in the background (setsid: it outlives the call); every call of the session runs this
# same command, which says where it stands and copies the result file (and its .partial) and the log into $OUT.
#
#   TEXT=.stage/pydoc-py311.txt [ZYFA_CACHE=/tmp/zyfa-cache] [STATE=/tmp/length32k] ZYFA_GIT_COMMIT=<sha> \
#       bash scripts/length_32k_h200.sh
#
# Needs the 1.5B's GGUF in $ZYFA_CACHE/models (staged in chunks and joined by scripts/stage_files.py, as
# scripts/humaneval_h200.sh does; the two can share one staging) and TEXT: the pydoc text the 2K and 8K captures
# were made from. The pydoc text is the reference of the Python that extracts it, and the GPU machine's Python
# (3.12) is not the CPU's that made them (3.11): so the file ~/.cache/zyfa/texts/pydoc-py311.txt is carried and
# given as a text file, checked against the sha256 the 2K and 8K rows record (input_text_sha256) before anything
# runs. Window 0 of the same text: the 32K capture's first 8192 tokens are the 8K capture's tokens.
set -u
cd "$(dirname "$0")/.."
export ZYFA_CACHE=${ZYFA_CACHE:-/tmp/zyfa-cache} PYTHONUNBUFFERED=1
TEXT=${TEXT:-.stage/pydoc-py311.txt}
TEXT_SHA=71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee
X=${STATE:-/tmp/length32k}
CAP=$HOME/.cache/zyfa/captures/qwen25coder-1.5b-pydoc-32768-L0-2.h5
RES=reports/accumulator-operator/length-qwen25coder-1.5b-32768-L0-2.jsonl
MODEL=$(PYTHONPATH=. python3 -c "from capture.models import MODELS; print(MODELS['qwen25coder-1.5b'].file_name)")
mkdir -p "$X"
if [ ! -f "$X/started" ]; then
  if [ ! -f "$ZYFA_CACHE/models/$MODEL" ]; then
    echo "length_32k_h200: $ZYFA_CACHE/models/$MODEL is not there yet (stage and join it first)"
  elif [ ! -f "$TEXT" ] || [ "$(sha256sum "$TEXT" | cut -d' ' -f1)" != "$TEXT_SHA" ]; then
    echo "length_32k_h200: $TEXT is missing or not the 2K/8K captures' pydoc text (sha256 ${TEXT_SHA:0:12})"
    exit 2
  else
    cp "$TEXT" "$X/pydoc-py311.txt"
    rm -rf "$X/src" && mkdir -p "$X/src/reports/accumulator-operator" "$(dirname "$CAP")"
    tar --exclude=./.stage --exclude=./.wheels --exclude=./.git -cf - . | tar -xf - -C "$X/src"
    (cd "$X/src" && PYTHONPATH=.:/tmp/site setsid nohup bash -c "python3 -m zyfa.cli capture \
--model qwen25coder-1.5b --text $X/pydoc-py311.txt --tokens 32768 --layers 0,1,2 --device-map cuda --no-progress \
--out $CAP && python3 -m zyfa.cli accuracy --inputs $CAP --recipes fa3,fa3:accum_flush_tiles=1 --heads 0,6 \
--device cuda --out $RES --resume --no-progress; echo exit \$?" >"$X/log" 2>&1 </dev/null &)
    date +%s >"$X/started"
    echo "length_32k_h200: started (log $X/log)"
  fi
fi
[ -f "$X/log" ] && echo "length_32k_h200 log: $(tail -c 400 "$X/log" | tr '\r' '\n' | tail -3)"
for f in "$X/src/$RES" "$X/src/$RES.partial"; do
  [ -e "$f" ] && echo "$(basename "$f"): $(wc -l <"$f") lines" && cp "$f" "${OUT:-/tmp}/"
done
[ -f "$X/log" ] && cp "$X/log" "${OUT:-/tmp}/length_32k.log"
true
