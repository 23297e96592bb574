"""A/B timings of kernel variants on the H200, against cuDNN FP8 in the same run, with bit-identity checks first.

One call, from the repository root, with the cuDNN frontend wheel installed into /tmp/site:

    PYTHONPATH=.:/tmp/site python3 scripts/ab_kernel_variants.py [--set NAME] [--out DIR] [--seq N]

1. compiles every variant in parallel (256 tokens); 2. checks that each variant marked ``same_bits`` gives the
default's output and LSE bit for bit (GQA, batch 2, 1000 tokens, causal or not, and inputs with huge logits);
3. times every variant at --seq tokens, --rounds times interleaved, with cuDNN FP8 per shape. Writes
DIR/ab_kernel_variants.txt (DIR = $OUT or /tmp). docs/KERNEL.md has the numbers of its runs that set a default; the
scripts of earlier A/B runs are in git history (reports/history.md, "Documents and scripts").

The variant sets (--set; each variant is name, shape, causal, recipe, config, same_bits): ``mad-guard``, the MAD
clamp at code 126 of the fused MAD kept (MAD_CVT 3, the default before the per-program guard), left out where the
program's bound allows (6, the default) or packed (5), and the register cap of 168 (three programs per SM) where it
is not the default; ``stages``, the depth of the TMA pipeline of K and V (num_stages); ``tiles``, 128-row programs
of two warpgroups against the default 64-row ones; ``loads``, K and V by pointer loads instead of TMA;
``hd64-occupancy``, four programs per SM at hd64 (a cap of 128 registers); ``block-n``, 64-key KV tiles (recipes
with ``block_n=64``: their own numerics, so each row also reports its error) with the launch shapes they allow (four
programs per SM at hd128, two of one warpgroup each at hd256); ``vt-early``, Vᵀ's tile loaded at the top of the
iteration beside K's (VT_EARLY 1: one mbarrier per stage for both) instead of after the softmax;
``vt-early-next``, with V beside K: two stages and one P·V dot at hd256, 128-row programs and three
stages at hd128 and MLA; ``hd256-unserialized``, the per-tile flush at hd256 as an explicit fresh product and add
(PV_MODE 4), which ptxas compiles without serializing the wgmma, against PV_MODE 2, which it serializes;
``mla-occupancy``, three programs per SM at MLA through 64-key tiles (their own numerics); ``cute-forms``, the
CuTe DSL kernel's forms (recipe ``cute:zyfa-hopper``, config its form: :func:`zyfa.kernels.cute_plan.cute_config`):
the default against the form that first ran (``CUTE_FIRST_FORM``) and each switch alone, beside the Triton kernel
(the CuTe DSL installed with ``--target /tmp/site`` as scripts/stage_cute_wheels.py says, and
``/tmp/site/nvidia_cutlass_dsl/dsl_packages`` on PYTHONPATH too); ``cute-rowsum``, the CuTe kernel with technique 3's
row sum on the tensor core (``rowsum=rounded_mma``) against its default, alone and with ``PV_OVERLAP`` switched from
its default (to 1 non-causal, to 0 causal). The rule that made ``PV_OVERLAP`` 1 the causal default was written on 7
December before its rerun: with ``--rounds 10``, its 'x base per round' against the row sum alone must have a median
>= 1.02 and a minimum >= 1.00 at hd128 causal and medians >= 0.98 at hd64 and MLA causal; non-causal only if the same
holds there. 6fe4706's run passed it causal (1.07 [1.05-1.11], hd64 1.00, MLA 1.06) and not non-causal (hd128 1.02
[0.96-1.07]), reports/bench/cute_rowsum_ab.txt;
``cute-hd256``, the CuTe kernel at d 256 with P·V in blocks of 64 columns through one accumulator (the default)
against blocks of 32 through two (``PV_BLOCK`` 32, the same bits), both row sums, beside the Triton kernel;
``cute-persistent``, the CuTe kernel with one CTA per SM taking work items pass by pass (``PERSISTENT`` 1, the same
bits) against one CTA per item, at every head dim and both row sums; ``cute-masked-overlap``, causal, the CuTe kernel
with ``PV_OVERLAP`` 2 (the masked KV loop without the overlap) against its default 1, both row sums, hd128, hd64, MLA.
Rule for ``PV_OVERLAP`` 2 as the causal default, written on 7 December before any timing of it: with ``--rounds 10``,
its 'x base per round' median at ``--seq 4096`` is >= 1.01 at hd128 with ``rowsum=rounded_mma`` and >= 1.00 in the
other five rows, and at ``--seq 32768`` >= 0.99 in all six (there only the few masked tiles differ).

Each row carries the variant's rel-L2 against PyTorch SDPA BF16 on the same Gaussian inputs (the bench's sanity
error), and cuDNN FP8's, so a variant that changes numerics can be read on the speed-accuracy plane.
"""
import argparse
import math
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.getcwd())

from zyfa.kernels.cute_plan import CUTE_FIRST_FORM  # noqa: E402  (torch-free; after the path insert)
from zyfa.recipe_spec import split_spec  # noqa: E402
from zyfa.timing import Sample, cuda_timer, ratio_summary, rotating_orders  # noqa: E402  (torch-free at import)

SETS = ("mad-guard", "stages", "tiles", "loads", "hd64-occupancy", "block-n", "vt-early", "vt-early-next",
        "hd256-unserialized", "mla-occupancy", "cute-forms", "cute-rowsum", "cute-hd256", "cute-persistent",
        "cute-masked-overlap")
CUTE = "cute:zyfa-hopper"  # the CuTe DSL kernel (zyfa.bench.cases.gaussian_kernel_call runs the cute namespace)

V = []


def add(name, shape, causal, recipe, cfg, same_bits=False):
    V.append((name, shape, causal, recipe, cfg, same_bits))


def add_other_overlap(shape, causal, recipe, prefix="", same_bits=False):
    """The CuTe kernel with PV_OVERLAP switched from its default at d_v <= 128 (1 causal, 0 not)."""
    value = 0 if causal else 1
    where = "after" if value == 0 else "beside"
    add(f"{prefix}softmax {where} the previous P·V (PV_OVERLAP {value})", shape, causal, recipe, {"PV_OVERLAP": value},
        same_bits=same_bits)


def variant_set(name):
    """The variants of one A/B run (``--set``)."""
    V.clear()
    if name == "mad-guard":
        for c in (False, True):
            for shape in ("hd128", "hd256", "mla", "hd64"):
                add("clamp (MAD_CVT 3)", shape, c, "zyfa-hopper", {"MAD_CVT": 3}, same_bits=True)
                add("guarded (default, 6)", shape, c, "zyfa-hopper", None)
            add("fa3 flushed per tile", "hd128", c, "fa3:accum_flush_tiles=1", None)
            add("fa3 flushed per tile, maxnreg 168", "hd128", c, "fa3:accum_flush_tiles=1", {"maxnreg": 168})
            add("guarded, maxnreg 168", "mla", c, "zyfa-hopper", {"maxnreg": 168}, same_bits=True)
        add("guarded, maxnreg 168", "hd128", False, "zyfa-hopper", {"maxnreg": 168}, same_bits=True)
        add("clamp (MAD_CVT 3), maxnreg 168", "hd128", False, "zyfa-hopper", {"MAD_CVT": 3, "maxnreg": 168})
        add("guarded, no maxnreg", "hd128", True, "zyfa-hopper", {"maxnreg": 0})
    elif name == "stages":
        for c in (False, True):
            add("default", "hd128", c, "zyfa-hopper", None)
            add("3 stages", "hd128", c, "zyfa-hopper", {"num_stages": 3}, same_bits=True)
            add("3 stages, no maxnreg", "hd128", c, "zyfa-hopper", {"num_stages": 3, "maxnreg": 0})
            add("default", "hd64", c, "zyfa-hopper", None)
            add("3 stages", "hd64", c, "zyfa-hopper", {"num_stages": 3}, same_bits=True)
            add("4 stages", "hd64", c, "zyfa-hopper", {"num_stages": 4})
            add("default", "mla", c, "zyfa-hopper", None)
            add("3 stages", "mla", c, "zyfa-hopper", {"num_stages": 3})
            add("default", "hd256", c, "zyfa-hopper", None)
            add("2 stages", "hd256", c, "zyfa-hopper", {"num_stages": 2})
            add("fa3 flushed per tile", "hd128", c, "fa3:accum_flush_tiles=1", None)
            add("fa3 flushed per tile, 3 stages", "hd128", c, "fa3:accum_flush_tiles=1", {"num_stages": 3})
    elif name == "tiles":
        bm128 = {"BLOCK_M": 128, "num_warps": 8}
        for c in (False, True):
            add("default", "hd128", c, "zyfa-hopper", None)
            add("128 rows, 8 warps", "hd128", c, "zyfa-hopper", {**bm128, "maxnreg": 0}, same_bits=True)
            add("128 rows, 8 warps, 3 stages", "hd128", c, "zyfa-hopper", {**bm128, "num_stages": 3, "maxnreg": 0})
            add("default", "mla", c, "zyfa-hopper", None)
            add("128 rows, 8 warps", "mla", c, "zyfa-hopper", bm128, same_bits=True)
            add("default", "hd64", c, "zyfa-hopper", None)
            add("128 rows, 8 warps, 3 stages", "hd64", c, "zyfa-hopper", {**bm128, "maxnreg": 0}, same_bits=True)
    elif name == "loads":
        for c in (False, True):
            for shape in ("hd128", "mla", "hd64"):
                add("default (TMA)", shape, c, "zyfa-hopper", None)
                add("pointer loads", shape, c, "zyfa-hopper", {"TMA": False}, same_bits=True)
            add("pointer loads, 3 stages", "hd128", c, "zyfa-hopper", {"TMA": False, "num_stages": 3})
    elif name == "hd64-occupancy":
        four = {"BLOCK_M": 64, "num_warps": 4, "num_stages": 3, "maxnreg": 128}  # 128 registers: four programs
        for c in (False, True):
            add("default", "hd64", c, "zyfa-hopper", None)
            add("64 rows, maxnreg 128 (four programs per SM)", "hd64", c, "zyfa-hopper", four, same_bits=True)
            add("64 rows, maxnreg 128, 4 stages", "hd64", c, "zyfa-hopper", {**four, "num_stages": 4})
            add("fa3 flushed per tile", "hd64", c, "fa3:accum_flush_tiles=1", None)
            add("fa3 flushed per tile, maxnreg 128, 3 stages", "hd64", c, "fa3:accum_flush_tiles=1", four)
    elif name == "block-n":
        one_wg = {"BLOCK_M": 64, "num_warps": 4}
        four = {"maxnreg": 128, "num_stages": 2}  # hd128, 64-key tiles: four programs per SM (41 KB, <= 128 regs)
        never = "aiter:accumulator=matrix_unit,accum_flush_tiles=0"
        flushed = "aiter:accumulator=matrix_unit,accum_flush_tiles=1"

        def bn64(r):
            return r + (",block_n=64" if ":" in r else ":block_n=64")
        for c in (False, True):
            for r in ("fa3", "zyfa-hopper", never):  # hd256: two one-warpgroup programs per SM (83 / 116 KB)
                add("default", "hd256", c, r, None)
                add("64-key tiles, 64 rows, 2 stages", "hd256", c, bn64(r), {**one_wg, "num_stages": 2})
                add("64-key tiles, 64 rows, 3 stages", "hd256", c, bn64(r), {**one_wg, "num_stages": 3})
            add("64-key tiles, 128 rows, 3 stages", "hd256", c, "fa3:block_n=64", {"num_stages": 3})
            add("64-key tiles, 128 rows, 4 stages", "hd256", c, "fa3:block_n=64", {"num_stages": 4})
            for r in ("zyfa-hopper", "fa3", "fa3:accum_flush_tiles=1", flushed, never):
                add("default", "hd128", c, r, None)
                add("64-key tiles, maxnreg 128, 2 stages (four programs)", "hd128", c, bn64(r), four)
                if r in ("zyfa-hopper", "fa3"):
                    add("64-key tiles, 3 stages, no cap", "hd128", c, bn64(r), {"num_stages": 3, "maxnreg": 0})
                if r == "zyfa-hopper":
                    add("64-key tiles, 2 stages, no cap", "hd128", c, bn64(r), {"num_stages": 2, "maxnreg": 0})
    elif name == "vt-early":
        for c in (False, True):
            for shape in ("hd128", "hd256", "mla", "hd64"):
                add("default", shape, c, "zyfa-hopper", None)
                add("V loaded beside K (one mbarrier)", shape, c, "zyfa-hopper", {"VT_EARLY": 1}, same_bits=True)
            add("default", "hd128", c, "fa3:accum_flush_tiles=1", None)
            add("V loaded beside K (one mbarrier)", "hd128", c, "fa3:accum_flush_tiles=1", {"VT_EARLY": 1})
            add("default", "hd256", c, "fa3", None)
            add("V loaded beside K (one mbarrier)", "hd256", c, "fa3", {"VT_EARLY": 1})
    elif name == "vt-early-next":  # launch shapes again, now that V can come beside K (all lost at fb79c9b)
        never = "aiter:accumulator=matrix_unit,accum_flush_tiles=0"
        for c in (False, True):
            for shape in ("hd128", "mla"):  # two warpgroups per program: what the barrier inside the softmax held back
                add("default", shape, c, "zyfa-hopper", None)
                add("128 rows, 8 warps, V beside K", shape, c, "zyfa-hopper",
                    {"BLOCK_M": 128, "num_warps": 8, "maxnreg": 0, "VT_EARLY": 1}, same_bits=True)
                add("V beside K, 3 stages", shape, c, "zyfa-hopper", {"VT_EARLY": 1, "num_stages": 3}, same_bits=True)
            for r in ("zyfa-hopper", "fa3", never):
                add("default (V beside K)", "hd256", c, r, None)
                add("V beside K, 2 stages", "hd256", c, r, {"num_stages": 2}, same_bits=True)
                if r != "zyfa-hopper":  # never flushed: one dot over all of O's columns needs no second register set
                    add("V beside K, one P·V dot (DV_SPLIT 1)", "hd256", c, r, {"DV_SPLIT": 1}, same_bits=True)
    elif name == "hd256-unserialized":
        # PV_MODE 2 (the per-tile flush through Triton's partial accumulator) makes ptxas serialize every wgmma of the
        # kernel at hd256 (advisory C7514: each QGMMA waited before the next); the explicit fresh product and add
        # (PV_MODE 4) with O's column halves and V beside K compiles without it
        flushed = "aiter:accumulator=matrix_unit,accum_flush_tiles=1"
        for c in (False, True):
            add("default (PV_MODE 2)", "hd256", c, "zyfa-hopper", None)
            add("PV_MODE 4 (fresh product added: no serialized wgmma)", "hd256", c, "zyfa-hopper", {"PV_MODE": 4},
                same_bits=True)
            add("PV_MODE 4, 2 stages", "hd256", c, "zyfa-hopper", {"PV_MODE": 4, "num_stages": 2}, same_bits=True)
            for r in ("fa3:accum_flush_tiles=1", flushed):
                add("default (PV_MODE 2)", "hd256", c, r, None)
                add("PV_MODE 4 (no serialized wgmma, 972 B of spills)", "hd256", c, r, {"PV_MODE": 4}, same_bits=True)
            add("default (never flushed)", "hd256", c, "fa3", None)
    elif name == "mla-occupancy":
        # MLA's 128-key tiles need 95 KB of shared memory: two programs per SM. 64-key tiles (their own numerics:
        # each row carries its error) need 54 KB (two stages) or 75 KB (three) at 158 registers: three programs
        for c in (False, True):
            add("default (128-key tiles, two programs per SM)", "mla", c, "zyfa-hopper", None)
            add("64-key tiles, 2 stages (three programs)", "mla", c, "zyfa-hopper:block_n=64", None)
            add("64-key tiles, 3 stages (three programs)", "mla", c, "zyfa-hopper:block_n=64", {"num_stages": 3})
            add("rounded sum on the tensor core", "mla", c, "zyfa-hopper:rowsum=rounded_mma", None)
            add("default", "mla", c, "fa3", None)
            add("64-key tiles, 2 stages", "mla", c, "fa3:block_n=64", None)
    elif name == "cute-forms":
        # every form gives the same bits (identity checked first, at unit scale, where the CTA's guard holds, and
        # at scale 300, where it fails and the clamped loop runs)
        for c in (False, True):
            add("default", "hd128", c, CUTE, None)
            add("first form (cc8e3cc)", "hd128", c, CUTE, CUTE_FIRST_FORM, same_bits=True)
            add("clamp on every code (MAD_CVT 3)", "hd128", c, CUTE, {"MAD_CVT": 3}, same_bits=True)
            add("mask tested on every tile (MASK_SPLIT 0)", "hd128", c, CUTE, {"MASK_SPLIT": 0}, same_bits=True)
            add("signed stage index, sum from 0 (BOOKKEEPING 0)", "hd128", c, CUTE, {"BOOKKEEPING": 0},
                same_bits=True)
            add_other_overlap("hd128", c, CUTE, same_bits=True)
            add("div.rn per element, bf16 stores (EPILOGUE 0)", "hd128", c, CUTE, {"EPILOGUE": 0}, same_bits=True)
            add("triton default", "hd128", c, "zyfa-hopper", None)
            for shape in ("hd64", "mla"):
                add("default", shape, c, CUTE, None)
                add("first form (cc8e3cc)", shape, c, CUTE, CUTE_FIRST_FORM, same_bits=True)
                add_other_overlap(shape, c, CUTE, same_bits=True)
    elif name == "cute-rowsum":
        # technique 3's rounded row sum on the tensor core (P8·ones, m64n8, in P·V's wgmma group) instead of decoded
        # from the codes (a shift and an add per score): other numerics (the sum goes through the unit's truncating
        # accumulator), so no identity check; each row's rel-L2 shows the error beside the speed
        for c in (False, True):
            for shape in ("hd128", "hd64", "mla"):
                add("default", shape, c, CUTE, None)
                add("row sum on the tensor core", shape, c, CUTE + ":rowsum=rounded_mma", None)
                add_other_overlap(shape, c, CUTE + ":rowsum=rounded_mma", "row sum on the tensor core, ")
                add("row sum on the tensor core, EPILOGUE 0", shape, c, CUTE + ":rowsum=rounded_mma",
                    {"EPILOGUE": 0}, same_bits=True)
            add("triton default", "hd128", c, "zyfa-hopper", None)
    elif name == "cute-hd256":
        for c in (False, True):
            add("default (P·V in blocks of 64, one accumulator)", "hd256", c, CUTE, None)
            add("P·V in blocks of 32, two accumulators (PV_BLOCK 32)", "hd256", c, CUTE, {"PV_BLOCK": 32},
                same_bits=True)
            add("row sum on the tensor core", "hd256", c, CUTE + ":rowsum=rounded_mma", None)
            add("row sum on the tensor core, PV_BLOCK 32", "hd256", c, CUTE + ":rowsum=rounded_mma",
                {"PV_BLOCK": 32}, same_bits=True)
            add("triton default", "hd256", c, "zyfa-hopper", None)
    elif name == "cute-masked-overlap":
        # causal: PV_OVERLAP 2 (the masked loop without the overlap, where with the row sum on the tensor core ptxas
        # packs the mask's predicates into registers inside the turn) against the default, 1; the same bits
        for shape in ("hd128", "hd64", "mla"):
            for recipe, label in ((CUTE + ":rowsum=rounded_mma", "row sum on the tensor core"), (CUTE, "default")):
                add(label, shape, True, recipe, None)
                add(label + ", masked loop without the overlap (PV_OVERLAP 2)", shape, True, recipe,
                    {"PV_OVERLAP": 2}, same_bits=True)
    elif name == "cute-persistent":
        for c in (False, True):
            for shape in ("hd128", "hd64", "mla", "hd256"):
                for recipe in (CUTE, CUTE + ":rowsum=rounded_mma"):
                    add("default" if recipe == CUTE else "row sum on the tensor core", shape, c, recipe, None)
                    add("persistent (PERSISTENT 1)" + ("" if recipe == CUTE else ", row sum on the tensor core"),
                        shape, c, recipe, {"PERSISTENT": 1}, same_bits=True)
    else:
        raise SystemExit(f"ab_kernel_variants: unknown --set {name!r} ({', '.join(SETS)})")


def _warm(task):
    name, shape, causal, recipe, cfg, _same = task
    t0 = time.time()
    try:
        import torch

        from zyfa.bench.cases import gaussian_kernel_call
        fn, _ = gaussian_kernel_call(shape, 256, causal, recipe, cfg)
        fn()
        torch.cuda.synchronize()
        return f"ok {time.time()-t0:.0f}s {shape} {causal} {name}"
    except Exception as e:  # noqa: BLE001 - reported, the run goes on
        return f"FAIL {shape} {causal} {name}: {type(e).__name__}: {str(e)[:300]}"


def _identity(p):
    """Each same_bits variant against the default, on GQA inputs at unit scale and with huge logits."""
    import torch

    from zyfa.bench.cases import SHAPES
    from zyfa.kernels import attention_fp8 as A
    for (name, shape, causal, recipe, cfg, same) in V:
        if not same:
            continue
        d_qk, d_v = SHAPES[shape]
        for scale in (1.0, 300.0):
            g = torch.Generator(device="cuda").manual_seed(1)
            q = torch.randn(2, 4, 1000, d_qk, device="cuda", generator=g).to(torch.float8_e4m3fn)
            k = torch.randn(2, 2, 1000, d_qk, device="cuda", generator=g).to(torch.float8_e4m3fn)
            v = torch.randn(2, 2, 1000, d_v, device="cuda", generator=g).to(torch.float8_e4m3fn)
            # scale 300: logits up to ~1e4, so DQK·448²·c passes mad_m_safe and the guard keeps the clamp
            kw = {"q_descale": scale, "k_descale": scale}
            run = A.attention_fp8
            if split_spec(recipe).namespace == "cute":
                from zyfa.kernels.attention_cute import attention_cute as run
            o1, l1 = run(q, k, v, recipe=recipe, causal=causal, **kw)
            o2, l2 = run(q, k, v, recipe=recipe, causal=causal, config=cfg, **kw)
            finite = bool(torch.isfinite(o1.float()).all() and torch.isfinite(l1).all())
            p(f"identity {shape} causal={causal} {name} scale={scale:g}: out {torch.equal(o1, o2)} "
              f"lse {torch.equal(l1, l2)} finite {finite}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--set", default="mad-guard", choices=SETS, help="the variant set (module docstring)")
    a = ap.parse_args()
    variant_set(a.set)
    import torch
    import triton
    os.makedirs(a.out, exist_ok=True)  # a folder not made yet (its first run failed on that)
    log = open(os.path.join(a.out, "ab_kernel_variants.txt"), "w")  # noqa: SIM115 - open for the whole run

    def p(*args):
        s = " ".join(str(x) for x in args)
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()
    p("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(), "commit",
      os.environ.get("ZYFA_GIT_COMMIT"))
    t0 = time.time()
    with mp.get_context("spawn").Pool(14, initializer=variant_set, initargs=(a.set,)) as pool:
        for line in pool.imap_unordered(_warm, V):
            p(line)
    p(f"warm {time.time()-t0:.0f}s")
    _identity(p)
    from zyfa.bench.cases import SHAPES, bench_heads, flops, gaussian_kernel_call
    from zyfa.norms import rel_l2
    from zyfa.peers.registry import prepare as prepare_peer
    timer = cuda_timer(10, 60)
    res, peers, errs, refs = {}, {}, {}, {}
    samples = []  # every timing as a zyfa.timing.Sample, so that ratios are taken within a round (ratio_summary)
    # each round starts one variant further on (zyfa.timing.rotating_orders), so that no variant, and no shape's
    # cuDNN FP8 (timed where its first variant comes in the round), always runs in the same place
    for rnd, order in enumerate(rotating_orders(list(range(len(V))), a.rounds)):
        for (name, shape, causal, recipe, cfg, _same) in (V[i] for i in order):
            d_qk, d_v = SHAPES[shape]
            fl = flops(1, bench_heads(shape), a.seq, a.seq, d_qk, d_v, causal)
            try:
                fn, (q, k, v) = gaussian_kernel_call(shape, a.seq, causal, recipe, cfg)
                if (shape, causal) not in refs:  # SDPA BF16 on the same inputs: the bench's sanity reference
                    refs[(shape, causal)] = torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=causal)
                if rnd == 0:
                    errs[(name, shape, causal, recipe)] = rel_l2(fn()[0], refs[(shape, causal)])
                ms = timer(fn)
                res.setdefault((name, shape, causal, recipe), []).append(fl / ms / 1e9)
                samples.append(Sample(_sample_name(name, shape, causal, recipe), rnd, 0, ms, None))
            except Exception as e:  # noqa: BLE001
                p("FAIL", name, shape, causal, type(e).__name__, str(e)[:200])
                continue
            if len(peers.get((shape, causal), [])) <= rnd:
                try:
                    cudnn = prepare_peer("cudnn-fp8", q, k, v, causal=causal, sm_scale=1 / math.sqrt(d_qk))
                    f2, deq = cudnn.call, cudnn.output
                    if rnd == 0:
                        errs[("cuDNN FP8", shape, causal, "-")] = rel_l2(deq(), refs[(shape, causal)])
                    ms = timer(f2)
                    peers.setdefault((shape, causal), []).append(fl / ms / 1e9)
                    samples.append(Sample(_sample_name("cuDNN FP8", shape, causal, "-"), rnd, 0, ms, None))
                except Exception as e:  # noqa: BLE001
                    peers.setdefault((shape, causal), []).append(float("nan"))
                    p("cudnn FAIL", shape, causal, str(e)[:200])
            del q, k, v
            torch.cuda.empty_cache()
    p(f"\n{a.seq} tokens, batch 1, Gaussian inputs, TFLOP/s of the kernel alone ({a.rounds} rounds, interleaved in "
      "rotating order)")
    p("(x per round: the ratio within each round, then its median [min-max]; the base: the same recipe's row with "
      "no form override)")
    p("| shape | causal | variant | recipe | TFLOP/s | x cuDNN FP8 (best of each) | x cuDNN FP8 per round "
      "| x base per round | rel-L2 vs SDPA BF16 |")
    p("|---|---|---|---|---|---|---|---|---|")
    nan = float("nan")
    base = {}  # (shape, causal, recipe) -> the first variant without a form override
    for (name, shape, causal, recipe, cfg, _same) in V:
        if cfg is None:
            base.setdefault((shape, causal, recipe), name)
    for key, ts in res.items():
        name, shape, causal, recipe = key
        pf = peers.get((shape, causal), [nan])
        me = _sample_name(*key)
        b = base.get((shape, causal, recipe))
        vs_base = (_per_round(samples, me, _sample_name(b, shape, causal, recipe)) if b not in (None, name)
                   else "-")
        p(f"| {shape} | {causal} | {name} | {recipe} | {' / '.join(f'{t:.0f}' for t in ts)} | {max(ts)/max(pf):.3f} "
          f"| {_per_round(samples, me, _sample_name('cuDNN FP8', shape, causal, '-'))} | {vs_base} "
          f"| {errs.get(key, nan):.4f} |")
    for (shape, causal), pf in peers.items():
        err = errs.get(("cuDNN FP8", shape, causal, "-"), nan)
        p(f"| {shape} | {causal} | cuDNN FP8 | - | {' / '.join(f'{t:.0f}' for t in pf)} | 1 | 1 | - | {err:.4f} |")


def _sample_name(name, shape, causal, recipe) -> str:
    return f"{name} | {shape} | {causal} | {recipe}"


def _per_round(samples, a: str, b: str) -> str:
    """How many times faster ``a`` ran than ``b`` within each round, as median [min-max] (zyfa.timing's
    ratio_summary; '-' where no round has both)."""
    r = ratio_summary(samples, a, b)
    return "-" if r is None else f"{r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}]"


if __name__ == "__main__":
    main()
