"""The study's inputs (the shipped captures and the Gaussian inputs of each mode) and its run: the accuracy
runner, then per-input features and per-head errors added to the rows.

Exposed: ``STUDY_RECIPES``, ``QUICK_RECIPES``, ``HEAD_RECIPES``, ``DEFAULT_IMPACT``, ``DEFAULT_LONGCTX``,
``DEFAULT_CLIFFS``, ``LONG_CAPTURE_COMMANDS``,
``gaussian_specs(...)``, ``default_captures(folder)``, ``study_inputs(...)``, ``refusals(...)``,
``planned_keys(...)``, ``run_study(...)``, ``log(msg)``.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import sys
import time
from pathlib import Path

from zyfa.recipe_spec import get_recipe
from zyfa.recipes import QUANT_SCHEMES
from zyfa.rotation import rotation_matrix

# every FP8 recipe: zyfa and its ablations, the peers, zyfa with other quantizations of Q/K/V (issue 14), and bf16
STUDY_RECIPES = ("zyfa", "zyfa-hopper", "zyfa-exp2", "zyfa-fp32sum", "zyfa-noscale", "zyfa-pow2fixed",
                 "zyfa-tilescale", "ck", "ck-blockscale", "aiter", "aiter-triton", "triton-amd", "fa3", "sage2",
                 "cudnn-fp8", *QUANT_SCHEMES[1:], "bf16")
QUICK_RECIPES = ("zyfa", "zyfa-exp2", "zyfa-fp32sum", "zyfa-noscale", "ck", "aiter", "fa3", "bf16")
# recipes whose error per head is computed for the captures' heatmaps (the emulator runs again for these), and
# the quantization schemes, whose per-head errors give the quantization section its samples (the heatmap figure
# shows the first six in the study's order: zyfa, ck, aiter, fa3 and two schemes)
HEAD_RECIPES = ("zyfa", "ck", "aiter", "fa3", *QUANT_SCHEMES[1:])
HEAD_DIMS = ((64, None), (128, None), (256, None), (192, 128))
OUTLIERS = {"outlier_frac": 0.001, "outlier_scale": 10.0}  # FA3 paper's N(0,1) + N(0,100)·Bernoulli(0.001)
# the committed model-impact results (zyfa impact; one file per concurrent run), rendered into the report
DEFAULT_IMPACT = "reports/impact/results*.jsonl"
# the committed long-context results (zyfa longctx) and length-cliff results (zyfa cliffs), for ``--long``
DEFAULT_LONGCTX = "reports/longctx/results*.jsonl"
DEFAULT_CLIFFS = "reports/cliffs/results.jsonl"


def log(msg: str) -> None:
    """One progress line on stderr; under torchrun (``WORLD_SIZE`` > 1) it names the rank."""
    rank = f" rank {os.environ.get('RANK')}" if int(os.environ.get("WORLD_SIZE", 1) or 1) > 1 else ""
    print(f"[zyfa study {time.strftime('%H:%M:%S')}{rank}] {msg}", file=sys.stderr, flush=True)


def gaussian_specs(mode: str, max_seq: int | None = None, name_filter: str | None = None) -> list:
    """The Gaussian inputs of a study mode ("default", "quick" or "long"), lengths capped at ``max_seq``, only
    those whose name matches the regular expression ``name_filter`` (e.g. ``d128-causal``)."""
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.inputs.attention_input import GaussianSpec

    def spec(seq, hd=128, hdv=None, **kw):
        return GaussianSpec(heads_q=1, heads_kv=1, seq=seq, head_dim=hd, head_dim_v=hdv, **kw)

    if mode == "quick":
        specs = [spec(s) for s in (256, 512, 1024)]
        specs += [spec(512, hd, hdv, **kw) for hd, hdv in HEAD_DIMS for kw in ({}, {"causal": True}, OUTLIERS)]
    elif mode == "long":  # causal like decoder prefill; one non-causal and one outlier input at 32K
        specs = [spec(s, causal=True) for s in (4096, 8192, 16384, 32768)]
        specs += [spec(32768, hd, hdv, causal=True) for hd, hdv in HEAD_DIMS]
        specs += [spec(32768), spec(32768, causal=True, **OUTLIERS)]
    else:
        specs = [spec(s) for s in (1024, 2048, 4096)]
        specs += [spec(1024, hd, hdv, **kw) for hd, hdv in HEAD_DIMS for kw in ({}, {"causal": True}, OUTLIERS)]
    if max_seq is not None:
        specs = [dataclasses.replace(s, seq=min(s.seq, max_seq)) for s in specs]
    out, seen = [], set()
    for s in specs:
        if s.name not in seen and (name_filter is None or re.search(name_filter, s.name)):
            seen.add(s.name)
            out.append(s)
    return out


# The long study's captures (not shipped: 32 MB; made locally, about 3-5 minutes each on 2 CPU cores). Gemma 3:
# its global layer 5 only, so that the three files fit the GPU machine's 64 MiB transfer with the repository.
LONG_CAPTURE_COMMANDS = (
    "zyfa capture --model smollm2 --text lee --tokens 8192 --layers 14 --heads 0 "
    "--out datasets/long/smollm2-lee-8192.h5",
    "zyfa capture --model qwen25coder --text pydoc --tokens 8192 --layers 8 --heads 0 "
    "--out datasets/long/qwen25coder-pydoc-8192.h5",
    "zyfa capture --model gemma3 --text shakespeare --tokens 8192 --layers 5 --heads 0 "
    "--out datasets/long/gemma3-shakespeare-8192-L5.h5",
)


def default_captures(folder: str = "datasets") -> list[Path]:
    """The captures in ``<folder>/*.h5`` (default: the shipped samples; ``datasets/long`` for ``--long``), in the
    current folder, else next to the package."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        found = sorted(Path(p) for p in glob.glob(str(root / folder / "*.h5")))
        if found:
            return found
    return []


def study_inputs(mode: str, captures: list[Path], *, max_seq: int | None = None,
                 max_tokens: int | None = None, name_filter: str | None = None) -> list:
    """Capture inputs (one per layer, all captured heads) then Gaussian inputs."""
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.inputs.attention_input import capture_inputs, make_gaussian

    inputs = []
    for path in captures:
        got = capture_inputs(path, max_tokens=max_tokens)
        log(f"capture {path}: {len(got)} layers, {got[0].shape['heads_q']} query heads, "
             f"{got[0].shape['seq_q']} tokens")
        inputs += got
    inputs += [make_gaussian(s) for s in gaussian_specs(mode, max_seq, name_filter)]
    return inputs


def refusals(inputs: list, recipes: list[str]) -> dict[tuple[str, str], str]:
    """{(input name, recipe): why} for the pairs a recipe refuses before running: a Q/K rotation needs a
    power-of-two head dim (:mod:`zyfa.rotation`), so a rotating recipe leaves out MLA's 192; a recipe that names a
    vendor kernel is applied only where the vendor's dispatcher runs that kernel (:mod:`zyfa.dispatch`: ``aiter``
    leaves out head dims 64 and 256)."""
    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.dispatch import route_input

    out = {}
    for r in recipes:
        for inp in inputs:
            decision = route_input(r, inp)
            if decision is not None and decision.refused is not None:
                out[(inp.name, r)] = decision.refused
    for r in recipes:
        recipe = get_recipe(r)
        if recipe.qk_rotation == "none":
            continue
        for inp in inputs:
            try:
                rotation_matrix(int(inp.shape["head_dim"]), recipe.qk_rotation, seed=recipe.rotation_seed)
            except ValueError as e:
                out[(inp.name, r)] = str(e)
    return out


def planned_keys(inputs: list, recipes: list[str], implementations=(), refused: dict | None = None) -> list[tuple]:
    """The row keys (:func:`zyfa.accuracy.operator.runner.input_key`) a study of ``inputs`` makes, in its order: per
    input, the
    recipes it takes (not in ``refused``, default :func:`refusals`), then the real implementations available
    here."""
    # lazy: imports torch, scipy; the command's flags are checked before it
    from zyfa.accuracy.operator.runner import input_key

    refused = refusals(inputs, recipes) if refused is None else refused
    usable = [i for i in implementations if i.available()[0]]
    return [k for inp in inputs for k in [input_key(inp, r) for r in recipes if (inp.name, r) not in refused]
            + [input_key(inp, i.recipe, i.name) for i in usable]]


def run_study(inputs: list, recipes: list[str], *, device: str = "auto", progress: bool = True,
              head_recipes=HEAD_RECIPES, extra_provenance: dict | None = None, implementations=(),
              rows_file=None):
    """Run the accuracy runner, then add per-input features and (captures) per-head errors to the rows.

    ``implementations``: real kernels (:mod:`zyfa.accuracy.implementations.registry`) run beside the recipes; those not
    available on this machine are listed with the reason in the provenance (``implementations_unavailable``).
    ``rows_file`` (an :class:`zyfa.accuracy.io.results_io.ResultsFile`, optional): the accuracy rows are appended to it
    as they finish, and the rows it already holds (a resumed study) are not run again; features and per-head errors
    are then computed for every row, so a resumed study's rows equal an uninterrupted one's. A sharded rank's
    ``rows_file`` (:class:`accuracy.io.shard.RankRows`) makes only that rank's share; the ranks other than 0 return None
    once their rows are merged (rank 0 computes the features of every row)."""
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.inputs.features import head_errors, input_features
    from zyfa.accuracy.io.device import resolve_device

    # lazy: kept off the refusal path, which imports only what checking the flags needs
    from zyfa.accuracy.io.results_io import ResultRows

    # lazy: imports torch, scipy; the command's flags are checked before it
    from zyfa.accuracy.operator.runner import run_accuracy

    dev = resolve_device(device)
    t0 = time.perf_counter()
    refused = refusals(inputs, recipes)
    takes = {inp.name: [r for r in recipes if (inp.name, r) not in refused] for inp in inputs}
    keys = planned_keys(inputs, recipes, implementations, refused)
    usable = [i for i in implementations if i.available()[0]]
    if rows_file is not None:
        rows_file.check_plan(keys)
    resumed = rows_file is not None and rows_file.resumed_from is not None
    log(f"accuracy: {len(inputs)} inputs x {len(recipes)} recipes on {dev}"
        + (f" ({len(rows_file.done)} rows done before, resumed)" if resumed else "")
        + (f"; {len(refused)} (input, recipe) pairs the recipe refuses are left out" if refused else ""))
    # one runner call per set of recipes the inputs take (one call when no recipe refuses an input), in input order
    groups: list[tuple[list, list]] = []
    for inp in inputs:
        if groups and groups[-1][1] == takes[inp.name]:
            groups[-1][0].append(inp)
        else:
            groups.append(([inp], takes[inp.name]))
    started: list[dict] = []
    plan = {"recipes": list(recipes), "inputs": [inp.name for inp in inputs]}  # the whole run's, not a group's

    def on_start(prov: dict) -> None:
        if not started and rows_file is not None:
            prov.update(plan)
            rows_file.start(prov)  # resumed: prov lists the earlier segments (in place), so the rows' copy does too
        started.append(prov)

    run_id = rows_file.run_id if rows_file is not None else None
    parts = []
    shown = [(g, n) for g, n in groups if n or usable]
    for gi, (group, names) in enumerate(shown, 1):
        # each runner call has its own bar: labelled with its part of the study, so a second bar is not a mystery
        label = (f"accuracy {gi}/{len(shown)}: {len(group)} input{'s' if len(group) != 1 else ''} x "
                 f"{len(names)} recipe{'s' if len(names) != 1 else ''}" if len(shown) > 1 else "accuracy")
        part = run_accuracy(group, names, device=dev, progress=progress, progress_label=label,
                            skip=rows_file.skip if rows_file is not None else (), on_start=on_start,
                            on_row=rows_file.add if rows_file is not None else None, run_id=run_id,
                            implementations=implementations)
        run_id = run_id or part.provenance.get("run_id")
        parts.append(part)
    rows = ResultRows([r for part in parts for r in part], provenance={**(started[0] if started else {}), **plan})
    if rows_file is not None:
        prov = rows.provenance  # this segment's; resumed, it lists the earlier ones
        ordered = rows_file.rows_in_order(keys)
        rows_file.close()
        if ordered is None:  # a sharded run's other rank: its rows are merged on rank 0, which goes on alone
            return None
        rows = ResultRows(ordered, provenance=prov)
    t_acc = time.perf_counter() - t0
    log(f"accuracy done in {t_acc:.0f} s; features and per-head errors")
    t1 = time.perf_counter()
    per_head = [r for r in recipes if r in head_recipes]
    by_input: dict[str, dict] = {}
    for i, inp in enumerate(inputs, 1):
        extra = dict(input_features(inp, device=dev))
        heads: dict = {}
        mine = [r for r in rows if r["input"] == inp.name and not r.get("real")]
        if inp.meta.get("source") != "capture" or not per_head or any("deq_rel_l2_heads" in r for r in mine):
            pass
        elif inp.shape["heads_q"] == 1:  # one head: its error is the input's
            heads = {r["recipe"]: {"deq_rel_l2_heads": [r["deq_rel_l2"]], "orig_rel_l2_heads": [r["orig_rel_l2"]]}
                     for r in mine if r["recipe"] in per_head}
        else:
            heads = head_errors(inp, [r for r in per_head if (inp.name, r) not in refused], device=dev)
        by_input[inp.name] = (extra, heads)
        if progress:
            log(f"features {i}/{len(inputs)}: {inp.name}")
    for r in rows:
        extra, heads = by_input[r["input"]]
        r.update(extra)
        if not r.get("real"):  # per-head errors are the recipes' (a real row shares its paired recipe's name)
            r.update(heads.get(r["recipe"], {}))
    t_feat = time.perf_counter() - t1
    rows.provenance.update({"study_accuracy_s": round(t_acc, 1), "study_features_s": round(t_feat, 1),
                            **(extra_provenance or {})})
    if refused:
        by_recipe: dict[str, list[str]] = {}
        for (i, r), why in refused.items():
            by_recipe.setdefault(f"`{r}` ({why})", []).append(i)
        rows.provenance.setdefault("study_notes", []).append(
            "Not run, refused by the recipe: " + "; ".join(f"{r} on {', '.join(ins)}" for r, ins in by_recipe.items())
            + ".")
    return rows
