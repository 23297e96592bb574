#!/usr/bin/env python3
"""Fit Hopper's FP8 wgmma accumulation on what the H200 recorded (CPU; reads the .npz of
scripts/record_wgmma_accumulation.py) and print, for every candidate rule, the fraction of outputs it
reproduces bit for bit in each experiment.

Every rule works one k = 32 step at a time: the 32 exact products and the incoming accumulator C (none at the
first step unless the experiment feeds one) are aligned to an exponent E, cut to a multiple of 2^(E - 13), summed,
and the sum stored in fp32; chains repeat it, ``flush_each_step`` experiments add each step's result into fp32.
The rules differ in the exponent a product counts at (its own, floor(log2|p|), or the sum of its operands'
exponents, ea + eb, before the significand product in [1, 4) is normalised), the exponent a subnormal operand
counts at (its format's smallest normal exponent: e4m3fn -6, e5m2 -14; or e4m3fn's -6 whatever the format; or its
own, floor(log2|x|)), the direction of the cut (toward zero or toward -inf), guard bits, a final truncation of the
sum to 13 bits below its own leading bit, and an exact sum rounded once (the "multi-term sum, one final RZ" model).
``library`` is zyfa.platforms itself (``truncating_mma``, ``stepwise_mma``, given each operand's smallest normal
exponent), run on the same operands; the rest is computed here in float64, exact for these operands wherever terms
are cut (every kept sum has at most ~22 bits; products are multiples of 2^-18 for e4m3fn, 2^-32 for e5m2). The two
rules that sum uncut products (``sum_rz_*``) are exact on e4m3fn operands only: e5m2 products range over 64 binades
(2^-32 to 2^32), more than float64's 53 bits hold, so on e5m2 experiments those two can be off in rare outputs.

Each experiment's operands are decoded by the formats in its meta entry (``formats``: A's and B's, e4m3fn for
recordings made before e5m2 experiments were added).

    python3 scripts/fit_wgmma_accumulation.py wgmma.npz [--rules fitted,old] [--blocks N]
    python3 scripts/fit_wgmma_accumulation.py wgmma.npz --sample-out tests/data/wgmma_h200_sample.npz

``--sample-out`` writes a small subset (the first block of each experiment, meta kept) for the CPU tests and
refuses to overwrite an existing file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from zyfa.formats import get_format  # noqa: E402

DEFAULT_FORMATS = ("e4m3fn", "e4m3fn")  # operand formats of an experiment whose meta names none
NONE = -10_000.0  # exponent of a zero term: never the largest


@dataclass(frozen=True)
class Rule:
    name: str
    doc: str
    product_exp: str = "operands"  # "operands" (ea + eb) or "own" (floor log2 |p|)
    cut: str = "trunc"  # per-term cut: "trunc" (toward zero), "floor" (two's complement), "none" (exact terms)
    guard: int = 0  # extra bits kept per term below the 13
    normalise: bool = True  # truncate the sum to 13 bits below its own leading bit
    final: str = "none"  # "none", or a single RZ of the exact sum: "rz_sum" (13 bits below the sum's leading
    # bit), "rz_max" (13 bits below the largest term)
    zeros_count: bool = False  # zero products take part in the largest exponent (at ea + eb)
    subnormal: str = "format"  # exponent of a subnormal operand: "format" (its format's smallest normal one),
    # "e4m3fn" (e4m3fn's, -6, whatever the format), "own" (floor log2 |x|: as if normalised)


RULES = {r.name: r for r in (
    Rule("old", "before this fit: own exponents, cut toward zero, no normalisation", product_exp="own",
         normalise=False),
    Rule("old_floor", "old, cut toward -inf (two's complement)", product_exp="own", cut="floor", normalise=False),
    Rule("sum_rz_sum", "exact sum, one RZ to 13 bits below the sum's leading bit", product_exp="own", cut="none",
         normalise=False, final="rz_sum"),
    Rule("sum_rz_max", "exact sum, one RZ to 13 bits below the largest term", product_exp="own", cut="none",
         normalise=False, final="rz_max"),
    Rule("own_norm", "old + the sum normalised (RZ, 13 bits below its leading bit)", product_exp="own"),
    Rule("operands", "products at ea + eb, no normalisation", normalise=False),
    Rule("fitted", "products at ea + eb, cut toward zero, the sum normalised (RZ): zyfa.platforms"),
    Rule("fitted_guard1", "fitted with one guard bit per term (14 kept), then the normalisation", guard=1),
    Rule("fitted_floor", "fitted with terms cut toward -inf", cut="floor"),
    Rule("fitted_zeros", "fitted with zero products taking part in the largest exponent", zeros_count=True),
    Rule("fitted_sub_e4m3fn", "fitted with every subnormal operand at -6 (e4m3fn's), whatever its format",
         subnormal="e4m3fn"),
    Rule("fitted_sub_own", "fitted with a subnormal operand at its own exponent floor(log2|x|)", subnormal="own"),
)}


def _floor_log2(x: np.ndarray) -> np.ndarray:
    """floor(log2 |x|) exactly (frexp), NONE where x == 0."""
    e = np.frexp(x)[1].astype(np.float64) - 1
    return np.where(x == 0, NONE, e)


def formats_of(exp: dict) -> tuple[str, str]:
    """(A's, B's) FP8 format of an experiment: its meta's ``formats``, else e4m3fn (the first recordings)."""
    fmts = tuple(exp.get("formats") or DEFAULT_FORMATS)
    if len(fmts) != 2:
        raise ValueError(f"experiment {exp.get('name')!r}: formats must name A's and B's, got {list(fmts)}")
    for f in fmts:
        get_format(f)  # ValueError (one line) for an unknown format
    return fmts


def decode(codes: np.ndarray, fmt: str) -> np.ndarray:
    """FP8 bytes of ``fmt`` -> float64 values."""
    return torch.from_numpy(np.ascontiguousarray(codes)).view(get_format(fmt).torch_dtype).double().numpy()


def _operand_exp(codes: np.ndarray, fmt: str, subnormal: str = "format") -> np.ndarray:
    """Each operand's exponent as the unit counts it: its exponent field less the bias for a normal value; for
    a subnormal (field 0) the format's smallest normal exponent (``subnormal="format"``), e4m3fn's -6
    (``"e4m3fn"``) or its own floor(log2|x|) (``"own"``; zeros are never the largest product anyway)."""
    f = get_format(fmt)
    field = (codes.astype(np.int32) >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1)
    if subnormal == "own":
        sub = np.frexp(decode(codes, fmt))[1] - 1
    else:
        sub = f.emin if subnormal == "format" else get_format("e4m3fn").emin
    return np.where(field == 0, sub, field - f.bias).astype(np.float64)


def _cut(x: np.ndarray, q: np.ndarray, how: str) -> np.ndarray:
    if how == "none":
        return x
    return (np.trunc(x / q) if how == "trunc" else np.floor(x / q)) * q


@np.errstate(divide="ignore", invalid="ignore")  # all-zero outputs divide by a zero quantum; set to 0 below
def _step(a, b, ea, eb, c, rule: Rule) -> np.ndarray:
    """One k step: a, b (blocks, rows, 32) values, ea, eb their exponents, c (blocks, rows, cols) or None."""
    p = a[:, :, None, :] * b[:, None, :, :]
    if rule.product_exp == "own":
        ep = _floor_log2(p)
    else:
        ep = ea[:, :, None, :] + eb[:, None, :, :]
        if not rule.zeros_count:
            ep = np.where(p == 0, NONE, ep)
    e = ep.max(-1)
    if c is not None:
        e = np.maximum(e, _floor_log2(c))
    q = np.exp2(e - 13 - rule.guard)
    s = _cut(p, q[..., None], rule.cut).sum(-1)
    if c is not None:
        s = s + _cut(c, q, rule.cut)
    if rule.normalise:  # a no-op unless the sum carried above 2^(E+1): it is a multiple of 2^(E-13-guard)
        qn = np.exp2(np.maximum(_floor_log2(s), e) - 13)
        s = np.trunc(s / qn) * qn
    if rule.final == "rz_sum":
        qs = np.exp2(_floor_log2(s) - 13)
        s = np.trunc(s / qs) * qs
    elif rule.final == "rz_max":
        qm = np.exp2(e - 13)
        s = np.trunc(s / qm) * qm
    return np.where(e <= NONE, 0.0, s)


def model(exp: dict, arrays: dict, rule: Rule) -> np.ndarray:
    """What ``rule`` computes for one experiment (float32 results as float64)."""
    a8, b8 = arrays["a"], arrays["b"]
    fa, fb = formats_of(exp)
    a, b = decode(a8, fa), decode(b8, fb)
    ea, eb = _operand_exp(a8, fa, rule.subnormal), _operand_exp(b8, fb, rule.subnormal)
    c0 = arrays["c"].astype(np.float64)
    k = a.shape[-1]
    if exp["flush_each_step"]:
        out = np.zeros(c0.shape, dtype=np.float32)
        for k0 in range(0, k, 32):
            sl = slice(k0, k0 + 32)
            out = out + _step(a[..., sl], b[..., sl], ea[..., sl], eb[..., sl], None, rule).astype(np.float32)
        return out.astype(np.float64)
    c = c0 if exp["c"] != "none" else None
    for k0 in range(0, k, 32):
        sl = slice(k0, k0 + 32)
        c = _step(a[..., sl], b[..., sl], ea[..., sl], eb[..., sl], c, rule).astype(np.float32).astype(np.float64)
    return c


def library(exp: dict, arrays: dict, bits: int = 13) -> np.ndarray:
    """zyfa.platforms on the experiment: truncating_mma (the chain) or stepwise_mma (flushed every step), each
    operand's subnormals at its format's smallest normal exponent."""
    from zyfa.platforms import stepwise_mma, truncating_mma

    fa, fb = formats_of(exp)
    a = torch.from_numpy(decode(arrays["a"], fa)).float()  # FP8 values: exact in float32
    b = torch.from_numpy(decode(arrays["b"], fb)).float().transpose(-1, -2)
    min_exp = (get_format(fa).emin, get_format(fb).emin)
    if exp["flush_each_step"]:
        return stepwise_mma(a, b, bits, min_exp=min_exp).double().numpy()
    c = torch.from_numpy(arrays["c"]) if exp["c"] != "none" else None
    return truncating_mma(a, b, c, bits, min_exp=min_exp).double().numpy()


def load(path: str) -> tuple[dict, dict]:
    """(meta, {experiment: {"a", "b", "c", "d"}}) from a recording; ValueError (one line) if it is not one."""
    try:
        z = np.load(path)
        meta = json.loads(bytes(z["meta"]).decode())
        data = {e["name"]: {f: z[f"{e['name']}.{f}"] for f in "abcd"} for e in meta["experiments"]}
        for e in meta["experiments"]:
            formats_of(e)
    except (OSError, KeyError, ValueError, TypeError) as err:
        raise ValueError(f"{path}: not a recording of scripts/record_wgmma_accumulation.py ({err})") from None
    return meta, data


def match_table(meta: dict, data: dict, rules: list[str], blocks: int | None = None) -> dict[str, dict[str, float]]:
    """{rule: {experiment: fraction of outputs equal bit for bit}} (-0.0 equals 0.0)."""
    table: dict[str, dict[str, float]] = {r: {} for r in rules}
    for exp in meta["experiments"]:
        arrays = {f: v[:blocks] for f, v in data[exp["name"]].items()}
        d = arrays["d"].astype(np.float64)
        for r in rules:
            got = library(exp, arrays) if r == "library" else model(exp, arrays, RULES[r])
            table[r][exp["name"]] = float(np.mean(got == d))
    return table


def write_sample(meta: dict, data: dict, out: str, blocks: int = 1) -> None:
    if os.path.exists(out):
        raise ValueError(f"{out} exists; not overwriting it")
    arrays = {f"{name}.{f}": v[:blocks] for name, fs in data.items() for f, v in fs.items()}
    meta = dict(meta, blocks=blocks, sample_of=f"the first {blocks} block(s) of each experiment of a recording "
                                                 f"of {meta.get('blocks')} blocks")
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez_compressed(out, **arrays)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("npz", help="a recording of scripts/record_wgmma_accumulation.py")
    ap.add_argument("--rules", default=",".join([*RULES, "library"]),
                    help=f"comma-separated, of: {', '.join(RULES)}, library (default: all)")
    ap.add_argument("--blocks", type=int, default=None, help="use the first N blocks of each experiment")
    ap.add_argument("--sample-out", default=None, help="write the first block of each experiment here and stop")
    args = ap.parse_args(argv)
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    bad = [r for r in rules if r not in RULES and r != "library"]
    if bad:
        print(f"fit_wgmma_accumulation: unknown rule(s) {', '.join(bad)}; known: {', '.join(RULES)}, library",
              file=sys.stderr)
        return 2
    try:
        meta, data = load(args.npz)
        if args.sample_out:
            write_sample(meta, data, args.sample_out)
            print(f"wrote {args.sample_out}")
            return 0
    except ValueError as err:
        print(f"fit_wgmma_accumulation: {err}", file=sys.stderr)
        return 2
    print(f"# {args.npz}: {meta.get('device')}, torch {meta.get('torch')}, triton {meta.get('triton')}, "
          f"{args.blocks or meta.get('blocks')} blocks of 64x64 outputs per experiment")
    for r in rules:
        print(f"# {r}: {RULES[r].doc if r in RULES else 'zyfa.platforms.truncating_mma / stepwise_mma'}")
    table = match_table(meta, data, rules, args.blocks)
    names = [e["name"] for e in meta["experiments"]]
    fmts = {e["name"]: "/".join(formats_of(e)) for e in meta["experiments"]}
    w, wf = max(map(len, names)), max(len("formats"), *map(len, fmts.values()))
    rw = max(13, *map(len, rules))
    print(f"{'experiment':<{w}} {'formats':<{wf}} " + " ".join(f"{r:>{rw}}" for r in rules))
    for n in names:
        print(f"{n:<{w}} {fmts[n]:<{wf}} " + " ".join(f"{table[r][n]:>{rw}.4f}" for r in rules))
    return 0


if __name__ == "__main__":
    sys.exit(main())
