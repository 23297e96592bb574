"""The SASS of every kernel variant the recipes launch, hashed, so a change that must not move the binary can be
checked without a GPU (docs/KERNEL.md, "Checks").

Compiles, for sm_90a with Triton's bundled ptxas (``scripts/inspect_sass.py``'s :func:`compile_variant`: exactly the
binary the wrapper launches, default config, per-head descales), each recipe at each head-dim shape, causal and not,
and records the sha256 of its SASS (the listing without cuobjdump's line naming the temporary cubin file), its
registers and its resolved config. A recipe the kernel refuses at a shape is recorded with the refusal's line.

Usage:
    python scripts/sass_variants.py --out before.json          # then change the kernel
    python scripts/sass_variants.py --out after.json
    python scripts/sass_variants.py --compare before.json after.json   # exit 1 when any variant differs

Needs triton 3.6.0 (as on the H200; ``pip install --target DIR triton==3.6.0`` and DIR on PYTHONPATH), no GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from inspect_sass import compile_variant, sass_histogram  # noqa: E402  (a sibling script, not a package)

RECIPES = ("zyfa", "zyfa-hopper", "fa3", "ck", "aiter", "triton-amd", "bf16")
SHAPES = {"hd64": (64, 64), "hd128": (128, 128), "hd256": (256, 256), "mla": (192, 128)}


def sass_digest(sass: str) -> str:
    """sha256 of a SASS listing, less the lines that name the temporary cubin it was read from."""
    kept = [line for line in sass.splitlines() if ".cubin" not in line]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()


def variant_record(recipe: str, dqk: int, dv: int, causal: bool) -> dict:
    """One variant's hash, registers and config, or its refusal."""
    try:
        ck, cfg, _ = compile_variant(recipe, dqk, dv, causal)
    except ValueError as e:
        return {"refused": str(e).splitlines()[0]}
    sass, ops = sass_histogram(ck.asm["cubin"])
    regs = re.search(r"REG:(\d+)", sass)
    return {"sha256": sass_digest(sass), "registers": int(regs.group(1)) if regs else None,
            "instructions": sum(ops.values()), "config": {k: v for k, v in sorted(cfg.items())}}


def collect(recipes, shapes) -> dict:
    out = {}
    for recipe in recipes:
        for shape in shapes:
            dqk, dv = SHAPES[shape]
            for causal in (False, True):
                name = f"{recipe}/{shape}/{'causal' if causal else 'noncausal'}"
                t0 = time.time()
                out[name] = variant_record(recipe, dqk, dv, causal)
                rec = out[name]
                what = rec.get("refused") or f"{rec['sha256'][:12]} {rec['registers']} registers"
                print(f"{name}: {what} ({time.time() - t0:.1f} s)", flush=True)
    return out


def compare(before: dict, after: dict) -> list[str]:
    """Lines naming each variant whose SASS, refusal or presence differs; empty when all are the same. The config
    may lose keys (a removed switch) without counting as a difference; a changed value counts."""
    diffs = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            diffs.append(f"{name}: only in {'after' if a is None else 'before'}")
        elif a.get("refused") != b.get("refused"):
            diffs.append(f"{name}: refusal {a.get('refused')!r} -> {b.get('refused')!r}")
        elif a.get("sha256") != b.get("sha256"):
            diffs.append(f"{name}: SASS {a['sha256'][:12]} -> {b['sha256'][:12]} (registers {a['registers']} -> "
                         f"{b['registers']}, instructions {a['instructions']} -> {b['instructions']})")
        else:
            changed = {k: (v, b["config"][k]) for k, v in (a.get("config") or {}).items()
                       if k in (b.get("config") or {}) and b["config"][k] != v}
            if changed:
                diffs.append(f"{name}: same SASS, config values changed {changed}")
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the variants' hashes here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two --out files")
    ap.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated (default {','.join(RECIPES)})")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated of {', '.join(SHAPES)}")
    a = ap.parse_args(argv)
    if bool(a.out) == bool(a.compare):
        ap.error("give --out FILE or --compare BEFORE AFTER")
    if a.compare:
        files = []
        for path in a.compare:
            try:
                with open(path, encoding="utf-8") as f:
                    files.append(json.load(f)["variants"])
            except (OSError, ValueError, KeyError) as e:
                ap.exit(2, f"sass_variants: {path}: not a --out file of this script ({e})\n")
        diffs = compare(*files)
        print("\n".join(diffs) if diffs else f"all {len(files[0])} variants have the same SASS")
        return 1 if diffs else 0
    shapes = [s.strip() for s in a.shapes.split(",") if s.strip()]
    bad = [s for s in shapes if s not in SHAPES]
    if bad:
        ap.error(f"unknown shape {bad[0]!r}; known: {', '.join(SHAPES)}")
    import triton

    variants = collect([r.strip() for r in a.recipes.split(",") if r.strip()], shapes)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump({"triton": triton.__version__, "target": "sm_90a", "variants": variants}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
