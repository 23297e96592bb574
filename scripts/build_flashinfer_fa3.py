"""Build FA3's FP8 prefill from FlashInfer for the H200 on a CPU machine, and pack what the GPU machine needs.

FlashInfer (``flashinfer-python``) compiles its kernels with nvcc on first use. The GPU machine cannot take the
whole package (a 101 MB wheel, 716 MB unpacked; one call carries 64 MiB with the working tree), so this script
runs FlashInfer's own JIT build here for the FP8 single-prefill module at head dims 64, 128 and 256 (its
``gen_single_prefill_module("fa3", e4m3, e4m3, bf16, d, d, ...)``, sm_90a), and packs every Python module of the
package (what ``import flashinfer`` pulls in depends on whether the CuTe DSL is importable), the four source
templates its generator reads, and the three built libraries into
FlashInfer's AOT folder (``flashinfer/data/aot/<module>/<module>.so``, which FlashInfer loads before it would
build). Nothing of FlashInfer's code is changed. docs/real_kernels.md says how it runs and what it computes.

    python3 scripts/build_flashinfer_fa3.py [--out .wheels] [--work DIR] [--jobs N]

Needs: network to the package index (pip's), CUDA 13's nvcc (``CUDA_HOME`` or on PATH), a C++ compiler, ninja,
torch, jinja2, filelock and FlashInfer's other import-time dependencies (click, einops, nvidia-ml-py, tabulate,
requests, tqdm, packaging). Every file is fetched as bytes and checked against its pinned sha256 before anything
reads it (``zyfa.capture.fetch.index_download``); only then does FlashInfer's build code run. Writes into ``--out``:
``flashinfer-fa3-sm90.tar.xz`` (about 5 MB; unpack it into the GPU machine's package folder) and the
apache-tvm-ffi wheel for the GPU machine's Python 3.12. ``scripts/gpu_check.sh`` and ``scripts/gpu_real_kernels.sh``
install both. On 2 CPU cores the build takes about 25 minutes.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VERSION = "0.7.4"
FLASHINFER = ("flashinfer-python", f"flashinfer_python-{VERSION}-py3-none-any.whl",
              "a051a62e09a2738e8b0de47a1944fd2f0f3eff01b728b662141ea660cb09dd32")
_TVM = "apache_tvm_ffi-0.1.15.post2-{0}-{0}-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"
TVM_FFI = {  # its C library is what FlashInfer's modules bind to; one wheel per Python
    "cp311": ("apache-tvm-ffi", _TVM.format("cp311"),
              "8ecebe749834f6ac0f2693d5964acf9ac75d0bc26e6ba64c46eb7ab00ea50fac"),
    "cp312": ("apache-tvm-ffi", _TVM.format("cp312"),
              "059eed9bfc94bcd41650fb8eefde74040a1bc7e7b1a6f0a8ff897b02b118875b"),
}
DEVICE_PYTHON = "cp312"  # the GPU machine's Python 3.12
# curand's headers, only where the CUDA toolkit here lacks them (CUTLASS's utilities include curand_kernel.h)
CURAND = ("nvidia-curand", "nvidia_curand-10.4.5.25-py3-none-manylinux_2_27_x86_64.whl",
          "22bb226a857e5888fe6b54ae465fc4371296bcff13a35f79e19691bcf454f529")
HEAD_DIMS = (64, 128, 256)
# what FlashInfer's generator reads for the FP8 sm_90 single prefill (jit/attention/modules.py, backend "fa3")
TEMPLATES = ("single_prefill_sm90_customize_config.jinja", "single_prefill_fp8_sm90_kernel_inst.jinja",
             "single_prefill_fp8_sm90.cu", "single_prefill_sm90_jit_binding.cu")
PACK = "flashinfer-fa3-sm90.tar.xz"
# what FlashInfer imports when it builds and loads the module, beside torch (all in the GPU machine's image)
IMPORT_DEPS = (("pynvml", "nvidia-ml-py"), ("einops", "einops"), ("click", "click"), ("tabulate", "tabulate"),
               ("jinja2", "jinja2"), ("filelock", "filelock"), ("requests", "requests"), ("tqdm", "tqdm"),
               ("packaging", "packaging"))

# Runs in a child process with the unpacked FlashInfer on its path: FlashInfer's JIT build of each module, then
# (with the libraries in a copy of the AOT folder) the load the prefill API does, recording what it imports.
_CHILD = r"""
import json, os, shutil, sys, torch
from pathlib import Path
from flashinfer.jit.attention.modules import gen_single_prefill_module
stage = Path(sys.argv[1])
dims = [int(x) for x in sys.argv[2].split(",")]
built = {}
for d in dims:
    spec = gen_single_prefill_module("fa3", torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16, d, d,
                                     0, False, False, False)
    print(f"building {spec.name}", flush=True)
    spec.build(verbose=False)
    so = Path(spec.get_library_path())
    dst = stage / "flashinfer" / "data" / "aot" / spec.name / f"{spec.name}.so"
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(so, dst)
    built[d] = spec.name
print(json.dumps({"built": built}), flush=True)
"""
_LOAD = r"""
import json, sys, torch
import flashinfer
from flashinfer.prefill import get_single_prefill_module
dims = [int(x) for x in sys.argv[1].split(",")]
for d in dims:
    get_single_prefill_module("fa3", torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16, d, d, 0, False, False,
                              False, False)
files = sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)})
print(json.dumps({"files": files, "version": flashinfer.__version__}))
"""


def _fetch(item, dest: Path) -> Path:
    from zyfa.capture.fetch import index_download

    project, filename, sha = item
    return index_download(project, filename, sha, dest_dir=dest)


def _cuda_home() -> Path:
    if os.environ.get("CUDA_HOME"):
        return Path(os.environ["CUDA_HOME"])
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        sys.exit("build_flashinfer_fa3: nvcc not found (set CUDA_HOME or put CUDA 13's nvcc on PATH)")
    home = Path(nvcc).resolve().parents[1]
    return home if (home / "include" / "cuda_runtime.h").exists() else Path("/usr/local/cuda")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / ".wheels"), help="where the pack and the tvm-ffi wheel go")
    ap.add_argument("--work", default=None, help="build folder (default: a temporary one, removed after)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel nvcc jobs")
    ap.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    a = ap.parse_args(argv)
    missing = [dist for mod, dist in IMPORT_DEPS if importlib.util.find_spec(mod) is None]
    if shutil.which("ninja") is None:
        missing.append("ninja")
    if missing:
        sys.exit(f"build_flashinfer_fa3: FlashInfer imports these at build time, install them first: "
                 f"python3 -m pip install {' '.join(missing)}")
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if py not in TVM_FFI:
        sys.exit(f"build_flashinfer_fa3: run it with Python {' or '.join(k[2] + '.' + k[3:] for k in TVM_FFI)}, "
                 f"not {sys.version.split()[0]} (the tvm-ffi wheel is pinned per Python)")
    try:
        dims = [int(x) for x in a.head_dims.split(",")]
    except ValueError:
        dims = []
    if not dims or any(d not in HEAD_DIMS for d in dims):
        sys.exit(f"build_flashinfer_fa3: --head-dims takes some of {','.join(map(str, HEAD_DIMS))} (FlashInfer's FP8 "
                 f"sm_90 prefill), not {a.head_dims!r}")
    cuda = _cuda_home()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="flashinfer-fa3-"))
    work.mkdir(parents=True, exist_ok=True)
    dl, site, stage = work / "downloads", work / "site", work / "stage"
    for p in (site, stage):
        shutil.rmtree(p, ignore_errors=True)
        p.mkdir(parents=True)
    try:
        whl = _fetch(FLASHINFER, dl)
        tvm_here = _fetch(TVM_FFI[py], dl)
        tvm_device = _fetch(TVM_FFI[DEVICE_PYTHON], dl)
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                        "--target", str(site), str(tvm_here)], check=True)
        inherited = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=f"{site}:{inherited}" if inherited else str(site),
                   FLASHINFER_WORKSPACE_BASE=str(work / "ws"),
                   FLASHINFER_CUDA_ARCH_LIST="9.0a", CUDA_HOME=str(cuda), MAX_JOBS=str(a.jobs))
        if not (cuda / "include" / "curand_kernel.h").exists():
            with zipfile.ZipFile(_fetch(CURAND, dl)) as z:
                z.extractall(work / "curand")
            inc = next((work / "curand").rglob("curand_kernel.h")).parent
            env["NVCC_APPEND_FLAGS"] = f"{os.environ.get('NVCC_APPEND_FLAGS', '')} -isystem {inc}".strip()
        if not any((cuda / d / "stubs" / "libcuda.so").exists() for d in ("lib64", "lib")):
            # FlashInfer links with -lcuda; with no driver here, an empty stub named as the driver's library
            # satisfies the linker (the module binds to the real driver where it is loaded)
            stub = work / "cudastub"
            stub.mkdir(exist_ok=True)
            subprocess.run(["cc", "-shared", "-x", "c", "-", "-o", str(stub / "libcuda.so"),
                            "-Wl,-soname,libcuda.so.1"], input=b"", check=True)
            env["LIBRARY_PATH"] = f"{stub}:{os.environ['LIBRARY_PATH']}" if os.environ.get("LIBRARY_PATH") \
                else str(stub)
        print(f"building FlashInfer {VERSION}'s FA3 FP8 prefill for sm_90a at head dims {a.head_dims} "
              f"({a.jobs} jobs; nvcc from {cuda}) in {work}", flush=True)
        res = subprocess.run([sys.executable, "-c", _CHILD, str(stage), ",".join(map(str, dims))], env=env, cwd=work,
                             capture_output=True, text=True)
        if res.returncode != 0:
            sys.stderr.write(res.stdout[-4000:] + res.stderr[-8000:])
            sys.exit("build_flashinfer_fa3: FlashInfer's build failed (its output above)")
        built = json.loads(res.stdout.strip().splitlines()[-1])["built"]
        # the staged package: FlashInfer's Python files, its templates and the built libraries in its AOT folder
        pkg = site / "flashinfer"
        for f in TEMPLATES:
            dst = stage / "flashinfer" / "data" / "csrc" / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pkg / "data" / "csrc" / f, dst)
        for p in pkg.rglob("*.py"):
            rel = p.relative_to(site)
            if rel.parts[1] != "data":
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, stage / rel)
        dist = next(site.glob("flashinfer_python-*.dist-info"))
        shutil.copytree(dist, stage / dist.name)
        # load from the staged package alone (tvm-ffi beside it), as the GPU machine will
        env_load = dict(env, PYTHONPATH=f"{stage}:{work / 'tvmonly'}" + (f":{inherited}" if inherited else ""))
        (work / "tvmonly").mkdir(exist_ok=True)
        for p in site.iterdir():
            if p.name.startswith(("tvm_ffi", "apache_tvm_ffi")) and not (work / "tvmonly" / p.name).exists():
                (work / "tvmonly" / p.name).symlink_to(p)
        res = subprocess.run([sys.executable, "-c", _LOAD, ",".join(map(str, dims))], env=env_load, cwd=work,
                             capture_output=True,
                             text=True)
        if res.returncode != 0:
            sys.stderr.write(res.stderr[-6000:])
            sys.exit("build_flashinfer_fa3: the staged package does not load its modules (above)")
        used = {Path(f) for f in json.loads(res.stdout.strip().splitlines()[-1])["files"]}
        if not any(stage in p.parents for p in used):
            sys.exit("build_flashinfer_fa3: the load imported nothing from the staged package")
        # every Python module of the package, not only those this load imported: which modules `import flashinfer`
        # pulls in depends on the machine (with the CuTe DSL importable, as on a GPU machine that also runs our CuTe
        # kernel, flashinfer.cute_dsl imports its utils and kernels; a pack of the modules recorded here without the
        # DSL failed there with "No module named 'flashinfer.cute_dsl.utils'")
        keep = {p.relative_to(stage) for p in (stage / "flashinfer").rglob("*.py")}
        keep |= {p.relative_to(stage) for p in (stage / "flashinfer" / "data").rglob("*") if p.is_file()}
        keep |= {p.relative_to(stage) for p in (stage / dist.name).rglob("*") if p.is_file()}
        manifest = {"flashinfer": VERSION, "wheel": FLASHINFER[1], "wheel_sha256": FLASHINFER[2],
                    "modules": built, "arch": "sm_90a", "files": len(keep),
                    "nvcc": subprocess.run([str(cuda / "bin" / "nvcc"), "--version"], capture_output=True,
                                           text=True).stdout.strip().splitlines()[-1]}
        (stage / "flashinfer-fa3-pack.json").write_text(json.dumps(manifest, indent=1) + "\n")
        keep.add(Path("flashinfer-fa3-pack.json"))
        tmp = out / (PACK + ".part")
        with tarfile.open(tmp, "w:xz") as tar:
            for rel in sorted(keep):
                info = tar.gettarinfo(str(stage / rel), arcname=str(rel))
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(stage / rel, "rb") as f:
                    tar.addfile(info, f)
        os.replace(tmp, out / PACK)
        shutil.copy2(tvm_device, out / tvm_device.name)
        print(f"wrote {out / PACK} ({(out / PACK).stat().st_size / 1e6:.1f} MB, {len(keep)} files) and "
              f"{out / tvm_device.name}")
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
