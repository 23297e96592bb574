"""A study plan's verdicts on long-context rows (:mod:`zyfa.accuracy.scoring.plan`,
:mod:`zyfa.accuracy.scoring.verdict`).

For each contrast of the plan and each (model, task, length) cell, the two arms' rows are paired per prompt
(depth, fact); the fact (the row's ``seed``: key, value and haystack window) is the independent unit, so the
interval is a cluster bootstrap over facts. Each metric of the plan gets
:func:`zyfa.accuracy.scoring.verdict.paired_verdict`
with the plan's threshold and alpha. The primary contrast's informative verdicts form one family for the plan's
correction (Holm): an "effect" whose adjusted p is not below alpha is reported as inconclusive after the
correction. A primary cell-metric without rows yet (a cut run) stays in the family with p = 1. Exploratory
contrasts are labelled so and left out of the family.

Generated metrics (``gen_exact``, ``gen_contains``: the answer decoded greedily, ``zyfa longctx --generate N``): a
row whose generation failed (``gen_error``; its gen_ values are None) takes its prompt out of both arms of that
metric, as pairing per prompt requires, and the prompts so lost are counted per cell (``gen_lost``) and shown in the
table's n column, never dropped silently from one arm.

Exposed: ``plan_verdicts(plan, rows) -> list[dict]``, ``plan_blocks(plan, rows, level=2) -> blocks``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from zyfa.accuracy.report.blocks import md_cell
from zyfa.accuracy.scoring.plan import GENERATED, METRICS, Contrast, Plan
from zyfa.accuracy.scoring.verdict import holm, paired_verdict

__all__ = ["plan_blocks", "plan_verdicts"]


def _values(rows: Sequence[dict], impl: str, model: str, task: str, length: int, metric: str
            ) -> tuple[dict, set]:
    """(prompt (depth, fact) -> the arm's value, the prompts whose generated answer failed: an ok row with a
    ``gen_error`` and no value of a gen_ metric)."""
    out, lost = {}, set()
    for r in rows:
        if (r.get("implementation") == impl and r.get("model") == model and r.get("task") == task
                and r.get("length") == length and r.get("status") == "ok"):
            key = (float(r["depth"]), int(r["seed"]))
            v = r.get(metric)
            if v is None and metric in GENERATED and r.get("gen_error"):
                lost.add(key)
                continue
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                continue
            out[key] = float(v)
    return out, lost


def plan_verdicts(plan: Plan, rows: Sequence[dict]) -> list[dict]:
    """One dict per (contrast, model, task, length, metric): ``contrast`` (:class:`~accuracy.scoring.plan.Contrast`),
    ``model``, ``task``, ``length``, ``metric``, ``verdict`` (:class:`~accuracy.scoring.verdict.Verdict` or None where
    no prompt has both arms), ``dropped`` (prompts with only one arm ok), ``gen_lost`` (a gen_ metric's prompts whose
    generated answer failed in either arm, ``gen_error``: left out of both arms), ``p_adjusted`` (the correction's,
    primary only), ``label`` (the verdict after the correction) and ``kind`` (its kind: the verdict's, "inconclusive"
    where the correction takes an effect away)."""
    out = []
    for c in plan.contrasts:
        for m in plan.models:
            for t in plan.tasks:
                for n in plan.lengths:
                    for metric, threshold in plan.metrics.items():
                        out.append(_one(plan, rows, c, m, t, n, metric, threshold))
    # the family is the plan's: a primary cell-metric with no rows yet (a run cut before it) counts with p = 1, so
    # a partial file's adjusted p-values are never smaller than the complete plan's would be
    family = [i for i, v in enumerate(out) if not v["contrast"].exploratory and (v["verdict"] is None or (
        v["verdict"].informative and math.isfinite(v["verdict"].p)))]
    pvals = [1.0 if out[i]["verdict"] is None else out[i]["verdict"].p for i in family]
    adjusted = holm(pvals) if plan.correction == "holm" else pvals
    for i, p in zip(family, adjusted, strict=True):
        if out[i]["verdict"] is None:
            continue
        out[i]["p_adjusted"] = p
        v = out[i]["verdict"]
        if v.kind == "effect" and not p < plan.alpha:
            out[i]["label"] = f"inconclusive after {plan.correction} (adjusted p = {p:.2g})"
            out[i]["kind"] = "inconclusive"
    return out


def _one(plan: Plan, rows, c: Contrast, m: str, t: str, n: int, metric: str, threshold: float) -> dict:
    a, lost_a = _values(rows, c.a, m, t, n, metric)
    b, lost_b = _values(rows, c.b, m, t, n, metric)
    lost = lost_a | lost_b  # a generation error in either arm: the prompt leaves both (counted, not scored)
    both = [k for k in a if k in b and k not in lost]
    rec = {"contrast": c, "model": m, "task": t, "length": n, "metric": metric, "verdict": None,
           "dropped": len((set(a) ^ set(b)) - lost), "gen_lost": len(lost), "p_adjusted": math.nan,
           "label": "no paired prompts", "kind": None}
    if not both:
        return rec
    spec = METRICS[metric]
    v = paired_verdict({k: a[k] for k in both}, {k: b[k] for k in both}, clusters=lambda k: k[1],
                       threshold=threshold, alpha=plan.alpha, higher_is_better=spec.higher_is_better,
                       metric=spec.label, arms=(c.a, c.b))
    rec.update(verdict=v, label=v.label, kind=v.kind)
    return rec


def _num(x: float) -> str:
    return f"{x:+.3g}" if math.isfinite(x) else "–"


def plan_blocks(plan: Plan, rows: Sequence[dict], level: int = 2) -> list[tuple]:
    """Report blocks: the plan's rule, and a table of its verdicts (primary first, exploratory after)."""
    res = plan_verdicts(plan, rows)
    blocks: list[tuple] = [("h", level, f"Study plan {plan.name}: verdicts by its rule")]
    thresholds = "; ".join(f"{METRICS[m].label} {t:g} {METRICS[m].unit}" for m, t in plan.metrics.items())
    generated = [m for m in plan.metrics if m in GENERATED]
    blocks.append(("p", (
        f"Plan `{plan.source}` (hash {plan.short_hash}, recorded in every row), decided before its rows: primary "
        f"contrast `{plan.primary.b}` against `{plan.primary.a}`, paired per prompt; the unit of inference is the "
        f"fact ({plan.facts} per cell; {len(plan.depths)} depths each), intervals by cluster bootstrap over facts at "
        f"α = {plan.alpha:g}, correction {plan.correction} over the primary contrast's cells. Thresholds of a "
        f"meaningful effect (b − a): {thresholds}. Verdict: no effect larger than the threshold when the whole "
        "interval lies inside ±threshold; an effect when it excludes 0 (and survives the correction); otherwise "
        "inconclusive with the smallest effect the design could detect (α, 80% power); cells where every arm is at "
        "the ceiling are uninformative and not counted."
        + (f" Generated answers ({', '.join(METRICS[m].label for m in generated)}): decoded greedily with the arm's "
           f"attention in the prefill and every decode step, at most len(answer) + {plan.generate} tokens; a prompt "
           "whose generation failed in either arm (`gen_error`) is left out of both and counted in the n column "
           "as lost to generation errors." if generated else "")
        + (f" **Pilot**: fewer than the 50 facts per cell a verdict needs ({plan.facts})." if plan.pilot else ""))))
    header = ["contrast", "model", "task", "length", "metric", "b − a [interval]", "n prompts (facts)",
              "detectable", "p (adjusted)", "verdict"]
    trs = []
    for r in res:
        v = r["verdict"]
        c = r["contrast"]
        what = md_cell(c.label)
        lost = f", {r['gen_lost']} lost to generation errors" if r["gen_lost"] else ""
        if v is None:
            trs.append([what, r["model"], r["task"], str(r["length"]), METRICS[r["metric"]].label, "–", "0" + lost,
                        "–", "–", r["label"]])
            continue
        interval = f"{_num(v.effect)} [{_num(v.lo)}, {_num(v.hi)}]"
        n = f"{v.n_units} ({v.n_clusters})" + (f", {r['dropped']} unpaired" if r["dropped"] else "") + lost
        p = "–" if not math.isfinite(v.p) else (f"{v.p:.2g}" + (f" ({r['p_adjusted']:.2g})"
                                                                  if math.isfinite(r["p_adjusted"]) else ""))
        trs.append([what, r["model"], r["task"], str(r["length"]), v.metric, interval, n,
                    f"{v.detectable:.3g}" if math.isfinite(v.detectable) else "–", p, r["label"]])
    blocks.append(("table", f"plan-{plan.name}", header, trs, True))
    counted = [r for r in res if not r["contrast"].exploratory and r["verdict"] is not None
               and r["verdict"].informative]
    ceiling = sum(1 for r in res if not r["contrast"].exploratory and r["verdict"] is not None
                  and not r["verdict"].informative)
    kinds = {}
    for r in counted:
        key = r["label"].split(" (")[0] if r["label"].startswith("inconclusive") else r["label"]
        kinds[key] = kinds.get(key, 0) + 1
    missing = sum(1 for r in res if not r["contrast"].exploratory and r["verdict"] is None)
    # a failed generation takes every gen_ value of its row: count each prompt once, on the first generated metric
    lost = sum(r["gen_lost"] for r in res if not r["contrast"].exploratory and generated
               and r["metric"] == generated[0])
    blocks.append(("p", f"Primary contrast: {len(counted)} informative cell-metrics ("
                   + (", ".join(f"{k}: {v}" for k, v in kinds.items()) or "none")
                   + f"); {ceiling} uninformative (every arm at the ceiling or floor), left out."
                   + (f" **The plan is incomplete: {missing} of its primary cell-metrics have no paired rows yet**; "
                      "they count in the correction with p = 1, and the plan's verdict waits for them."
                      if missing else "")
                   + (f" {lost} prompts of the primary contrast were lost to generation errors (left out of both "
                      "arms of every generated metric)." if lost else "")))
    return blocks
