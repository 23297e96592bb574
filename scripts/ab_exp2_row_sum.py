"""A/B on the H200: zyfa-exp2's rounded row sum in the kernel's forms now, against an older kernel source.

    git show 3ad4a44:zyfa/kernels/_triton_fp8.py > old_triton_fp8.py      # the sum read back from P's FP8 codes
    PYTHONPATH=. python3 scripts/ab_exp2_row_sum.py --old old_triton_fp8.py [--technique-1] [--out FILE]

For zyfa-exp2 and zyfa-exp2 with the Hopper accumulator flushed per tile, at 8K tokens (b1, 16 heads; hd128 non-causal
and causal, hd64 non-causal), through the same wrapper: the old kernel; the current one ("new": the default, the
sum decoded from codes of a conversion of their own); with ``EXP2_SUM: 0`` (p rounded again in fp32); and with
``DEBUG: 2`` (the sum of P's FP8 tensor converted back to fp32, wrong at tiny lengths). Outputs and LSE are compared
bit for bit with the old kernel's, then timed interleaved (5 rounds of ``triton.testing.do_bench``, median).
--technique-1: the kernel notes' technique-1 comparison instead, at 32K tokens (hd128, 16 heads, non-causal and
causal, bf16 inputs): zyfa-hopper (MAD) beside the Hopper-accumulator zyfa-exp2 in those forms, with TFLOP/s. One
JSON line per case, on stdout and in --out (default: $OUT/ab_exp2_row_sum.jsonl, or /tmp). docs/KERNEL.md
("The launch defaults", "Tried and not kept") has the numbers.
"""
import argparse
import functools
import importlib.util
import json
import os

import torch
import triton.testing

import zyfa.kernels._triton_fp8 as kernel_module
from zyfa.kernels.attention_fp8 import attention_fp8, quantize_for_kernel

RECIPES = ("zyfa-exp2", "zyfa-exp2:accumulator=matrix_unit,accum_flush_tiles=1")
SHAPES = ((128, 8192, False), (128, 8192, True), (64, 8192, False))  # (head dim, tokens, causal)


class _OlderKernel:
    """An older ``attn_fwd_fp8`` launched through today's wrapper: constexprs it does not know are left out."""

    OPTIONS = {"num_warps", "num_stages", "maxnreg"}

    def __init__(self, fn):
        self.fn = fn
        self.names = set(fn.arg_names) | self.OPTIONS

    def __getitem__(self, grid):
        launcher = self.fn[grid]
        return lambda *a, **kw: launcher(*a, **{k: v for k, v in kw.items() if k in self.names})


def load_kernel(path: str) -> _OlderKernel:
    spec = importlib.util.spec_from_file_location("old_triton_fp8", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return _OlderKernel(mod.attn_fwd_fp8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="an older zyfa/kernels/_triton_fp8.py")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "ab_exp2_row_sum.jsonl"))
    ap.add_argument("--technique-1", action="store_true", help="zyfa-hopper against the exp2 forms at 32K, hd128")
    args = ap.parse_args()
    current = kernel_module.attn_fwd_fp8
    variants = [("old", load_kernel(args.old), None), ("new", current, None), ("conv", current, {"DEBUG": 2}),
                ("fp32-resum", current, {"EXP2_SUM": 0})]
    cases = [(r, d, s, c) for r in RECIPES for d, s, c in SHAPES]
    if args.technique_1:
        variants.insert(0, ("zyfa-hopper", current, None))
        cases = [(RECIPES[1], 128, 32768, False), (RECIPES[1], 128, 32768, True)]
    rows = []
    for recipe, d, s, causal in cases:
        torch.manual_seed(0)
        dtype = torch.bfloat16 if args.technique_1 else torch.float32
        q, k, v = (torch.randn(1, 16, s, d, device="cuda", dtype=dtype) for _ in range(3))
        calls, outs, times = {}, {}, {}
        for name, fn, cfg in variants:
            r = "zyfa-hopper" if name == "zyfa-hopper" else recipe
            q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, r)
            calls[name] = functools.partial(attention_fp8, q8, k8, v8, recipe=r, causal=causal, q_descale=qd,
                                            k_descale=kd, v_descale=vd, config=cfg)
            kernel_module.attn_fwd_fp8 = fn
            outs[name] = calls[name]()
            times[name] = []
        for _ in range(5):
            for name, fn, _cfg in variants:
                kernel_module.attn_fwd_fp8 = fn
                times[name].append(triton.testing.do_bench(calls[name], warmup=25, rep=100))
        kernel_module.attn_fwd_fp8 = current
        med = {n: sorted(t)[2] for n, t in times.items()}
        same = {n: torch.equal(outs["old"][0], o[0]) and torch.equal(outs["old"][1], o[1]) for n, o in outs.items()
                if n != "zyfa-hopper"}
        flops = 4 * 16 * s * s * d / (2 if causal else 1)
        row = {"recipe": recipe, "d": d, "s": s, "causal": causal, "ms": med,
               "tflops": {n: round(flops / t / 1e9, 1) for n, t in med.items()},
               "over_old": {n: med[n] / med["old"] for n in med}, "same_bits": same}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
