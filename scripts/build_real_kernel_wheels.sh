#!/usr/bin/env bash
# Builds the wheels scripts/gpu_real_kernels.sh carries to the GPU machine, on a CPU machine with network
# (docs/real_kernels.md): nvidia-cudnn-frontend 1.32.0 for the GPU's Python 3.12, and flash-attn 2.8.3.post2
# built from its source distribution without the CUDA extension (pure Python, ~0.4 MB).
#   bash scripts/build_real_kernel_wheels.sh [FOLDER]      (default .wheels, git-ignored)
# The sdist is fetched as a file from pip's configured index and checked against its pinned sha256 (no pip
# download, which would run its setup.py to prepare metadata); the build needs torch, packaging and wheel.
set -eu
W=${1:-.wheels}
mkdir -p "$W"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$W" nvidia-cudnn-frontend==1.32.0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SDIST=$(python3 -c '
import sys
from pathlib import Path
from zyfa.capture.fetch import index_download
print(index_download("flash-attn", "flash_attn-2.8.3.post2.tar.gz",
                     "d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b", dest_dir=Path(sys.argv[1])))
' "$TMP")
# SKIP_CUDA_BUILD: no extension; FORCE_BUILD: do not fetch a prebuilt CUDA wheel from the project's releases;
# TRITON_AMD_ENABLE: no CK build either
FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE \
  python3 -m pip wheel -q --no-deps --no-build-isolation -w "$W" "$SDIST"
ls -la "$W"/*.whl
