"""Measure ZYFA's open numerics choices (MAD offset and rounding; per-row, per-tile or fixed P exponent).

Usage: python3 scripts/measure_zyfa_choices.py [--seq 2048] [--seeds 3]
Prints rel-L2 error against the FP64 oracle of the dequantized inputs, mean over seeds, per variant.
The defaults of the ``zyfa`` recipe (zyfa/recipes.py) were set from this table (docs/numerics.md).
"""

from __future__ import annotations

import argparse

import torch
from zyfa.reference.attention import attention_fp64

from zyfa.emulator import emulate
from zyfa.norms import rel_l2
from zyfa.recipe_spec import get_recipe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--std", type=float, nargs="+", default=[1.0, 2.0])
    args = ap.parse_args()
    base = get_recipe("zyfa")
    variants = {f"mad nearest offset {o:+.2f}": base.replace(name=f"o{o}", mad_offset=o)
                for o in (0.0, -0.25, -0.35, -0.5, -0.75)}
    variants |= {f"mad trunc offset {o:+.2f}": base.replace(name=f"t{o}", mad_rounding="trunc", mad_offset=o)
                 for o in (0.0, 0.25, 0.5)}
    variants["exp2 + RNE cast (zyfa-exp2)"] = get_recipe("zyfa-exp2")
    variants["fixed 2^8 exponent"] = get_recipe("zyfa-pow2fixed")
    variants["per-tile exponent"] = get_recipe("zyfa-tilescale")
    variants["fp32 row sum"] = get_recipe("zyfa-fp32sum")
    variants["ck (x448, fp32 sum)"] = get_recipe("ck")
    print(f"seq={args.seq} d={args.head_dim} heads=2 seeds={args.seeds}; rel-L2 vs FP64 of dequantized inputs")
    print("| variant | " + " | ".join(f"std {s}" for s in args.std) + " |")
    print("|---|" + "---|" * len(args.std))
    cache = {}
    for label, recipe in variants.items():
        cells = []
        for std in args.std:
            errs = []
            for seed in range(args.seeds):
                g = torch.Generator().manual_seed(seed)
                q, k, v = (torch.randn(1, 2, args.seq, args.head_dim, generator=g) * s for s in (std, std, 1.0))
                emu = emulate(q, k, v, recipe)
                key = (std, seed)
                if key not in cache:
                    cache[key] = attention_fp64(emu.q_deq, emu.k_deq, emu.v_deq)[0]
                ref = cache[key]
                errs.append(rel_l2(emu.out, ref))
            cells.append(f"{100 * sum(errs) / len(errs):.3f}%")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
