"""``zyfa impact``: perplexity and next-token KL with each recipe's emulator swapped into a model.

    zyfa impact --models smollm2 --recipes zyfa,ck --out impact/results.jsonl
    zyfa impact --render-only --out 'reports/impact/results*.jsonl'

Every argument (models, recipes, layers) is checked before anything is written or deleted. ``--out`` defaults
to ``zyfa-impact/results.jsonl`` in the current directory; an existing file is refused unless ``--resume``
(keep its rows, measure the missing ones) or ``--force`` (start over). Rows go to ``<out>.partial`` as they finish
(one fsync'd line each, under the run lock that refuses a second live run on the same output), and ``<out>`` is
written whole when the run finishes (:class:`zyfa.accuracy.io.results_io.ResultsFile`, as every command).

Exposed: ``main(args) -> int``; the flags are in :mod:`zyfa.accuracy.impact.impact_args` (``add_arguments``,
``check_args``), read before this module (torch) is imported.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path

import torch
from zyfa.accuracy.impact.impact_args import add_arguments, kernel_names
from zyfa.accuracy.impact.model import model_attention
from zyfa.accuracy.impact.rows import drop_rows, impact_key, json_default, parse_drop_spec, read_rows, row_key
from zyfa.accuracy.impact.run import impact_cells, run_impact
from zyfa.accuracy.impact.section import command_of, impact_files_beside, results_paths, write_markdown
from zyfa.accuracy.implementations.plugins import load_plugins
from zyfa.accuracy.io.cost_model import IMPACT_TRUNCATING_SCALE, PROVENANCE_KEY, estimate_s, record
from zyfa.accuracy.io.cost_model import rate as units_per_second
from zyfa.accuracy.io.device import resolve_device
from zyfa.accuracy.io.results_io import ResultsFile
from zyfa.accuracy.io.shard import (
    Dist,
    ShardedResults,
    announce,
    give_up,
    launch,
    plan,
    print_dry_run,
    rank_device,
    say,
    sharding_summary,
    wants_sharding,
)
from zyfa.accuracy.operator.cli import cell_cost as attention_cost
from zyfa.capture.fetch import FetchError
from zyfa.capture.models import MODELS, check_model_names, prepare_sources

from zyfa.outputs import OutputError, atomic_write_text
from zyfa.plugins import wall_options
from zyfa.recipe_spec import get_recipe, split_spec_list


def _section_files(out: Path, current: Path, args: argparse.Namespace) -> list[Path]:
    """What a run's Markdown section renders: ``current`` (``out``, or its ``.partial`` while the run goes) alone
    under ``--markdown``; by default, beside the other impact results files in ``out``'s folder, so that the shared
    ``impact.md`` keeps the earlier runs' rows (:func:`~zyfa.accuracy.impact.section.impact_files_beside`)."""
    if args.markdown:
        return [current]
    return [current if p == out else p for p in impact_files_beside(out)]


def main(args: argparse.Namespace) -> int:
    outs = results_paths(args.out)
    if not outs:
        print(f"zyfa impact: --out {args.out!r} names no file", file=sys.stderr)
        return 2
    out = outs[0]
    md = Path(args.markdown) if args.markdown else out.with_name("impact.md")
    command = command_of(list(sys.argv))
    if args.render_only:
        try:
            write_markdown(outs, md)
        except (ValueError, OSError) as e:  # a row in an older form, a file that cannot be read: one line
            print(f"zyfa impact: {e}", file=sys.stderr)
            return 2
        print(f"wrote {md} from {len(outs)} file(s)")
        return 0
    if len(outs) > 1 or any(c in args.out for c in ",*?["):
        print("zyfa impact: --out must be one file (several only with --render-only)", file=sys.stderr)
        return 2
    if args.drop_rows is not None:
        try:
            parse_drop_spec(args.drop_rows)
            if not out.is_file():
                raise FileNotFoundError(f"no such file: {out}")
            n, sidecar = drop_rows(out, args.drop_rows, reason=args.reason)
        except (ValueError, FileNotFoundError, RuntimeError) as e:
            print(f"zyfa impact: {e}", file=sys.stderr)
            return 2
        print(f"dropped {n} row(s) from {out}" + (f" (kept in {sidecar}); re-render with --render-only" if n else ""))
        return 0
    split = [s.strip() for s in args.models.split(",") if s.strip()]
    try:  # every argument before anything is written or deleted
        if args.force and args.resume:
            raise ValueError("--force and --resume exclude each other")

        check_model_names(split)
        recipes = [get_recipe(r).name for r in split_spec_list(args.recipes)]

        plugins = load_plugins(args.kernel or [], args.kernel_recipe or [], **wall_options(args))
        impl_names = kernel_names(args)
        for n in impl_names:
            ok, why = model_attention(n).impl.available()
            if not ok:
                raise ValueError(f"implementation {n} cannot run here: {why}")

        device = resolve_device(args.device)
        layer_recipes = [get_recipe(r).name for r in split_spec_list(args.layer_recipes)]
        try:
            layers = [int(x) for x in args.layers.split(",")] if args.layers else None
        except ValueError:
            raise ValueError(f"--layers takes comma-separated integers, got {args.layers!r}") from None
        per_layer = [s.strip() for s in args.per_layer.split(",") if s.strip()]
        unknown = [m for m in per_layer if m not in split]
        if unknown:
            raise ValueError(f"--per-layer {unknown} not in --models")
        if args.dry_run is None:  # every cached model file and text checked (a bad one fetched again) first
            prepare_sources(split, [args.text])
            out.parent.mkdir(parents=True, exist_ok=True)
        if wants_sharding(args, out):
            return _main_sharded(args, split, recipes, impl_names, plugins, device, layer_recipes, layers, per_layer,
                                 out, md, command)
        results = ResultsFile.open(out, force=args.force, resume=args.resume, reader=_read_out, n_rows=256,
                                   key=row_key, check=_impact_row, dumps=_dumps)
    except (ValueError, OSError, FetchError) as e:
        print(f"zyfa impact: error: {e}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    # rows go to <out>.partial (fsync'd, under the run lock); <out> is written whole when the run finishes
    results.start({"command": command})
    sink = _Sink(results, str(device))
    t0 = time.perf_counter()
    try:
        run_impact(split, recipes, n_tokens=args.tokens, windows=args.windows, text=args.text, per_layer=per_layer,
                   layer_recipes=layer_recipes, layer_windows=args.layer_windows, layers=layers, out=out,
                   progress=not args.no_progress, implementations=impl_names, plugins=plugins, device=device,
                   sink=sink, on_model_done=lambda: write_markdown(
                       _section_files(out, results.partial, args), md, command=command))
    except (ValueError, OSError) as e:
        results.close()
        print(f"zyfa impact: error: {e}; the rows finished so far are in {results.partial} (rerun with --resume)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        results.close()
        say(f"zyfa impact: interrupted; the rows finished so far are in {results.partial} (rerun with --resume)")
        return 130
    # the --dry-run estimate of the rows beside their time, in each row's provenance (accuracy/io/cost_model.py)
    rec = record(sum(row_cost(r, device.type) for r in results.made),
                 time.perf_counter() - t0, device.type, command="impact", cells=len(results.made),
                 work={"passes": len(results.made), "tokens": args.tokens, "models": split,
                       "attention": sorted({str(r.get("recipe")) for r in results.made})})
    for r in results.made:
        r["provenance"] = {**(r.get("provenance") or {}), PROVENANCE_KEY: [rec]}
    results.finish(results.kept + results.made, {},
                   lambda rows, path, _prov: atomic_write_text(path, "".join(_dumps(r) + "\n" for r in rows)))
    write_markdown(_section_files(out, out, args), md, command=command)
    print(f"wrote {out} and {md} in {time.perf_counter() - t0:.0f} s")
    return 0


# Cost model of --dry-run and of the plan (accuracy.io.shard.plan), in impact units (RATES["impact"]): one forward
# pass of n tokens costs n x (n + 2048) x (model file size / 1e8) units, the model's own layers and attention; a
# pass whose attention is swapped adds, per layer swapped, the cost the accuracy command gives the same attention
# (zyfa.accuracy.operator.cli.cell_cost on one layer's input, query heads x n x n scores: d + d_v units per score,
# or the truncating unit on the CPU where the recipe's emulation truncates, that one scaled there by
# IMPACT_TRUNCATING_SCALE), converted to impact units at the two commands' rates. A window cell is one pass with
# every layer swapped; a per-layer sweep cell one pass per swept layer with that layer swapped. Layers and heads are
# the registry's (capture.models.ModelSpec); for a model path (not loaded to plan) the guesses below.
LAYERS_GUESS = 24
HEADS_GUESS = 16
HEAD_DIM_GUESS = 64


def pass_cost(model: str, attention: str | None, n_tokens: int, swapped_layers: int, device_type: str = "cpu",
              *, kernel: bool = False) -> float:
    """The estimated cost of one forward pass of ``model`` over ``n_tokens`` with ``attention`` (a recipe spec, or
    with ``kernel`` a real implementation's name; None: the model's own) in ``swapped_layers`` of its layers, on a
    ``device_type`` device. A real implementation adds its attention at the plain unit (the accuracy command costs
    a kernel's row so)."""
    spec = MODELS.get(model)
    size = spec.file_size / 1e8 if spec else 1.0
    forward = float(n_tokens * (n_tokens + 2048) * size)
    if attention is None or swapped_layers == 0:
        return forward
    shape = layer_shape(model, n_tokens)
    return forward + swapped_layers * attention_seconds(shape, attention, device_type, kernel=kernel) * \
        units_per_second("impact", device_type)


def attention_seconds(shape: dict, attention: str, device_type: str = "cpu", *, kernel: bool = False,
                      scale_truncating: bool = True) -> float:
    """The estimated seconds of one layer's swapped attention on an input of ``shape``: the accuracy command's cost
    of it at its rate, without the accuracy row's fixed cost (a layer's attention call computes no references and
    no metrics); a truncating recipe's (:meth:`zyfa.recipes.Recipe.truncated_gemms`) scaled by
    :data:`~zyfa.accuracy.io.cost_model.IMPACT_TRUNCATING_SCALE` on a device type that has one (unless
    ``scale_truncating`` is off: the unscaled estimate the scale is fitted against)."""
    units = attention_cost(shape, None if kernel else attention, device_type)
    seconds = estimate_s("accuracy", device_type, units, 0)  # 0 cells: no accuracy row's fixed cost
    scale = IMPACT_TRUNCATING_SCALE.get(device_type)
    if scale_truncating and scale is not None and not kernel and any(get_recipe(attention).truncated_gemms()):
        return seconds * scale
    return seconds


def model_layers(model: str) -> int:
    """The decoder layers of ``model`` (the registry's; the guess for a model it lacks)."""
    spec = MODELS.get(model)
    return (spec and spec.layers) or LAYERS_GUESS


def layer_shape(model: str, n_tokens: int) -> dict:
    """One layer's attention input of ``model`` over ``n_tokens`` (its query heads and head dim; the guesses for a
    model the registry lacks)."""
    spec = MODELS.get(model)
    return {"batch": 1, "heads_q": (spec and spec.heads_q) or HEADS_GUESS, "seq_q": n_tokens, "seq_k": n_tokens,
            "head_dim": (spec and spec.head_dim) or HEAD_DIM_GUESS}


def impact_truncating_scale(paths) -> float:
    """The fit of :data:`~zyfa.accuracy.io.cost_model.IMPACT_TRUNCATING_SCALE` (CPU) from impact result files:
    the geometric mean over their window rows of a truncating recipe of the emulation's measured seconds (the
    row's ``seconds`` less its window's stock pass, ``seconds_stock``) over its unscaled estimate. ValueError
    (one line) without such a row."""
    logs = []
    for path in paths:
        for row in read_rows(path):
            if row.get("kind") != "impact_window" or row.get("implementation"):
                continue
            if not any(get_recipe(row["recipe"]).truncated_gemms()):
                continue
            unscaled = model_layers(row["model"]) * attention_seconds(layer_shape(row["model"], int(row["n_tokens"])),
                                                       row["recipe"], "cpu", scale_truncating=False)
            logs.append(math.log((row["seconds"] - row["seconds_stock"]) / unscaled))
    if not logs:
        raise ValueError("no window row of a truncating recipe to fit the impact scale from")
    return math.exp(sum(logs) / len(logs))


def cell_cost(cell: tuple, n_tokens: int, layers: list[int] | None, device_type: str = "cpu",
              kernels: Collection[str] = ()) -> float:
    """The estimated cost of one impact cell (:func:`zyfa.accuracy.impact.run.impact_cells`) on a ``device_type``
    device: :func:`pass_cost` of each of its passes. ``kernels``: the run's real implementations (a name there is
    a kernel's cell; any other is a recipe's, run by the emulator)."""
    kind, model, _w, attention = cell
    n_layers = model_layers(model)
    kernel = attention in kernels
    if kind == "window":
        return pass_cost(model, attention, n_tokens, n_layers, device_type, kernel=kernel)
    passes = len(layers) if layers else n_layers
    return passes * pass_cost(model, attention, n_tokens, 1, device_type, kernel=kernel)


def row_cost(row: dict, device_type: str = "cpu") -> float:
    """The estimated cost of the pass that made one impact row (a window row: every layer swapped; a per-layer
    row: its one layer), as :func:`cell_cost` counts it: what a run records beside its measured time."""
    model = row.get("model")
    swapped = 1 if row.get("kind") == "impact_layer" else model_layers(model)
    return pass_cost(model, row.get("recipe"), int(row["n_tokens"]), swapped, device_type,
                     kernel=bool(row.get("implementation")))


def impact_order(models, recipes, layer_recipes) -> Callable[[dict], tuple]:
    """The sort key of a single uninterrupted process's row order: model, window, its window rows (recipes then
    implementations, as asked) before its per-layer rows (recipe, then layer)."""
    def at(seq, v):
        return seq.index(v) if v in seq else len(seq)

    def key(row: dict) -> tuple:
        layer = row.get("kind") == "impact_layer"
        return (at(models, row.get("model")), int(row.get("window") or 0), layer,
                at(layer_recipes if layer else recipes, row.get("recipe")), int(row.get("layer") or 0))
    return key


def _impact_row(obj, where: str) -> dict:
    if not isinstance(obj, dict) or obj.get("kind") not in ("impact_window", "impact_layer"):
        raise ValueError(f"{where}: not a zyfa impact row (no impact kind)")
    return obj


def _read_out(path: Path) -> tuple[list[dict], dict]:
    rows = [r for r in read_rows(path) if r.get("kind") in ("impact_window", "impact_layer")]
    # impact rows carry their own provenance; a file without rows still resumes (nothing kept)
    return rows, (rows[0].get("provenance") if rows else None) or {"rows_of": str(path)}


def _dumps(row: dict) -> str:
    return json.dumps(row, default=json_default)


class _Sink:
    """``run_impact``'s sink: the done set, rows into the results file (a
    :class:`zyfa.accuracy.io.results_io.ResultsFile`,
    or one rank's file of an :class:`zyfa.accuracy.io.shard.ShardedResults`)."""

    def __init__(self, results, device: str):
        self.results, self.device, self.done = results, device, set(results.done)

    def write(self, row: dict) -> None:
        row = json.loads(json.dumps(row, default=json_default))
        row.setdefault("device", self.device)
        self.results.add(row)
        self.done.add(row_key(row))


def _main_sharded(args, models, recipes, impl_names, plugins, device, layer_recipes, layers, per_layer, out: Path,
                  md: Path, command) -> int:
    """One rank of a sharded ``zyfa impact`` (or its --dry-run): cells planned over the ranks, each rank's rows in
    ``<out>.partial/rank-K.jsonl``, rank 0 merging them into ``--out`` in a single process's order."""
    cells = impact_cells(models, recipes, impl_names, windows=args.windows, per_layer=per_layer,
                         layer_recipes=layer_recipes, layer_windows=args.layer_windows)
    costs = [cell_cost(c, args.tokens, layers, device.type, impl_names) for c in cells]
    if args.dry_run is not None:
        try:  # impact has no seconds per cell; were it given some, a sweep cell's rows (one per layer) need counting
            print_dry_run(args.dry_run, [" ".join(map(str, c)) for c in cells], costs,
                          [estimate_s("impact", device.type, c, 1) for c in costs])
        except OutputError as e:
            say(f"zyfa impact: error: {e}")
            return 2
        return 0
    dist = Dist()
    try:
        dist = launch(args.backend)
        device = rank_device(device, dist)
        results = ShardedResults.open(out, dist, force=args.force, resume=args.resume, reader=_read_out,
                                      need_bytes=1 << 20, key=row_key, check=_impact_row,
                                      dumps=_dumps,
                                      cells=list(zip(cells, costs, strict=True)))
    except OutputError as e:
        say(f"zyfa impact: error: {e}")
        give_up(dist, e)
        return 2

    def done(cell) -> bool:  # a window cell is done when its row is; a sweep cell is planned until run
        kind, m, w, r = cell
        return kind == "window" and impact_key("impact_window", m, r, w, None, args.tokens, args.text) in results.done

    todo = [i for i, c in enumerate(cells) if not done(c)]
    shares = plan([costs[i] for i in todo], dist.world)
    mine = {cells[todo[j]] for j in shares[dist.rank]}
    if dist.rank == 0 and results.done:
        say(f"zyfa impact: resuming {results.folder}: {len(results.done)} rows done")
    announce("zyfa impact: ", dist, shares, "cells")
    results.start({"command": command, "world_size": dist.world, "rank": dist.rank})
    sink = _Sink(results, str(device))
    t0 = time.perf_counter()
    try:
        run_impact(models, recipes, n_tokens=args.tokens, windows=args.windows, text=args.text, per_layer=per_layer,
                   layer_recipes=layer_recipes, layer_windows=args.layer_windows, layers=layers, out=out,
                   progress=not args.no_progress and dist.rank == 0, implementations=impl_names, plugins=plugins,
                   device=device, sink=sink, owns=lambda *c: c in mine)
    except (ValueError, OSError) as e:
        results.close()
        dist.close()
        say(f"zyfa impact: error: {e}; the rows finished so far are in {results.folder} (rerun with --resume)")
        return 2
    except KeyboardInterrupt:
        results.close()
        dist.close()
        say(f"zyfa impact: interrupted; the rows finished so far are in {results.folder} (rerun with --resume)")
        return 130
    made = dist.gather(sorted((list(k) for k in sink.done), key=repr))
    windows = [impact_key("impact_window", m, r, w, None, args.tokens, args.text) for kind, m, w, r in cells
               if kind == "window"]
    keys = list(dict.fromkeys([*windows, *(tuple(k) for ks in made for k in ks)]))  # a window row missing: refused

    def write(rows, path: Path, _prov) -> None:
        sharding = sharding_summary(dist, rows, time.perf_counter() - t0)
        for r in rows:
            if dist.grouped:
                r["provenance"] = {**(r.get("provenance") or {}), "sharding": sharding}
        atomic_write_text(path, "".join(json.dumps(r, default=json_default) + "\n" for r in rows))

    try:
        rows = results.finish(keys, lambda rows: {}, write,
                              order=impact_order(models, [*recipes, *impl_names], layer_recipes))
    except (RuntimeError, OutputError) as e:
        results.close()
        dist.close()
        say(f"zyfa impact: error: {e}")
        return 2
    dist.close()
    if rows is None:
        return 0
    write_markdown(_section_files(out, out, args), md, command=command)
    print(f"wrote {out} ({len(rows)} rows, {dist.world} rank(s)) and {md} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    p = argparse.ArgumentParser(prog="python -m zyfa.accuracy.impact.cli")
    add_arguments(p)
    sys.exit(main(p.parse_args()))
