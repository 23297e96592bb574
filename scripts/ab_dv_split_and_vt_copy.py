"""A/B on the H200 (issue 16): P·V over O's two column halves (DV_SPLIT) and the Triton copy of V's transpose.

One call, from the repository root, with the cuDNN frontend wheel installed for the cuDNN FP8 peer:

    PYTHONPATH=.:/tmp/site python3 scripts/ab_dv_split_and_vt_copy.py      (writes $OUT/ab_split.txt, or /tmp)

1. compiles every variant in parallel (256 tokens); 2. checks that DV_SPLIT 2 gives the same bits as 1 (hd128, hd256,
MLA; causal or not; zyfa-hopper and fa3; GQA, batch 2, 1000 tokens); 3. checks and times prepare_vt's Triton copy
against its torch copy at 32K; 4. times every variant at 32K (AB_SEQ) twice, interleaved, with cuDNN FP8 per shape.
docs/kernel_notes.md has the numbers of its run.
"""
import math
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.getcwd())
OUT = os.environ.get("OUT", "/tmp")
SEQ = int(os.environ.get("AB_SEQ", "32768"))
HEADS = {"hd128": 16, "hd256": 8, "mla": 16, "hd64": 32}
SH = {"hd128": (128, 128), "hd256": (256, 256), "mla": (192, 128), "hd64": (64, 64)}

V = []  # (name, shape, causal, recipe, config); "base" = the default config, but one P·V dot (DV_SPLIT 1)


def add(name, shape, causal, recipe, cfg):
    V.append((name, shape, causal, recipe, cfg))


for c in (False, True):
    add("base", "hd128", c, "zyfa-hopper", None)
    add("split2", "hd128", c, "zyfa-hopper", {"DV_SPLIT": 2})
    add("split2+168", "hd128", c, "zyfa-hopper", {"DV_SPLIT": 2, "maxnreg": 168})
    add("fa3f1", "hd128", c, "fa3:accum_flush_tiles=1", None)
    add("fa3f1 split2+168", "hd128", c, "fa3:accum_flush_tiles=1", {"DV_SPLIT": 2, "maxnreg": 168})
    add("fa3", "hd128", c, "fa3", None)
    add("base", "hd256", c, "zyfa-hopper", {"DV_SPLIT": 1})
    add("pv2 split2", "hd256", c, "zyfa-hopper", {"DV_SPLIT": 2})
    add("pv4 split2", "hd256", c, "zyfa-hopper", {"DV_SPLIT": 2, "PV_MODE": 4})
    add("fa3", "hd256", c, "fa3", {"DV_SPLIT": 1})
    add("fa3 split2", "hd256", c, "fa3", {"DV_SPLIT": 2})
    add("fa3f1 split2", "hd256", c, "fa3:accum_flush_tiles=1", {"DV_SPLIT": 2})
    add("base", "mla", c, "zyfa-hopper", None)
    add("split2", "mla", c, "zyfa-hopper", {"DV_SPLIT": 2})
    add("split2+168", "mla", c, "zyfa-hopper", {"DV_SPLIT": 2, "maxnreg": 168})
    add("base", "hd64", c, "zyfa-hopper", None)
    add("fa3f1", "hd64", c, "fa3:accum_flush_tiles=1", None)


def _prep(shape, causal, recipe, cfg, s, seed=0):
    from zyfa.bench import gaussian_qkv
    from zyfa.kernels import attention_fp8 as A
    d_qk, d_v = SH[shape]
    h = HEADS[shape]
    q, k, v = gaussian_qkv(1, h, h, s, d_qk, d_v, seed=seed)
    r = A.recipe_from_spec(recipe)
    q8, k8, v8, qd, kd, vd = A.quantize_for_kernel(q, k, v, r)
    vt = A.prepare_vt(v8, permute_k32=A.vt_key_order_for(cfg))
    plan = A.kernel_plan(r)

    def fn():
        return A.launch(q8, k8, vt, qd, kd, vd, plan=plan, seq_k=s, causal=causal, sm_scale=1 / math.sqrt(d_qk),
                        window=None, config=cfg)

    return fn, (q, k, v, q8, k8, v8, qd, kd, vd)


def _warm(task):
    name, shape, causal, recipe, cfg = task
    t0 = time.time()
    try:
        import torch
        fn, _ = _prep(shape, causal, recipe, cfg, 256)
        fn()
        torch.cuda.synchronize()
        return f"ok {time.time()-t0:.0f}s {shape} {causal} {name}"
    except Exception as e:
        return f"FAIL {shape} {causal} {name}: {type(e).__name__}: {str(e)[:300]}"


def main():
    import torch
    import triton
    log = open(os.path.join(OUT, "ab_split.txt"), "w")  # noqa: SIM115 - open for the whole run, line-buffered by hand
    def p(*a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()
    p("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(), "commit",
      os.environ.get("ZYFA_GIT_COMMIT"))
    t0 = time.time()
    with mp.get_context("spawn").Pool(14) as pool:
        for line in pool.imap_unordered(_warm, V):
            p(line)
    p(f"warm {time.time()-t0:.0f}s")
    from zyfa.kernels import attention_fp8 as A
    # ---- bit-identity of DV_SPLIT 2 against 1, 1000/1024 tokens, GQA
    for shape in ("hd128", "hd256", "mla"):
        for causal in (False, True):
            for recipe in ("zyfa-hopper", "fa3"):
                d_qk, d_v = SH[shape]
                g = torch.Generator(device="cuda").manual_seed(1)
                q = torch.randn(2, 4, 1000, d_qk, device="cuda", generator=g).to(torch.float8_e4m3fn)
                k = torch.randn(2, 2, 1000, d_qk, device="cuda", generator=g).to(torch.float8_e4m3fn)
                v = torch.randn(2, 2, 1000, d_v, device="cuda", generator=g).to(torch.float8_e4m3fn)
                o1, l1 = A.attention_fp8(q, k, v, recipe=recipe, causal=causal)
                o2, l2 = A.attention_fp8(q, k, v, recipe=recipe, causal=causal, config={"DV_SPLIT": 2})
                p("identity", shape, causal, recipe, torch.equal(o1, o2), torch.equal(l1, l2))
    # ---- V transpose: bytes and time
    from zyfa.bench import ClockSampler, flops, make_cudnn_fp8, timed
    sampler = ClockSampler()
    for shape in ("hd128", "hd256", "hd64"):
        d_qk, d_v = SH[shape]
        h = HEADS[shape]
        v8 = torch.randn(1, h, SEQ, d_v, device="cuda").to(torch.float8_e4m3fn)
        for perm in (True, False):
            a = A.prepare_vt(v8, permute_k32=perm, copy="torch")
            b = A.prepare_vt(v8, permute_k32=perm, copy="triton")
            same = torch.equal(a.view(torch.uint8), b.view(torch.uint8))
            tt, _ = timed(lambda v8=v8, perm=perm: A.prepare_vt(v8, permute_k32=perm, copy="torch"), 5, 20, sampler)
            tr, _ = timed(lambda v8=v8, perm=perm: A.prepare_vt(v8, permute_k32=perm, copy="triton"), 5, 20, sampler)
            gbs = 2 * v8.numel() / tr / 1e6
            p(f"vt {shape} perm={perm} same={same} torch {tt:.4f} ms triton {tr:.4f} ms ({gbs:.0f} GB/s)")
    odd = torch.randn(2, 3, 1001, 128, device="cuda").to(torch.float8_e4m3fn)
    p("vt odd same", torch.equal(A.prepare_vt(odd, copy="torch").view(torch.uint8),
                                 A.prepare_vt(odd, copy="triton").view(torch.uint8)))
    # ---- timings at SEQ, interleaved twice
    res = {}
    peers = {}
    for rnd in range(2):
        for (name, shape, causal, recipe, cfg) in V:
            d_qk, d_v = SH[shape]
            try:
                fn, (q, k, v, *_r) = _prep(shape, causal, recipe, cfg, SEQ)
                ms, clk = timed(fn, 10, 60, sampler)
                fl = flops(1, HEADS[shape], SEQ, SEQ, d_qk, d_v, causal)
                res.setdefault((name, shape, causal, recipe), []).append(fl / ms / 1e9)
            except Exception as e:
                p("FAIL", name, shape, causal, type(e).__name__, str(e)[:200])
            if (shape, causal) not in peers or rnd == 1 and name == "base":
                try:
                    q8, k8, v8, qd, kd, vd = A.quantize_for_kernel(q, k, v, "ck")
                    f2, _ = make_cudnn_fp8(q8, k8, v8, qd[0, 0], kd[0, 0], vd[0, 0], causal, 1 / math.sqrt(d_qk))
                    ms, _ = timed(f2, 10, 60, sampler)
                    fl = flops(1, HEADS[shape], SEQ, SEQ, d_qk, d_v, causal)
                    peers.setdefault((shape, causal), []).append(fl / ms / 1e9)
                except Exception as e:
                    peers[(shape, causal)] = [float("nan")]
                    p("cudnn FAIL", shape, causal, str(e)[:200])
            del q, k, v
            torch.cuda.empty_cache()
    p("\n| shape | causal | variant | recipe | TFLOP/s (2 rounds) | x cuDNN FP8 |")
    for (name, shape, causal, recipe), ts in res.items():
        pf = peers.get((shape, causal), [float('nan')])
        pm = sum(pf) / len(pf)
        p(f"| {shape} | {causal} | {name} | {recipe} | {' / '.join(f'{t:.0f}' for t in ts)} | {max(ts)/pm:.3f} |")
    for (shape, causal), pf in peers.items():
        p(f"| {shape} | {causal} | cudnn-fp8 | - | {' / '.join(f'{t:.0f}' for t in pf)} | 1 |")


if __name__ == "__main__":
    main()
