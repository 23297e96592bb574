"""Run the hd128 sensitivity plan: each technique-1 variant the plan runs, on the capture's layers, with the
per-head errors the claims table pairs per layer x head.

    python -m zyfa.accuracy.study.hd128_sensitivity --plan studies/hd128-sensitivity-all.toml --device cuda \
        --inputs ~/.cache/zyfa/captures/qwen25coder-1.5b-pydoc-2048.h5 --out reports/hd128/sensitivity-all.jsonl

Rows are those of ``zyfa accuracy`` (:func:`zyfa.accuracy.operator.runner.run_accuracy`) plus ``deq_rel_l2_heads`` and
``orig_rel_l2_heads`` (:func:`accuracy.inputs.features.head_errors`) and ``plan``/``plan_hash``; the peers' rows are
not run again (they are in the plan's ``results``, paired on the input's content hash). ``--layers`` runs a subset (a
slice for a test or a timing); the plan's layers are the default. An existing ``--out`` is refused unless ``--force``.

Bad input (a plan that does not parse, a missing capture, an absent layer) is refused in one line before any row is
computed or any file written.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from zyfa.accuracy.inputs.attention_input import capture_inputs
from zyfa.accuracy.inputs.features import head_errors
from zyfa.accuracy.io.results_io import write_results
from zyfa.accuracy.operator.runner import run_accuracy
from zyfa.accuracy.report.hd128 import SENSITIVITY_PLAN, PlanFileError, load_sensitivity_plan

__all__ = ["main", "run_sensitivity"]


def run_sensitivity(plan, inputs, *, device: str = "cpu", progress: bool = False) -> tuple[list[dict], dict]:
    """(rows, provenance): the rows of ``plan.run`` on ``inputs``, each with its per-head errors and the plan's
    hash."""
    rows = run_accuracy(inputs, list(plan.run), device=device, progress=progress)
    out = []
    for inp in inputs:
        heads = head_errors(inp, list(plan.run), device=device)
        for r in rows:
            if r["input"] == inp.name:
                r.update(heads.get(r["recipe"], {}))
                r.update(plan=plan.name, plan_hash=plan.hash)
                out.append(r)
    return out, rows.provenance


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zyfa.accuracy.study.hd128_sensitivity",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--plan", default=str(SENSITIVITY_PLAN))
    ap.add_argument("--inputs", required=True, help="the hd128 capture file (.h5)")
    ap.add_argument("--layers", default=None, help="comma-separated layer indices (default: the plan's)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    try:
        plan = load_sensitivity_plan(args.plan)
        if not plan.run:
            raise PlanFileError(f"plan {args.plan}: run is empty: nothing to run")
        out = Path(args.out)
        if out.suffix != ".jsonl":
            raise PlanFileError(f"--out {out}: the rows are written as .jsonl")
        if out.exists() and not args.force:
            raise PlanFileError(f"{out} exists: pass --force to replace it")
        if not Path(args.inputs).is_file():
            raise PlanFileError(f"--inputs {args.inputs}: no such capture file")
        if args.layers is not None:
            try:
                layers = [int(x) for x in args.layers.split(",")]
            except ValueError:
                raise PlanFileError(f"--layers {args.layers!r}: not a comma-separated list of layer indices") from None
        else:
            layers = None if plan.layers == "all" else list(plan.layers)
        inputs = capture_inputs(args.inputs, layers=layers, device=args.device)
    except (PlanFileError, ValueError, OSError) as e:
        print(f"hd128_sensitivity: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows, prov = run_sensitivity(plan, inputs, device=args.device)
    prov = {**prov, "plan": args.plan, "plan_hash": plan.hash, "wall_s": round(time.perf_counter() - t0, 1),
            "argv": ["python", "-m", "zyfa.accuracy.study.hd128_sensitivity",
                     *(argv if argv is not None else sys.argv[1:])]}
    write_results(rows, out, prov)
    print(f"wrote {len(rows)} rows to {out} in {prov['wall_s']} s ({len(inputs)} layers x {len(plan.run)} variants)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
