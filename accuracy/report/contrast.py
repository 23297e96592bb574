"""Contrast plans: one factor, two recipe arms, a verdict per condition, rendered as a claims table.

The hd128 claims set ZYFA against a peer (:mod:`zyfa.accuracy.report.claims`). A contrast plan generalizes that to
any two recipe specs ``a`` and ``b`` (``[[claims]]`` entries with ``a``, ``b`` and a ``threshold``): the figure is
the geometric mean over units of the ratio b / a of each error, its interval a cluster bootstrap over the capture
layers (:func:`zyfa.accuracy.report.claims.pair_figure`), the verdict
:func:`zyfa.accuracy.scoring.verdict.paired_verdict`'s against the threshold. Each ``[[conditions]]`` entry (inputs,
layers, a results file of ``zyfa accuracy`` rows) is its own verdict; conditions are never pooled. A condition marked
``descriptive`` (too few layers for a verdict that means anything) shows its figure and says so.

A condition of ``kind = "impact"`` contrasts the arms in a whole model instead of one layer: ``zyfa impact`` rows
(``model``, ``text``, ``tokens``, ``windows``; every layer's attention the arm's) and the per-window ratio b / a of a
model metric (``metric``, :data:`IMPACT_METRICS`: the next-token KL against the stock model), paired per held-out
window, windows independent (example plan: ``studies/per-head-descales.toml``).

Example plan: ``studies/accumulator-operator.toml``. Render::

    python -m zyfa.accuracy.report.contrast studies/accumulator-operator.toml \\
        --out reports/accumulator-operator/report.md

Exposed: ``Condition``, ``PairClaim``, ``ContrastPlan``, ``IMPACT_METRICS``, ``load_contrast_plan(path)``,
``run_command(plan, condition)``, ``read_condition(condition, root)``, ``contrast_figures(plan, rows_by_results)``,
``impact_pair_figure(rows, a, b, condition, threshold)``, ``descriptive_unit_rows(figures)``,
``figure_text(figure)``, ``n_text(figure)``, ``verdict_text(figure)``, ``contrast_section(plan, figures)``,
``main(argv)``.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from zyfa.accuracy.io.schemas import read_rows
from zyfa.accuracy.report.blocks import fmt
from zyfa.accuracy.report.claims import ERRORS, pair_figure
from zyfa.accuracy.report.document import Doc, render_markdown
from zyfa.accuracy.report.front import source_label
from zyfa.accuracy.report.hd128 import PlanFileError, read_plan_file
from zyfa.accuracy.scoring.plan import plan_hash
from zyfa.accuracy.scoring.verdict import paired_verdict
from zyfa.capture.models import MODELS

from zyfa.recipe_spec import get_recipe

__all__ = ["IMPACT_METRICS", "Condition", "ContrastPlan", "PairClaim", "contrast_figures", "contrast_section",
           "descriptive_unit_rows", "figure_text", "impact_pair_figure", "load_contrast_plan", "main", "n_text",
           "read_condition", "run_command", "verdict_text"]

# the model metrics an impact condition may contrast (a ``zyfa impact`` row's field: its words in the table)
IMPACT_METRICS = {"kl_mean": "next-token KL"}
CONDITION_KINDS = ("operator", "impact")


@dataclass(frozen=True)
class PairClaim:
    a: str  # the denominator's recipe spec
    b: str  # the numerator's
    threshold: float  # the smallest effect that matters, a fraction of 1
    text: str


@dataclass(frozen=True)
class Condition:
    label: str
    inputs: str  # capture file(s), as zyfa accuracy --inputs takes them ("~" allowed)
    layers: str  # "all" or zyfa accuracy's --layers value
    results: str  # the rows' file, relative to the working directory
    heads: str = ""  # zyfa accuracy's --heads value (query head indices), "" for every head
    primary: bool = False
    descriptive: bool = False
    kind: str = "operator"  # "operator": zyfa accuracy on captures; "impact": zyfa impact on a whole model
    model: str = ""  # impact: the registry model
    text: str = ""  # impact: its text source
    tokens: int = 0  # impact: tokens per window
    windows: int = 0  # impact: held-out windows (the units)
    metric: str = ""  # impact: the row field contrasted (IMPACT_METRICS)

    @property
    def cluster(self) -> str:
        """What the verdict's interval is over: a whole-model condition's window, else the capture's layer."""
        return "window" if self.kind == "impact" else "layer"


@dataclass(frozen=True)
class ContrastPlan:
    source: str
    name: str
    hash: str
    claims: tuple[PairClaim, ...]
    errors: tuple[str, ...]
    conditions: tuple[Condition, ...]


def _text(entry: dict, key: str, where: str) -> str:
    v = entry.get(key)
    if not isinstance(v, str) or not v.strip():
        raise PlanFileError(f"{where}: {key} must be a non-empty string")
    return v


def load_contrast_plan(path: str | Path) -> ContrastPlan:
    """Read and check a contrast plan: each claim's ``a`` and ``b`` recipe specs the grammar takes and different,
    a positive threshold, errors among :data:`zyfa.accuracy.report.claims.ERRORS`, at least one condition.

    Raises:
        PlanFileError: one line naming the file and the first problem.
    """
    data = read_plan_file(path)
    src = str(path)
    claims_in = data.get("claims")
    if not isinstance(claims_in, list) or not claims_in or not all(isinstance(c, dict) for c in claims_in):
        raise PlanFileError(f"plan {src}: [[claims]] must hold at least one contrast (a, b, threshold)")
    claims = []
    for i, c in enumerate(claims_in, 1):
        where = f"plan {src}: claim {i}"
        a, b = _text(c, "a", where), _text(c, "b", where)
        for arm, spec in (("a", a), ("b", b)):
            try:
                get_recipe(spec)
            except ValueError as e:
                raise PlanFileError(f"{where}: {arm} = {spec!r}: {str(e).splitlines()[0]}") from None
        if get_recipe(a).name == get_recipe(b).name:
            raise PlanFileError(f"{where}: a and b are the same recipe ({get_recipe(a).name})")
        th = c.get("threshold")
        if isinstance(th, bool) or not isinstance(th, (int, float)) or not (0 < th < 1):
            raise PlanFileError(f"{where}: threshold must be a number between 0 and 1 (a fraction of the ratio 1)")
        claims.append(PairClaim(a=a, b=b, threshold=float(th), text=str(c.get("text", f"{b} / {a}"))))
    errors = data.get("errors", list(ERRORS))
    if not isinstance(errors, list) or not errors or any(e not in ERRORS for e in errors):
        raise PlanFileError(f"plan {src}: errors must be a list of {', '.join(ERRORS)}")
    conds_in = data.get("conditions")
    if not isinstance(conds_in, list) or not conds_in or not all(isinstance(c, dict) for c in conds_in):
        raise PlanFileError(f"plan {src}: [[conditions]] must hold at least one condition (label, inputs, results)")
    conds = []
    for i, c in enumerate(conds_in, 1):
        where = f"plan {src}: condition {i}"
        kind = c.get("kind", "operator")
        if kind not in CONDITION_KINDS:
            raise PlanFileError(f"{where}: kind must be one of {', '.join(CONDITION_KINDS)}, not {kind!r}")
        if kind == "impact":
            conds.append(_impact_condition(c, where))
            continue
        layers = c.get("layers", "all")
        if not isinstance(layers, str) or not layers.strip():
            raise PlanFileError(f"{where}: layers must be \"all\" or zyfa accuracy's --layers value (a string)")
        heads = c.get("heads", "")
        if not isinstance(heads, str):
            raise PlanFileError(f"{where}: heads must be zyfa accuracy's --heads value (a string such as \"0,6\")")
        conds.append(Condition(label=_text(c, "label", where), inputs=_text(c, "inputs", where), layers=layers,
                               results=_text(c, "results", where), heads=heads, primary=bool(c.get("primary", False)),
                               descriptive=bool(c.get("descriptive", False))))
    if len({c.results for c in conds}) < len(conds):
        raise PlanFileError(f"plan {src}: two conditions share a results file (conditions are never pooled)")
    return ContrastPlan(source=src, name=str(data.get("name", Path(src).stem)), hash=plan_hash(data),
                        claims=tuple(claims), errors=tuple(errors), conditions=tuple(conds))


def _impact_condition(c: dict, where: str) -> Condition:
    model, text = _text(c, "model", where), _text(c, "text", where)
    if model not in MODELS:
        raise PlanFileError(f"{where}: model {model!r} is not in the registry ({', '.join(MODELS)})")
    for key in ("tokens", "windows"):
        v = c.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanFileError(f"{where}: {key} must be a positive whole number")
    metric = c.get("metric", "kl_mean")
    if metric not in IMPACT_METRICS:
        raise PlanFileError(f"{where}: metric must be one of {', '.join(IMPACT_METRICS)}, not {metric!r}")
    return Condition(label=_text(c, "label", where), inputs="", layers="all", results=_text(c, "results", where),
                     primary=bool(c.get("primary", False)), descriptive=bool(c.get("descriptive", False)),
                     kind="impact", model=model, text=text, tokens=int(c["tokens"]), windows=int(c["windows"]),
                     metric=metric)


def _recipes(plan: ContrastPlan) -> list[str]:
    return list(dict.fromkeys(s for c in plan.claims for s in (c.b, c.a)))


def run_command(plan: ContrastPlan, cond: Condition, device: str = "cpu") -> str:
    """The ``zyfa accuracy`` (``zyfa impact``) command that makes (or, resumed, completes) a condition's rows."""
    if cond.kind == "impact":
        parts = ["zyfa", "impact", "--models", cond.model, "--recipes", ",".join(_recipes(plan)), "--text",
                 cond.text, "--tokens", str(cond.tokens), "--windows", str(cond.windows), "--device", device,
                 "--out", cond.results, "--resume", "--no-progress"]
        return " ".join(shlex.quote(p) for p in parts)
    parts = ["zyfa", "accuracy", "--inputs", cond.inputs, "--recipes", ",".join(_recipes(plan))]
    if cond.layers != "all":
        parts += ["--layers", cond.layers]
    if cond.heads:
        parts += ["--heads", cond.heads]
    parts += ["--device", device, "--out", cond.results, "--resume", "--no-progress"]
    return " ".join(p if p.startswith("~/") else shlex.quote(p) for p in parts)


def read_condition(cond: Condition, root: str | Path = ".") -> tuple[list[dict], str, dict]:
    """(rows, state, provenance) of a condition's results file, relative to ``root``: the finished file (state
    "complete"), else its .partial (state "partial"), else none (state "missing"); provenance is the file's record
    ({} where there is none)."""
    path = Path(root) / cond.results
    part = path.with_name(path.name + ".partial")
    for f, state in ((path, "complete"), (part, "partial")):
        if f.exists():
            rows, prov = read_rows(f)
            return rows, state, prov or {}
    return [], "missing", {}


def contrast_figures(plan: ContrastPlan, rows_by_results: Mapping[str, Sequence[dict]]) -> list[dict]:
    """One dict per (condition, claim, error): :func:`zyfa.accuracy.report.claims.pair_figure` on the condition's
    capture rows (any head dim: each condition is one model), plus ``condition`` and ``pair`` (the claim)."""
    out = []
    for cond in plan.conditions:
        rows = rows_by_results.get(cond.results, ())
        for c in plan.claims:
            if cond.kind == "impact":
                rec = impact_pair_figure(rows, c.a, c.b, cond, c.threshold)
                rec.update(condition=cond, pair=c)
                out.append(rec)
                continue
            for err in plan.errors:
                rec = pair_figure(rows, (c.a,), (c.b,), "capture", err, threshold=c.threshold, head_dim=None)
                rec.update(condition=cond, pair=c)
                out.append(rec)
    return out


def _recipe_name(spec) -> str | None:
    try:
        return get_recipe(str(spec)).name
    except ValueError:  # a real implementation's name (triton:..., sdpa-fp32): no recipe of this contrast
        return None


def impact_pair_figure(rows: Sequence[dict], a: str, b: str, cond: Condition, threshold: float) -> dict:
    """The figure of one contrast in a whole model: the geometric mean over the held-out windows both arms ran of
    the ratio b / a of the condition's metric, its interval over windows (each window independent: the bootstrap
    widened to the t interval on windows − 1 degrees of freedom) and paired_verdict's verdict against
    ``threshold`` (or, where both arms gave the same value in every window, "identical": no measurement of the
    factor, which then changes nothing on that model); the same keys as
    :func:`zyfa.accuracy.report.claims.pair_figure`'s record. Rows of another model, text or window length, and
    one-layer (per-layer sweep) rows, are not the condition's."""
    named = [(_recipe_name(r.get("recipe")), r) for r in rows
             if r.get("kind") == "impact_window" and r.get("layer") is None and r.get("model") == cond.model
             and r.get("text") == cond.text and r.get("n_tokens") == cond.tokens
             and isinstance(r.get(cond.metric), (int, float))]

    def arm(spec: str) -> dict[int, float]:
        name = _recipe_name(spec)
        return {int(r["window"]): float(r[cond.metric]) for n, r in named if n == name}

    pa, pb = arm(a), arm(b)
    both = sorted(set(pa) & set(pb))
    rec = {"a": a, "b": b, "kind": "impact", "error": IMPACT_METRICS[cond.metric], "n": len(both),
           "per_head": False, "ratio": math.nan, "lo": math.nan, "hi": math.nan, "lo_unit": math.nan,
           "hi_unit": math.nan, "detectable": math.inf, "label": "untested (no paired rows)",
           "label_unit": "untested (no paired rows)", "n_clusters": len(both), "inputs": len(both)}
    if both:
        v = paired_verdict({w: pa[w] for w in both}, {w: pb[w] for w in both}, threshold=threshold, ratio=True,
                           higher_is_better=False, metric=f"ratio of {IMPACT_METRICS[cond.metric]}", arms=(a, b))
        label = v.label
        if all(pa[w] == pb[w] for w in both):  # not a measured null: on this model the two arms are one computation
            label = f"identical in all {len(both)} windows: the arms compute the same here"
        rec.update(ratio=v.effect, lo=v.lo, hi=v.hi, lo_unit=v.lo, hi_unit=v.hi, detectable=v.detectable,
                   label=label, label_unit=label)
    return rec


def figure_text(rec: dict) -> str:
    """A figure's geometric mean with its interval over layers, as the table shows it."""
    if rec["n"] == 0:
        return "–"
    if not math.isfinite(rec["lo"]):
        return f"{fmt(rec['ratio'], 'ratio')} (no interval: one {rec['condition'].cluster})"
    return f"{fmt(rec['ratio'], 'ratio')} [{fmt(rec['lo'], 'ratio')}, {fmt(rec['hi'], 'ratio')}]"


def _unit_interval(rec: dict) -> str:
    if rec["n"] == 0 or not math.isfinite(rec["lo_unit"]):
        return "–"
    if rec["kind"] == "impact":
        return "(one unit per window: the same)"
    if not rec["per_head"] and rec["n"] == rec["n_clusters"]:
        return "(one unit per layer: the same)"
    return f"[{fmt(rec['lo_unit'], 'ratio')}, {fmt(rec['hi_unit'], 'ratio')}]"


def n_text(rec: dict) -> str:
    """A figure's n in words: its units and the layers they lie in."""
    if rec["n"] == 0:
        return "0"
    if rec["kind"] == "impact":
        return f"{rec['n']} held-out windows of {rec['condition'].tokens} tokens (each its own unit)"
    if rec["per_head"]:
        return f"{rec['n']} layer × head units in {rec['n_clusters']} layers"
    heads = rec["condition"].heads
    what = f"query heads {heads}" if heads else "query heads"
    if rec["n"] == rec["n_clusters"]:
        return f"{rec['n']} layers (a layer's unit: rel-L2 over its {what})"
    return f"{rec['n']} inputs in {rec['n_clusters']} layers"


def verdict_text(rec: dict) -> str:
    """A figure's verdict, as the table shows it (a descriptive condition's says it is not claimed)."""
    if rec["n"] == 0:
        return rec["label"]
    if rec["condition"].descriptive:
        return f"descriptive only ({rec['n_clusters']} {rec['condition'].cluster}s); the rule would say: {rec['label']}"
    return rec["label"]


def _unit_label(unit: tuple) -> str:
    inp, head, cluster, _ratio = unit
    where = f"layer {cluster[2]}" if cluster[0] == "layer" else str(inp)
    return where if head is None else f"{where}, head {head}"


def descriptive_unit_rows(figures: Sequence[dict]) -> list[tuple[str, str, str, dict[str, float]]]:
    """(condition label, claim's pair, unit label, error -> ratio b / a) for every paired unit of the descriptive
    operator conditions among ``figures`` (:func:`contrast_figures`), in the figures' order."""
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for f in figures:
        cond = f["condition"]
        if cond.kind == "impact" or not cond.descriptive:
            continue
        pair = f"`{f['pair'].b}` / `{f['pair'].a}`"
        for unit in f.get("units", ()):
            out.setdefault((cond.label, pair, _unit_label(unit)), {})[f["error"]] = unit[3]
    return [(*k, v) for k, v in out.items()]


def contrast_section(plan: ContrastPlan, figures: Sequence[dict], states: Mapping[str, str] | None = None):
    """A report section (``add(doc, plots)``): the plan's rule in words and one table row per (condition, claim,
    error). ``states``: results path -> "complete", "partial" or "missing" (said beside each condition)."""
    states = states or {}

    def add(doc: Doc, plots: bool) -> None:
        doc.h(2, f"Contrast plan `{plan.name}`")
        doc.p(f"Plan `{plan.source}` (hash {plan.hash[:12]}), written before its rows. Each row is one condition "
              "(a model's capture at one length; never pooled) and one error: the geometric mean over units of the "
              "per-unit ratio b / a of rel-L2 against the FP64 oracle, kernel-only (deq: the oracle on the recipe's "
              "own FP8 inputs) or against the original inputs (orig). The unit is a layer × query head where rows "
              "carry per-head errors, else the layer (its rel-L2 over the heads it ran; `zyfa accuracy` rows carry "
              "no per-head errors); a layer's heads share its input, so the verdict's 95% interval is a cluster "
              "bootstrap over layers (widened to "
              "the t interval on layers − 1 degrees of freedom where wider); the interval that counts every "
              "layer × head as independent is shown beside it (narrower, optimistic). Rule (paired_verdict's): "
              "**no effect larger than X** when the interval lies inside [1 − X, 1 + X]; **effect** when it "
              "excludes 1 and reaches beyond that range; otherwise **inconclusive**, with the smallest change the "
              "design could detect. Conditions marked descriptive have too few layers for the interval to mean "
              "much; their verdict is shown but not claimed.")
        if any(c.kind == "impact" for c in plan.conditions):
            doc.p("A whole-model condition (`zyfa impact`) puts each arm in every layer of the model instead: its "
                  "unit is a held-out window of text, its figure the geometric mean over windows of the per-window "
                  "ratio b / a of the model metric named in the error column (next-token KL: the mean over a "
                  "window's positions of KL(stock ‖ arm) of the next-token distributions), and its interval is "
                  "over windows, each independent (the same rule and t widening, on windows − 1 degrees of "
                  "freedom).")
        rows = []
        for f in figures:
            cond, c = f["condition"], f["pair"]
            state = states.get(cond.results, "")
            label = cond.label + ("" if state in ("", "complete") else f" ({state} rows)")
            rows.append([label, f"`{c.b}` / `{c.a}` (threshold {c.threshold:g})", f["error"], figure_text(f),
                         _unit_interval(f), n_text(f), verdict_text(f)])
        doc.table(f"t-contrast-{plan.name}", ["condition", "ratio b / a", "error",
                                              "geometric mean [95% interval over layers or windows]",
                                              "95% interval over layer × head units", "n",
                                              "verdict (over layers or windows)"],
                  rows, text=True)
        per_layer = descriptive_unit_rows(figures)
        if per_layer:
            errors = list(dict.fromkeys(f["error"] for f in figures if f["condition"].kind != "impact"))
            doc.p("Per unit of the descriptive conditions (too few clusters for an interval that means much): the "
                  "ratio b / a of each layer's (or layer × head's) error, so a reader sees the units behind each "
                  "geometric mean and whether they agree.")
            doc.table(f"t-contrast-{plan.name}-units", ["condition", "ratio b / a", "unit",
                                                        *(f"{e} ratio" for e in errors)],
                      [[cond, pair, unit, *(f"{vals[e]:.3f}" if e in vals else "–" for e in errors)]
                       for cond, pair, unit, vals in per_layer], text=True)
        missing = [cond for cond in plan.conditions if states.get(cond.results) in ("missing", "partial")]
        if missing:
            doc.p("Rows missing or incomplete for " + ", ".join(c.label for c in missing) + "; the commands below "
                  "make or complete them:")
            doc.code("\n".join(run_command(plan, c) for c in missing))

    return add


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zyfa.accuracy.report.contrast",
                                 description="render a contrast plan's verdict table from its conditions' rows")
    ap.add_argument("plan", help="the contrast plan (TOML), e.g. studies/accumulator-operator.toml")
    ap.add_argument("--out", help="the Markdown report to write (required unless --commands)")
    ap.add_argument("--commands", action="store_true", help="print the zyfa accuracy (zyfa impact) command of every "
                    "condition and stop")
    args = ap.parse_args(argv)
    try:
        plan = load_contrast_plan(args.plan)
    except PlanFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.commands:
        print("\n".join(run_command(plan, c) for c in plan.conditions))
        return 0
    if not args.out:
        print("error: --out is required (the Markdown report to write)", file=sys.stderr)
        return 2
    rows_by, states, provs = {}, {}, {}
    try:
        for cond in plan.conditions:
            rows_by[cond.results], states[cond.results], provs[cond.results] = read_condition(cond)
    except (OSError, ValueError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    figs = contrast_figures(plan, rows_by)
    doc = Doc(title=f"Contrast: {plan.name}")
    doc.p("Made by `python -m zyfa.accuracy.report.contrast " + " ".join(shlex.quote(a) for a in (
        list(argv) if argv is not None else sys.argv[1:])) + "` from the rows these commands wrote (each on the "
        "device its file's provenance records):")
    doc.code("\n".join(run_command(plan, c, device=provs[c.results].get("device") or "cpu")
                        for c in plan.conditions))
    doc.p("Where each condition's rows were made: " + "; ".join(
        f"{c.label}: {source_label(c.results, provs[c.results])}" for c in plan.conditions) + ".")
    contrast_section(plan, figs, states)(doc, False)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_markdown(doc), encoding="utf-8")
    print(f"wrote {os.fspath(out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
