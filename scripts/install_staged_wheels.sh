#!/usr/bin/env bash
# Install the wheels staged on the GPU machine (scripts/stage_files.py join puts them beside the models) into a
# --target folder, all of them in one pip command whenever one is new.
#
#   bash scripts/install_staged_wheels.sh DIR TARGET
#
# A --target install replaces each top-level folder it writes, and wheels of one distribution family share one (the
# CuTe DSL's nvidia_cutlass_dsl/): a wheel installed alone after the others would leave that folder with its own files
# only (cutlass.cute missing; seen on the GPU machine, 6 December). So once any wheel in DIR lacks its marker
# (TARGET/.installed-NAME), every wheel in DIR is installed again together, and each gets its marker. One line says
# what was installed, or why it failed (pip's last line); nothing is printed when nothing is new.
set -u
DIR=${1:?usage: install_staged_wheels.sh DIR TARGET}
TARGET=${2:?usage: install_staged_wheels.sh DIR TARGET}
wheels=("$DIR"/*.whl)
[ -e "${wheels[0]}" ] || exit 0
fresh=0
for w in "${wheels[@]}"; do [ -e "$TARGET/.installed-$(basename "$w")" ] || fresh=1; done
[ "$fresh" = 1 ] || exit 0
mkdir -p "$TARGET"
log=$(mktemp)
if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$TARGET" \
    "${wheels[@]}" >"$log" 2>&1; then
  for w in "${wheels[@]}"; do touch "$TARGET/.installed-$(basename "$w")"; done
  echo "installed ${#wheels[@]} wheel(s) into $TARGET: $(for w in "${wheels[@]}"; do basename "$w"; done | paste -sd' ')"
  rm -f "$log"
else
  echo "installing the wheels of $DIR failed: $(grep -v '^\s*$' "$log" | tail -1)"
  rm -f "$log"
  exit 1
fi
