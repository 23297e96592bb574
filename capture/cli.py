"""``zyfa capture``: capture Q/K/V from a real model into HDF5.

    zyfa capture --model smollm2 --text lee --tokens 8192 --out smollm2.h5 [--layers 0,5,29] [--heads 0,3]
                 [--window-index N] [--dtype fp32|bf16] [--overwrite] [--no-progress]
    zyfa capture --list                 # registry models and texts
    zyfa capture --sample [--out-dir datasets]   # regenerate the shipped sample (see capture/sample.py)

An interrupted capture resumes when the same command is run again. Exit codes: 0 ok, 2 bad input
(unknown model/text, context too long, mismatching existing file), 3 fetch or hash failure, 4 write failure.
"""

from __future__ import annotations

import argparse
import shlex
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="registry name (smollm2, gemma3, qwen25coder, qwen25coder-1.5b), a Hugging "
                        "Face model directory, a .gguf file, or a hub id")
    parser.add_argument("--text", default="lee",
                        help="text source: lee, shakespeare, pydoc, paulgraham, or a UTF-8 text file of your own "
                        "(default lee)")
    parser.add_argument("--tokens", type=int, default=2048, help="sequence length in tokens (default 2048)")
    parser.add_argument("--out", help="output HDF5 file")
    parser.add_argument("--layers", default=None, help="layers to capture, e.g. 0,5,29 or 0-3 (default all)")
    parser.add_argument("--heads", default=None, help="query heads to capture, e.g. 0,3 (default all); the "
                        "KV heads they use are stored with them")
    parser.add_argument("--window-index", type=int, default=0,
                        help="which capture window of the text (default 0); windows never overlap")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="dtype the model runs in and Q/K/V are stored in, exactly (default fp32)")
    parser.add_argument("--device-map", default=None, metavar="MAP",
                        help="spread the model over devices through accelerate (a model larger than one GPU): "
                             "auto, balanced, sequential, one device (cpu, cuda:1), or a JSON object (inline or a "
                             ".json file) of module name -> device; default: the whole model on the CPU")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing different capture")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--list", action="store_true", help="list registry models and texts, then exit")
    parser.add_argument("--sample", action="store_true", help="regenerate the shipped sample captures")
    parser.add_argument("--out-dir", default="datasets", help="with --sample: where to write (default datasets)")


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this capture (recorded in the file)."""
    parts = ["zyfa", "capture", "--model", args.model, "--text", args.text, "--tokens", str(args.tokens)]
    for flag, value in (("--layers", args.layers), ("--heads", args.heads)):
        if value is not None:
            parts += [flag, value]
    if args.window_index:
        parts += ["--window-index", str(args.window_index)]
    if getattr(args, "device_map", None) is not None:
        parts += ["--device-map", args.device_map]
    parts += ["--dtype", args.dtype, "--out", args.out]
    return " ".join(shlex.quote(p) for p in parts)


def check_args(args: argparse.Namespace) -> None:
    """The flags' checks that need no heavy import (run by the ``zyfa`` dispatch before :func:`main`): the model
    name, the text, the token count and window, the layer and head lists; ``--list`` and ``--sample`` take none."""
    from zyfa.capture.models import MODELS, check_context, check_model_names
    from zyfa.capture.pipeline import parse_index_list
    from zyfa.capture.text import check_text

    if args.list or args.sample or not args.model or not args.out:
        return
    check_model_names([args.model])
    check_text(args.text)
    if args.tokens < 1:
        raise ValueError(f"--tokens must be >= 1, got {args.tokens}")
    if args.window_index < 0:
        raise ValueError(f"--window-index must be >= 0, got {args.window_index}")
    if args.model in MODELS:
        check_context(args.tokens, MODELS[args.model].max_context, args.model)
    parse_index_list(args.layers, "--layers")
    parse_index_list(args.heads, "--heads")


def main(args: argparse.Namespace) -> int:
    from zyfa.capture.fetch import FetchError
    from zyfa.capture.models import MODELS, ContextTooLongError, NoAttentionInterfaceError, UnknownModelError
    from zyfa.capture.pipeline import parse_index_list, run_capture
    from zyfa.capture.store import CaptureFormatError, CaptureMismatchError, CaptureWriteError
    from zyfa.capture.text import TEXTS, UnknownTextError, WindowOutOfRangeError

    if args.list:
        for name, spec in MODELS.items():
            print(f"{name:16s} {spec.description}; context {spec.max_context}; {spec.packages}")
        for name, src in TEXTS.items():
            print(f"{name:16s} {src.description}")
        return 0
    if args.sample:
        from zyfa.capture.sample import make_sample

        make_sample(args.out_dir, progress=not args.no_progress)
        return 0
    if not args.model or not args.out:
        print("zyfa capture: --model and --out are required (or --list / --sample)", file=sys.stderr)
        return 2
    command = _command(args)
    try:
        from zyfa.capture.models import parse_device_map

        device_map = parse_device_map(getattr(args, "device_map", None))
        res = run_capture(
            args.model, args.text, args.tokens, args.out,
            layers=parse_index_list(args.layers, "--layers"), heads=parse_index_list(args.heads, "--heads"),
            window_index=args.window_index, dtype=args.dtype, overwrite=args.overwrite,
            progress=not args.no_progress, command=command, device_map=device_map,
        )
    except (UnknownModelError, UnknownTextError, ContextTooLongError, WindowOutOfRangeError,
            NoAttentionInterfaceError, CaptureMismatchError, CaptureFormatError, ValueError) as e:
        print(f"zyfa capture: {e}", file=sys.stderr)
        return 2
    except FetchError as e:
        print(f"zyfa capture: {e}", file=sys.stderr)
        return 3
    except CaptureWriteError as e:
        print(f"zyfa capture: {e}", file=sys.stderr)
        return 4
    skipped = f", {len(res.layers_skipped)} already complete (resumed)" if res.layers_skipped else ""
    timing = ", ".join(f"{k} {v:.1f}" for k, v in res.seconds.items())
    print(f"wrote {res.path}: layers {res.layers_written}{skipped}; {timing}")
    return 0
