"""``zyfa recipes``: list the named recipes, their numerics and sources."""

from __future__ import annotations

import argparse
import dataclasses
import json

from zyfa.recipes import RECIPES, get_recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", help="recipes to show in full (default: a table of all)")
    parser.add_argument("--json", action="store_true", help="print every field as JSON")


def main(args: argparse.Namespace) -> int:
    try:
        recipes = [get_recipe(n) for n in args.names] if args.names else list(RECIPES.values())
    except ValueError as err:
        print(f"zyfa recipes: {err}")
        return 2
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in recipes], indent=2))
        return 0
    if args.names:
        for r in recipes:
            print(f"{r.name}\n  source: {r.source}")
            for f in dataclasses.fields(r):
                if f.name not in ("name", "source"):
                    print(f"  {f.name}: {getattr(r, f.name)}")
        return 0
    print("| recipe | Q/K/V | scales | P handling | row sum | accumulator | output |")
    print("|---|---|---|---|---|---|---|")
    for r in recipes:
        p = f"{r.exp_method} -> {r.p_format} x{r.p_scale}"
        acc = r.accumulator + (f" flush/{r.accum_flush_tiles}" if r.accum_flush_tiles else "")
        print(f"| {r.name} | {r.q_format}/{r.k_format}/{r.v_format} | {r.q_scale}/{r.k_scale}/{r.v_scale} "
              f"| {p} | {r.rowsum} | {acc} | {r.out_format} |")
    return 0
