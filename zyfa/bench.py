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
import sys

from capture.version import git_label
from zyfa.norms import rel_l2
from zyfa.outputs import atomic_write_text
from zyfa.timing import NvmlClock, Sample, cuda_timer, ratio_summary, summarize, time_interleaved

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
# the peers, by the implementation registry's names (accuracy.implementations); older bench files' names map on
PEERS = ("sdpa-bf16:cudnn", "sdpa-bf16:flash", "cudnn-fp8", "flash-attn-triton-amd", "flashinfer-fa3")
OLD_PEER_NAMES = {"sdpa-cudnn": "sdpa-bf16:cudnn", "sdpa-flash": "sdpa-bf16:flash"}
OURS_IMPL = "triton-fp8"  # the bench's name of our kernel (its recipe in the row's "recipe")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seqlens", default="8192,16384,32768", help="comma-separated tokens (batch 1)")
    p.add_argument("--shapes", default="hd64,hd128,hd256,mla", help=f"subset of {','.join(SHAPES)}")
    p.add_argument("--causal", default="both", choices=("both", "true", "false"))
    p.add_argument("--recipes", default=";".join(DEFAULT_RECIPES),
                   help="recipe specs the kernel runs, ';'-separated (or ','; docs/CONTRACTS.md 'Recipe specs')")
    p.add_argument("--recipes-other", default=";".join(OTHER_RECIPES),
                   help="';'-separated recipe specs for the shapes other than hd128 ('same' = --recipes)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"subset of {','.join(PEERS)} (or 'none')")
    p.add_argument("--kernel", action="append", default=[], metavar="[NAME=]FILE.py:FN",
                   help="a user's kernel (the plug-in contract, docs/CONTRACTS.md) timed beside the peers in the same "
                        "interleaving, in this process; repeatable; NAME names it in the tables")
    p.add_argument("--repeats", type=int, default=5,
                   help="times each case is timed, every implementation once per repeat in rotating order (>= 1; "
                        "ratios are taken within a repeat, then summarised)")
    p.add_argument("--hidden", type=int, default=2048, help="heads = hidden // d_v (MLA: 16 heads)")
    p.add_argument("--captured", default="auto",
                   help="HDF5 capture to time on (tiled to the length); 'auto' = first datasets/*.h5; 'none'")
    p.add_argument("--warmup", type=int, default=10, help="do_bench warm-up per sample, ms")
    p.add_argument("--rep", type=int, default=40, help="do_bench repetitions per sample, ms")
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

def make_sdpa(q, k, v, causal, sm_scale, peer):
    """PyTorch SDPA in bf16 on one backend (``sdpa-bf16:cudnn`` or ``sdpa-bf16:flash``; zyfa.peers.sdpa), GQA
    expanded. Returns (fn, first output)."""
    import torch

    from zyfa.peers.sdpa import sdpa_forward

    backend = peer.split(":", 1)[1]

    def fn():
        return sdpa_forward(q, k, v, causal=causal, sm_scale=sm_scale, dtype=torch.bfloat16, backend=backend)

    out = fn()
    torch.cuda.synchronize()
    return fn, out


def cudnn_fp8_call(q, k, v, causal, sm_scale):
    """cuDNN FP8 SDPA (zyfa.peers.cudnn_fp8's graph, built once) on q, k, v quantized with per-tensor descales (the
    ``ck`` recipe's quantizer), GQA K/V heads repeated: (fn launching it, a function giving the last output
    dequantized; FP8 output on Hopper)."""
    from zyfa.kernels.attention_fp8 import quantize_for_kernel
    from zyfa.peers.common import expand_kv
    from zyfa.peers.cudnn_fp8 import PreparedCudnnFp8

    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1]), "ck")
    prepared = PreparedCudnnFp8(q8, k8, v8, qd.reshape(-1)[0], kd.reshape(-1)[0], vd.reshape(-1)[0], causal=causal,
                                sm_scale=sm_scale)
    return prepared.call, prepared.output


def make_cudnn_fp8(q, k, v, causal, sm_scale):
    """:func:`cudnn_fp8_call` as (fn, first output dequantized)."""
    import torch

    fn, output = cudnn_fp8_call(q, k, v, causal, sm_scale)
    fn()
    torch.cuda.synchronize()
    return fn, output().clone()


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


def _find_capture(spec):
    import glob

    if spec == "none":
        return None
    if spec != "auto":
        return spec
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "datasets")
    files = sorted(glob.glob(os.path.join(root, "*.h5")))
    return files[0] if files else None


def rotation_times(q, k, recipe, timer):
    """GPU time of rotating Q and K along the head dim as ``recipe.qk_rotation`` says, before the kernel (issue 14):
    ``rotation_ms``: zyfa.rotation.rotate_qk on the CUDA tensors (the fast Walsh-Hadamard transform the quantizer
    runs, fp32 out); ``rotation_matmul_ms``: Q and K times the d x d rotation matrix as one bf16 matmul each (bf16
    out, a cheaper form a pipeline feeding an FP8 quantizer could use). Neither includes the quantization."""
    import torch

    from zyfa.rotation import rotate_qk, rotation_matrix

    kind, seed = recipe.qk_rotation, recipe.rotation_seed
    m = rotation_matrix(q.shape[-1], kind, seed=seed, dtype=torch.bfloat16, device=q.device)
    qb, kb = q.to(torch.bfloat16), k.to(torch.bfloat16)
    return {"rotation": kind, "rotation_ms": timer(lambda: rotate_qk(q, k, kind, seed=seed)),
            "rotation_matmul_ms": timer(lambda: (qb @ m, kb @ m))}


def fp8_output_rel_l2(out, ref) -> float:
    """rel-L2 against ``ref`` of ``out`` rounded to e4m3 with one scale 448 / amax(out), as cuDNN FP8 writes its output
    on Hopper: our kernel's error at cuDNN's output format (an FP8 output against a BF16 one is no kernel
    comparison)."""
    import torch

    o = out.float()
    amax = float(o.abs().max())
    scale = 448.0 / amax if math.isfinite(amax) and amax > 0 else 1.0
    return rel_l2((o * scale).to(torch.float8_e4m3fn).float() / scale, ref)


class Candidate:
    """One implementation of one case, prepared (inputs quantized, graphs built) and checked: ``fn`` launches it;
    ``row`` holds its result fields; ``extra``: callables timed beside it whose time it also pays (V's transpose)."""

    def __init__(self, row: dict, fn=None, extra=None):
        self.row, self.fn, self.extra = row, fn, extra or {}

    @property
    def key(self) -> str:
        return f"{self.row['impl']}|{self.row['recipe']}"


def _check_output(row: dict, out, ref) -> bool:
    err = rel_l2(out, ref)
    row["rel_l2_vs_sdpa_bf16"] = err
    if not math.isfinite(err) or err > WRONG_OUTPUT_REL_L2:
        row["error"] = f"correctness check failed: rel L2 vs SDPA bf16 = {err:.3g}"
        return False
    return True


def prepare_ours(base, spec, q, k, v, causal, config, quant_cache, ref) -> Candidate:
    """Our Triton kernel under recipe ``spec``, with the recipe's descales (per tensor, head or block)."""
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

    d_qk, s_k = q.shape[3], k.shape[2]
    from zyfa.emulator import quantization_key
    from zyfa.recipes import get_recipe

    sm_scale = 1.0 / math.sqrt(d_qk)
    row = dict(base, impl=OURS_IMPL, recipe=spec)
    r = get_recipe(spec)
    plan = kernel_plan(r)
    key = quantization_key(r)
    if key not in quant_cache:
        quant_cache[key] = quantize_for_kernel(q, k, v, r)
    q8, k8, v8, qd, kd, vd = quant_cache[key]
    block_n = (config or {}).get("BLOCK_N", plan.block_n)
    if kd.dim() == 3:  # per-block K descales: one per KV tile
        kd = k_descale_per_tile(kd, block_n)
    if plan.vd_mode == 2:  # per-block V descales: one per KV tile (per-channel ones go as they are)
        vd = k_descale_per_tile(vd, block_n, "v_descale")
    if qd.dim() == 3:  # per-block Q descales: one per program where the blocks allow it, else per row
        qd_prog = q_descale_per_program(qd, resolve_config(d_qk, v.shape[3], causal, plan, config)[0]["BLOCK_M"])
        qd = qd if qd_prog is None else qd_prog
    perm = vt_key_order_for(config)
    vt = prepare_vt(v8, permute_k32=perm)

    def fn():
        return launch(q8, k8, vt, qd, kd, vd, plan=plan, seq_k=s_k, causal=causal, sm_scale=sm_scale, window=None,
                      config=config)

    out, _lse = fn()
    torch.cuda.synchronize()
    if not _check_output(row, out, ref):
        return Candidate(row)
    row["rel_l2_fp8_out_vs_sdpa_bf16"] = fp8_output_rel_l2(out, ref)
    if r.qk_rotation != "none":
        row.update(rotation_times(q, k, r, cuda_timer(5, 20)))
    return Candidate(row, fn, {"v_transpose": lambda: prepare_vt(v8, permute_k32=perm)})


def peer_recipe(peer: str) -> str:
    """The recipe the implementation registry pairs a peer with (its row's ``recipe``)."""
    from zyfa.peers.flash_attn_amd import FLASH_ATTN_AMD_RECIPE
    from zyfa.peers.flashinfer_fa3 import FLASHINFER_FA3_RECIPE

    return {"flash-attn-triton-amd": FLASH_ATTN_AMD_RECIPE, "flashinfer-fa3": FLASHINFER_FA3_RECIPE,
            "cudnn-fp8": "cudnn-fp8"}.get(peer, "bf16")


def prepare_peer(base, peer, q, k, v, causal, ref) -> Candidate:
    """A real peer kernel (registry name) prepared once from ``zyfa.peers``."""
    sm_scale = 1.0 / math.sqrt(q.shape[3])
    row = dict(base, impl=peer, recipe=peer_recipe(peer))
    if peer == "flash-attn-triton-amd":
        fn, out = make_flash_attn_amd(q, k, v, causal, sm_scale)
    elif peer == "flashinfer-fa3":
        fn, out = make_flashinfer_fa3(q, k, v, causal, sm_scale)
    elif peer == "cudnn-fp8":
        fn, out = make_cudnn_fp8(q, k, v, causal, sm_scale)
    else:
        fn, out = make_sdpa(q, k, v, causal, sm_scale, peer)
    if not _check_output(row, out, ref):
        return Candidate(row)
    return Candidate(row, fn)


def prepare_plugin(base, name, kernel, q, k, v, causal, ref) -> Candidate:
    """A user's kernel (the plug-in contract of docs/CONTRACTS.md: ``fn(q, k, v, *, causal, sm_scale, window)``),
    called in this process on the bf16 inputs, timed like the peers."""
    import torch

    sm_scale = 1.0 / math.sqrt(q.shape[3])
    row = dict(base, impl=f"plugin:{name}", recipe="-")

    def fn():
        return kernel(q, k, v, causal=causal, sm_scale=sm_scale, window=None)

    res = fn()
    out = res[0] if isinstance(res, (tuple, list)) else res
    torch.cuda.synchronize()
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (*q.shape[:3], v.shape[3]):
        row["error"] = f"returned {type(out).__name__} of shape {tuple(getattr(out, 'shape', ()))}, expected " \
                       f"{(*q.shape[:3], v.shape[3])}"
        return Candidate(row)
    if not _check_output(row, out, ref):
        return Candidate(row)
    row["rel_l2_fp8_out_vs_sdpa_bf16"] = fp8_output_rel_l2(out, ref)
    return Candidate(row, fn)


def run_case(rows, *, label, inputs, causal, recipes, peers, plugins=(), repeats, timer, clock, config, log):
    """Every implementation of one input (q, k, v bf16) prepared and checked first, then timed interleaved
    (:func:`zyfa.timing.time_interleaved`: rotating order, ``repeats`` times); appends one row per
    implementation with its median, spread and clock, and for our kernel and the plug-ins the speed ratio against
    each peer taken within each repeat (``vs``; with V's transpose included for ours: ``vs_incl_transpose``)."""
    import torch

    q, k, v = inputs
    b, h, s_q, d_qk = q.shape
    h_kv, s_k, d_v = k.shape[1], k.shape[2], v.shape[3]
    fl = flops(b, h, s_q, s_k, d_qk, d_v, causal)
    base = {"input": label, "b": b, "h": h, "h_kv": h_kv, "s": s_q, "d_qk": d_qk, "d_v": d_v, "causal": causal}
    ref = sdpa_reference(q, k, v, causal, 1.0 / math.sqrt(d_qk)).float()
    quant_cache: dict = {}
    cands: list[Candidate] = []
    jobs = [(lambda spec=spec: prepare_ours(base, spec, q, k, v, causal, config, quant_cache, ref),
             dict(base, impl=OURS_IMPL, recipe=spec)) for spec in recipes]
    jobs += [(lambda p=p: prepare_peer(base, p, q, k, v, causal, ref), dict(base, impl=p, recipe=peer_recipe(p)))
             for p in peers]
    jobs += [(lambda n=n, f=f: prepare_plugin(base, n, f, q, k, v, causal, ref),
              dict(base, impl=f"plugin:{n}", recipe="-")) for n, f in plugins]
    for prepare, blank in jobs:
        try:
            cands.append(prepare())
        except Exception as e:  # noqa: BLE001 - one failing implementation must not end the run
            cands.append(Candidate(dict(blank, error=f"{type(e).__name__}: {str(e)[:300]}")))
    ready = [c for c in cands if c.fn is not None]
    fns = {c.key: c.fn for c in ready}
    for c in ready:
        fns.update({f"{name}|{c.key}": f for name, f in c.extra.items()})
    failures: dict[str, str] = {}
    samples = time_interleaved(fns, repeats=repeats, timer=timer, clock=clock, failures=failures) if fns else []
    for c in ready:
        bad = {k: e for k, e in failures.items() if k == c.key or k.endswith(f"|{c.key}")}
        if bad:
            c.row["error"] = f"failed while timed: {next(iter(bad.values()))}"
            c.fn = None
    samples = [s for s in samples if s.name not in failures and s.name.split("|", 1)[-1] not in failures]
    ready = [c for c in ready if c.fn is not None]
    # our kernel's time with V's transpose (paid once per call by a caller with V as stored), per repeat
    incl = []
    for c in ready:
        if "v_transpose" in c.extra:
            vt = {s.repeat: s for s in samples if s.name == f"v_transpose|{c.key}"}
            incl += [Sample(f"incl|{c.key}", s.repeat, s.position, s.ms + vt[s.repeat].ms, s.clock_mhz)
                     for s in samples if s.name == c.key and s.repeat in vt]
    stats = summarize([*samples, *incl])
    peer_keys = [c.key for c in ready if c.row["impl"] in peers]
    for c in cands:
        row = c.row
        if c.fn is not None:
            st = stats[c.key]
            row.update(ms=st["ms_median"], ms_min=st["ms_min"], ms_max=st["ms_max"], ms_q1=st["ms_q1"],
                       ms_q3=st["ms_q3"], repeats=st["repeats"], tflops=fl / st["ms_median"] / 1e9,
                       sm_clock_mhz=st["clock_mhz_median"], sm_clock_min_mhz=st["clock_mhz_min"],
                       sm_clock_max_mhz=st["clock_mhz_max"])
            if f"incl|{c.key}" in stats:
                si, sv = stats[f"incl|{c.key}"], stats[f"v_transpose|{c.key}"]
                row.update(v_transpose_ms=sv["ms_median"], tflops_incl_transpose=fl / si["ms_median"] / 1e9,
                           tflops_incl_transpose_min=fl / si["ms_max"] / 1e9,
                           tflops_incl_transpose_max=fl / si["ms_min"] / 1e9)
            if c.row["impl"] not in peers:
                row["vs"] = {pk.split("|")[0]: ratio_summary(samples, c.key, pk) for pk in peer_keys}
                if f"incl|{c.key}" in stats:
                    row["vs_incl_transpose"] = {pk.split("|")[0]: ratio_summary([*samples, *incl], f"incl|{c.key}",
                                                                                  pk) for pk in peer_keys}
        rows.append(row)
        log(row)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return rows


def canonical_rows(rows):
    """Bench rows with today's peer names (older files called SDPA's backends ``sdpa-cudnn``/``sdpa-flash``)."""
    return [dict(r, impl=OLD_PEER_NAMES.get(r.get("impl"), r.get("impl"))) for r in rows]


def _num(x, fmt):
    return format(x, fmt) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else "-"


def ratio_cell(row: dict, peer: str) -> str:
    """``median [min–max]`` of the speed ratio against ``peer`` taken within each repeat (V's transpose included for
    our kernel), with the ratio at matched SM clock after it; "-" without one."""
    vs = (row.get("vs_incl_transpose") or row.get("vs") or {}).get(peer)
    if not isinstance(vs, dict) or not isinstance(vs.get("median"), (int, float)):
        return "-"
    cell = f"{vs['median']:.2f} [{_num(vs.get('min'), '.2f')}–{_num(vs.get('max'), '.2f')}]"
    if isinstance(vs.get("matched_clock_median"), (int, float)):
        cell += f" (clock-matched {vs['matched_clock_median']:.2f})"
    return cell


def plugin_lines(rows) -> list[str]:
    """'Your kernels': every user kernel (``plugin:NAME``) at each case it ran, its median TFLOP/s with the range
    over the repeats, its error (bf16 and FP8 output), and its speed ratio against each peer of the same
    interleaving (median [min–max] of the per-repeat ratios, clock-matched median)."""
    mine = [r for r in canonical_rows(rows) if str(r.get("impl", "")).startswith("plugin:")]
    if not mine:
        return []
    peers = [p for p in PEERS if any(p in (r.get("vs") or {}) for r in mine)]
    out = ["## Your kernels (same run, interleaved with the peers)", "",
           "| kernel | input | shape | s | mask | TFLOP/s | range | err | err FP8 out | "
           + " | ".join(f"× {p}" for p in peers) + " |", "|" + "---|" * (9 + len(peers))]
    for r in mine:
        shape = f"h{r['h']}/{r['h_kv']} d{r['d_qk']}/{r['d_v']}"
        mask = "causal" if r.get("causal") else "non-causal"
        if "error" in r:
            out.append(f"| {r['impl'][7:]} | {r['input']} | {shape} | {r['s']} | {mask} | failed: "
                       f"{str(r['error'])[:160]} |" + "  |" * (3 + len(peers)))
            continue
        rng = "-"
        if isinstance(r.get("ms_min"), (int, float)) and isinstance(r.get("ms_max"), (int, float)):
            rng = f"{r['tflops'] * r['ms'] / r['ms_max']:.0f}–{r['tflops'] * r['ms'] / r['ms_min']:.0f}"
        out.append(f"| {r['impl'][7:]} | {r['input']} | {shape} | {r['s']} | {mask} | {_num(r.get('tflops'), '.0f')} | "
                   f"{rng} | {_num(r.get('rel_l2_vs_sdpa_bf16'), '.4f')} | "
                   f"{_num(r.get('rel_l2_fp8_out_vs_sdpa_bf16'), '.4f')} | "
                   + " | ".join(ratio_cell(r, p) for p in peers) + " |")
    return [*out, ""]


def to_markdown(meta, rows, ours="zyfa-hopper"):
    from zyfa.markdown import md_escape

    rows = canonical_rows(rows)
    # every string of the file as inert Markdown (zyfa.markdown): names and notes add no column, row or heading
    meta = {k: md_escape(v) if isinstance(v, str) else v for k, v in meta.items()}
    rows = [{k: md_escape(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]
    ours = md_escape(ours)
    repeats = meta.get("repeats")
    method = (f"every implementation of a case timed once per repeat in rotating order, {repeats} repeats; a "
              "row's TFLOP/s is the median over the repeats with their range beside it, and a speed ratio is taken "
              "within each repeat, then summarised as median [min–max]" if repeats else
              "one timing per implementation, in a fixed order (a file from before the interleaved bench)")
    lines = [f"# Benchmark: FP8 attention on {meta['device']}", "",
             f"- command: `{meta['command']}`", f"- date: {meta['date']}", f"- git commit: {meta['git_commit']}",
             f"- versions: {md_escape(json.dumps(meta['versions']))}",
             f"- inputs: {meta['inputs_note']}",
             f"- method: {method}. Each sample is a triton.testing.do_bench median (CUDA events, L2 flushed). "
             "TFLOP/s = FLOPs / time; FLOPs = 4·b·h·s²·d (2·(d_qk+d_v) for MLA), halved for causal. Our kernel's "
             "'ms' and 'TFLOP/s' exclude V's one-off transpose (column 'V^T ms'); 'incl.' includes it, and the "
             "summary tables use 'incl.'. SM clock: NVML, read every 5 ms during each sample; the clock-matched ratio "
             "compares cycles (time × clock) and is what the ratio would be at one fixed clock if time scales with it. "
             "No power column: NVML's power reading averages over about a second, longer than a sample.",
             "- err = relative L2 of the output vs PyTorch SDPA bf16 on the same (bf16) inputs: a sanity check, not "
             "the accuracy study. cuDNN FP8 writes FP8 on Hopper, so our kernel's error is also given with its output "
             "rounded to FP8 the same way ('err FP8 out': one scale 448/amax); compare like with like.", ""]
    summary = summary_lines(rows, ours)  # ends with "", "## Every row", ""
    lines += (plugin_lines(rows) + summary[:-2] + plane_lines(rows) + plane_lines(rows, "flashinfer-fa3")
              + summary[-2:])
    hdr = ("| input | shape | s | causal | impl | recipe | TFLOP/s | range | ms | repeats | V^T ms | incl. | err | "
           "err FP8 out | SM MHz | rotation ms (FWHT / matmul) |")
    lines += [hdr, "|" + "---|" * 16]
    for r in rows:
        shape = f"h{r['h']}/{r['h_kv']} d{r['d_qk']}/{r['d_v']}"
        if "error" in r:
            lines.append(f"| {r['input']} | {shape} | {r['s']} | {r['causal']} | {r['impl']} | {r['recipe']} | "
                         f"failed: {str(r['error'])[:120]} |" + "  |" * 9)
            continue
        fl_lo, fl_hi = r.get("ms_max"), r.get("ms_min")
        rng = "-"
        if isinstance(fl_lo, (int, float)) and isinstance(fl_hi, (int, float)) and fl_lo > 0 and fl_hi > 0:
            rng = f"{r['tflops'] * r['ms'] / fl_lo:.0f}–{r['tflops'] * r['ms'] / fl_hi:.0f}"
        clk = _num(r.get("sm_clock_mhz"), ".0f")
        if isinstance(r.get("sm_clock_min_mhz"), (int, float)):
            clk += f" [{_num(r.get('sm_clock_min_mhz'), '.0f')}–{_num(r.get('sm_clock_max_mhz'), '.0f')}]"
        lines.append(
            f"| {r['input']} | {shape} | {r['s']} | {r['causal']} | {r['impl']} | {r['recipe']} | "
            f"{_num(r.get('tflops'), '.0f')} | {rng} | {_num(r.get('ms'), '.3f')} | {r.get('repeats', 1)} | "
            f"{_num(r.get('v_transpose_ms'), '.3f')} | {_num(r.get('tflops_incl_transpose'), '.0f')} | "
            f"{_num(r.get('rel_l2_vs_sdpa_bf16'), '.4f')} | {_num(r.get('rel_l2_fp8_out_vs_sdpa_bf16'), '.4f')} | "
            f"{clk} | "
            + (f"{_num(r.get('rotation_ms'), '.3f')} / {_num(r.get('rotation_matmul_ms'), '.3f')} |"
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
    rows = canonical_rows(rows)
    # cuDNN FP8 writes FP8: set against our error with the output rounded the same way, where the row has it
    err_key = "rel_l2_fp8_out_vs_sdpa_bf16" if peer == "cudnn-fp8" else "rel_l2_vs_sdpa_bf16"

    def ours_err(r):
        v = r.get(err_key)
        return v if isinstance(v, (int, float)) else r.get("rel_l2_vs_sdpa_bf16")

    out = []
    for (d_qk, d_v, causal), (s, at, _rs) in _longest_gaussian(rows).items():
        fp8 = [r for r in at if r["impl"] == peer and _plausible(r)
               and isinstance(r.get("rel_l2_vs_sdpa_bf16"), (int, float))]
        ours = [r for r in at if r["impl"] == OURS_IMPL and _plausible(r) and isinstance(ours_err(r), (int, float))]
        if not fp8 or not ours:
            continue
        ref = max(fp8, key=lambda r: r["tflops"])
        t_ref, e_ref = ref["tflops"], ref["rel_l2_vs_sdpa_bf16"]
        better = sorted((r for r in ours if ours_err(r) < e_ref), key=headline_tflops, reverse=True)
        both = [r for r in better if headline_tflops(r) > t_ref]

        def cell(r, t_ref=t_ref):
            return (f"{r['recipe']} ({headline_tflops(r):.0f}, {ours_err(r):.4f}, "
                    f"{headline_tflops(r) / t_ref:.2f}×)")

        found = "; ".join(cell(r) for r in both) if both else \
            ("none; fastest more accurate: " + cell(better[0]) if better else "none more accurate")
        shape = "MLA 192/128" if d_qk != d_v else f"hd{d_qk}"
        out.append(f"| {shape} | {s} | {'causal' if causal else 'non-causal'} | {t_ref:.0f} | {e_ref:.4f} | "
                   f"{found} |")
    if not out:
        return []
    with_fp8 = any(isinstance(r.get("rel_l2_fp8_out_vs_sdpa_bf16"), (int, float)) for r in rows)
    own = ("both with FP8 output: ours rounded to FP8 as cuDNN writes it" if peer == "cudnn-fp8" and with_fp8
           else "cuDNN FP8's includes its FP8 output, ours is bf16: not like for like" if peer == "cudnn-fp8"
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
    rows = canonical_rows(rows)
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
        peers = {"cudnn": lambda r: r["impl"] == "sdpa-bf16:cudnn", "bf16": lambda r: r["impl"].startswith("sdpa-"),
                 "fp8": lambda r: r["impl"] == "cudnn-fp8", "fa3": lambda r: r["impl"] == "flashinfer-fa3",
                 "amd": lambda r: r["impl"] == "flash-attn-triton-amd"}
        cudnn, bf16, fp8, fa3, amd = (best(peers[k]) for k in ("cudnn", "bf16", "fp8", "fa3", "amd"))
        same = [r for r in rs if r["s"] == s and r["impl"] == "triton-fp8" and r["recipe"] == ours]
        cap = [r for r in same if r["input"].startswith("captured")]
        like = [r for r in same if r["input"] == "gaussian-like-capture"]

        def t(r, peer=None, peers=peers):
            return f"{headline_tflops(r):.0f}" if r else (wrong(peers[peer]) if peer else "-")

        ratios = [(ratio_cell(mine, p["impl"]) if mine.get("vs") else f"{headline_tflops(mine) / p['tflops']:.2f}")
                  if p else "-" for p in (cudnn, bf16, fp8, fa3, amd)]
        ratios.append(f"{cap[0]['tflops'] / like[0]['tflops']:.2f}" if cap and like else "-")
        shape = "MLA 192/128" if d_qk != d_v else f"hd{d_qk}"
        out.append(f"| {shape} | {s} | {'causal' if causal else 'non-causal'} | {t(mine)} | "
                   f"{t(top)} ({top['recipe']}) | {t(cudnn, 'cudnn')} | {t(bf16, 'bf16')} "
                   f"({bf16['impl'].rpartition(':')[2] if bf16 else '-'}) | {t(fp8, 'fp8')} | {t(fa3, 'fa3')} | "
                   f"{t(amd, 'amd')} | "
                   + " | ".join(ratios) + " |")
    if not out:
        return []
    return ["## Where we land (TFLOP/s at each shape's longest Gaussian sequence, same run)", "",
            "Our kernel's numbers include V's transpose (the one copy a caller with V as stored pays; 'incl.' "
            "below); the peers read V as stored. Ratios: median [min–max] over the repeats, each taken within one "
            "repeat, with the clock-matched median after it.", "",
            f"| shape | s | mask | {ours} | fastest of our recipes | cuDNN BF16 | best BF16 SDPA | cuDNN FP8 | "
            "FA3 FP8 (FlashInfer) | AMD Triton FP8 | × cuDNN BF16 | × best BF16 | × cuDNN FP8 | × FA3 FP8 | "
            "× AMD Triton FP8 | captured / Gaussian |",
            "|" + "---|" * 16, *out, "", "## Every row", ""]


# Row fields that count something (heads, tokens, dims): positive integers; and measured numbers: finite, >= 0
# (the error against SDPA may be NaN: a NaN output).
_BENCH_COUNTS = ("b", "h", "h_kv", "s", "d_qk", "d_v")
_BENCH_NUMBERS = ("ms", "tflops", "v_transpose_ms", "tflops_incl_transpose", "rel_l2_vs_sdpa_bf16", "sm_clock_mhz",
                  "power_w", "rotation_ms", "rotation_matmul_ms", "ms_min", "ms_max", "v_transpose_ms",
                  "rel_l2_fp8_out_vs_sdpa_bf16")


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


def parse_kernel_arg(arg: str) -> tuple[str, str]:
    """``[NAME=]FILE.py:FN`` -> (name, spec), the name defaulting to the function's; checked without running the file
    (:func:`zyfa.plugins.parse_spec`). ValueError in one line for a missing file or function."""
    from zyfa.plugins import PluginError, parse_spec

    try:
        src = parse_spec(arg)
    except PluginError as e:
        raise ValueError(f"--kernel: {e}") from None
    name = src.name if not src.name.startswith("plugin:") else src.function
    return name, arg


def load_kernel(spec: str):
    """The user's kernel, imported in this process and its signature checked (zyfa.plugins)."""
    from zyfa.plugins import PluginError, check_signature, load_callable, parse_spec

    try:
        fn, _where = load_callable(parse_spec(spec))
        check_signature(spec, fn)
    except PluginError as e:
        raise ValueError(str(e)) from None
    return fn


def check_args(args) -> None:
    """The flags' checks that need no heavy import (run by the ``zyfa`` dispatch before :func:`main`, before torch
    and Triton): lengths, shapes, peers, counts, the launch config and the recipe names."""
    from zyfa.recipes import get_recipe, split_spec_list

    if args.render:
        return
    output_stem(args.out)
    for s in (t.strip() for t in args.seqlens.split(",")):
        if s and not (s.isdigit() and int(s) >= 1):
            raise ValueError(f"--seqlens takes comma-separated token counts >= 1, got {s!r}")
    unknown = [s for s in args.shapes.split(",") if s and s not in SHAPES]
    if unknown:
        raise ValueError(f"--shapes: unknown {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    peers = [] if args.peers == "none" else [OLD_PEER_NAMES.get(p, p) for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ValueError(f"--peers: unknown {', '.join(unknown)}; known: {', '.join(PEERS)}")
    for flag, value in (("--repeats", args.repeats), ("--hidden", args.hidden), ("--warmup", args.warmup),
                        ("--rep", args.rep)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.config:
        try:
            json.loads(args.config)
        except json.JSONDecodeError as e:
            raise ValueError(f"--config is not JSON: {e}") from None
    for spec in split_spec_list(args.recipes) + ([] if args.recipes_other == "same"
                                                 else split_spec_list(args.recipes_other)):
        get_recipe(spec)


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
    try:
        check_args(args)  # as the zyfa dispatch does, for a caller of main() alone
        plugins = [parse_kernel_arg(k) for k in args.kernel]
        peers = [] if args.peers == "none" else [OLD_PEER_NAMES.get(p, p) for p in args.peers.split(",") if p]
    except ValueError as err:
        print(f"zyfa bench: {err}", file=sys.stderr)
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
    shapes = [s for s in args.shapes.split(",") if s]
    seqlens = [int(s) for s in args.seqlens.split(",") if s]
    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    config = json.loads(args.config) if args.config else None
    timer = cuda_timer(args.warmup, args.rep)
    clock = NvmlClock if NvmlClock.available() else None
    rows = []
    try:
        kernels = [(name, load_kernel(spec)) for name, spec in plugins]
    except ValueError as err:
        print(f"zyfa bench: {err}", file=sys.stderr)
        return 2
    timing = dict(repeats=args.repeats, timer=timer, clock=clock, config=config)

    def log(row):
        keys = ("input", "s", "d_qk", "causal", "impl", "recipe", "tflops", "ms_min", "ms_max", "rel_l2_vs_sdpa_bf16",
                "sm_clock_mhz", "rotation_ms", "rotation_matmul_ms", "error")
        print(" ".join(f"{k}={row[k]:.4g}" if isinstance(row.get(k), float) else f"{k}={row.get(k)}"
                       for k in keys if k in row), flush=True)

    date = _dt.datetime.now(_dt.timezone.utc)
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    meta = {"command": "zyfa bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
            "date": date.isoformat(timespec="seconds"), "git_commit": git_label(), "versions": _versions(),
            "device": torch.cuda.get_device_name(), "inputs_note": "Gaussian N(0,1) bf16 q, k, v (batch 1)",
            "nvml": clock is not None, "repeats": args.repeats, "warmup_ms": args.warmup, "rep_ms": args.rep,
            "kernels": {name: spec for name, spec in plugins}}

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
                         recipes=recipes if shape == "hd128" else other, peers=peers, plugins=kernels, log=log,
                         **timing)
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
                             recipes=recs, peers=[], log=log, **timing)
                    gq, gk, gv = gaussian_qkv(*q.shape[:2], k.shape[1], s, q.shape[3], v.shape[3], seed=1)
                    run_case(rows, label="gaussian-like-capture", inputs=(gq, gk, gv), causal=causal,
                             recipes=recs, peers=[], log=log, **timing)
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
