"""Stage the wheels the H200 machine needs for the CuTe DSL kernel (zyfa/kernels/_cute_fp8.py), which has no network.

``download`` fetches the exact wheels (``pip download --no-deps``, binary only) into a folder; ``manifest`` writes
``cute_wheels.json`` there (each wheel's name, size and sha256); ``stage`` does both and cuts the wheels into chunks
of at most ``--chunk-mb`` (default 56, under the 64 MiB a device call carries) with scripts/stage_files.py, whose
``join`` puts them together and checks them on the other side. ``install-command`` prints the one pip command for a
GPU machine with a network. The pins are the versions the kernel was compiled with (docs/KERNEL.md).

    python3 scripts/stage_cute_wheels.py stage --wheels .stage/cute-wheels --out .stage/cute-chunks
    python3 scripts/stage_files.py plan --out .stage/cute-chunks              # one chunk per device call
    # on the GPU machine, after the chunks are copied to /tmp/stage:
    python3 scripts/stage_files.py join --parts /tmp/stage --into /tmp/cute-wheels
    pip install --no-deps --no-index /tmp/cute-wheels/*.whl
    # or join them into the folder scripts/gpu_check.sh installs from (its --wheels, with --target /tmp/site;
    # it then adds nvidia_cutlass_dsl/dsl_packages to PYTHONPATH, which a --target install's .pth cannot)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stage_files  # noqa: E402  (scripts/stage_files.py, beside this file)

# (distribution, version): nvidia-cutlass-dsl and its CUDA 13 libraries, and the CUDA Python bindings it loads
WHEELS = (
    ("nvidia-cutlass-dsl", "4.8.1"),
    ("nvidia-cutlass-dsl-libs-base", "4.8.1"),
    ("nvidia-cutlass-dsl-libs-core", "4.8.1"),
    ("nvidia-cutlass-dsl-libs-cu13", "4.8.1"),
    ("cuda-bindings", "13.5.0"),
    ("cuda-pathfinder", "1.9.1"),
)
MANIFEST = "cute_wheels.json"


def pins() -> list[str]:
    return [f"{name}=={version}" for name, version in WHEELS]


def install_command() -> str:
    """The one command for a GPU machine with a network (no dependency resolution: the pins are the whole set)."""
    return "pip install --no-deps " + " ".join(pins())


def download_commands(dest: Path, python_version: str | None = None, platform: str | None = None) -> list[list[str]]:
    """One ``pip download`` per pin (binary wheels only, no dependencies), for another interpreter or platform when
    given (e.g. ``3.11``, ``manylinux_2_28_x86_64``)."""
    extra = []
    if python_version:
        extra += ["--python-version", python_version]
    if platform:
        extra += ["--platform", platform]
    return [[sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), *extra, p]
            for p in pins()]


def download(dest: Path, python_version: str | None = None, platform: str | None = None) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for cmd in download_commands(dest, python_version, platform):
        subprocess.run(cmd, check=True)


def _dist_of(wheel: Path) -> str:
    """A wheel file's distribution name, normalised (``nvidia_cutlass_dsl_libs_cu13-4.8.1-...whl`` ->
    ``nvidia-cutlass-dsl-libs-cu13``)."""
    return wheel.name.split("-")[0].replace("_", "-").lower()


def manifest(dest: Path) -> dict:
    """Write ``cute_wheels.json`` in ``dest``: each wheel's name, bytes and sha256; ValueError (one line) when a pinned
    distribution has no wheel there or one has two."""
    wheels = sorted(dest.glob("*.whl"))
    found = [_dist_of(w) for w in wheels]
    for name, version in WHEELS:
        n = found.count(name)
        if n != 1:
            raise ValueError(f"{dest}: {n} wheels of {name} (want exactly one, version {version})")
    man = {"install": install_command(),
           "wheels": [{"name": w.name, "bytes": w.stat().st_size, "sha256": stage_files.sha256_file(w)}
                      for w in wheels]}
    (dest / MANIFEST).write_text(json.dumps(man, indent=1) + "\n")
    return man


def stage(wheels: Path, out: Path, chunk_mb: float) -> dict:
    """The manifest of the wheels in ``wheels``, then their chunks and stage_files' manifest under ``out``."""
    man = manifest(wheels)
    stage_files.split([wheels / w["name"] for w in man["wheels"]] + [wheels / MANIFEST], out, chunk_mb)
    return man


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("download", "stage"):
        s = sub.add_parser(name)
        s.add_argument("--wheels", type=Path, required=True, help="folder the wheels are downloaded into")
        s.add_argument("--python-version", default=None)
        s.add_argument("--platform", default=None)
        if name == "stage":
            s.add_argument("--out", type=Path, required=True, help="folder of the chunks (git-ignored .stage/...)")
            s.add_argument("--chunk-mb", type=float, default=56.0)
            s.add_argument("--no-download", action="store_true", help="the wheels are already in --wheels")
    m = sub.add_parser("manifest")
    m.add_argument("--wheels", type=Path, required=True)
    sub.add_parser("install-command")
    a = ap.parse_args(argv)
    if a.cmd == "install-command":
        print(install_command())
        return 0
    try:
        if a.cmd == "manifest":
            manifest(a.wheels)
            return 0
        if a.cmd == "stage" and a.chunk_mb > 60:
            raise ValueError(f"--chunk-mb must be at most 60 (a device call carries 64 MiB), got {a.chunk_mb}")
        if not getattr(a, "no_download", False):
            download(a.wheels, a.python_version, a.platform)
        if a.cmd == "stage":
            stage(a.wheels, a.out, a.chunk_mb)
    except (ValueError, subprocess.CalledProcessError) as e:
        print(f"stage_cute_wheels: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
