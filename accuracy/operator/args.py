"""What the ``zyfa accuracy`` command line names, parsed and checked: the recipes, the table's columns, ``--out``,
the inputs (described without drawing or reading anything, so :func:`zyfa.accuracy.operator.cli.check_args` refuses
a bad one before torch is imported; then drawn or read), the real implementations and plug-ins, the ablations, and
the command that reproduces a run.

Exposed: ``DEFAULT_RECIPES``, ``DEFAULT_COLUMNS``, ``OTHER_COLUMNS``, ``GAUSSIAN_DEFAULTS``,
``parse_recipe_flag(spec)``, ``parse_columns(spec)``, ``check_out(out)``, ``plan_inputs(args)``,
``load_inputs(args, device)``, ``implementations_of(args)``, ``ablations_of(args)``, ``ablation_tagger(args)``,
``repro_command(args)``.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from zyfa.accuracy.implementations.names import kernel_namespace
from zyfa.accuracy.inputs.gaussian_spec import GaussianSpec
from zyfa.accuracy.inputs.synthetic_spec import is_synthetic, parse_synthetic, split_inputs
from zyfa.accuracy.io.command import UsageError
from zyfa.accuracy.scoring.metric_names import ERROR_METRICS

from zyfa.plugins import wall_flags, wall_options
from zyfa.recipe_spec import get_recipe, parse_recipes

__all__ = ["DEFAULT_COLUMNS", "DEFAULT_RECIPES", "GAUSSIAN_DEFAULTS", "OTHER_COLUMNS", "ablation_tagger",
           "ablations_of", "check_out", "implementations_of", "load_inputs", "parse_columns", "parse_recipe_flag",
           "plan_inputs", "repro_command"]

DEFAULT_RECIPES = "zyfa,ck,aiter,aiter-triton,triton-amd,fa3,bf16"
# Table columns by default: row keys of accuracy.operator.runner.run_accuracy
DEFAULT_COLUMNS = ("deq_rel_l2", "orig_rel_l2", "deq_sqnr_db", "deq_max_abs_err", "deq_row_rel_err_p99",
                   "deq_lse_max_abs_err", "p_flushed_frac", "time_emulate_s")
# Columns --metrics may name, besides deq_/orig_ + ERROR_METRICS (a bare metric name means both)
OTHER_COLUMNS = ("has_nan", "nonfinite_frac", "p_flushed_frac", "time_emulate_s", "time_ref_deq_s", "real_emu_ratio",
                 "real_vs_emu_rel_l2", "status", "time_real_s",
                 "time_ref_orig_s", "ref_deq_source", "recipe_short", "deq_zero_ref_rows_max_abs_err",
                 "orig_zero_ref_rows_max_abs_err")
GAUSSIAN_DEFAULTS = {"seq": 4096, "head_dim": 128, "heads": "4", "batch": 1, "std": 1.0, "outliers": 0.0,
                     "outlier_scale": 10.0, "outlier_tensors": "qk", "dtype": "bf16"}


def parse_recipe_flag(spec: str):
    if spec.strip() == "none":
        return []
    return parse_recipes(spec)


def implementations_of(args: argparse.Namespace) -> list:
    """Built-ins of --implementations, then the --kernel plug-ins (a kernel that does not load fails its rows)."""
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.implementations.plugins import load_plugins
    from zyfa.accuracy.implementations.registry import get_implementation, parse_implementations

    if args.kernel_recipe and not args.kernel:
        raise UsageError("--kernel-recipe pairs a --kernel with a recipe; no --kernel given")
    impls = parse_implementations(args.implementations)
    have = {i.name for i in impls}
    for a in ablations_of(args):
        if kernel_namespace(a.base) is not None:
            impls += [i for i in (get_implementation(s) for s in a.specs) if i.name not in have]
    impls += load_plugins(args.kernel or [], args.kernel_recipe or [], **wall_options(args))
    return impls


def ablations_of(args: argparse.Namespace) -> list:
    """--ablate IMPL FIELD=V1,V2 -> :class:`accuracy.scoring.ablation.Ablation` each (SpecError, one line, for a bad
    one)."""
    # lazy: imports numpy; the command's flags are checked before it
    from zyfa.accuracy.scoring.ablation import parse_ablation

    return [parse_ablation(base, assignment) for base, assignment in (getattr(args, "ablate", None) or [])]


def ablation_tagger(args: argparse.Namespace):
    """A function adding a row's ablation group (ablation_base, _field, _value) to it, in place; rows are matched
    by the name they carry (the recipe's canonical name on --platform, or the implementation's)."""
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.implementations.registry import get_implementation
    from zyfa.accuracy.scoring.ablation import ablation_tags

    ablations = ablations_of(args)
    names = {}
    for a in ablations:
        for s in a.specs:
            if kernel_namespace(s) is not None:
                names[s] = get_implementation(s).name
            else:
                r = get_recipe(s)
                names[s] = r.on(args.platform).name if getattr(args, "platform", None) is not None else r.name
    tags = ablation_tags(ablations, names)

    def tag(row: dict) -> None:
        row.update(tags.get(row.get("implementation") or row.get("recipe"), {}))

    return tag


def parse_columns(spec: str | None) -> list[str]:
    if not spec:
        return list(DEFAULT_COLUMNS)
    known = {f"{p}{m}" for p in ("deq_", "orig_") for m in ERROR_METRICS} | set(OTHER_COLUMNS)
    cols: list[str] = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        expanded = [f"deq_{name}", f"orig_{name}"] if name in ERROR_METRICS else [name]
        for col in expanded:
            if col not in known:
                raise UsageError(f"unknown metric {name!r}; known: {', '.join(ERROR_METRICS)}, "
                                 f"or a column such as {', '.join(OTHER_COLUMNS[:5])}")
            if col not in cols:
                cols.append(col)
    if not cols:
        raise UsageError("--metrics names no metric")
    return cols


def check_out(out: str | None) -> Path | None:
    if out is None:
        return None
    path = Path(out)
    if path.suffix.lower() not in (".jsonl", ".csv"):
        raise UsageError(f"--out must end in .jsonl or .csv, got {out!r}")
    if path.parent != Path("") and not path.parent.exists():
        raise FileNotFoundError(f"--out: directory {path.parent} does not exist")
    if path.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name ending in .jsonl or .csv")
    return path


def _int_list(spec: str, flag: str) -> list[int]:
    try:
        return [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated integers, got {spec!r}") from None


def plan_inputs(args: argparse.Namespace):
    """The inputs the flags name, checked without drawing or reading anything (no torch: :func:`check_args`):
    (GaussianSpec or None, SyntheticSpecs, capture files)."""
    items = split_inputs(args.inputs)
    if not items:
        raise UsageError("--inputs is empty")
    synthetic = [parse_synthetic(s) for s in items if is_synthetic(s)]
    files = [s for s in items if s != "gaussian" and not is_synthetic(s)]
    gaussian = len(files) + len(synthetic) < len(items)
    if not gaussian:
        gaussian_only = [k for k in GAUSSIAN_DEFAULTS if k != "heads"] + ["kv_heads", "head_dim_v", "window",
                                                                          "seq_q", "seq_k"]
        given = [f"--{k.replace('_', '-')}" for k in gaussian_only if getattr(args, k, None) is not None]
        if args.causal:
            given.append("--causal")
        if given:
            raise UsageError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to Gaussian inputs; "
                             "captures and synthetic inputs carry their own shape and mask (captures: use "
                             "--max-tokens, --layers, --heads; synthetic: its KEY=VALUE list)")
    if not files and (args.layers is not None or args.max_tokens is not None):
        raise UsageError("--layers and --max-tokens apply to capture inputs (--inputs path/to/capture.h5)")
    if not files and not gaussian and args.heads is not None:
        raise UsageError("--heads applies to Gaussian inputs and captures; a synthetic input takes heads=N")
    if files and gaussian and args.heads is not None:
        raise UsageError("--heads means a head count for Gaussian inputs and head indices for captures; "
                         "run them separately")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    for f in files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"no such input file: {f} (--inputs takes 'gaussian' or capture .h5 files)")
    spec = None
    if gaussian:
        opts = {k: (getattr(args, k) if getattr(args, k) is not None else d) for k, d in GAUSSIAN_DEFAULTS.items()}
        try:
            heads = int(opts["heads"])
        except ValueError:
            raise UsageError(f"for Gaussian inputs --heads is the number of query heads, got {opts['heads']!r}") \
                from None
        seq_q, seq_k = getattr(args, "seq_q", None), getattr(args, "seq_k", None)
        if args.seq is not None and (seq_q is not None or seq_k is not None):
            raise UsageError("--seq sets queries and keys alike; give either --seq or --seq-q/--seq-k")
        seq = seq_k if seq_k is not None else (seq_q if seq_q is not None else opts["seq"])
        spec = GaussianSpec(
            batch=opts["batch"], heads_q=heads, heads_kv=args.kv_heads if args.kv_heads is not None else heads,
            seq=seq, seq_q=seq_q if seq_q is not None and seq_q != seq else None,
            head_dim=opts["head_dim"], head_dim_v=args.head_dim_v, causal=args.causal,
            window=args.window, std=opts["std"], outlier_frac=opts["outliers"],
            outlier_scale=opts["outlier_scale"], outlier_tensors=opts["outlier_tensors"], seed=args.seed,
            dtype=opts["dtype"])
    return spec, synthetic, files


def load_inputs(args: argparse.Namespace, device="cpu") -> list:
    # lazy: imports torch, numpy; the command's flags are checked before it
    from zyfa.accuracy.inputs.attention_input import capture_inputs, make_gaussian
    from zyfa.accuracy.inputs.synthetic import make_synthetic
    from zyfa.accuracy.io.device import check_memory

    spec, synthetic, files = plan_inputs(args)
    gaussian = spec is not None
    inputs = []
    if gaussian:
        d_v = spec.head_dim_v or spec.head_dim
        check_memory({"batch": spec.batch, "heads_q": spec.heads_q, "heads_kv": spec.heads_kv, "seq_q": spec.s_q,
                      "seq_k": spec.seq, "head_dim": spec.head_dim, "head_dim_v": d_v}, device,
                     what="the Gaussian input")
        inputs.append(make_gaussian(spec))
    for spec in synthetic:
        check_memory({"batch": spec.batch, "heads_q": spec.heads, "heads_kv": spec.n_kv, "seq_q": spec.seq,
                      "seq_k": spec.seq, "head_dim": spec.head_dim, "head_dim_v": spec.head_dim}, device,
                     what=f"the synthetic input {spec.name}")
        inputs.append(make_synthetic(spec))
    layers = _int_list(args.layers, "--layers") if args.layers is not None else None
    heads = _int_list(args.heads, "--heads") if (files and args.heads is not None) else None
    for f in files:
        inputs.extend(capture_inputs(f, layers=layers, heads=heads, max_tokens=args.max_tokens, device=device))
    return inputs


def repro_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (flags at their defaults left out)."""
    parts = ["zyfa", "accuracy", "--inputs", args.inputs, "--recipes", args.recipes]
    if getattr(args, "platform", None) is not None:
        parts += ["--platform", args.platform]
    for flag in ("seq", "seq_q", "seq_k", "head_dim", "head_dim_v", "heads", "kv_heads", "batch", "std", "outliers",
                 "outlier_scale", "outlier_tensors", "dtype", "window", "layers", "max_tokens"):
        v = getattr(args, flag)
        if v is not None:
            parts += [f"--{flag.replace('_', '-')}", str(v)]
    if args.causal:
        parts.append("--causal")
    if args.seed:
        parts += ["--seed", str(args.seed)]
    if args.device != "auto":
        parts += ["--device", args.device]
    if getattr(args, "implementations", None):
        parts += ["--implementations", args.implementations]
    for base, assignment in getattr(args, "ablate", None) or []:
        parts += ["--ablate", base, assignment]
    for spec in getattr(args, "kernel", None) or []:
        parts += ["--kernel", spec]
    for name in getattr(args, "kernel_recipe", None) or []:
        parts += ["--kernel-recipe", name]
    parts += wall_flags(args)
    return shlex.join(parts)
