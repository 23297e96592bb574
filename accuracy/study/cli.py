"""``zyfa study``: the one-command study (see :mod:`zyfa.accuracy.study` for what it runs and writes).

Exposed: ``add_arguments(parser)``, ``main(args) -> int``, ``impact_files(spec)``.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import shutil
import time
import uuid
from pathlib import Path

import torch
from zyfa.accuracy.implementations.base import unavailable_lines
from zyfa.accuracy.implementations.plugins import load_plugins
from zyfa.accuracy.implementations.registry import parse_implementations
from zyfa.accuracy.io.cost_model import add_record, estimate_s
from zyfa.accuracy.io.device import resolve_device
from zyfa.accuracy.io.results_io import row_key, run_provenances, write_results
from zyfa.accuracy.io.shard import (
    Dist,
    RankRows,
    ShardedResults,
    SharedOutputError,
    announce,
    dry_run_world,
    give_up,
    launch,
    print_dry_run,
    rank_device,
    say,
)
from zyfa.accuracy.operator.cli import key_cost, read_finished
from zyfa.accuracy.operator.table import failed_rows_status
from zyfa.accuracy.report.document import save_screenshot
from zyfa.accuracy.report.results import load_results
from zyfa.accuracy.study import run as study_run
from zyfa.accuracy.study.compose import REPO_ROOT, find_bench, load_report_inputs, render, split_paths
from zyfa.accuracy.study.report_cli import report_command
from zyfa.accuracy.study.run import (
    DEFAULT_CLIFFS,
    DEFAULT_IMPACT,
    DEFAULT_LONGCTX,
    LONG_CAPTURE_COMMANDS,
    QUICK_RECIPES,
    STUDY_RECIPES,
    gaussian_specs,
    log,
    planned_keys,
    run_study,
    study_inputs,
)
from zyfa.accuracy.study.study_args import DEFAULT_OUT
from zyfa.capture.fetch import sha256_file

from zyfa.outputs import OutputError, StagedFolder
from zyfa.plugins import wall_flags, wall_options
from zyfa.recipe_spec import parse_recipes

# The accuracy rows of a study in progress, kept in its <out>.partial/ folder as they finish.
ROWS_NAME = "accuracy_rows.jsonl"
# Free space a study needs for its folder (results, report, plots), checked before it starts.
STUDY_BYTES = 64 << 20


# Files a study writes into its folder; any other file of an existing folder (e.g. a README) is kept when the
# folder is replaced, these are not (an old screenshot never stays beside a new report).
GENERATED = ("results.jsonl", "report.md", "report.html", "report_screenshot.png")


def _generated(name: str) -> bool:
    return name in GENERATED or (name.startswith("fig_") and name.endswith(".png")) or name.endswith(".partial")


def _on_gpu(device: str) -> bool:
    return device != "cpu" and torch.cuda.is_available()


def _command(args: argparse.Namespace) -> str:
    parts = ["zyfa", "study"]
    if args.quick:
        parts.append("--quick")
    if args.long:
        parts.append("--long")
    for flag in ("captures", "recipes", "platform", "max_seq", "gaussian_filter", "max_tokens", "bench", "impact",
                 "longctx", "cliffs"):
        v = getattr(args, flag)
        if v is not None:
            parts += [f"--{flag.replace('_', '-')}", str(v)]
    if args.device != "auto":
        parts += ["--device", args.device]
    if args.implementations is not None:
        parts += ["--implementations", args.implementations]
    for spec in args.kernel or []:
        parts += ["--kernel", spec]
    for name in args.kernel_recipe or []:
        parts += ["--kernel-recipe", name]
    parts += wall_flags(args)
    if args.out is not None:
        parts += ["--out", args.out]
    return shlex.join(parts)


def longctx_files(spec: str | None, long: bool) -> tuple[list[Path], Path | None]:
    """(long-context result files, cliff file) of ``--longctx`` / ``--cliffs``: unset -> the committed ones with
    ``--long`` (those present), none otherwise; ``none`` -> none."""
    if spec == "none" or (spec is None and not long):
        return [], None
    if spec is None:
        return [Path(p) for p in sorted(glob.glob(str(REPO_ROOT / DEFAULT_LONGCTX)))], None
    found = [Path(p) for part in spec.split(",") if part.strip() for p in (sorted(glob.glob(part.strip()))
             if any(c in part for c in "*?[") else [part.strip()])]
    missing = [str(p) for p in found if not p.is_file()]
    if missing or not found:
        raise FileNotFoundError(f"--longctx: no such file: {', '.join(missing) or spec}")
    return found, None


def cliffs_file(spec: str | None, long: bool) -> Path | None:
    if spec == "none" or (spec is None and not long):
        return None
    if spec is None:
        p = REPO_ROOT / DEFAULT_CLIFFS
        return p if p.is_file() else None
    if not Path(spec).is_file():
        raise FileNotFoundError(f"--cliffs: no such file: {spec}")
    return Path(spec)


def _impact_default() -> list[Path]:
    """The committed impact results of the repository this package sits in (not of the current directory)."""
    found = [Path(p) for p in sorted(glob.glob(str(REPO_ROOT / DEFAULT_IMPACT)))]
    return [Path(_shown(p)) for p in sorted(found, key=lambda p: (p.name != "results.jsonl", p.name))]


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _paths(spec: str) -> list[Path]:
    return [Path(p) for p in split_paths([spec])]


def impact_files(spec: str | None) -> list[Path]:
    """The impact result files of ``--impact``: ``none`` -> none; unset -> :data:`DEFAULT_IMPACT` (those present,
    ``results.jsonl`` first), found in the repository whatever the current directory; else the named files (globs
    expanded), which must exist."""
    if spec is not None and spec.strip().lower() == "none":
        return []
    if spec is None:
        return _impact_default()
    paths = _paths(spec)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing or not paths:
        raise FileNotFoundError(f"--impact: no such file: {', '.join(missing) or spec}")
    return paths


def _open_stage(out: Path, dist: Dist, *, force: bool, resume: bool) -> tuple[StagedFolder | None, Path, bool]:
    """(the StagedFolder on rank 0 else None, the stage folder, resumed): rank 0 opens it (lock, refuse / force /
    resume) and tells the other ranks; a refusal raises the same :class:`SharedOutputError` on every rank."""
    stage, answer = None, None
    if dist.rank == 0:
        try:
            stage = StagedFolder.open(out, force=force, resume=resume, need_bytes=STUDY_BYTES)
            answer = {"stage": str(stage.stage), "resumed": stage.resumed}
        except OutputError as e:
            answer = {"error": str(e)}
    answer = dist.broadcast(answer)
    if "error" in answer:
        raise SharedOutputError(answer["error"])
    return stage, Path(answer["stage"]), bool(answer["resumed"])


def _dry_run(args: argparse.Namespace, mode: str, captures, max_tokens, recipes, impls) -> int:
    """``--dry-run [N]``: the accuracy rows per rank with estimated seconds; writes nothing."""
    dry_run_world(args.dry_run)  # a bad N is refused on every rank
    if int(os.environ.get("RANK", 0) or 0) != 0:
        return 0
    inputs = study_inputs(mode, captures, max_seq=args.max_seq, max_tokens=max_tokens,
                          name_filter=args.gaussian_filter)
    by_name = {inp.name: inp for inp in inputs}
    keys = planned_keys(inputs, recipes, impls)
    device_type = resolve_device(args.device).type
    costs = [key_cost(by_name[k[0]].shape, k, device_type=device_type) for k in keys]
    labels = [f"{k[0]} {k[3] or k[2]}" for k in keys]
    print_dry_run(args.dry_run, labels, costs, [estimate_s("study", device_type, c, 1) for c in costs])
    return 0


def main(args: argparse.Namespace) -> int:
    """Run the study; 0 on success, 2 on bad input (one line on stderr), 3 when real-kernel rows failed or are
    nonconforming (after the study is written; ``--allow-failed``: 0)."""
    t0 = time.perf_counter()
    mode = "quick" if args.quick else "long" if args.long else "default"
    out = Path(args.out or DEFAULT_OUT[mode])
    notes = []
    stage = rows_file = None
    dist = Dist()
    try:
        if args.captures is not None and args.captures.strip().lower() == "none":
            captures = []
        elif args.captures is not None:
            captures = _paths(args.captures)
            missing = [str(p) for p in captures if not p.is_file()]
            if missing or not captures:
                raise FileNotFoundError(f"--captures: no such file: {', '.join(missing) or args.captures}")
        elif args.long:
            captures = study_run.default_captures("datasets/long")
            if not captures:
                raise FileNotFoundError("--long: no captures in datasets/long/ and no --captures; make them with:\n  "
                                        + "\n  ".join(LONG_CAPTURE_COMMANDS))
        else:
            captures = study_run.default_captures()
        if not captures:
            notes.append("No capture files were used (no `datasets/*.h5` found, or `--captures none`): this study "
                         "ran on Gaussian inputs only.")
            log("no capture files: Gaussian inputs only")

        base = QUICK_RECIPES if args.quick else STUDY_RECIPES
        recipes = [r.name for r in parse_recipes(args.recipes or ",".join(base))]
        if args.recipes is None and args.long and not _on_gpu(args.device):
            slow = [r.name for r in parse_recipes(";".join(recipes)) if r.accumulator == "matrix_unit"]
            if slow:
                recipes = [r for r in recipes if r not in slow]
                base = tuple(recipes)
                notes.append(f"Left out on CPU: {', '.join(slow)}. They model Hopper's FP8 tensor-core accumulator "
                             "product by product (zyfa.emulator_tile.mma), which takes hours at 32K tokens on a CPU; "
                             "they run when a GPU is present, or when named with `--recipes`.")
                log(f"CPU: leaving out {', '.join(slow)} (Hopper accumulator emulation; name them in --recipes "
                     "to run them)")
        if getattr(args, "platform", None) is not None:
            base = tuple(r.on(args.platform).name for r in parse_recipes(";".join(base)))
            recipes = [r.on(args.platform).name for r in parse_recipes(";".join(recipes))]
        max_tokens = args.max_tokens if args.max_tokens is not None else (512 if args.quick else None)
        if args.gaussian_filter is not None:
            re.compile(args.gaussian_filter)

        if args.kernel_recipe and not args.kernel:
            raise ValueError("--kernel-recipe pairs a --kernel with a recipe; no --kernel given")
        impls = parse_implementations(args.implementations if args.implementations is not None else "all")
        impls += load_plugins(args.kernel or [], args.kernel_recipe or [], **wall_options(args))
        if not captures and not gaussian_specs(mode, args.max_seq, args.gaussian_filter):
            raise ValueError("no inputs: no captures and --gaussian-filter keeps no Gaussian input")
        bench = split_paths([args.bench]) if args.bench else find_bench()
        impact_paths = impact_files("none" if args.long and args.impact is None else args.impact)
        longctx_paths, _ = longctx_files(args.longctx, args.long)
        cliffs_path = cliffs_file(args.cliffs, args.long)
        extra = load_report_inputs(bench, impact_paths, longctx_paths, cliffs_path)
        if args.dry_run is not None:
            return _dry_run(args, mode, captures, max_tokens, recipes, impls)
        # every argument is checked; now the output (before any work): writable, free space, refuse/force/resume,
        # decided by rank 0 alone (it holds the folder's lock) and told to the others
        dist = launch(args.backend)
        stage, stage_dir, resumed = _open_stage(out, dist, force=args.force, resume=args.resume)
        inputs = study_inputs(mode, captures, max_seq=args.max_seq, max_tokens=max_tokens,
                              name_filter=args.gaussian_filter)

        device = rank_device(resolve_device(args.device), dist)
        shapes = {inp.name: inp.shape for inp in inputs}
        shared = ShardedResults.open(stage_dir / ROWS_NAME, dist, resume=True, reader=read_finished, flag="--out",
                                     cells=[*((i.name, list(i.shape)) for i in inputs), *recipes,
                                            *((i.name, i.available()[0]) for i in impls)])
        run_id = dist.broadcast(uuid.uuid4().hex[:12])  # this segment's, shared by the ranks (a resume too)
        rows_file = RankRows(shared, lambda key: key_cost(shapes[key[0]], key, device_type=device.type), str(device),
                             run_id,
                             on_plan=(lambda shares: announce("zyfa study: ", dist, shares, "rows"))
                             if dist.grouped else None)
        full = [g.name for g in gaussian_specs(mode)]
        ran = {i.name for i in inputs}
        left = [n for n in full if n not in ran]
        if left or set(recipes) != set(base):
            notes.append(f"This run narrows the {mode} configuration of `zyfa study`: "
                         + (f"Gaussian inputs left out: {', '.join(left)}. " if left else "")
                         + (f"Recipes: {', '.join(recipes)} (of {', '.join(base)})." if set(recipes) != set(base)
                            else ""))
    except (ValueError, FileNotFoundError, OSError, re.error) as e:
        if stage is not None and not stage.resumed and not any(stage.stage.iterdir()):
            stage.stage.rmdir()  # made by this run, still empty: leave nothing behind
        if stage is not None:
            stage.release()
        say(f"zyfa study: error: {e}")
        give_up(dist, e)
        return 2

    command = _command(args)
    prov = {"study_command": command, "study_mode": mode, "study_notes": notes,
            "study_captures": ", ".join(f"{p.name} (sha256 {sha256_file(p)[:16]})" for p in captures) or "none",
            "study_impact": "; ".join(f"{f['path']} (sha256 {f['sha256']}, {f['rows']} rows)"
                                      for f in (extra.impact[1] if extra.impact else [])) or "none"}
    if resumed and dist.rank == 0:
        log(f"resuming the interrupted study in {stage_dir}: {len(rows_file.done)} rows done")
    done_before = set(rows_file.done)
    try:
        rows = run_study(inputs, recipes, device=str(device), progress=not args.no_progress and dist.rank == 0,
                         extra_provenance=prov, implementations=impls, rows_file=rows_file)
    except (ValueError, RuntimeError) as e:  # an output error (disk full) or a resumed folder of another study
        rows_file.close()
        if stage is not None:
            stage.release()
        dist.close()
        say(f"zyfa study: error: {e}; the rows finished so far are in {stage_dir} (rerun with --resume)")
        return 2
    except KeyboardInterrupt:
        rows_file.close()
        if stage is not None:
            stage.release()
        dist.close()
        say(f"zyfa study: interrupted; the rows finished so far are in {stage_dir} (rerun with --resume)")
        return 130
    if rows is not None:
        rows.provenance.update(rows_file.sharding(rows))
    dist.close()
    if rows is None:  # a rank other than 0: its rows are merged, rank 0 writes the study
        return 0

    for line in unavailable_lines(rows.provenance.get("implementations_unavailable") or {}):
        log(line)
    if not dist.grouped:  # one process: the --dry-run estimate of the rows it made beside their time

        made = [r for r in rows if row_key(r) not in done_before]
        add_record(rows.provenance, rows_file.provenance,
                   sum(key_cost(shapes[r["input"]], row_key(r), device_type=device.type) for r in made),
                   rows.provenance["study_accuracy_s"], device.type, command="study", cells=len(made))
    runs = run_provenances(rows.provenance)  # a resumed study: every segment, each where it ran
    where = " and ".join(dict.fromkeys(f"`{p.get('device')}` ({p.get('device_name')})" for p in runs))
    rows.provenance["study_notes"].append(
        f"Accuracy ran on {where}" + (f" (a resumed run of {len(runs)} segments)" if len(runs) > 1 else "")
        + f": {len(inputs)} inputs x {len(recipes)} recipes; the runner took "
        f"{rows.provenance['study_accuracy_s']:.0f} s and the input features and per-head errors "
        f"{rows.provenance['study_features_s']:.0f} s.")
    # the report and its results are written together into the stage, which then replaces --out as a whole
    staged = stage.stage / "results.jsonl"
    try:
        write_results(rows, staged)
        title = ("ZYFA long-context study: FP8 attention error at 8K-32K tokens" if args.long else
                 "ZYFA study: FP8 attention error on model captures and Gaussian inputs")
        rep_cmd = report_command([str(out / "results.jsonl")], str(out), bench, title,
                                 shot=bool(shutil.which("chromium")), impact=[str(p) for p in impact_paths],
                                 longctx=[str(p) for p in longctx_paths], cliffs=str(cliffs_path) if cliffs_path
                                 else None)
        _, paths = render(load_results([staged]), stage.stage, extra, command=rep_cmd, title=title,
                          this_run=(staged.name,))
        rc = save_screenshot(paths["html"]) if shutil.which("chromium") else 0
        removed = stage.commit(keep=lambda name: not _generated(name))
        (out / ROWS_NAME).unlink(missing_ok=True)  # the merged accuracy rows: results.jsonl holds them
    except (ValueError, OSError) as e:
        stage.release()
        say(f"zyfa study: error: {e}; the finished rows are in {stage.stage} (rerun with --resume)")
        return 2
    log(f"wrote {len(rows)} rows, report.md and report.html to {out}; total {time.perf_counter() - t0:.0f} s")
    if "report_screenshot.png" in removed:
        log("no screenshot this time (no Chromium): the old report_screenshot.png, which showed the previous "
            "report, was removed")
    if rc:
        return rc

    return failed_rows_status(rows, "zyfa study", allow=getattr(args, "allow_failed", False))
