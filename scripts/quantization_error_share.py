#!/usr/bin/env python3
"""Which tensor's quantization makes a recipe's operator error? Q, K or V kept in bf16, one at a time (CPU).

For every captured layer, the recipe's error against the FP64 oracle on the original inputs (rel-L2, ``orig``),
then the same recipe with Q, with K, or with V in bf16 instead of FP8 (``NAME:q_format=bf16`` and so on), and
the bf16 recipe as the floor. Where keeping one tensor in bf16 removes most of the error, that tensor's FP8
quantization is what a remedy has to fix; docs/QUANTIZATION.md uses it to explain why no FP8 scheme reaches
5x lower model KL on Gemma 3.

    python3 scripts/quantization_error_share.py --captures 'datasets/*.h5' --recipe zyfa --max-tokens 2048
"""

from __future__ import annotations

import argparse
import glob
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--captures", default="datasets/*.h5", help="capture files (glob, comma-separated)")
    ap.add_argument("--recipe", default="zyfa")
    ap.add_argument("--max-tokens", type=int, default=None)
    args = ap.parse_args(argv)

    from zyfa.accuracy.inputs.attention_input import capture_inputs
    from zyfa.reference.attention import attention_fp64

    from zyfa.emulator import emulate
    from zyfa.kernels.attention_fp8 import recipe_from_spec
    from zyfa.norms import rel_l2

    variants = [args.recipe] + [f"{args.recipe}:{t}_format=bf16" for t in "qkv"] + ["bf16"]
    try:
        recipes = [recipe_from_spec(v) for v in variants]
    except ValueError as e:
        print(f"quantization_error_share: {e}", file=sys.stderr)
        return 2
    paths = sorted(p for pat in args.captures.split(",") for p in glob.glob(pat))
    if not paths:
        print(f"quantization_error_share: no capture matches {args.captures!r}", file=sys.stderr)
        return 2
    names = ["all FP8", "Q bf16", "K bf16", "V bf16", "bf16"]
    print("| input | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for path in paths:
        for x in capture_inputs(path, max_tokens=args.max_tokens):
            ref = attention_fp64(x.q, x.k, x.v, causal=x.causal, sm_scale=x.sm_scale, window=x.window)[0]
            errs = [rel_l2(emulate(x.q, x.k, x.v, r, causal=x.causal, sm_scale=x.sm_scale, window=x.window).out,
                           ref) for r in recipes]
            print(f"| {x.name} | " + " | ".join(f"{e:.3e}" for e in errs) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
