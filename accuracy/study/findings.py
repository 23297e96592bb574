"""The findings that carry a verdict, generated from committed result files and plan files: the README's "What we
found" verdict table and docs/FINDINGS.md's, between markers, so that neither can drift from the data.

    python -m zyfa.accuracy.study.findings            # print the block
    python -m zyfa.accuracy.study.findings --write    # replace the block in README.md and docs/FINDINGS.md
    python -m zyfa.accuracy.study.findings --check    # exit 1 where a file's block differs from the generated one

Each row states its condition (model, head dim, length, metric), its unit and n, the figure with its 95% interval
over the independent units, the verdict by its plan's rule, and for a null or an inconclusive verdict the smallest
effect the design could have detected. Rows:

- the paper's three accuracy claims at head dim 128 (:mod:`zyfa.accuracy.report.claims`, plan
  ``studies/hd128-claims-clustered.toml``; intervals over layers), each with how many technique-1 variants of
  ``studies/hd128-sensitivity-all.toml`` keep its verdict (rows in ``reports/hd128/sensitivity-all.jsonl`` where run);
- every other study plan in ``studies/`` (:mod:`zyfa.accuracy.study.plan_findings`): each retrieval plan's primary
  contrast per model, each contrast plan's claims on its primary condition, the HumanEval plan's arms; "untested at
  the condition", with the planned n, until rows written under the plan's hash exist.

Exposed: ``BEGIN``, ``END``, ``Finding``, ``findings(root)`` (= ``hd128_findings`` + ``plan_findings``),
``render(findings)``, ``replace_block(text, block)``, ``main(argv)``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from zyfa.accuracy.report.claims import CLAIMS, claim_figures
from zyfa.accuracy.report.hd128 import (
    CLAIMS_PLAN,
    SENSITIVITY_PLAN,
    SENSITIVITY_RESULTS,
    load_sensitivity_plan,
    plan_file_hash,
    sensitivity_figures,
)
from zyfa.accuracy.report.results import load_results
from zyfa.accuracy.study.finding import UNTESTED, Finding
from zyfa.accuracy.study.plan_findings import plan_findings

__all__ = ["BEGIN", "END", "Finding", "findings", "hd128_findings", "main", "render", "replace_block"]

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- findings:begin (generated: python -m zyfa.accuracy.study.findings --write; do not edit by hand) -->"
END = "<!-- findings:end -->"
HEADER = ("| question (generated) | condition | unit, n | figure [95% interval] | verdict | from |\n"
          "|---|---|---|---|---|---|")
# what a claim's verdict cannot say by itself (each from the doc named)
NOTES = {"zyfa-aiter": "at GQA 6:1 AITER dispatches CK, not the assembly kernel `aiter` models, so this is "
                       "untested against the kernel AITER runs there (docs/DISPATCH.md)"}


def _r(x: float) -> str:
    return f"{x:.3f}"


def _pct(x: float) -> str:
    return "∞" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _side(f: dict, c) -> str:
    """The verdict with the side of the range a contradiction lies on (below: zyfa's error ratio under it)."""
    v = f["verdict"]
    if v == "contradicted":
        return f"contradicted ({'below' if f['hi'] < c.low else 'above'} the range)"
    return "inconclusive" if v.startswith("inconclusive") else v


def hd128_findings(root: Path) -> list[Finding]:
    """The paper's three claims at head dim 128, with the technique-1 sensitivity."""
    results = root / "reports" / "hd128" / "results.jsonl"
    sens_file = root / SENSITIVITY_RESULTS.relative_to(ROOT)
    rows = load_results([results]).rows
    all_rows = load_results([results, sens_file]).rows if sens_file.is_file() else rows
    figs = [f for f in claim_figures(rows) if f["kind"] == "capture"]
    plan = load_sensitivity_plan(root / SENSITIVITY_PLAN.relative_to(ROOT))
    sens = [s for s in sensitivity_figures(all_rows, plan) if s["kind"] == "capture"]
    claims_hash = plan_file_hash(root / "studies" / CLAIMS_PLAN.name)[:12]
    model = next((r.get("input_model") for r in rows if r.get("input_source") == "capture"), "?")
    tokens = next((r.get("seq_k") for r in rows if r.get("input_source") == "capture"), "?")
    out = []
    for c in CLAIMS:
        mine = {f["error"]: f for f in figs if f["claim"] is c}
        if not any(f["n"] for f in mine.values()):
            out.append(Finding(f"{c.text} (paper: zyfa / {c.peer} {c.low:g}–{c.high:g}, head dim 128)?",
                               "head dim 128, real activations", "n = 0", "–", UNTESTED,
                               "`studies/hd128-claims-clustered.toml`"))
            continue
        d, o = mine["deq"], mine["orig"]
        figure = "; ".join(f"{e} {_r(f['ratio'])} [{_r(f['lo'])}, {_r(f['hi'])}]" for e, f in (("deq", d),
                                                                                                   ("orig", o)))
        parts = []
        for e, f in (("deq", d), ("orig", o)):
            v = f["verdict"]
            if v.startswith("inconclusive"):
                v = f"inconclusive (straddles the range, detectable change ≥ {_pct(f['detectable'])})"
            parts.append(f"{e} {v}")
        verdict = ", ".join(parts)
        base = {s["error"]: s for s in sens if s["spec"] == "zyfa" and s["claim"] is c and s["n"] > 0}
        ran, changed = 0, []
        for label, spec in plan.variants:
            cells = {s["error"]: s for s in sens if s["variant"] == label and s["claim"] is c and s["n"] > 0}
            if spec == "zyfa" or set(cells) != {"deq", "orig"} or set(base) != {"deq", "orig"}:
                continue
            ran += 1
            diff = [f"{e} {_side(cells[e], c)} ({_r(cells[e]['ratio'])})" for e in ("deq", "orig")
                    if _side(cells[e], c) != _side(base[e], c)]
            if diff:
                changed.append(f"`{spec}`: " + ", ".join(diff))
        layers = "all layers" if plan.layers == "all" else f"the same {len(plan.layers)} even layers"
        if ran:
            n_base = base["deq"]["n_clusters"]
            verdict += (f"; technique-1 variants against zyfa on {layers} ({n_base} clusters; there zyfa "
                        f"is deq {_side(base['deq'], c)}, orig {_side(base['orig'], c)}): the same under "
                        f"{ran - len(changed)} of {ran}" + (f", changed under {'; '.join(changed)}" if changed
                                                            else ""))
        else:
            verdict += "; technique-1 variants not run"
        if c.key in NOTES:
            verdict += f"; {NOTES[c.key]}"
        out.append(Finding(
            f"{c.text} (paper: zyfa / {c.peer} {c.low:g}–{c.high:g}, head dim 128)?",
            f"{model} captures, head dim 128, {tokens} tokens, causal; rel-L2 vs FP64: kernel-only (deq) and "
            "against the original inputs (orig); geometric mean of zyfa / peer",
            f"layer × head, n = {d['n']} in {d['n_clusters']} layers (interval over layers)",
            figure, verdict,
            f"`reports/hd128/`, `studies/hd128-claims-clustered.toml` ({claims_hash}), "
            f"`{SENSITIVITY_PLAN.relative_to(ROOT).as_posix()}` ({plan.hash[:12]})"))
    return out


def findings(root: str | Path = ROOT) -> list[Finding]:
    """Every generated finding, from the result and plan files under ``root``."""
    root = Path(root)
    return hd128_findings(root) + plan_findings(root)


def render(items: Sequence[Finding]) -> str:
    """The block, markers included."""
    return "\n".join([BEGIN, HEADER, *(f.row() for f in items), END])


def replace_block(text: str, block: str) -> str:
    """``text`` with its generated block replaced by ``block``.

    Raises:
        ValueError: the text has no block (both markers, in order).
    """
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        raise ValueError("no generated findings block (its begin and end markers)")
    return text[:i] + block + text[j + len(END):]


TARGETS = ("README.md", "docs/FINDINGS.md")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zyfa.accuracy.study.findings", description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="replace the block in " + " and ".join(TARGETS))
    ap.add_argument("--check", action="store_true", help="exit 1 where a file's block differs")
    args = ap.parse_args(argv)
    try:
        block = render(findings(ROOT))
    except (OSError, ValueError) as e:
        print(f"findings: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if not (args.write or args.check):
        print(block)
        return 0
    status = 0
    for name in TARGETS:
        path = ROOT / name
        text = path.read_text(encoding="utf-8")
        try:
            new = replace_block(text, block)
        except ValueError as e:
            print(f"findings: {name}: {e}", file=sys.stderr)
            return 2
        if new != text:
            if args.write:
                path.write_text(new, encoding="utf-8")
                print(f"wrote {name}")
            else:
                print(f"findings: {name}: its block differs from the generated one "
                      "(python -m zyfa.accuracy.study.findings --write)", file=sys.stderr)
                status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
