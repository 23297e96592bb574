"""The findings of the study plans in ``studies/``, one kind of plan at a time, each row from its plan's own verdict
code (never a statistic computed here):

- a retrieval plan (``[primary]``, :func:`zyfa.accuracy.scoring.plan.load_plan`; e.g. ``studies/accumulator.toml``,
  ``studies/fp8-retrieval-hd128.toml``): one row per model, the primary contrast's cells by
  :func:`zyfa.accuracy.longctx.verdicts.plan_verdicts` after the plan's correction, the exploratory contrasts named
  in the figure with their count of effects (outside the rule, never in the verdict); before any paired row, the
  design's detectable difference as a multiple of the per-fact spread (:func:`design_detectable`);
- a contrast plan (``[[conditions]]``, :mod:`zyfa.accuracy.report.contrast`; ``studies/accumulator-operator.toml``):
  one row per claim and primary condition, every other condition's own verdict beside it;
- a HumanEval plan (``arms``, :mod:`zyfa.accuracy.tasks.plan`; ``studies/humaneval.toml``): one row, each arm's
  verdict by :func:`zyfa.accuracy.tasks.plan.plan_verdicts`, or before any row the design's detectable loss.

Rows of a retrieval or HumanEval plan are those written under the plan's current hash in any ``reports/**/*.jsonl``
or ``*.jsonl.partial`` (a cut run's rows: the verdict waits for the rest);
without any, the row says "untested at the condition" with the planned n. A contrast plan's rows are its
conditions' results files.

Exposed: ``plan_files(root)``, ``retrieval_findings(root)``, ``contrast_findings(root)``, ``humaneval_findings(root)``,
``plan_findings(root)`` (all three), ``plan_rows(root, plan_hash)``, ``design_detectable(plan)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from zyfa.accuracy.io.schemas import read_rows
from zyfa.accuracy.longctx.scores import load_rows
from zyfa.accuracy.longctx.verdicts import plan_verdicts
from zyfa.accuracy.report.claims import ERRORS
from zyfa.accuracy.report.contrast import (
    contrast_figures,
    figure_text,
    load_contrast_plan,
    n_text,
    read_condition,
    verdict_text,
)
from zyfa.accuracy.report.hd128 import read_plan_file
from zyfa.accuracy.scoring.plan import GENERATED, METRICS, load_plan
from zyfa.accuracy.scoring.verdict import POWER, mde
from zyfa.accuracy.study.finding import UNTESTED, UNTESTED_PREFIX, Finding, untested_unpaired
from zyfa.accuracy.tasks import plan as he
from zyfa.capture.models import MODELS

__all__ = ["contrast_findings", "humaneval_findings", "plan_files", "plan_findings", "plan_rows",
           "retrieval_findings"]

KINDS = ("retrieval", "contrast", "humaneval")
# the discordance rates (share of problems passing under one arm only) at which a HumanEval design's detectable
# loss is stated before its rows (the plan file's header has the table: scripts/humaneval_detectable.py)
DISCORDANCE = (0.10, 0.15)
MAX_CELLS = 4  # effect cells a retrieval finding lists one by one (more: summarized per metric)


def plan_files(root: Path) -> dict[str, list[Path]]:
    """``studies/*.toml`` by kind ("retrieval", "contrast", "humaneval"), ``accumulator.toml`` first, then by name.
    Plans of another kind (the hd128 claims and their sensitivity) are left out: :mod:`zyfa.accuracy.study.findings`
    reads them itself."""
    out: dict[str, list[Path]] = {k: [] for k in KINDS}
    for f in sorted((root / "studies").glob("*.toml"), key=lambda f: (f.name != "accumulator.toml", f.name)):
        data = read_plan_file(f)
        kind = ("contrast" if "conditions" in data else "humaneval" if "arms" in data
                else "retrieval" if "primary" in data else None)
        if kind:
            out[kind].append(f)
    return out


def _texts(root: Path) -> dict[Path, str]:
    """Every result file under ``reports/`` (any depth) with its text: finished (``*.jsonl``) and cut, to be resumed
    (``*.jsonl.partial``: a plan's verdict then waits for the rows it lacks, and its row says how many it has)."""
    base = root.resolve() / "reports"
    files = sorted([*base.glob("**/*.jsonl"), *base.glob("**/*.jsonl.partial")])
    return {f: f.read_text(encoding="utf-8") for f in files}


def _rows_under(texts: dict[Path, str], plan_hash: str, read) -> dict[Path, list[dict]]:
    """The rows written under ``plan_hash`` by file (``read``: a file's rows), of the files that hold any."""
    out = {}
    for f, text in texts.items():
        if plan_hash in text:  # a file that never names the hash holds none of its rows: not parsed
            mine = [r for r in read(f) if r.get("plan_hash") == plan_hash]
            if mine:
                out[f] = mine
    return out


def plan_rows(root: Path, plan_hash: str) -> dict[Path, list[dict]]:
    """The long-context rows written under ``plan_hash`` in any ``reports/**/*.jsonl`` of ``root``, by file."""
    return _rows_under(_texts(root), plan_hash, lambda f: load_rows([str(f)])[0])


def _source(root: Path, plan_file: Path, short_hash: str, files: Sequence[Path]) -> str:
    folders = sorted({f.parent.relative_to(root.resolve()).as_posix() for f in files})
    return f"`studies/{plan_file.name}` ({short_hash})" + "".join(f", `{d}/`" for d in folders)


def _head_dim(model: str) -> str:
    return str(MODELS[model].head_dim) if model in MODELS else "not stated"


def _question(description: str, what: str, contrast: str) -> str:
    """"<the plan's description>: does <what> change (<contrast>)?" (without a description, the question alone)."""
    return (f"{description}: does {what} change ({contrast})?" if description
            else f"Does {what} change ({contrast})?")


def _metric_phrases(metrics) -> str:
    """The plan's metrics as a finding's condition names them (:data:`zyfa.accuracy.scoring.plan.METRICS`), e.g.
    "Δ log p(answer) (nats, summed over the answer) and exact match"."""
    phrases = [METRICS[m].phrase for m in metrics]
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def retrieval_findings(root: Path) -> list[Finding]:
    """Every retrieval plan's primary contrast, one finding per model of each plan."""
    out, texts = [], _texts(root)
    for plan_file in plan_files(root)["retrieval"]:
        plan = load_plan(plan_file)
        by_file = _rows_under(texts, plan.hash, lambda f: load_rows([str(f)])[0])
        rows = [r for f in sorted(by_file) for r in by_file[f]]
        out += _retrieval_rows(plan, plan_verdicts(plan, rows) if rows else [],
                               _source(root, plan_file, plan.short_hash, list(by_file)),
                               {m: sum(r.get("model") == m for r in rows) for m in plan.models})
    return out


def _cell(v) -> str:
    return (f"{v['task']} {v['length']} {v['metric']} {v['verdict'].effect:+.3g} "
            f"[{v['verdict'].lo:+.3g}, {v['verdict'].hi:+.3g}]")


def _effects(plan, effects: list[dict]) -> str:
    """The effect cells, each with its interval; past :data:`MAX_CELLS` of them, per metric their range and the cell
    nearest zero (the weakest effect) with its interval."""
    if len(effects) <= MAX_CELLS:
        return "; ".join(_cell(v) for v in effects)
    parts = []
    for m in plan.metrics:
        mine = [v for v in effects if v["metric"] == m]
        if mine:
            xs = sorted(v["verdict"].effect for v in mine)
            weakest = min(mine, key=lambda v: abs(v["verdict"].effect))
            parts.append(f"{m} {xs[0]:+.3g} to {xs[-1]:+.3g} over {len(mine)} cells, the weakest " + _cell(weakest))
    return "; ".join(parts)


def _exploratory(plan, verdicts: list[dict], model: str) -> str:
    """The exploratory contrasts in a few words each: how many of their cells show an effect by the interval alone
    (no correction: outside the rule), and the range of those effects per metric."""
    parts = []
    for c in plan.exploratory:
        mine = [v for v in verdicts if v["model"] == model and v["contrast"] == c and v["verdict"] is not None
                and v["verdict"].informative]
        if not mine:
            continue
        effects = [v for v in mine if v["kind"] == "effect"]
        ranges = []
        for m in plan.metrics:
            xs = sorted(v["verdict"].effect for v in effects if v["metric"] == m)
            if xs:
                ranges.append(f"{m} {xs[0]:+.3g}" + (f" to {xs[-1]:+.3g}" if len(xs) > 1 else ""))
        parts.append(f"{c.b} vs {c.a} {len(effects)} of {len(mine)} cells effects"
                     + (f" ({', '.join(ranges)})" if ranges else ""))
    return "; exploratory, outside the rule: " + "; ".join(parts) if parts else ""


def design_detectable(plan) -> str:
    """What a retrieval plan's design can detect before its rows, as a clause: a cell's detectable difference (80%
    power, the t test over facts that :func:`~zyfa.accuracy.scoring.verdict.paired_verdict` makes) is a multiple of
    SD_f, the spread over the facts of the per-fact mean difference b − a, which only the rows will show."""
    per_unit = 1 / math.sqrt(plan.facts)  # the standard error of a mean over the facts, per unit of SD_f
    family = plan.primary_family
    text = (f"; the design finds a cell's difference of {mde(per_unit, plan.facts, plan.alpha):.2f} × SD_f with "
            f"{100 * POWER:g}% power at α = {plan.alpha:g}")
    if plan.correction == "holm" and family > 1:
        text += (f" ({mde(per_unit, plan.facts, plan.alpha / family):.2f} × SD_f at Holm's first step over "
                 f"{family} cell-metrics)")
    return text + " (SD_f: the spread over the facts of the per-fact mean difference, known only from the rows)"


def _retrieval_rows(plan, verdicts: list[dict], src: str, n_rows: dict[str, int] | None = None) -> list[Finding]:
    """One finding per model of a retrieval plan (``n_rows``: the plan's rows per model, for the untested ones)."""
    out = []
    for model in plan.models:
        q = _question(plan.description, f"long-context retrieval on {model}", f"{plan.primary.b} vs {plan.primary.a}")
        cond = (f"{model}, head dim {_head_dim(model)}; {', '.join(plan.tasks)}; "
                f"{', '.join(str(n) for n in plan.lengths)} tokens; "
                f"{_metric_phrases(plan.metrics)}, b − a paired per prompt; "
                f"thresholds " + ", ".join(f"{m} {t:g}" for m, t in plan.metrics.items()))
        primary = [v for v in verdicts if v["model"] == model and not v["contrast"].exploratory]
        mine = [v for v in primary if v["verdict"] is not None]
        if not mine:
            have = (n_rows or {}).get(model, 0)
            out.append(Finding(q, cond, f"fact (cluster of prompts), n = 0 ({plan.facts} facts per cell planned)",
                               "–", (untested_unpaired(have) if have else UNTESTED) + design_detectable(plan),
                               src))
            continue
        informative = [v for v in mine if v["verdict"].informative]
        kinds = {k: [v for v in informative if v["kind"] == k] for k in ("effect", "equivalent", "inconclusive")}
        det = [v["verdict"].detectable for v in kinds["inconclusive"] if math.isfinite(v["verdict"].detectable)]
        n_units = sorted({v["verdict"].n_clusters for v in informative})
        figure = _effects(plan, kinds["effect"])
        if not figure and informative:  # no effect: the cell furthest from zero in units of its metric's threshold
            figure = "no effect; largest " + _cell(max(informative, key=lambda v: abs(v["verdict"].effect)
                                                        / plan.metrics[v["metric"]]))
        figure += _exploratory(plan, verdicts, model)
        verdict = (f"{len(kinds['effect'])} effects, {len(kinds['equivalent'])} no effect above the threshold, "
                   f"{len(kinds['inconclusive'])} inconclusive" + (f" (detectable ≥ {min(det):.3g}–{max(det):.3g})"
                                                                   if det else "")
                   + f" of {len(informative)} cells; {len(mine) - len(informative)} ceiling/floor cells left out")
        first_gen = next((m for m in plan.metrics if m in GENERATED), None)  # a failed generation takes them all
        lost = sum(v["gen_lost"] for v in primary if v["metric"] == first_gen)
        if lost:
            verdict += f"; {lost} prompts lost to generation errors (left out of both arms)"
        waiting = [v for v in primary if v["verdict"] is None]
        if waiting:  # a cut run: the cells it has not reached are named, never counted as tested
            cells = ", ".join(dict.fromkeys(f"{v['task']} {v['length']}" for v in waiting))
            verdict += (f"; interim: {len(waiting)} of {len(primary)} cell-metrics have no paired rows "
                        f"yet ({cells}: untested; the plan's command resumes the run)")
        span = f"{n_units[0]}" if n_units and n_units[0] == n_units[-1] else \
            (f"{n_units[0]}–{n_units[-1]}" if n_units else "0")
        out.append(Finding(q, cond, f"fact, n = {span} per cell", figure, verdict, src))
    return out


def contrast_findings(root: Path) -> list[Finding]:
    """Every contrast plan: one finding per claim and primary condition (the first condition where none is marked
    primary), the other conditions' verdicts beside it, each its own (conditions are never pooled). A plan whose
    every condition is descriptive claims nothing and makes no finding (its report shows its figures)."""
    out = []
    for plan_file in plan_files(root)["contrast"]:
        plan = load_contrast_plan(plan_file)
        if all(c.descriptive for c in plan.conditions):
            continue
        rows_by, states = {}, {}
        for cond in plan.conditions:
            rows_by[cond.results], states[cond.results], _ = read_condition(cond, root)
        figs = contrast_figures(plan, rows_by)
        primary = [c for c in plan.conditions if c.primary] or [plan.conditions[0]]
        found = [Path(root) / c.results for c in plan.conditions if states[c.results] != "missing"]
        src = _source(root, plan_file, plan.hash[:12], [f.resolve() for f in found])
        errors = " and ".join(f"{'kernel-only' if ERRORS[e] == 'deq' else 'against the original inputs'} "
                              f"({ERRORS[e]})" for e in plan.errors)
        for claim in plan.claims:
            def of(cond, figs=figs, claim=claim):
                return [f for f in figs if f["condition"] is cond and f["pair"] is claim]

            for cond in primary:
                mine = of(cond)
                partial = " (partial rows)" if states[cond.results] == "partial" else ""
                impact = cond.kind == "impact"
                what = f"{cond.model}'s {mine[0]['error']}" if impact else "attention's error"
                q = _question(claim.text, what, f"{claim.b} / {claim.a}")
                measure = (f"{mine[0]['error']} against the stock model, the arm in every layer" if impact
                           else f"rel-L2 vs FP64, {errors}")
                c = (f"{cond.label}{partial}; {measure}; geometric mean of {claim.b} / {claim.a} "
                     f"per unit; threshold {claim.threshold:g} of the ratio 1")
                if not any(f["n"] for f in mine):
                    planned = f"{cond.windows} windows" if impact else "every layer of the condition"
                    out.append(Finding(q, c, f"n = 0 ({planned} planned)", "–", UNTESTED, src))
                    continue
                figure = "; ".join(f"{f['error']} {figure_text(f)}" for f in mine)
                verdict = ", ".join(f"{f['error']} {verdict_text(f)}" for f in mine)
                others = [o for o in plan.conditions if o not in primary and any(f["n"] for f in of(o))]
                if others:
                    verdict += "; other conditions, each its own verdict: " + "; ".join(
                        f"{o.label} ({of(o)[0]['n_clusters']} {o.cluster}s): "
                        + ", ".join(f"{f['error']} {figure_text(f)} {verdict_text(f)}" for f in of(o))
                        for o in others)
                out.append(Finding(q, c, f"n = {n_text(mine[0])}, interval over {cond.cluster}s", figure, verdict,
                                   src))
    return out


def humaneval_findings(root: Path) -> list[Finding]:
    """Every HumanEval plan: one finding, each arm's verdict on the primary models (descriptive models beside)."""
    out, texts = [], _texts(root)
    for plan_file in plan_files(root)["humaneval"]:
        plan = he.load_humaneval_plan(plan_file)
        by_file = _rows_under(texts, plan.hash, lambda f: read_rows(f)[0])
        rows = [r for f in sorted(by_file) for r in by_file[f]]
        src = _source(root, plan_file, plan.short_hash, list(by_file))
        q = _question(plan.description, f"pass@1 on {', '.join(plan.models)}",
                      f"{', '.join(plan.arms)} vs {plan.baseline}")
        models = ", ".join(f"{m} (head dim {_head_dim(m)})" for m in plan.models)
        family = len(plan.models) * len(plan.arms)
        cond = (f"{models}, HumanEval, greedy, at most {plan.max_new_tokens} new tokens, {plan.dtype}; pass@1 "
                f"paired per problem, arm − {plan.baseline}; threshold {100 * plan.threshold:g} points, "
                f"α = {plan.alpha:g}, exact McNemar"
                + (f" with {plan.correction} over {family} contrasts" if plan.correction != "none"
                   else f", {family} contrast{'s' if family > 1 else ''}, no correction")
                + (f"; {', '.join(plan.descriptive_models)} descriptive, outside the family"
                   if plan.descriptive_models else ""))
        verdicts = he.plan_verdicts(plan, rows) if rows else []
        primary = [v for v in verdicts if v["primary"] and v["verdict"] is not None]
        if not primary:
            holm = plan.correction == "holm"
            alpha = plan.alpha / family if holm else plan.alpha
            det = [he.detectable_loss(he.N_PROBLEMS, d, alpha) for d in DISCORDANCE]
            said = [f"{100 * x:.1f} points at {100 * d:g}%" for x, d in zip(det, DISCORDANCE, strict=True)
                    if math.isfinite(x)]
            out.append(Finding(
                q, cond, f"problem, n = 0 ({he.N_PROBLEMS} problems per arm planned)", "–",
                f"{UNTESTED}; the design finds a pass@1 loss of {' or '.join(said)} discordant problems with "
                f"{100 * he.POWER:g}% power (exact McNemar at α = {alpha:.3g}"
                + (", Holm's first step)" if holm else ")"), src))
            continue
        figure = "; ".join(f"{v['arm']}{'' if v['primary'] else ' on ' + v['model']} "
                           f"{100 * v['verdict'].effect:+.1f} [{100 * v['verdict'].lo:+.1f}, "
                           f"{100 * v['verdict'].hi:+.1f}] points" for v in verdicts if v["verdict"] is not None)
        verdict = "; ".join(f"{v['arm']}{'' if v['primary'] else ' on ' + v['model']}: {v['label']}"
                            for v in verdicts if v["primary"] or v["verdict"] is not None)
        n = sorted({v["n"] for v in primary})
        span = f"{n[0]}" if n[0] == n[-1] else f"{n[0]}–{n[-1]}"
        out.append(Finding(q, cond, f"problem, n = {span} paired per arm (of {he.N_PROBLEMS})", figure, verdict,
                           src))
    return out


def plan_findings(root: Path) -> list[Finding]:
    """The findings of every retrieval, contrast and HumanEval plan, in that order, those with rows first."""
    root = Path(root)
    out = retrieval_findings(root) + contrast_findings(root) + humaneval_findings(root)
    return sorted(out, key=lambda f: f.verdict.startswith(UNTESTED_PREFIX))
