"""``zyfa bench``: TFLOP/s of the Triton FP8 kernel (recipes and ablations) against cuDNN and SDPA (GPU only).

Every case runs in one process on one GPU, so ratios between implementations come from the same run:
our kernel per recipe (kernel time; V's one-off transpose timed separately, and for recipes with ``qk_rotation``
the rotation of Q and K before the kernel, also on its own: :func:`rotation_times`), PyTorch SDPA in bf16 with the
cuDNN and flash backends, cuDNN's FP8 attention (``nvidia-cudnn-frontend`` graph ``sdpa_fp8``; FP8
output on Hopper), AMD's Triton FP8 forward from the ``flash-attn`` package (``flash-attn-triton-amd``: it
reads V as stored, so it has no transpose to time; docs/real_kernels.md) and FA3's FP8 forward as FlashInfer builds
it for sm_90 (``flashinfer-fa3``, NHD layout, one launch per sequence; d_qk = d_v in 64, 128, 256 only).
Shapes: batch 1, ``--hidden`` / d_v heads (MLA: 16 heads, QK 192 / V 128), sequence lengths 8K, 16K, 32K
(s_q = s_k). FLOPs = 4·b·h·s_q·s_k·d (2·(d_qk + d_v) for MLA), halved for causal.

Method (docs/DESIGN.md 'Measuring speed'): inputs never zeros (Gaussian, or a captured HDF5 slice tiled to the
length), each output checked against an SDPA bf16 reference before timing, ``triton.testing.do_bench``
medians, SM clock and power sampled by NVML (nvidia-ml-py) in a background thread during each timed run.
Writes ``--out`` (default ``bench.json`` in the current directory; never over an existing file unless
``--overwrite``) and the Markdown next to it (``bench.md``), with the command, date, versions, device and git
commit inside; both are rewritten atomically after every shape, so an interrupted run keeps what it measured.
The committed run is ``reports/bench/bench.json`` / ``.md``, written by ``scripts/gpu_check.sh``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time

from zyfa.outputs import atomic_write_text

DEFAULT_RECIPES = (
    "zyfa",
    "zyfa-hopper",
    "zyfa:accumulator=hopper_fp8",
    "zyfa-exp2:accumulator=hopper_fp8,accum_flush_tiles=1",
    "zyfa-fp32sum:accumulator=hopper_fp8,accum_flush_tiles=1",
    "ck:accumulator=hopper_fp8,accum_flush_tiles=1",
    "aiter:accumulator=hopper_fp8,accum_flush_tiles=1",
    "fa3",
    "fa3:accum_flush_tiles=1",
)
OTHER_RECIPES = (
    "zyfa",
    "zyfa-hopper",
    "zyfa-exp2:accumulator=hopper_fp8,accum_flush_tiles=1",
    "ck:accumulator=hopper_fp8,accum_flush_tiles=1",
    "fa3",
)
SHAPES = {"hd64": (64, 64), "hd128": (128, 128), "hd256": (256, 256), "mla": (192, 128)}
PEERS = ("sdpa-cudnn", "sdpa-flash", "cudnn-fp8", "flash-attn-triton-amd", "flashinfer-fa3")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seqlens", default="8192,16384,32768", help="comma-separated tokens (batch 1)")
    p.add_argument("--shapes", default="hd64,hd128,hd256,mla", help=f"subset of {','.join(SHAPES)}")
    p.add_argument("--causal", default="both", choices=("both", "true", "false"))
    p.add_argument("--recipes", default=";".join(DEFAULT_RECIPES),
                   help="recipe specs the kernel runs, ';'-separated (or ','; docs/CONTRACTS.md 'Recipe specs')")
    p.add_argument("--recipes-other", default=";".join(OTHER_RECIPES),
                   help="';'-separated recipe specs for the shapes other than hd128 ('same' = --recipes)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"subset of {','.join(PEERS)} (or 'none')")
    p.add_argument("--hidden", type=int, default=2048, help="heads = hidden // d_v (MLA: 16 heads)")
    p.add_argument("--captured", default="auto",
                   help="HDF5 capture to time on (tiled to the length); 'auto' = first datasets/*.h5; 'none'")
    p.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetitions, ms")
    p.add_argument("--out", default="bench.json",
                   help="result file (default ./bench.json); the Markdown goes next to it with .md; a folder "
                        "means FOLDER/bench.json")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file (and its .md)")
    p.add_argument("--config", default="", help="launch overrides for our kernel, JSON")
    p.add_argument("--render", default="", metavar="JSON",
                   help="no GPU: rewrite the Markdown next to a bench JSON from its rows (e.g. after a change here)")
    p.add_argument("--ours", default="zyfa-hopper", help="the recipe the summary compares with the peers")


# ---------------------------------------------------------------------------------------------- helpers

def flops(b, h, s_q, s_k, d_qk, d_v, causal):
    f = 2.0 * b * h * s_q * s_k * (d_qk + d_v)
    return f / 2 if causal else f


class ClockSampler:
    """SM clock (MHz) and power (W) sampled by NVML every ``period`` s while active."""

    def __init__(self, device_index=0, period=0.01):
        self.period = period
        self.samples = []
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._h = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:  # noqa: BLE001 - NVML missing: no samples, stated in the report
            self._nvml = None

    def _run(self):
        nv = self._nvml
        while not self._stop.is_set():
            try:
                clk = nv.nvmlDeviceGetClockInfo(self._h, nv.NVML_CLOCK_SM)
                pw = nv.nvmlDeviceGetPowerUsage(self._h) / 1000.0
                self.samples.append((clk, pw))
            except Exception:  # noqa: BLE001
                pass
            time.sleep(self.period)

    def __enter__(self):
        self.samples = []
        if self._nvml is not None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def summary(self):
        if not self.samples:
            return {"sm_clock_mhz": None, "power_w": None, "n_samples": 0}
        clk = [c for c, _ in self.samples]
        pw = [p for _, p in self.samples]
        return {"sm_clock_mhz": sum(clk) / len(clk), "sm_clock_min_mhz": min(clk),
                "power_w": sum(pw) / len(pw), "power_max_w": max(pw), "n_samples": len(clk)}


def timed(fn, warmup, rep, sampler):
    import triton

    fn()  # compile / warm
    import torch

    torch.cuda.synchronize()
    with sampler:
        ms = triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    return ms, sampler.summary()


def bench_heads(shape: str, hidden: int = 2048) -> int:
    """Query (= KV) heads of one bench shape: hidden // d_v, MLA 16."""
    return 16 if shape == "mla" else hidden // SHAPES[shape][1]


def gaussian_kernel_call(shape: str, s: int, causal: bool, spec: str, config: dict | None = None, seed: int = 0):
    """Our kernel on Gaussian inputs of one bench shape (batch 1, :func:`bench_heads` heads, s tokens) with the
    recipe's per-head descales: (fn, (q, k, v)), fn launching it once. For the scripts that time, warm or profile
    launch variants; :func:`run_case` also handles per-block descales and checks the output."""
    from zyfa.kernels import attention_fp8 as A
    from zyfa.recipes import get_recipe

    d_qk, d_v = SHAPES[shape]
    h = bench_heads(shape)
    q, k, v = gaussian_qkv(1, h, h, s, d_qk, d_v, seed=seed)
    r = get_recipe(spec)
    q8, k8, v8, qd, kd, vd = A.quantize_for_kernel(q, k, v, r)
    vt = A.prepare_vt(v8, permute_k32=A.vt_key_order_for(config))
    plan = A.kernel_plan(r)

    def fn():
        return A.launch(q8, k8, vt, qd, kd, vd, plan=plan, seq_k=s, causal=causal, sm_scale=1 / math.sqrt(d_qk),
                        window=None, config=config)

    return fn, (q, k, v)


def rel_l2(a, b):
    a = a.float()
    b = b.float()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def gaussian_qkv(b, h, h_kv, s, d_qk, d_v, seed=0, device="cuda"):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn((b, h, s, d_qk), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    k = torch.randn((b, h_kv, s, d_qk), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    v = torch.randn((b, h_kv, s, d_v), generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    return q, k, v


def captured_qkv(path, s, device="cuda"):
    """First layer of a capture, tiled along the sequence to s tokens (bf16)."""
    from capture.store import read_capture

    rec = next(iter(read_capture(path, allow_incomplete=True)))
    out = []
    for x in (rec.q, rec.k, rec.v):
        reps = -(-s // x.shape[2])
        out.append(x.to(device=device, dtype=torch_bf16()).repeat(1, 1, reps, 1)[:, :, :s].contiguous())
    return (*out, rec)


def torch_bf16():
    import torch

    return torch.bfloat16


def sdpa_reference(q, k, v, causal, sm_scale):
    """bf16 SDPA (flash, else math) on the given tensors, GQA expanded: the sanity reference."""
    import torch
    import torch.nn.functional as F

    g = q.shape[1] // k.shape[1]
    if g > 1:
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError("reference: bottom-right causal needs s_q == s_k here")
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)


# ---------------------------------------------------------------------------------------------- peers

def make_sdpa(q, k, v, causal, sm_scale, backend):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}[backend]

    def fn():
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)

    return fn


def make_cudnn_fp8(q8, k8, v8, qd, kd, vd, causal, sm_scale):
    """cuDNN FP8 SDPA (frontend graph); per-tensor descales; FP8 e4m3 output scaled by scale_o."""
    import cudnn
    import torch

    dt = cudnn.data_type
    g = cudnn.pygraph(io_data_type=dt.FP8_E4M3, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT)

    def t(name, x):
        return g.tensor(name=name, dim=list(x.shape), stride=list(x.stride()), data_type=dt.FP8_E4M3)

    def sc(name):
        return g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=dt.FLOAT)

    Q, K, V = t("Q", q8), t("K", k8), t("V", v8)
    names = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
    S = {n: sc(n) for n in names}
    O, _stats, amax_s, amax_o = g.sdpa_fp8(Q, K, V, S["descale_q"], S["descale_k"], S["descale_v"],
                                           S["descale_s"], S["scale_s"], S["scale_o"], generate_stats=False,
                                           attn_scale=sm_scale, use_causal_mask=causal, name="sdpa_fp8")
    b, h, s_q, _ = q8.shape
    d_v = v8.shape[3]
    O.set_output(True).set_dim([b, h, s_q, d_v]).set_stride([h * s_q * d_v, s_q * d_v, d_v, 1]).set_data_type(
        dt.FP8_E4M3)
    amax_o.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(dt.FLOAT)
    amax_s.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(dt.FLOAT)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    ws = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)
    dev = q8.device
    o = torch.empty((b, h, s_q, d_v), dtype=torch.float8_e4m3fn, device=dev)
    one = torch.ones((1, 1, 1, 1), dtype=torch.float32, device=dev)
    scale_o = torch.full((1, 1, 1, 1), 1.0, dtype=torch.float32, device=dev)
    pack = {Q: q8, K: k8, V: v8, S["descale_q"]: qd.reshape(1, 1, 1, 1), S["descale_k"]: kd.reshape(1, 1, 1, 1),
            S["descale_v"]: vd.reshape(1, 1, 1, 1), S["descale_s"]: one / 448.0,
            S["scale_s"]: one * 448.0, S["scale_o"]: scale_o, O: o,
            amax_o: torch.empty_like(one), amax_s: torch.empty_like(one)}

    def fn():
        g.execute(pack, ws)
        return o

    # scale_o so the FP8 output uses its range: O values are about |v|max; 448 / amax(O) after one run
    fn()
    torch.cuda.synchronize()
    amax = float(pack[amax_o].reshape(-1)[0]) if torch.isfinite(pack[amax_o]).all() else 0.0
    if amax > 0:
        scale_o.fill_(448.0 / amax)

    def out_deq():
        fn()
        return o.float() / scale_o.reshape(1, 1, 1, 1)

    return fn, out_deq


def cudnn_fp8_call(q, k, v, causal, sm_scale):
    """cuDNN FP8 SDPA on q, k, v (bf16, MHA) quantized with per-tensor descales, as the bench runs it:
    :func:`make_cudnn_fp8`'s (fn, dequantized output)."""
    from zyfa.kernels.attention_fp8 import quantize_for_kernel

    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, "ck")
    return make_cudnn_fp8(q8, k8, v8, qd[0, 0], kd[0, 0], vd[0, 0], causal, sm_scale)


def make_flash_attn_amd(q, k, v, causal, sm_scale):
    """AMD's Triton FP8 forward from the flash-attn package (zyfa.peers.flash_attn_amd), on the FP8
    values of its recipe; it reads V as stored (no transpose of ours). Returns (fn, first output)."""
    import torch

    from zyfa.emulator import quantize_inputs
    from zyfa.peers.common import per_head_descales
    from zyfa.peers.flash_attn_amd import FLASH_ATTN_AMD_RECIPE, flash_attn_amd_forward
    from zyfa.recipes import get_recipe

    qi = quantize_inputs(q, k, v, get_recipe(FLASH_ATTN_AMD_RECIPE))
    q8, k8, v8 = (t.to(torch.float8_e4m3fn).contiguous() for t in (qi.q_values, qi.k_values, qi.v_values))
    qd, kd, vd = per_head_descales(qi, q.shape[0], q.shape[1], k.shape[1])
    o = torch.zeros((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), dtype=torch.float32, device=q.device)

    def fn():
        return flash_attn_amd_forward(q8, k8, v8, qd, kd, vd, causal=causal, sm_scale=sm_scale, out=o)[0]

    out = fn()
    torch.cuda.synchronize()
    return fn, out.clone()


def make_flashinfer_fa3(q, k, v, causal, sm_scale):
    """FA3's FP8 forward from FlashInfer (zyfa.peers.flashinfer_fa3), on the FP8 values of its recipe in
    FlashInfer's NHD layout (made once, outside the timing; it reads V as stored). One launch per sequence.
    Returns (fn, first output (b, h, s_q, d_v) fp32)."""
    import torch

    from zyfa.emulator import quantize_inputs
    from zyfa.peers.flashinfer_fa3 import (
        FLASHINFER_FA3_DIMS,
        FLASHINFER_FA3_RECIPE,
        check,
        flashinfer_fa3_forward,
        flashinfer_fa3_inputs,
    )
    from zyfa.recipes import get_recipe

    ok, why = check()
    if not ok:
        raise RuntimeError(f"{why} (scripts/build_flashinfer_fa3.py builds FlashInfer's FA3 FP8 prefill for the GPU)")
    if (q.shape[-1], v.shape[-1]) not in FLASHINFER_FA3_DIMS:
        raise ValueError(f"FlashInfer's FP8 prefill takes d_qk = d_v in "
                         f"{', '.join(str(d) for d, _ in FLASHINFER_FA3_DIMS)}, not {q.shape[-1]}/{v.shape[-1]}")
    qi = quantize_inputs(q, k, v, get_recipe(FLASHINFER_FA3_RECIPE))
    per_seq = flashinfer_fa3_inputs(qi, q.shape[1], k.shape[1])

    def fn():
        return [flashinfer_fa3_forward(*t, causal=causal, sm_scale=sm_scale)[0] for t in per_seq]

    outs = fn()
    torch.cuda.synchronize()
    return fn, torch.stack([o.transpose(0, 1).float() for o in outs])


# ---------------------------------------------------------------------------------------------- main

def _versions():
    v = {"python": platform.python_version()}
    for mod in ("torch", "triton", "cudnn"):
        try:
            m = __import__(mod)
            v[mod] = getattr(m, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            v[mod] = f"unavailable ({type(e).__name__})"
    try:
        import torch

        v["cuda"] = torch.version.cuda
        v["cudnn_backend"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        pass
    return v


def _git_commit():
    """HEAD's hash (+ '-dirty' with local changes); ZYFA_GIT_COMMIT overrides (copies without .git)."""
    if os.environ.get("ZYFA_GIT_COMMIT"):
        return os.environ["ZYFA_GIT_COMMIT"]
    cwd = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=cwd).stdout.strip()
        if len(head) != 40:
            return "unknown (no git repository here)"
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=cwd).stdout
        return head + ("-dirty" if dirty.strip() else "")
    except Exception:  # noqa: BLE001
        return "unknown"


def _find_capture(spec):
    import glob

    if spec == "none":
        return None
    if spec != "auto":
        return spec
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "datasets")
    files = sorted(glob.glob(os.path.join(root, "*.h5")))
    return files[0] if files else None


def rotation_times(q, k, recipe, sampler, warmup=5, rep=20):
    """GPU time of rotating Q and K along the head dim as ``recipe.qk_rotation`` says, before the kernel (issue 14):
    ``rotation_ms``: zyfa.rotation.rotate_qk on the CUDA tensors (the fast Walsh-Hadamard transform the quantizer
    runs, fp32 out); ``rotation_matmul_ms``: Q and K times the d x d rotation matrix as one bf16 matmul each (bf16
    out, a cheaper form a pipeline feeding an FP8 quantizer could use). Both do_bench medians; neither includes
    the quantization itself."""
    import torch

    from zyfa.rotation import rotate_qk, rotation_matrix

    kind, seed = recipe.qk_rotation, recipe.rotation_seed
    m = rotation_matrix(q.shape[-1], kind, seed=seed, dtype=torch.bfloat16, device=q.device)
    qb, kb = q.to(torch.bfloat16), k.to(torch.bfloat16)
    fwht_ms, _ = timed(lambda: rotate_qk(q, k, kind, seed=seed), warmup, rep, sampler)
    mm_ms, _ = timed(lambda: (qb @ m, kb @ m), warmup, rep, sampler)
    return {"rotation": kind, "rotation_ms": fwht_ms, "rotation_matmul_ms": mm_ms}


def run_case(rows, *, label, inputs, causal, recipes, peers, warmup, rep, sampler, config, log):
    """Time every implementation on one input (q, k, v bf16); append result rows."""
    import torch

    from zyfa.kernels.attention_fp8 import (
        k_descale_per_tile,
        kernel_plan,
        launch,
        prepare_vt,
        q_descale_per_program,
        quantize_for_kernel,
        resolve_config,
        vt_key_order_for,
    )
    from zyfa.recipes import get_recipe

    q, k, v = inputs
    b, h, s_q, d_qk = q.shape
    h_kv, s_k, d_v = k.shape[1], k.shape[2], v.shape[3]
    sm_scale = 1.0 / math.sqrt(d_qk)
    fl = flops(b, h, s_q, s_k, d_qk, d_v, causal)
    base = {"input": label, "b": b, "h": h, "h_kv": h_kv, "s": s_q, "d_qk": d_qk, "d_v": d_v, "causal": causal}
    ref = None
    quant_cache = {}
    for spec in recipes:
        row = dict(base, impl="triton-fp8", recipe=spec)
        try:
            r = get_recipe(spec)
            plan = kernel_plan(r)
            key = (r.q_scale, r.k_scale, r.v_scale, r.scale_block_q, r.scale_block_kv, r.k_smoothing,
                   r.qk_rotation, r.rotation_seed)
            if key not in quant_cache:
                quant_cache[key] = quantize_for_kernel(q, k, v, r)
            q8, k8, v8, qd, kd, vd = quant_cache[key]
            block_n = (config or {}).get("BLOCK_N", plan.block_n)
            if kd.dim() == 3:  # per-block K descales: one per KV tile
                kd = k_descale_per_tile(kd, block_n)
            if plan.vd_mode == 2:  # per-block V descales: one per KV tile (per-channel ones go as they are)
                vd = k_descale_per_tile(vd, block_n, "v_descale")
            if qd.dim() == 3:  # per-block Q descales: one per program where the blocks allow it, else per row
                qd_prog = q_descale_per_program(qd, resolve_config(d_qk, d_v, causal, plan, config)[0]["BLOCK_M"])
                qd = qd if qd_prog is None else qd_prog
            perm = vt_key_order_for(config)
            vt = prepare_vt(v8, permute_k32=perm)
            if ref is None:
                ref = sdpa_reference(q, k, v, causal, sm_scale).float()

            def fn(q8=q8, k8=k8, vt=vt, qd=qd, kd=kd, vd=vd, plan=plan):
                return launch(q8, k8, vt, qd, kd, vd, plan=plan, seq_k=s_k, causal=causal, sm_scale=sm_scale,
                              window=None, config=config)

            out, lse = fn()
            torch.cuda.synchronize()
            err = rel_l2(out, ref)
            row["rel_l2_vs_sdpa_bf16"] = err
            if not math.isfinite(err) or err > 0.25:
                row["error"] = f"correctness check failed: rel L2 vs SDPA bf16 = {err:.3g}"
                rows.append(row)
                log(row)
                continue
            ms, clk = timed(fn, warmup, rep, sampler)
            t_ms, _ = timed(lambda v8=v8, perm=perm: prepare_vt(v8, permute_k32=perm), 5, 20, sampler)
            row.update(ms=ms, tflops=fl / ms / 1e9, v_transpose_ms=t_ms,
                       tflops_incl_transpose=fl / (ms + t_ms) / 1e9, **clk)
            if r.qk_rotation != "none":
                row.update(rotation_times(q, k, r, sampler))
        except Exception as e:  # noqa: BLE001 - one failing case must not end the run
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        log(row)
    g = h // h_kv
    qb, kb, vb = q, (k.repeat_interleave(g, 1) if g > 1 else k), (v.repeat_interleave(g, 1) if g > 1 else v)
    for peer in peers:
        row = dict(base, impl=peer, recipe="bf16" if peer.startswith("sdpa") else "cudnn-fp8")
        try:
            if peer in ("flash-attn-triton-amd", "flashinfer-fa3"):
                from zyfa.peers.flash_attn_amd import FLASH_ATTN_AMD_RECIPE
                from zyfa.peers.flashinfer_fa3 import FLASHINFER_FA3_RECIPE

                make, row["recipe"] = ((make_flash_attn_amd, FLASH_ATTN_AMD_RECIPE) if peer == "flash-attn-triton-amd"
                                       else (make_flashinfer_fa3, FLASHINFER_FA3_RECIPE))
                fn, out = make(q, k, v, causal, sm_scale)
                if ref is None:
                    ref = sdpa_reference(q, k, v, causal, sm_scale).float()
                row["rel_l2_vs_sdpa_bf16"] = rel_l2(out, ref)
            elif peer.startswith("sdpa"):
                fn = make_sdpa(qb, kb, vb, causal, sm_scale, peer)
                out = fn()
                torch.cuda.synchronize()
                if ref is None:
                    ref = sdpa_reference(q, k, v, causal, sm_scale).float()
                row["rel_l2_vs_sdpa_bf16"] = rel_l2(out, ref)
            else:
                if h_kv != h:
                    raise ValueError("cuDNN FP8 peer run with expanded K/V only for MHA shapes")
                fn, out_deq = cudnn_fp8_call(q, k, v, causal, sm_scale)
                if ref is None:
                    ref = sdpa_reference(q, k, v, causal, sm_scale).float()
                row["rel_l2_vs_sdpa_bf16"] = rel_l2(out_deq(), ref)
            ms, clk = timed(fn, warmup, rep, sampler)
            row.update(ms=ms, tflops=fl / ms / 1e9, **clk)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        log(row)
    return rows


def to_markdown(meta, rows, ours="zyfa-hopper"):
    from zyfa.markdown import md_escape

    # every string of the file as inert Markdown (zyfa.markdown): names and notes add no column, row or heading
    meta = {k: md_escape(v) if isinstance(v, str) else v for k, v in meta.items()}
    rows = [{k: md_escape(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]
    ours = md_escape(ours)
    lines = [f"# Benchmark: FP8 attention on {meta['device']}", "",
             f"- command: `{meta['command']}`", f"- date: {meta['date']}", f"- git commit: {meta['git_commit']}",
             f"- versions: {md_escape(json.dumps(meta['versions']))}",
             f"- inputs: {meta['inputs_note']}",
             "- TFLOP/s = FLOPs / median kernel time (triton.testing.do_bench); FLOPs = 4·b·h·s²·d "
             "(2·(d_qk+d_v) for MLA), halved for causal. Our kernel's 'ms' and 'TFLOP/s' exclude V's one-off "
             "transpose (column 'V^T ms'); 'incl.' includes it, and the two summary tables use 'incl.'. "
             "SM clock / power: NVML means during the timed run. "
             "Recipes with qk_rotation: Q and K are rotated before the kernel, timed on their own in the last "
             "column (zyfa.rotation's FWHT / one bf16 matmul by the rotation matrix), not in 'ms'.",
             "- err = relative L2 of the output vs PyTorch SDPA bf16 on the same (bf16) inputs: a sanity check, "
             "not the accuracy study (cuDNN FP8's includes its FP8 output rounding).", ""]
    summary = summary_lines(rows, ours)  # ends with "", "## Every row", ""
    lines += summary[:-2] + plane_lines(rows) + plane_lines(rows, "flashinfer-fa3") + summary[-2:]
    hdr = ("| input | shape | s | causal | impl | recipe | TFLOP/s | ms | V^T ms | incl. | err | SM MHz | W | "
           "rotation ms (FWHT / matmul) |")
    lines += [hdr, "|" + "---|" * 14]
    for r in rows:
        shape = f"h{r['h']}/{r['h_kv']} d{r['d_qk']}/{r['d_v']}"
        if "error" in r:
            lines.append(f"| {r['input']} | {shape} | {r['s']} | {r['causal']} | {r['impl']} | {r['recipe']} | "
                         f"failed: {r['error'][:120]} |  |  |  |  |  |  |  |")
            continue

        def f(x, fmt):
            return format(x, fmt) if isinstance(x, (int, float)) and x is not None else "-"

        lines.append(
            f"| {r['input']} | {shape} | {r['s']} | {r['causal']} | {r['impl']} | {r['recipe']} | "
            f"{f(r.get('tflops'), '.0f')} | {f(r.get('ms'), '.3f')} | {f(r.get('v_transpose_ms'), '.3f')} | "
            f"{f(r.get('tflops_incl_transpose'), '.0f')} | {f(r.get('rel_l2_vs_sdpa_bf16'), '.4f')} | "
            f"{f(r.get('sm_clock_mhz'), '.0f')} | {f(r.get('power_w'), '.0f')} | "
            + (f"{f(r.get('rotation_ms'), '.3f')} / {f(r.get('rotation_matmul_ms'), '.3f')} |"
               if r.get("rotation_ms") is not None else "- |"))
    return "\n".join(lines) + "\n"


# rel-L2 against SDPA BF16 on Gaussian inputs above which a row's output is wrong (an FP8 attention is at about
# 0.05 there): such a row is no speed, and the summary shows it as a wrong output. (AMD's Triton FP8 kernel gave
# 0.49 and NaN at MLA's 192/128 head dims on the H200 when the bench still ran it there: it takes one head size for
# Q, K and V, and ``flash_attn_amd_forward`` now refuses such a shape.)
WRONG_OUTPUT_REL_L2 = 0.3


def _plausible(r: dict) -> bool:
    err = r.get("rel_l2_vs_sdpa_bf16")
    return err is None or err <= WRONG_OUTPUT_REL_L2


def headline_tflops(r: dict) -> float:
    """A row's TFLOP/s as the summaries count it: our kernel's with V's transpose included where it was timed
    (``tflops_incl_transpose``: a user with V as stored pays it), a peer's as timed."""
    incl = r.get("tflops_incl_transpose")
    return float(incl) if r.get("impl") == "triton-fp8" and isinstance(incl, (int, float)) else float(r["tflops"])


def _longest_gaussian(rows):
    """{(d_qk, d_v, causal): rows at that shape's longest Gaussian sequence} over the rows that ran."""
    ok = [r for r in rows if "error" not in r and r.get("tflops")]
    by = {}
    for r in ok:
        by.setdefault((r["d_qk"], r["d_v"], r["causal"]), []).append(r)
    out = {}
    for key, rs in sorted(by.items(), key=lambda kv: (kv[0][0] == 192, kv[0][0], kv[0][2])):
        gs = [r for r in rs if r["input"] == "gaussian"]
        if gs:
            s = max(r["s"] for r in gs)
            out[key] = (s, [r for r in gs if r["s"] == s], rs)
    return out


# the peers our configurations are set against on the speed–accuracy plane: bench name -> how the tables name it
PLANE_PEERS = {"cudnn-fp8": "cuDNN FP8", "flashinfer-fa3": "FA3 FP8 (FlashInfer)"}


def plane_lines(rows, peer="cudnn-fp8"):
    """'Against <peer> on the speed–accuracy plane': at each shape's longest Gaussian sequence, the peer's speed and
    error (rel-L2 against SDPA BF16 on the same inputs) and every configuration of our kernel that is both faster
    (V's transpose included) and more accurate, fastest first; where none is, the fastest of the more accurate ones.
    Empty without a row of that peer. ``peer``: a key of :data:`PLANE_PEERS`."""
    name = PLANE_PEERS[peer]
    out = []
    for (d_qk, d_v, causal), (s, at, _rs) in _longest_gaussian(rows).items():
        fp8 = [r for r in at if r["impl"] == peer and _plausible(r)
               and isinstance(r.get("rel_l2_vs_sdpa_bf16"), (int, float))]
        ours = [r for r in at if r["impl"] == "triton-fp8" and _plausible(r)
                and isinstance(r.get("rel_l2_vs_sdpa_bf16"), (int, float))]
        if not fp8 or not ours:
            continue
        ref = max(fp8, key=lambda r: r["tflops"])
        t_ref, e_ref = ref["tflops"], ref["rel_l2_vs_sdpa_bf16"]
        better = sorted((r for r in ours if r["rel_l2_vs_sdpa_bf16"] < e_ref), key=headline_tflops, reverse=True)
        both = [r for r in better if headline_tflops(r) > t_ref]

        def cell(r, t_ref=t_ref):
            return (f"{r['recipe']} ({headline_tflops(r):.0f}, {r['rel_l2_vs_sdpa_bf16']:.4f}, "
                    f"{headline_tflops(r) / t_ref:.2f}×)")

        found = "; ".join(cell(r) for r in both) if both else \
            ("none; fastest more accurate: " + cell(better[0]) if better else "none more accurate")
        shape = "MLA 192/128" if d_qk != d_v else f"hd{d_qk}"
        out.append(f"| {shape} | {s} | {'causal' if causal else 'non-causal'} | {t_ref:.0f} | {e_ref:.4f} | "
                   f"{found} |")
    if not out:
        return []
    own = ("cuDNN FP8's includes its FP8 output, ours is bf16" if peer == "cudnn-fp8"
           else "both write bf16")
    return [f"## Against {name} on the speed–accuracy plane (same inputs, same run)", "",
            f"Our configurations that are both faster than {name} (TFLOP/s with V's transpose) and more accurate "
            f"(rel-L2 against SDPA BF16 on the same Gaussian inputs; {own}), fastest first, as recipe (TFLOP/s, "
            f"error, × {name}).", "",
            f"| shape | s | mask | {name} TFLOP/s | {name} error | faster and more accurate |",
            "|" + "---|" * 6, *out, ""]


def summary_lines(rows, ours="zyfa-hopper"):
    """'Where we land': at each shape's longest Gaussian sequence, ``ours`` against the peers of the same run,
    and its captured/Gaussian throughput ratio (the capture tiled to that length against Gaussian inputs of the
    capture's shape) where both were timed. Our kernel's speeds include V's transpose where it was timed
    (:func:`headline_tflops`). A row whose output is wrong (rel-L2 against SDPA BF16 above
    :data:`WRONG_OUTPUT_REL_L2`) is shown as such, never as a speed."""
    out = []
    for (d_qk, d_v, causal), (s, at, rs) in _longest_gaussian(rows).items():

        def best(pred, at=at):
            c = [r for r in at if pred(r) and _plausible(r)]
            return max(c, key=headline_tflops) if c else None

        def wrong(pred, at=at):
            c = [r["rel_l2_vs_sdpa_bf16"] for r in at if pred(r) and not _plausible(r)]
            return f"wrong output (rel-L2 {max(c):.2f})" if c else "-"

        mine = best(lambda r: r["impl"] == "triton-fp8" and r["recipe"] == ours)
        if mine is None:
            continue
        top = best(lambda r: r["impl"] == "triton-fp8")
        peers = {"cudnn": lambda r: r["impl"] == "sdpa-cudnn", "bf16": lambda r: r["impl"].startswith("sdpa-"),
                 "fp8": lambda r: r["impl"] == "cudnn-fp8", "fa3": lambda r: r["impl"] == "flashinfer-fa3",
                 "amd": lambda r: r["impl"] == "flash-attn-triton-amd"}
        cudnn, bf16, fp8, fa3, amd = (best(peers[k]) for k in ("cudnn", "bf16", "fp8", "fa3", "amd"))
        same = [r for r in rs if r["s"] == s and r["impl"] == "triton-fp8" and r["recipe"] == ours]
        cap = [r for r in same if r["input"].startswith("captured")]
        like = [r for r in same if r["input"] == "gaussian-like-capture"]

        def t(r, peer=None, peers=peers):
            return f"{headline_tflops(r):.0f}" if r else (wrong(peers[peer]) if peer else "-")

        ratios = [f"{headline_tflops(mine) / p['tflops']:.2f}" if p else "-" for p in (cudnn, bf16, fp8, fa3, amd)]
        ratios.append(f"{cap[0]['tflops'] / like[0]['tflops']:.2f}" if cap and like else "-")
        shape = "MLA 192/128" if d_qk != d_v else f"hd{d_qk}"
        out.append(f"| {shape} | {s} | {'causal' if causal else 'non-causal'} | {t(mine)} | "
                   f"{t(top)} ({top['recipe']}) | {t(cudnn, 'cudnn')} | {t(bf16, 'bf16')} "
                   f"({bf16['impl'][5:] if bf16 else '-'}) | {t(fp8, 'fp8')} | {t(fa3, 'fa3')} | {t(amd, 'amd')} | "
                   + " | ".join(ratios) + " |")
    if not out:
        return []
    return ["## Where we land (TFLOP/s at each shape's longest Gaussian sequence, same run)", "",
            "Our kernel's numbers include V's transpose (the one copy a caller with V as stored pays; 'incl.' "
            "below); the peers read V as stored.", "",
            f"| shape | s | mask | {ours} | fastest of our recipes | cuDNN BF16 | best BF16 SDPA | cuDNN FP8 | "
            "FA3 FP8 (FlashInfer) | AMD Triton FP8 | × cuDNN BF16 | × best BF16 | × cuDNN FP8 | × FA3 FP8 | "
            "× AMD Triton FP8 | captured / Gaussian |",
            "|" + "---|" * 16, *out, "", "## Every row", ""]


# Row fields that count something (heads, tokens, dims): positive integers; and measured numbers: finite, >= 0
# (the error against SDPA may be NaN: a NaN output).
_BENCH_COUNTS = ("b", "h", "h_kv", "s", "d_qk", "d_v")
_BENCH_NUMBERS = ("ms", "tflops", "v_transpose_ms", "tflops_incl_transpose", "rel_l2_vs_sdpa_bf16", "sm_clock_mhz",
                  "power_w", "rotation_ms", "rotation_matmul_ms")


def _check_bench_row(r: dict, where: str) -> None:
    """ValueError naming the row and field for a count that is not a positive integer (a NaN or negative head
    count) or a measured number that is not finite and >= 0."""
    for k in _BENCH_COUNTS:
        v = r.get(k)
        if k in r and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{where}: {k!r} must be a positive integer, got {v!r}; the Markdown was left as it was")
    for k in _BENCH_NUMBERS:
        v = r.get(k)
        if k == "rel_l2_vs_sdpa_bf16" and isinstance(v, float) and math.isnan(v):
            continue  # a NaN output: shown as a wrong output, not a speed
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                  and v >= 0):
            raise ValueError(f"{where}: {k!r} must be a finite number >= 0, got {v!r}; the Markdown was left as it "
                             "was")


def render(path: str, ours: str = "zyfa-hopper") -> str:
    """Rewrite ``<stem>.md`` from ``<stem>.json`` (no GPU); returns the Markdown path.

    The Markdown is rendered to a string first and then replaces the old file atomically, so a file that
    cannot be rendered (missing, not JSON, not a bench file, a row or meta field missing) leaves the old
    Markdown as it was; the error (ValueError / FileNotFoundError) names the file and the problem."""
    from zyfa.outputs import atomic_write_text

    if not path.endswith(".json") or not os.path.isfile(path):
        raise FileNotFoundError(f"--render takes a .json written by zyfa bench; {path!r} is not one")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file") from None
    except RecursionError:
        raise ValueError(f"{path}: not a zyfa bench file (nested too deeply to read)") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise ValueError(f"{path}: not JSON ({str(e).split(';')[0]})") from None
    if not isinstance(data, dict) or "meta" not in data or "rows" not in data:
        raise ValueError(f"{path}: not a zyfa bench file (expected 'meta' and 'rows')")
    if not isinstance(data["meta"], dict) or not isinstance(data["rows"], list) \
            or not all(isinstance(r, dict) for r in data["rows"]):
        raise ValueError(f"{path}: not a zyfa bench file ('meta' must be an object, 'rows' a list of objects)")
    for i, r in enumerate(data["rows"]):
        _check_bench_row(r, f"{path}: rows[{i}]")
    try:
        text = to_markdown(data["meta"], data["rows"], ours)
    except KeyError as e:
        raise ValueError(f"{path}: not a complete zyfa bench file (no {e.args[0]!r} field); "
                         "the Markdown was left as it was") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: a field has the wrong type ({e}); the Markdown was left as it was") from None
    md = path[: -len(".json")] + ".md"
    atomic_write_text(md, text)
    return md


def output_stem(out: str) -> str:
    """``--out`` -> the path without ``.json`` (a folder, existing or ending in '/', means FOLDER/bench.json)."""
    if out.endswith(("/", os.sep)) or os.path.isdir(out):
        out = os.path.join(out, "bench.json")
    if not out.endswith(".json"):
        raise ValueError(f"--out {out!r}: give a .json file (or a folder)")
    return out[: -len(".json")]


def main(args) -> int:
    if args.render:
        try:
            print("wrote", render(args.render, args.ours))
        except (OSError, ValueError) as err:
            print(f"zyfa bench --render: {err}", file=sys.stderr)
            return 2
        return 0
    try:
        stem = output_stem(args.out)
    except ValueError as err:
        print(f"zyfa bench: {err}", file=sys.stderr)
        return 2
    existing = [p for p in (stem + ".json", stem + ".md") if os.path.exists(p)]
    if existing and not args.overwrite:
        print(f"zyfa bench: {existing[0]} exists; choose another --out or pass --overwrite", file=sys.stderr)
        return 2
    from zyfa.kernels.attention_fp8 import kernel_plan
    from zyfa.recipes import get_recipe, split_spec_list

    recipes = split_spec_list(args.recipes)
    other = recipes if args.recipes_other == "same" else split_spec_list(args.recipes_other)
    try:  # every spec the kernel honours, before the GPU is looked for
        for spec in dict.fromkeys([*recipes, *other]):
            kernel_plan(get_recipe(spec))
    except ValueError as err:
        print(f"zyfa bench: {err}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("zyfa bench needs a CUDA GPU (Hopper); none found", file=sys.stderr)
        return 2
    peers = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    shapes = [s for s in args.shapes.split(",") if s]
    seqlens = [int(s) for s in args.seqlens.split(",") if s]
    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    config = json.loads(args.config) if args.config else None
    sampler = ClockSampler()
    rows = []

    def log(row):
        keys = ("input", "s", "d_qk", "causal", "impl", "recipe", "tflops", "rel_l2_vs_sdpa_bf16", "sm_clock_mhz",
                "rotation_ms", "rotation_matmul_ms", "error")
        print(" ".join(f"{k}={row[k]:.4g}" if isinstance(row.get(k), float) else f"{k}={row.get(k)}"
                       for k in keys if k in row), flush=True)

    date = _dt.datetime.now(_dt.timezone.utc)
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    meta = {"command": "zyfa bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
            "date": date.isoformat(timespec="seconds"), "git_commit": _git_commit(), "versions": _versions(),
            "device": torch.cuda.get_device_name(), "inputs_note": "Gaussian N(0,1) bf16 q, k, v (batch 1)",
            "nvml": sampler._nvml is not None}

    def write():
        atomic_write_text(stem + ".json", json.dumps({"meta": meta, "rows": rows}, indent=1))
        atomic_write_text(stem + ".md", to_markdown(meta, rows, args.ours))

    for shape in shapes:
        d_qk, d_v = SHAPES[shape]
        h = bench_heads(shape, args.hidden)
        for s in seqlens:
            inputs = gaussian_qkv(1, h, h, s, d_qk, d_v)
            for causal in causals:
                run_case(rows, label="gaussian", inputs=inputs, causal=causal,
                         recipes=recipes if shape == "hd128" else other, peers=peers,
                         warmup=args.warmup, rep=args.rep, sampler=sampler, config=config, log=log)
            del inputs
            torch.cuda.empty_cache()
            write()
    cap = _find_capture(args.captured)
    inputs_note = "Gaussian N(0,1) bf16 q, k, v (batch 1)"
    if cap:
        try:
            for s in seqlens:
                q, k, v, rec = captured_qkv(cap, s)
                for causal in causals:
                    recs = ["zyfa-hopper", "fa3"]
                    run_case(rows, label=f"captured:{os.path.basename(cap)}", inputs=(q, k, v), causal=causal,
                             recipes=recs, peers=[], warmup=args.warmup, rep=args.rep, sampler=sampler,
                             config=config, log=log)
                    gq, gk, gv = gaussian_qkv(*q.shape[:2], k.shape[1], s, q.shape[3], v.shape[3], seed=1)
                    run_case(rows, label="gaussian-like-capture", inputs=(gq, gk, gv), causal=causal,
                             recipes=recs, peers=[], warmup=args.warmup, rep=args.rep, sampler=sampler,
                             config=config, log=log)
                    write()
            inputs_note += (f"; captured: first layer of {os.path.basename(cap)} ({rec.name}) tiled along the "
                            "sequence to each length, against Gaussian inputs of the same shape")
        except Exception as e:  # noqa: BLE001
            inputs_note += f"; captured inputs not timed ({type(e).__name__}: {str(e)[:200]})"
    else:
        inputs_note += "; no captured HDF5 slice under datasets/*.h5, so no captured-input timing"
    meta["inputs_note"] = inputs_note
    write()
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="zyfa bench")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
