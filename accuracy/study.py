"""``zyfa study``: the one-command study: captures + Gaussian inputs -> accuracy -> report.

    zyfa study                      # the shipped sample captures (datasets/*.h5) + Gaussian inputs
    zyfa study --quick              # a smaller version (about a minute on 2 CPU cores)
    zyfa study --long --captures smollm2-8k.h5,gemma3-8k.h5,qwen-8k.h5 --out reports/study-long

Default (the embedded study): every shipped sample capture (``datasets/*.h5``, all their layers and heads)
and Gaussian inputs: head dim 128 at 1K, 2K and 4K tokens; head dims 64, 128, 256 and MLA 192/128 at 1K
tokens, plain, causal and with FA3-style outliers in Q/K; one head each (22 inputs with the three samples).
Every named FP8 recipe runs (ZYFA, its five ablations, the AMD and NVIDIA peers) plus bf16 (330 runs).
Measured on 2 idle CPU cores (AMD EPYC, 2026-11-30): 66 s wall, 122 s of CPU time; on the H200 17 s. Its CPU and
GPU results agree within 0.2% (rel-L2 of every input and recipe). ``--device auto`` picks CUDA when present.
``--long`` on a CPU leaves out the recipes that emulate Hopper's FP8 accumulator product by product (fa3, sage2,
cudnn-fp8, zyfa-hopper: hours at 32K tokens) unless named with ``--recipes``.

``--long``: the committed configuration: the captures given by ``--captures`` (the three models at 8K tokens
or more, made locally with ``zyfa capture``) and Gaussian inputs up to 32K tokens: head dim 128 causal at
4K, 8K, 16K and 32K; head dims 64, 256 and MLA 192/128 causal at 32K; head dim 128 at 32K non-causal and
causal with outliers. On a GPU it takes minutes. On 2 CPU cores a 32K causal input costs about 2-4 minutes
per recipe (a non-causal one twice that): the whole configuration takes hours, so ``--recipes``,
``--max-seq`` and ``--gaussian-filter REGEX`` (on the input names) narrow it; reports/study-long/ was made
that way (its command is at the top of its report).

The report gets the model-impact section of ``zyfa impact`` from ``reports/impact/results*.jsonl`` when present
(``--impact FILES`` names others, ``--impact none`` leaves it out; ``--long`` leaves it out unless named); their
paths and sha256 go into the provenance (``study_impact``) and the regenerating command.

Writes ``<out>/results.jsonl`` (the runner's rows plus per-input features and per-head errors, with a
provenance header) and the report (``report.md``, ``fig_*.png``, ``report.html``, and with Chromium installed
``report_screenshot.png``, checked for console errors). Progress goes to stderr.
Exposed: ``add_arguments(parser)``, ``main(args) -> int``, ``study_inputs(...)``, ``run_study(...)``.
"""

from __future__ import annotations

import argparse
import glob
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

STUDY_RECIPES = ("zyfa", "zyfa-exp2", "zyfa-fp32sum", "zyfa-noscale", "zyfa-pow2fixed", "zyfa-tilescale", "ck",
                 "ck-blockscale", "aiter", "aiter-triton", "triton-amd", "fa3", "sage2", "cudnn-fp8", "bf16")
QUICK_RECIPES = ("zyfa", "zyfa-exp2", "zyfa-fp32sum", "zyfa-noscale", "ck", "aiter", "fa3", "bf16")
# recipes whose error per head is computed for the captures' heatmaps (the emulator runs again for these)
HEAD_RECIPES = ("zyfa", "ck", "aiter", "fa3")
HEAD_DIMS = ((64, None), (128, None), (256, None), (192, 128))
OUTLIERS = {"outlier_frac": 0.001, "outlier_scale": 10.0}  # FA3 paper's N(0,1) + N(0,100)·Bernoulli(0.001)
# the committed model-impact results (zyfa impact; one file per concurrent run), rendered into the report
DEFAULT_IMPACT = "reports/impact/results*.jsonl"


def _log(msg: str) -> None:
    print(f"[zyfa study {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def gaussian_specs(mode: str, max_seq: int | None = None, name_filter: str | None = None) -> list:
    """The Gaussian inputs of a study mode ("default", "quick" or "long"), lengths capped at ``max_seq``, only
    those whose name matches the regular expression ``name_filter`` (e.g. ``d128-causal``)."""
    from accuracy.inputs import GaussianSpec

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
        import dataclasses

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
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        found = sorted(Path(p) for p in glob.glob(str(root / folder / "*.h5")))
        if found:
            return found
    return []


def study_inputs(mode: str, captures: list[Path], *, max_seq: int | None = None,
                 max_tokens: int | None = None, name_filter: str | None = None) -> list:
    """Capture inputs (one per layer, all captured heads) then Gaussian inputs."""
    from accuracy.inputs import capture_inputs, make_gaussian

    inputs = []
    for path in captures:
        got = capture_inputs(path, max_tokens=max_tokens)
        _log(f"capture {path}: {len(got)} layers, {got[0].shape['heads_q']} query heads, "
             f"{got[0].shape['seq_q']} tokens")
        inputs += got
    inputs += [make_gaussian(s) for s in gaussian_specs(mode, max_seq, name_filter)]
    return inputs


def run_study(inputs: list, recipes: list[str], *, device: str = "auto", progress: bool = True,
              head_recipes=HEAD_RECIPES, extra_provenance: dict | None = None):
    """Run the accuracy runner, then add per-input features and (captures) per-head errors to the rows."""
    from accuracy.features import head_errors, input_features
    from accuracy.runner import resolve_device, run_accuracy

    dev = resolve_device(device)
    t0 = time.perf_counter()
    _log(f"accuracy: {len(inputs)} inputs x {len(recipes)} recipes on {dev}")
    rows = run_accuracy(inputs, recipes, device=dev, progress=progress)
    t_acc = time.perf_counter() - t0
    _log(f"accuracy done in {t_acc:.0f} s; features and per-head errors")
    t1 = time.perf_counter()
    per_head = [r for r in recipes if r in head_recipes]
    by_input: dict[str, dict] = {}
    for i, inp in enumerate(inputs, 1):
        extra = dict(input_features(inp, device=dev))
        heads: dict = {}
        mine = [r for r in rows if r["input"] == inp.name]
        if inp.meta.get("source") != "capture" or not per_head or any("deq_rel_l2_heads" in r for r in mine):
            pass
        elif inp.shape["heads_q"] == 1:  # one head: its error is the input's
            heads = {r["recipe"]: {"deq_rel_l2_heads": [r["deq_rel_l2"]], "orig_rel_l2_heads": [r["orig_rel_l2"]]}
                     for r in mine if r["recipe"] in per_head}
        else:
            heads = head_errors(inp, per_head, device=dev)
        by_input[inp.name] = (extra, heads)
        if progress:
            _log(f"features {i}/{len(inputs)}: {inp.name}")
    for r in rows:
        extra, heads = by_input[r["input"]]
        r.update(extra)
        r.update(heads.get(r["recipe"], {}))
    t_feat = time.perf_counter() - t1
    rows.provenance.update({"study_accuracy_s": round(t_acc, 1), "study_features_s": round(t_feat, 1),
                            **(extra_provenance or {})})
    factor = _flush_count_factor()
    if factor != 1.0:
        for r in rows:
            if isinstance(r.get("p_flushed_frac"), (int, float)):
                r["p_flushed_frac"] = r["p_flushed_frac"] / (r["batch"] * r["heads_q"])
        rows.provenance["p_flushed_frac_note"] = (
            "divided by batch x heads: this emulator counts flushed probabilities over (batch, head, row, key) "
            "but the unmasked ones over (row, key) only")
    return rows


def _flush_count_factor() -> float:
    """1.0 if the emulator's ``p_flushed_frac`` is a fraction; b*h if it counts the denominator once per tile.

    Checked on a tiny input: the same head twice must flush the same fraction as once.
    """
    import torch

    from zyfa.emulator import emulate

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 64, 64, generator=gen) * 4 for _ in range(3))
    one = emulate(q, k, v, "aiter").stats.get("p_flushed_frac", 0.0)
    two = emulate(q.repeat(1, 2, 1, 1), k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), "aiter").stats.get(
        "p_flushed_frac", 0.0)
    return 1.0 if one == 0 or abs(two / one - 1.0) < 1e-6 else two / one


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help="output folder (default reports/study, or reports/study-long "
                        "with --long)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a smaller study (shorter inputs, fewer recipes)")
    mode.add_argument("--long", action="store_true",
                      help="the committed long-context study (captures: datasets/long/*.h5 unless --captures)")
    parser.add_argument("--captures", default=None,
                        help="capture .h5 files, comma-separated or a glob (default: datasets/*.h5, with --long "
                        "datasets/long/*.h5; 'none': Gaussian inputs only)")
    parser.add_argument("--recipes", default=None, help="comma-separated recipes (default: every FP8 recipe + bf16)")
    parser.add_argument("--max-seq", type=int, default=None, help="cap the Gaussian sequence lengths")
    parser.add_argument("--gaussian-filter", default=None, metavar="REGEX",
                        help="keep only the Gaussian inputs whose name matches, e.g. 'd128-causal' or '^$' for none")
    parser.add_argument("--max-tokens", type=int, default=None, help="use the first N tokens of each capture")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (default: cuda when present)")
    parser.add_argument("--bench", default=None, help="benchmark JSON files for the speed tables "
                        "(default: the latest reports/bench_*.json when present)")
    parser.add_argument("--impact", default=None,
                        help="zyfa impact result files for the report's model-impact section, comma-separated or "
                        f"a glob (default: {DEFAULT_IMPACT} when present, none with --long; 'none': no impact section)")
    parser.add_argument("--no-progress", action="store_true", help="no progress output")


def _on_gpu(device: str) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()


def _command(args: argparse.Namespace) -> str:
    parts = ["zyfa", "study"]
    if args.quick:
        parts.append("--quick")
    if args.long:
        parts.append("--long")
    for flag in ("captures", "recipes", "max_seq", "gaussian_filter", "max_tokens", "bench", "impact"):
        v = getattr(args, flag)
        if v is not None:
            parts += [f"--{flag.replace('_', '-')}", str(v)]
    if args.device != "auto":
        parts += ["--device", args.device]
    if args.out is not None:
        parts += ["--out", args.out]
    return shlex.join(parts)


def _paths(spec: str) -> list[Path]:
    out = []
    for s in (x.strip() for x in spec.split(",")):
        if s:
            out += [Path(p) for p in sorted(glob.glob(s))] if any(c in s for c in "*?[") else [Path(s)]
    return out


def impact_files(spec: str | None) -> list[Path]:
    """The impact result files of ``--impact``: ``none`` -> none; unset -> :data:`DEFAULT_IMPACT` (those present,
    ``results.jsonl`` first); else the named files (globs expanded), which must exist."""
    if spec is not None and spec.strip().lower() == "none":
        return []
    if spec is None:
        found = [Path(p) for p in sorted(glob.glob(DEFAULT_IMPACT))]
        return sorted(found, key=lambda p: (p.name != "results.jsonl", p.name))
    paths = _paths(spec)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing or not paths:
        raise FileNotFoundError(f"--impact: no such file: {', '.join(missing) or spec}")
    return paths


def main(args: argparse.Namespace) -> int:
    """Run the study; 0 on success, 2 on bad input (one line on stderr)."""
    from accuracy import report

    t0 = time.perf_counter()
    mode = "quick" if args.quick else "long" if args.long else "default"
    out = Path(args.out or ("reports/study-long" if args.long else "reports/study"))
    notes = []
    try:
        if args.captures is not None and args.captures.strip().lower() == "none":
            captures = []
        elif args.captures is not None:
            captures = _paths(args.captures)
            missing = [str(p) for p in captures if not p.is_file()]
            if missing or not captures:
                raise FileNotFoundError(f"--captures: no such file: {', '.join(missing) or args.captures}")
        elif args.long:
            captures = default_captures("datasets/long")
            if not captures:
                raise FileNotFoundError("--long: no captures in datasets/long/ and no --captures; make them with:\n  "
                                        + "\n  ".join(LONG_CAPTURE_COMMANDS))
        else:
            captures = default_captures()
        if not captures:
            notes.append("No capture files were used (no `datasets/*.h5` found, or `--captures none`): this study "
                         "ran on Gaussian inputs only.")
            _log("no capture files: Gaussian inputs only")
        from zyfa.recipes import parse_recipes

        base = QUICK_RECIPES if args.quick else STUDY_RECIPES
        recipes = [r.name for r in parse_recipes(args.recipes or ",".join(base))]
        if args.recipes is None and args.long and not _on_gpu(args.device):
            slow = [r.name for r in parse_recipes(",".join(recipes)) if r.accumulator == "hopper_fp8"]
            if slow:
                recipes = [r for r in recipes if r not in slow]
                base = tuple(recipes)
                notes.append(f"Left out on CPU: {', '.join(slow)}. They model Hopper's FP8 tensor-core accumulator "
                             "product by product (zyfa.emulator._mma), which takes hours at 32K tokens on a CPU; "
                             "they run when a GPU is present, or when named with `--recipes`.")
                _log(f"CPU: leaving out {', '.join(slow)} (Hopper accumulator emulation; name them in --recipes "
                     "to run them)")
        max_tokens = args.max_tokens if args.max_tokens is not None else (512 if args.quick else None)
        if args.gaussian_filter is not None:
            re.compile(args.gaussian_filter)
        inputs = study_inputs(mode, captures, max_seq=args.max_seq, max_tokens=max_tokens,
                              name_filter=args.gaussian_filter)
        if not inputs:
            raise ValueError("no inputs: no captures and --gaussian-filter keeps no Gaussian input")
        full = [g.name for g in gaussian_specs(mode)]
        ran = {i.name for i in inputs}
        left = [n for n in full if n not in ran]
        if left or set(recipes) != set(base):
            notes.append(f"This run narrows the {mode} configuration of `zyfa study`: "
                         + (f"Gaussian inputs left out: {', '.join(left)}. " if left else "")
                         + (f"Recipes: {', '.join(recipes)} (of {', '.join(base)})." if set(recipes) != set(base)
                            else ""))
        bench = report._split([args.bench]) if args.bench else sorted(glob.glob("reports/bench_*.json"))[-1:]
        bench_rows = report.load_bench(bench)
        impact_paths = impact_files("none" if args.long and args.impact is None else args.impact)
        impact = report.load_impact(impact_paths) if impact_paths else None
    except (ValueError, FileNotFoundError, OSError, re.error) as e:
        print(f"zyfa study: error: {e}", file=sys.stderr)
        return 2

    from accuracy.inputs import file_sha256
    from accuracy.runner import write_results

    command = _command(args)
    prov = {"study_command": command, "study_mode": mode, "study_notes": notes,
            "study_captures": ", ".join(f"{p.name} (sha256 {file_sha256(p)[:16]})" for p in captures) or "none",
            "study_impact": "; ".join(f"{f['path']} (sha256 {f['sha256']}, {f['rows']} rows)"
                                      for f in (impact[1] if impact else [])) or "none"}
    rows = run_study(inputs, recipes, device=args.device, progress=not args.no_progress, extra_provenance=prov)
    rows.provenance["study_notes"].append(
        f"Accuracy ran on `{rows.provenance.get('device')}` ({rows.provenance.get('device_name')}): "
        f"{len(inputs)} inputs x {len(recipes)} recipes; the runner took {rows.provenance['study_accuracy_s']:.0f} s "
        f"and the input features and per-head errors {rows.provenance['study_features_s']:.0f} s.")
    results = out / "results.jsonl"
    write_results(rows, results)
    _log(f"wrote {len(rows)} rows to {results}")

    title = ("ZYFA long-context study: FP8 attention error at 8K-32K tokens" if args.long else
             "ZYFA study: FP8 attention error on model captures and Gaussian inputs")
    res = report.load_results([results])
    rep_cmd = report.report_command([results], str(out), bench, title, shot=bool(shutil.which("chromium")),
                                    impact=[str(p) for p in impact_paths])
    doc = report.build_report(res, bench=bench_rows, command=rep_cmd, title=title, impact=impact)
    paths = report.write_report(doc, out)
    _log(f"wrote {paths['markdown']} and {paths['html']}; total {time.perf_counter() - t0:.0f} s")
    if shutil.which("chromium"):
        rc = report._screenshot(paths["html"])
        if rc:
            return rc
    return 0
