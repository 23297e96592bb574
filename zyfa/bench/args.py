"""``zyfa bench``'s flags and their checks, with no heavy import (no torch, no Triton): the ``zyfa`` dispatch parses
and checks with this module before it imports :mod:`zyfa.bench.cli`, so a bad flag is refused in one line at once.
"""

from __future__ import annotations

import argparse
import json
import os

from zyfa.kernels.cute_plan import CUTE_HEAD_DIMS, cute_plan
from zyfa.peers.names import BENCH_PEERS, PEER_NAMES, canonical_name
from zyfa.plugins import PluginError, parse_spec
from zyfa.recipe_spec import get_recipe, split_spec_list

# how a refusal's line starts, before torch (the zyfa dispatch reads it) and in zyfa.bench.cli
REFUSAL = "zyfa bench: "
# name -> (d_qk, d_v) of the benchmarked shapes
SHAPES = {"hd64": (64, 64), "hd128": (128, 128), "hd256": (256, 256), "mla": (192, 128)}

DEFAULT_RECIPES = (
    "zyfa",
    "zyfa-hopper",
    "zyfa:accumulator=matrix_unit",
    "zyfa-exp2:accumulator=matrix_unit,accum_flush_tiles=1",
    "zyfa-fp32sum:accumulator=matrix_unit,accum_flush_tiles=1",
    "ck:accumulator=matrix_unit,accum_flush_tiles=1",
    "aiter:accumulator=matrix_unit,accum_flush_tiles=1",
    "fa3",
    "fa3:accum_flush_tiles=1",
)
OTHER_RECIPES = (
    "zyfa",
    "zyfa-hopper",
    "zyfa-exp2:accumulator=matrix_unit,accum_flush_tiles=1",
    "ck:accumulator=matrix_unit,accum_flush_tiles=1",
    "fa3",
)
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seqlens", default="8192,16384,32768", help="comma-separated tokens (batch 1)")
    p.add_argument("--shapes", default="hd64,hd128,hd256,mla", help=f"subset of {','.join(SHAPES)}")
    p.add_argument("--causal", default="both", choices=("both", "true", "false"))
    p.add_argument("--recipes", default=";".join(DEFAULT_RECIPES),
                   help="recipe specs the kernel runs, ';'-separated (or ','; docs/CONTRACTS.md 'Recipe specs')")
    p.add_argument("--recipes-other", default=";".join(OTHER_RECIPES),
                   help="';'-separated recipe specs for the shapes other than hd128 ('same' = --recipes)")
    p.add_argument("--cute-recipes", default="",
                   help="recipe specs our CuTe DSL kernel runs beside the Triton kernel, ';'-separated (default none; "
                        "zyfa-hopper's numerics, its row sum decoded or rowsum=rounded_mma, head dims "
                        + ", ".join(f"{a}" for a, _ in CUTE_HEAD_DIMS) + "; needs nvidia-cutlass-dsl: docs/KERNEL.md)")
    p.add_argument("--peers", default=",".join(BENCH_PEERS), help=f"subset of {','.join(PEER_NAMES)} (or 'none')")
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
    try:
        src = parse_spec(arg)
    except PluginError as e:
        raise ValueError(f"--kernel: {e}") from None
    name = src.name if not src.name.startswith("plugin:") else src.function
    return name, arg


def check_args(args) -> None:
    """The flags' checks that need no heavy import (run by the ``zyfa`` dispatch before :func:`zyfa.bench.cli.main`,
    and by it): lengths, shapes, peers, counts, the launch config, the recipe names (``--cute-recipes``: those the
    CuTe kernel takes) and the ``--kernel`` specs (the files parsed, not run). ValueError in one line."""
    if args.render:
        return
    output_stem(args.out)
    for s in (t.strip() for t in args.seqlens.split(",")):
        if s and not (s.isdigit() and int(s) >= 1):
            raise ValueError(f"--seqlens takes comma-separated token counts >= 1, got {s!r}")
    unknown = [s for s in args.shapes.split(",") if s and s not in SHAPES]
    if unknown:
        raise ValueError(f"--shapes: unknown {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    peers = [] if args.peers == "none" else [canonical_name(p) for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEER_NAMES]
    if unknown:
        raise ValueError(f"--peers: unknown {', '.join(unknown)}; known: {', '.join(PEER_NAMES)}")
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
    for spec in split_spec_list(args.cute_recipes):
        try:
            cute_plan(spec)
        except ValueError as e:
            raise ValueError(f"--cute-recipes: {e}") from None
    for spec in args.kernel:
        parse_kernel_arg(spec)
