#!/usr/bin/env python3
"""Which emulation does a real kernel match? One implementation against several candidate pairings (GPU).

For each input, runs the real implementation once and every candidate emulation spec (a recipe spec with
``@platform`` where wanted) on the same inputs, and prints, per (input, spec): the real kernel's rel-L2 error and
the emulation's against the FP64 oracle on the spec's dequantized inputs, their ratio, and the rel-L2 between the
two outputs. The candidate whose outputs are closest to the kernel's is the better description of what it
computes; `zyfa.accuracy.implementations.base.pairing` should name it. Used to find why AMD's Triton FP8 forward
had 1.86x its emulation's error on Qwen2.5-Coder's layer 0 (docs/real_kernels.md).

    A=triton-amd:p_scale=tile_amax
    python3 scripts/compare_pairings.py --impl flash-attn-triton-amd \\
        --specs "$A@h200;$A,accumulator=matrix_unit,accum_flush_tiles=1@h200" \\
        --captures 'datasets/*.h5' --gaussian --out pairings.json

Specs are separated by ';' when a spec itself holds commas (``--specs 'a:x=1,y=2@h200;b@h200'``); with no ';'
present a ',' separates them unless the next piece holds '=' without ':' (a field of the previous spec).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import sys
import time

import torch

from zyfa.recipe_spec import get_recipe, split_spec_list


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", required=True, help="a built-in implementation name (zyfa implementations)")
    ap.add_argument("--specs", required=True, help="candidate emulation specs (see the module docstring)")
    ap.add_argument("--captures", default="datasets/*.h5", help="capture files (glob, comma-separated; 'none')")
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--gaussian", action="store_true", help="also the default study's Gaussian inputs")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    args = ap.parse_args(argv)

    from zyfa.accuracy.implementations.base import ImplementationError, call_implementation, unsupported_reason
    from zyfa.accuracy.implementations.registry import get_implementation
    from zyfa.accuracy.inputs.attention_input import capture_inputs
    from zyfa.reference.attention import attention_fp64

    from zyfa.emulator import emulate
    from zyfa.norms import rel_l2

    try:
        impl = get_implementation(args.impl)
        specs = [(s, get_recipe(s)) for s in split_spec_list(args.specs)]
    except (KeyError, ValueError) as e:
        print(f"compare_pairings: {e}", file=sys.stderr)
        return 2
    ok, why = impl.available()
    if not ok:
        print(f"compare_pairings: {impl.name} is not available here: {why}", file=sys.stderr)
        return 2

    inputs = []
    if args.captures != "none":
        for pat in args.captures.split(","):
            for path in sorted(glob.glob(pat)):
                inputs += capture_inputs(path, max_tokens=args.max_tokens)
    if args.gaussian:
        from zyfa.accuracy.inputs.attention_input import make_gaussian
        from zyfa.accuracy.study.run import gaussian_specs

        inputs += [make_gaussian(s) for s in gaussian_specs("default")]

    rows = []
    for x0 in inputs:
        why = unsupported_reason(impl, x0)
        if why:
            print(f"{x0.name}: skipped ({why})")
            continue
        x = x0.to(args.device)
        try:
            real = call_implementation(impl, x).out.float()
        except ImplementationError as e:
            print(f"{x0.name}: {e}")
            continue
        for spec, recipe in specs:
            t0 = time.perf_counter()
            emu = emulate(x.q, x.k, x.v, recipe, causal=x.causal, sm_scale=x.sm_scale, window=x.window)
            ref = attention_fp64(emu.q_deq, emu.k_deq, emu.v_deq, causal=x.causal, sm_scale=x.sm_scale,
                                 window=x.window)[0]
            e_real, e_emu = rel_l2(real, ref), rel_l2(emu.out, ref)
            row = {"input": x0.name, "impl": impl.name, "spec": spec, "platform": recipe.platform,
                   "real_rel_l2": e_real, "emu_rel_l2": e_emu, "ratio": e_real / e_emu if e_emu else math.nan,
                   "real_vs_emu_rel_l2": rel_l2(real, emu.out), "seconds": time.perf_counter() - t0}
            rows.append(row)
            print(f"{x0.name:45s} {spec:70s} real {e_real:.4e} emu {e_emu:.4e} ratio {row['ratio']:.4f} "
                  f"real-vs-emu {row['real_vs_emu_rel_l2']:.3e}", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"impl": impl.name, "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                       else "cpu", "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
