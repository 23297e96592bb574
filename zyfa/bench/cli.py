"""``zyfa bench``'s command (:mod:`zyfa.bench` says what it measures): its arguments, the loop over shapes, lengths,
masks and inputs (each case run by :func:`zyfa.bench.cases.run_case`), and the result files (JSON, and the Markdown
of :mod:`zyfa.bench.table`), rewritten atomically after every shape.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import sys

from zyfa.bench.args import REFUSAL, SHAPES, add_arguments, check_args, output_stem, parse_kernel_arg
from zyfa.bench.cases import bench_heads, captured_qkv, gaussian_qkv, run_case
from zyfa.bench.table import render, to_markdown
from zyfa.capture.version import git_label
from zyfa.outputs import atomic_write_text
from zyfa.peers.names import canonical_name
from zyfa.peers.registry import PEERS
from zyfa.timing import NvmlClock, cuda_timer


def command_line(argv: list[str]) -> str:
    """The command as a shell takes it back (each argument quoted where it needs to be, e.g. the ';' of a recipe
    list), from ``sys.argv`` of ``zyfa bench ...`` or of ``python -m zyfa.bench ...``."""
    return "zyfa bench " + shlex.join(argv[2:] if argv[1:2] == ["bench"] else argv[1:])


def _versions():
    v = {"python": platform.python_version()}
    for mod in ("torch", "triton", "cudnn"):
        try:
            m = __import__(mod)
            v[mod] = getattr(m, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            v[mod] = f"unavailable ({type(e).__name__})"
    try:
        import torch

        v["cuda"] = torch.version.cuda
        v["cudnn_backend"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        pass
    return v


def _find_capture(spec):
    import glob

    if spec == "none":
        return None
    if spec != "auto":
        return spec
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "datasets")
    files = sorted(glob.glob(os.path.join(root, "*.h5")))
    return files[0] if files else None


def load_kernel(spec: str):
    """The user's kernel, imported in this process and its signature checked (zyfa.plugins)."""
    from zyfa.plugins import PluginError, check_signature, load_callable, parse_spec

    try:
        fn, _where = load_callable(parse_spec(spec))
        check_signature(spec, fn)
    except PluginError as e:
        raise ValueError(str(e)) from None
    return fn


def main(args) -> int:
    if args.render:
        try:
            print("wrote", render(args.render, args.ours))
        except (OSError, ValueError) as err:
            print(f"zyfa bench --render: {err}", file=sys.stderr)
            return 2
        return 0
    try:
        stem = output_stem(args.out)
    except ValueError as err:
        print(f"{REFUSAL}{err}", file=sys.stderr)
        return 2
    existing = [p for p in (stem + ".json", stem + ".md") if os.path.exists(p)]
    if existing and not args.overwrite:
        print(f"zyfa bench: {existing[0]} exists; choose another --out or pass --overwrite", file=sys.stderr)
        return 2
    try:
        check_args(args)  # as the zyfa dispatch does, for a caller of main() alone
        plugins = [parse_kernel_arg(k) for k in args.kernel]
        peers = [] if args.peers == "none" else [canonical_name(p) for p in args.peers.split(",") if p]
        timed = [n for n, p in PEERS.items() if p.prepare]
        unknown = [p for p in peers if p not in timed]
        if unknown:
            raise ValueError(f"--peers: unknown {', '.join(unknown)}; known: {', '.join(timed)}")
    except ValueError as err:
        print(f"{REFUSAL}{err}", file=sys.stderr)
        return 2
    from zyfa.kernels.attention_fp8 import kernel_plan
    from zyfa.recipe_spec import get_recipe, split_spec_list

    recipes = split_spec_list(args.recipes)
    cute_recipes = split_spec_list(args.cute_recipes)
    other = recipes if args.recipes_other == "same" else split_spec_list(args.recipes_other)
    try:  # every spec the kernel honours, before the GPU is looked for
        for spec in dict.fromkeys([*recipes, *other]):
            kernel_plan(get_recipe(spec))
    except ValueError as err:
        print(f"{REFUSAL}{err}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("zyfa bench needs a CUDA GPU (Hopper); none found", file=sys.stderr)
        return 2
    shapes = [s for s in args.shapes.split(",") if s]
    seqlens = [int(s) for s in args.seqlens.split(",") if s]
    causals = {"both": [False, True], "true": [True], "false": [False]}[args.causal]
    config = json.loads(args.config) if args.config else None
    timer = cuda_timer(args.warmup, args.rep)
    clock = NvmlClock if NvmlClock.available() else None
    rows = []
    try:
        kernels = [(name, load_kernel(spec)) for name, spec in plugins]
    except ValueError as err:
        print(f"{REFUSAL}{err}", file=sys.stderr)
        return 2
    timing = dict(repeats=args.repeats, timer=timer, clock=clock, config=config)

    def log(row):
        keys = ("input", "s", "d_qk", "causal", "impl", "recipe", "tflops", "ms_min", "ms_max", "rel_l2_vs_sdpa_bf16",
                "sm_clock_mhz", "rotation_ms", "rotation_matmul_ms", "error")
        print(" ".join(f"{k}={row[k]:.4g}" if isinstance(row.get(k), float) else f"{k}={row.get(k)}"
                       for k in keys if k in row), flush=True)

    date = _dt.datetime.now(_dt.timezone.utc)
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    meta = {"command": command_line(sys.argv),
            "date": date.isoformat(timespec="seconds"), "git_commit": git_label(), "versions": _versions(),
            "device": torch.cuda.get_device_name(), "inputs_note": "Gaussian N(0,1) bf16 q, k, v (batch 1)",
            "nvml": clock is not None, "repeats": args.repeats, "warmup_ms": args.warmup, "rep_ms": args.rep,
            "kernels": {name: spec for name, spec in plugins}, "cute_recipes": cute_recipes}

    def write():
        atomic_write_text(stem + ".json", json.dumps({"meta": meta, "rows": rows}, indent=1))
        atomic_write_text(stem + ".md", to_markdown(meta, rows, args.ours))

    for shape in shapes:
        d_qk, d_v = SHAPES[shape]
        h = bench_heads(shape, args.hidden)
        for s in seqlens:
            inputs = gaussian_qkv(1, h, h, s, d_qk, d_v)
            for causal in causals:
                run_case(rows, label="gaussian", inputs=inputs, causal=causal,
                         recipes=recipes if shape == "hd128" else other, peers=peers, plugins=kernels,
                         cute_recipes=cute_recipes, log=log, **timing)
            del inputs
            torch.cuda.empty_cache()
            write()
    cap = _find_capture(args.captured)
    inputs_note = "Gaussian N(0,1) bf16 q, k, v (batch 1)"
    if cap:
        try:
            for s in seqlens:
                q, k, v, rec = captured_qkv(cap, s)
                for causal in causals:
                    recs = ["zyfa-hopper", "fa3"]
                    run_case(rows, label=f"captured:{os.path.basename(cap)}", inputs=(q, k, v), causal=causal,
                             recipes=recs, peers=[], log=log, **timing)
                    gq, gk, gv = gaussian_qkv(*q.shape[:2], k.shape[1], s, q.shape[3], v.shape[3], seed=1)
                    run_case(rows, label="gaussian-like-capture", inputs=(gq, gk, gv), causal=causal,
                             recipes=recs, peers=[], log=log, **timing)
                    write()
            inputs_note += (f"; captured: first layer of {os.path.basename(cap)} ({rec.name}) tiled along the "
                            "sequence to each length, against Gaussian inputs of the same shape")
        except Exception as e:  # noqa: BLE001
            inputs_note += f"; captured inputs not timed ({type(e).__name__}: {str(e)[:200]})"
    else:
        inputs_note += "; no captured HDF5 slice under datasets/*.h5, so no captured-input timing"
    meta["inputs_note"] = inputs_note
    write()
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="zyfa bench")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
