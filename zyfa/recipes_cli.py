"""``zyfa recipes``: list the named recipes, their numerics, default platform, sources and status."""

from __future__ import annotations

import argparse
import dataclasses
import json

from zyfa.recipe_spec import get_recipe
from zyfa.recipes import DESCRIPTIVE_FIELDS, RECIPES, Recipe

# Table columns: (header, main fields, further fields). Main fields always show their value; a further field
# shows as name=value where it is not at its default, and the line under the table names the defaults of those
# that differ between the listed recipes. Every numerics field of Recipe belongs to exactly one column
# (tests/zyfa/test_recipes_cli.py checks), so no difference between two recipes can hide.
COLUMNS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("Q/K/V", ("q_format", "k_format", "v_format"), ()),
    ("scales", ("q_scale", "k_scale", "v_scale"),
     ("scale_block_q", "scale_block_kv", "k_smoothing", "qk_rotation", "rotation_seed")),
    ("tiles", ("block_m", "block_n"), ("head_dim_tiles", "kv_order")),
    ("P handling", ("exp_method", "p_format", "p_scale"),
     ("log2e_folded", "mad_offset", "mad_rounding", "p_scale_log2", "p_scale_granularity", "p_block_max_log2")),
    ("row sum", ("rowsum",), ()),
    ("accumulator", ("accumulator",), ("accum_flush_tiles",)),
    ("V descale", ("v_descale",), ()),
    ("1/l", ("reciprocal",), ()),
    ("output", ("out_format",), ()),
    ("default platform", ("platform",), ()),
    ("status", ("status",), ()),
)
_SEPARATOR = {"Q/K/V": "/", "scales": "/", "tiles": "x"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", help="recipes to show in full (default: a table of all)")
    parser.add_argument("--json", action="store_true", help="print every field as JSON")


def numerics_fields() -> list[str]:
    """Recipe fields that decide numerics (every field but the descriptive ones)."""
    return [f.name for f in dataclasses.fields(Recipe) if f.name not in DESCRIPTIVE_FIELDS]


def table_lines(recipes: list[Recipe]) -> list[str]:
    """The Markdown table of ``recipes`` and, under it, the defaults of further fields left out of cells."""
    default = Recipe(name="", source="")
    differing = {f for f in numerics_fields() if len({getattr(r, f) for r in recipes}) > 1}
    lines = ["| recipe | " + " | ".join(c[0] for c in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for r in recipes:
        cells = [r.name]
        for header, main, further in COLUMNS:
            cell = _SEPARATOR.get(header, " ").join(str(getattr(r, f)) for f in main)
            if header == "P handling":
                cell = f"{r.exp_method} -> {r.p_format}, scale {r.p_scale}"
            extra = [f"{f}={getattr(r, f)}" for f in further if getattr(r, f) != getattr(default, f)]
            cells.append(" ".join([cell, *extra]))
        lines.append("| " + " | ".join(cells) + " |")
    hidden = [f"{f}={getattr(default, f)}" for _, _, further in COLUMNS for f in further
              if f in differing and any(getattr(r, f) == getattr(default, f) for r in recipes)]
    if hidden:
        lines.append("")
        lines.append("Where a cell leaves them out: " + ", ".join(hidden) + ".")
    lines.append("`zyfa recipes NAME` shows a recipe's every field, its sources and what backs its status; "
                 "docs/PLATFORMS.md what each platform's arithmetic rests on.")
    return lines


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
            print(f"{r.name}\n  source: {r.source}\n  status: {r.status}"
                  + (f" ({r.status_note})" if r.status_note else ""))
            for f in dataclasses.fields(r):
                if f.name not in ("name", "source", "status", "status_note"):
                    print(f"  {f.name}: {getattr(r, f.name)}")
        return 0
    for line in table_lines(recipes):
        print(line)
    return 0
