"""One bench case: its inputs (Gaussian or a capture tiled to the length), the SDPA BF16 sanity reference, our
kernel per recipe and each peer prepared once (:func:`zyfa.peers.registry.prepare`) and checked, then all of them
timed interleaved (:func:`run_case`).

Exposed: ``SHAPES``, ``flops``, ``bench_heads``, ``gaussian_qkv``, ``captured_qkv``, ``gaussian_kernel_call``,
``sdpa_reference``, ``rotation_times``, ``fp8_output_rel_l2``, ``Candidate``, ``prepare_ours``, ``prepare_cute``,
``prepare_peer``, ``prepare_plugin``, ``run_case``.
"""

from __future__ import annotations

import math

from zyfa.bench.args import SHAPES
from zyfa.bench.table import CUTE_IMPL, OURS_IMPL, WRONG_OUTPUT_REL_L2
from zyfa.norms import rel_l2
from zyfa.peers.registry import get_peer
from zyfa.peers.registry import prepare as prepare_prepared_peer
from zyfa.timing import Sample, cuda_timer, ratio_summary, summarize, time_interleaved

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
    launch variants; :func:`run_case` also handles per-block descales and checks the output. A spec in the ``cute``
    namespace (``cute:zyfa-hopper``) runs the CuTe DSL kernel (V's transpose done once, outside fn), ``config``
    then being its form (:func:`zyfa.kernels.cute_plan.cute_config`); any other the Triton kernel, ``config`` its
    launch overrides."""
    from zyfa.kernels import attention_fp8 as A
    from zyfa.recipe_spec import get_recipe, split_spec

    d_qk, d_v = SHAPES[shape]
    h = bench_heads(shape)
    q, k, v = gaussian_qkv(1, h, h, s, d_qk, d_v, seed=seed)
    r = get_recipe(spec)
    q8, k8, v8, qd, kd, vd = A.quantize_for_kernel(q, k, v, r)
    if isinstance(spec, str) and split_spec(spec).namespace == "cute":
        from zyfa.kernels.attention_cute import prepare_cute_call

        launch, _vt, _out, _lse = prepare_cute_call(q8, k8, v8, recipe=r, causal=causal, sm_scale=1 / math.sqrt(d_qk),
                                                    q_descale=qd, k_descale=kd, v_descale=vd, config=config)
        return launch, (q, k, v)
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
    from zyfa.capture.store import read_capture

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


def _quantized(quant_cache: dict, q, k, v, recipe):
    """The kernels' FP8 inputs and descales under ``recipe``, made once per quantization
    (:func:`zyfa.emulator.quantization_key`) and shared by every recipe and kernel of the case."""
    from zyfa.emulator import quantization_key
    from zyfa.kernels.attention_fp8 import quantize_for_kernel

    key = quantization_key(recipe)
    if key not in quant_cache:
        quant_cache[key] = quantize_for_kernel(q, k, v, recipe)
    return quant_cache[key]


def prepare_ours(base, spec, q, k, v, causal, config, quant_cache, ref) -> Candidate:
    """Our Triton kernel under recipe ``spec``, with the recipe's descales (per tensor, head or block)."""
    import torch

    from zyfa.kernels.attention_fp8 import (
        k_descale_per_tile,
        kernel_plan,
        launch,
        prepare_vt,
        q_descale_per_program,
        resolve_config,
        vt_key_order_for,
    )

    d_qk, s_k = q.shape[3], k.shape[2]
    from zyfa.recipe_spec import get_recipe

    sm_scale = 1.0 / math.sqrt(d_qk)
    row = dict(base, impl=OURS_IMPL, recipe=spec)
    r = get_recipe(spec)
    plan = kernel_plan(r)
    q8, k8, v8, qd, kd, vd = _quantized(quant_cache, q, k, v, r)
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


def prepare_cute(base, spec, q, k, v, causal, quant_cache, ref) -> Candidate:
    """Our CuTe DSL kernel (:mod:`zyfa.kernels.attention_cute`) under recipe ``spec``, on the inputs quantized as for
    the Triton kernel (the same cache), compiled and launched once and checked; V's transpose timed apart."""
    import torch

    from zyfa.kernels.attention_cute import prepare_cute_call
    from zyfa.recipe_spec import get_recipe

    row = dict(base, impl=CUTE_IMPL, recipe=spec)
    r = get_recipe(spec)
    q8, k8, v8, qd, kd, vd = _quantized(quant_cache, q, k, v, r)
    launch, vt_again, _out, _lse = prepare_cute_call(q8, k8, v8, recipe=r, causal=causal,
                                                     sm_scale=1.0 / math.sqrt(q.shape[3]), q_descale=qd,
                                                     k_descale=kd, v_descale=vd)
    out, _ = launch()
    torch.cuda.synchronize()
    if not _check_output(row, out, ref):
        return Candidate(row)
    row["rel_l2_fp8_out_vs_sdpa_bf16"] = fp8_output_rel_l2(out, ref)
    return Candidate(row, launch, {"v_transpose": vt_again})


def prepare_peer(base, peer, q, k, v, causal, ref) -> Candidate:
    """A real peer kernel (:data:`zyfa.peers.registry.PEERS` name) as ``zyfa.peers`` prepares it, launched once and
    checked."""
    import torch

    row = dict(base, impl=peer, recipe=get_peer(peer).recipe)
    prepared = prepare_prepared_peer(peer, q, k, v, causal=causal, sm_scale=1.0 / math.sqrt(q.shape[3]))
    prepared.call()
    torch.cuda.synchronize()
    if not _check_output(row, prepared.output(), ref):
        return Candidate(row)
    return Candidate(row, prepared.call)


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


def run_case(rows, *, label, inputs, causal, recipes, peers, plugins=(), cute_recipes=(), repeats, timer, clock, config,
             log):
    """Every implementation of one input (q, k, v bf16) prepared and checked first, then timed interleaved
    (:func:`zyfa.timing.time_interleaved`: rotating order, ``repeats`` times); appends one row per
    implementation with its median, spread and clock, and for our kernels and the plug-ins the speed ratio against
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
    jobs += [(lambda spec=spec: prepare_cute(base, spec, q, k, v, causal, quant_cache, ref),
              dict(base, impl=CUTE_IMPL, recipe=spec)) for spec in cute_recipes]
    jobs += [(lambda p=p: prepare_peer(base, p, q, k, v, causal, ref),
              dict(base, impl=p, recipe=get_peer(p).recipe))
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
