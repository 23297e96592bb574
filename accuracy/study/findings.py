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
- the long-context accumulator contrast of ``studies/accumulator.toml`` (:mod:`zyfa.accuracy.longctx.verdicts`), one
  row per model: "untested at the condition" until rows written under that plan's hash exist in
  ``reports/accumulator/`` (or ``reports/longctx/``).

Exposed: ``BEGIN``, ``END``, ``Finding``, ``findings(root)`` (= ``hd128_findings`` + ``accumulator_findings``),
``render(findings)``, ``replace_block(text, block)``, ``main(argv)``.
"""

from __future__ import annotations

import argparse
import glob
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zyfa.accuracy.longctx.scores import load_rows
from zyfa.accuracy.longctx.verdicts import plan_verdicts
from zyfa.accuracy.report.claims import CLAIMS, claim_figures
from zyfa.accuracy.report.hd128 import (
    CLAIMS_PLAN,
    SENSITIVITY_PLAN,
    SENSITIVITY_RESULTS,
    load_sensitivity_plan,
    plan_file_hash,
    read_plan_file,
    sensitivity_figures,
)
from zyfa.accuracy.report.results import load_results
from zyfa.accuracy.scoring.plan import GENERATED, METRICS, load_plan
from zyfa.capture.models import MODELS

__all__ = ["BEGIN", "END", "Finding", "accumulator_findings", "accumulator_plan_files", "findings", "hd128_findings",
           "main", "render",
           "replace_block"]

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- findings:begin (generated: python -m zyfa.accuracy.study.findings --write; do not edit by hand) -->"
END = "<!-- findings:end -->"
HEADER = ("| question (generated) | condition | unit, n | figure [95% interval] | verdict | from |\n"
          "|---|---|---|---|---|---|")
# what a claim's verdict cannot say by itself (each from the doc named)
NOTES = {"zyfa-aiter": "at GQA 6:1 AITER dispatches CK, not the assembly kernel `aiter` models, so this is "
                       "untested against the kernel AITER runs there (docs/DISPATCH.md)"}


@dataclass(frozen=True)
class Finding:
    question: str
    condition: str
    unit: str
    figure: str
    verdict: str
    source: str

    def row(self) -> str:
        cells = [self.question, self.condition, self.unit, self.figure, self.verdict, self.source]
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


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
                               "head dim 128, real activations", "n = 0", "–", "untested at the condition",
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


def accumulator_findings(root: Path) -> list[Finding]:
    """The accumulator plans' primary contrast (``studies/accumulator*.toml``: the first plan and the same contrast
    on further models), one finding per model of each plan, from the rows under ``reports/accumulator*/`` and
    ``reports/longctx/`` (any depth of folder) written under that plan's current hash. A cell's verdict is the plan's
    after its correction (an effect that does not survive Holm is inconclusive)."""
    plans, operator_rows = accumulator_plan_files(root)
    files = sorted({f for pattern in ("accumulator*", "longctx")
                    for f in glob.glob(str(root / "reports" / pattern / "**" / "*.jsonl"), recursive=True)
                    if Path(f).resolve() not in operator_rows})
    by_file = {f: load_rows([f])[0] for f in files}
    out = []
    for plan_file in plans:
        out += _accumulator_plan_findings(root, load_plan(plan_file), plan_file.name, by_file)
    return out


def accumulator_plan_files(root: Path) -> tuple[list[Path], set[Path]]:
    """(the retrieval plans ``studies/accumulator*.toml``, the first plan first; the result files of the operator
    contrast plans among them). A contrast plan (``[[conditions]]``, :mod:`zyfa.accuracy.report.contrast`, e.g.
    ``studies/accumulator-operator.toml``) is no retrieval plan: its verdict is its own report's."""
    plans, operator_rows = [], set()
    for plan_file in sorted((root / "studies").glob("accumulator*.toml"),
                            key=lambda f: (f.name != "accumulator.toml", f.name)):
        data = read_plan_file(plan_file)
        if "conditions" in data:
            operator_rows |= {(root / str(c.get("results", ""))).resolve() for c in data["conditions"]
                              if isinstance(c, dict)}
        else:
            plans.append(plan_file)
    return plans, operator_rows


def _accumulator_plan_findings(root: Path, plan, plan_name: str, by_file: dict[str, list[dict]]) -> list[Finding]:
    mine = {f: [r for r in rows if r.get("plan_hash") == plan.hash] for f, rows in by_file.items()}
    rows = [r for f in sorted(mine) for r in mine[f]]
    folders = sorted({Path(f).parent.relative_to(root).as_posix() for f, rs in mine.items() if rs})
    src = f"`studies/{plan_name}` ({plan.short_hash})" + "".join(f", `{d}/`" for d in folders)
    verdicts = plan_verdicts(plan, rows) if rows else []
    out = []
    for model in plan.models:
        q = (f"Does a never-flushed Hopper FP8 accumulator lose long-context retrieval on {model} "
             f"({plan.primary.b} vs {plan.primary.a})?")
        hd = MODELS[model].head_dim if model in MODELS else None
        cond = (f"{model}, head dim {hd if hd else 'not stated'}; {', '.join(plan.tasks)}; "
                f"{', '.join(str(n) for n in plan.lengths)} tokens; "
                f"{_metric_phrases(plan.metrics)}, b − a paired per prompt; "
                f"thresholds " + ", ".join(f"{m} {t:g}" for m, t in plan.metrics.items()))
        mine = [v for v in verdicts if v["model"] == model and not v["contrast"].exploratory
                and v["verdict"] is not None]
        if not mine:
            out.append(Finding(q, cond, f"fact (cluster of prompts), n = 0 ({plan.facts} facts per cell planned)",
                               "–", "untested at the condition: no rows under this plan yet", src))
            continue
        informative = [v for v in mine if v["verdict"].informative]
        kinds = {k: [v for v in informative if v["kind"] == k] for k in ("effect", "equivalent", "inconclusive")}
        det = [v["verdict"].detectable for v in kinds["inconclusive"] if math.isfinite(v["verdict"].detectable)]
        n_units = sorted({v["verdict"].n_clusters for v in informative})
        def cell(v) -> str:
            return (f"{v['task']} {v['length']} {v['metric']} {v['verdict'].effect:+.3g} "
                    f"[{v['verdict'].lo:+.3g}, {v['verdict'].hi:+.3g}]")

        figure = "; ".join(cell(v) for v in kinds["effect"])
        if not figure and informative:  # no effect: the cell furthest from zero in units of its metric's threshold
            figure = "no effect; largest " + cell(max(informative, key=lambda v: abs(v["verdict"].effect)
                                                       / plan.metrics[v["metric"]]))
        verdict = (f"{len(kinds['effect'])} effects, {len(kinds['equivalent'])} no effect above the threshold, "
                   f"{len(kinds['inconclusive'])} inconclusive" + (f" (detectable ≥ {min(det):.3g}–{max(det):.3g})"
                                                                   if det else "")
                   + f" of {len(informative)} cells; {len(mine) - len(informative)} ceiling/floor cells left out")
        first_gen = next((m for m in plan.metrics if m in GENERATED), None)  # a failed generation takes them all
        lost = sum(v["gen_lost"] for v in verdicts if v["model"] == model and not v["contrast"].exploratory
                   and v["metric"] == first_gen)
        if lost:
            verdict += f"; {lost} prompts lost to generation errors (left out of both arms)"
        span = f"{n_units[0]}" if n_units and n_units[0] == n_units[-1] else \
            (f"{n_units[0]}–{n_units[-1]}" if n_units else "0")
        unit = f"fact, n = {span} per cell"
        out.append(Finding(q, cond, unit, figure, verdict, src))
    return out


def _metric_phrases(metrics) -> str:
    """The plan's metrics as a finding's condition names them (:data:`zyfa.accuracy.scoring.plan.METRICS`), e.g.
    "Δ log p(answer) (nats, summed over the answer) and exact match"."""
    phrases = [METRICS[m].phrase for m in metrics]
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def findings(root: str | Path = ROOT) -> list[Finding]:
    """Every generated finding, from the result and plan files under ``root``."""
    root = Path(root)
    return hd128_findings(root) + accumulator_findings(root)


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
