"""A HumanEval study plan: the rule decided before the rows, and the verdict by it (issue 41;
/work/shared/research/study_methods.md §3).

The plan (``studies/humaneval.toml``) names a baseline implementation, the arms compared with it (the primary
family: one contrast ``arm vs baseline`` per arm and primary model), the threshold of a meaningful pass@1 change
(a fraction of problems), alpha and the correction over the family, the primary models and the descriptive ones
(verdicts shown, outside the family), and the run's settings (dtype, max_new_tokens, fallback, coverage)::

    name = "humaneval-fp8"
    alpha = 0.05
    correction = "holm"
    models = ["qwen25coder-1.5b"]          # primary: the family
    descriptive_models = ["qwen25coder"]   # verdicts shown, outside the family
    baseline = "stock"
    arms = ["cudnn-fp8", "triton:fa3"]
    descriptive = ["sdpa-fp32"]            # run beside, not compared by the rule
    threshold = 0.05                       # pass@1 points as a fraction
    dtype = "bf16"
    max_new_tokens = 384

The unit is the problem (all :data:`N_PROBLEMS`); per contrast the pass/fail pairs go to
:func:`zyfa.accuracy.scoring.verdict.paired_verdict` (interval, detectable effect) and
:func:`~zyfa.accuracy.scoring.verdict.mcnemar_exact` (the test); the family's McNemar p-values get Holm. A contrast
short of problems keeps p = 1 in the family and its verdict waits ("incomplete"). The plan's hash
(:func:`zyfa.accuracy.scoring.plan.plan_hash`) is written in every row of ``zyfa tasks humaneval --plan`` and rows
under another hash are refused (:func:`zyfa.accuracy.scoring.plan.check_rows`).

Exposed: ``N_PROBLEMS``, ``HumanEvalPlan``, ``load_humaneval_plan(path)``, ``parse_humaneval_plan(data, source)``,
``plan_verdicts(plan, rows)``, ``verdict_markdown(plan, rows)``, and the design's detectable loss before any row:
``mcnemar_power(n, d, delta, alpha)``, ``detectable_loss(n, d, alpha)`` (exact McNemar) and
``approx_detectable_loss(n, d, alpha)`` (normal approximation); ``scripts/humaneval_detectable.py`` prints them.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats
from zyfa.accuracy.implementations.names import check_attention_names, check_decoding
from zyfa.accuracy.scoring.plan import PlanError, check_rows, plan_hash
from zyfa.accuracy.scoring.verdict import holm, mcnemar_exact, paired_verdict
from zyfa.accuracy.tasks.stats import pass_arrays
from zyfa.capture.models import UnknownModelError, get_model_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["N_PROBLEMS", "POWER", "HumanEvalPlan", "approx_detectable_loss", "detectable_loss", "load_humaneval_plan",
           "mcnemar_power", "parse_humaneval_plan", "plan_verdicts", "verdict_markdown"]

N_PROBLEMS = 164
POWER = 0.8  # the power at which the design's detectable loss is stated
_KEYS = {"name", "description", "alpha", "correction", "models", "descriptive_models", "baseline", "arms",
         "descriptive", "threshold", "dtype", "max_new_tokens", "fallback", "coverage"}
_CHOICES = {"correction": ("holm", "none"), "dtype": ("fp32", "bf16"), "fallback": ("none", "stock"),
            "coverage": ("equal", "own")}


@dataclass(frozen=True)
class HumanEvalPlan:
    name: str
    source: str
    hash: str
    baseline: str
    arms: tuple[str, ...]
    threshold: float
    alpha: float
    correction: str
    models: tuple[str, ...]
    descriptive_models: tuple[str, ...] = ()
    descriptive: tuple[str, ...] = ()
    dtype: str = "bf16"
    max_new_tokens: int = 384
    fallback: str = "none"
    coverage: str = "equal"
    description: str = ""

    @property
    def implementations(self) -> list[str]:
        """What a run of the plan runs, the baseline first."""
        return [self.baseline, *self.arms, *self.descriptive]

    @property
    def all_models(self) -> tuple[str, ...]:
        return (*self.models, *self.descriptive_models)

    @property
    def short_hash(self) -> str:
        return self.hash[:12]


def load_humaneval_plan(path: str | Path) -> HumanEvalPlan:
    """Read, parse and check a plan file (registry models, known implementations). PlanError: one line."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_bytes().decode("utf-8"))
    except OSError as e:
        raise PlanError(f"plan {p}: cannot read it ({e.strerror or e})") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise PlanError(f"plan {p}: not valid TOML ({str(e).splitlines()[0]})") from None
    return parse_humaneval_plan(data, str(p))


def _names(data: dict, key: str, source: str, required: bool) -> tuple[str, ...]:
    v = data.get(key)
    if v is None and not required:
        return ()
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x.strip() for x in v):
        raise PlanError(f"plan {source}: {key} must be a non-empty list of names")
    return tuple(x.strip() for x in v)


def parse_humaneval_plan(data: dict, source: str = "<plan>") -> HumanEvalPlan:
    """A :class:`HumanEvalPlan` from parsed TOML, checked against the model registry and the implementation names.

    Raises:
        PlanError: one line naming the file and the first problem.
    """
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise PlanError(f"plan {source}: unknown key {unknown[0]!r}; keys: {', '.join(sorted(_KEYS))}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise PlanError(f"plan {source}: name must be a non-empty string")
    baseline = data.get("baseline")
    if not isinstance(baseline, str) or not baseline.strip():
        raise PlanError(f"plan {source}: baseline must name an implementation")
    arms = _names(data, "arms", source, True)
    descriptive = _names(data, "descriptive", source, False)
    impls = [baseline.strip(), *arms, *descriptive]
    if len(set(impls)) != len(impls):
        raise PlanError(f"plan {source}: baseline, arms and descriptive name an implementation twice")
    try:
        check_attention_names(impls, prefix="")
    except ValueError as e:
        raise PlanError(f"plan {source}: unknown implementation: {str(e).splitlines()[0]}") from None
    try:
        check_decoding(impls, prefix="")  # HumanEval decodes every answer greedily
    except ValueError as e:
        raise PlanError(f"plan {source}: {e}") from None
    models = _names(data, "models", source, True)
    extra = _names(data, "descriptive_models", source, False)
    if len(set(models + extra)) != len(models + extra):
        raise PlanError(f"plan {source}: models and descriptive_models name a model twice")
    for m in models + extra:
        try:
            get_model_spec(m)
        except UnknownModelError as e:
            raise PlanError(f"plan {source}: {e}") from None
    t = data.get("threshold")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (0 < t < 1):
        raise PlanError(f"plan {source}: threshold must be a pass@1 change in (0, 1) (0.05 = 5 points), not {t!r}")
    alpha = data.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise PlanError(f"plan {source}: alpha must be a number in (0, 1), not {alpha!r}")
    for key, allowed in _CHOICES.items():
        if key in data and data[key] not in allowed:
            raise PlanError(f"plan {source}: {key} {data[key]!r} is not one of {', '.join(allowed)}")
    mnt = data.get("max_new_tokens", 384)
    if isinstance(mnt, bool) or not isinstance(mnt, int) or mnt < 1:
        raise PlanError(f"plan {source}: max_new_tokens must be a positive integer, not {mnt!r}")
    if "description" in data and not isinstance(data["description"], str):
        raise PlanError(f"plan {source}: description must be a string")
    return HumanEvalPlan(name=name.strip(), source=source, hash=plan_hash(data), baseline=baseline.strip(), arms=arms,
                         threshold=float(t), alpha=float(alpha), correction=data.get("correction", "holm"),
                         models=models, descriptive_models=extra, descriptive=descriptive,
                         dtype=data.get("dtype", "bf16"), max_new_tokens=mnt, fallback=data.get("fallback", "none"),
                         coverage=data.get("coverage", "equal"), description=data.get("description", ""))


def plan_verdicts(plan: HumanEvalPlan, rows: Sequence[dict]) -> list[dict]:
    """One dict per (model, arm), primary models first: ``model``, ``arm``, ``primary`` (in the family),
    ``n_base``/``n_arm`` (scored problems of each), ``n`` (paired), ``verdict`` (None without paired problems),
    ``mcnemar_p``, ``n01``, ``n10``, ``p_adjusted``, ``complete`` (all :data:`N_PROBLEMS` paired) and ``label``.

    Rows of the plan's models must carry the plan's hash (PlanError otherwise, one line)."""
    mine = [r for r in rows if r.get("kind") == "humaneval" and r.get("model") in plan.all_models]
    check_rows(plan, mine, "rows")  # type: ignore[arg-type]  (needs .hash, .source, .short_hash)
    arrays = pass_arrays(mine)
    out = []
    for m in plan.all_models:
        base = arrays.get((m, plan.baseline), {})
        for arm in plan.arms:
            b = arrays.get((m, arm), {})
            common = sorted(set(base) & set(b))
            rec = {"model": m, "arm": arm, "primary": m in plan.models, "n_base": len(base), "n_arm": len(b),
                   "n": len(common), "verdict": None, "mcnemar_p": math.nan, "n01": 0, "n10": 0,
                   "p_adjusted": math.nan, "complete": len(common) >= N_PROBLEMS}
            if common:
                av = [float(base[t]) for t in common]
                bv = [float(b[t]) for t in common]
                rec["verdict"] = paired_verdict(av, bv, units=common, threshold=plan.threshold, alpha=plan.alpha,
                                                metric="pass@1", arms=(plan.baseline, arm))
                rec["mcnemar_p"], rec["n01"], rec["n10"] = mcnemar_exact(av, bv)
            out.append(rec)
    family = [r for r in out if r["primary"]]
    # an incomplete contrast counts with p = 1: a partial file never gives smaller adjusted p than the whole plan
    pvals = [r["mcnemar_p"] if r["complete"] else 1.0 for r in family]
    adjusted = holm(pvals) if plan.correction == "holm" else pvals
    for r, p in zip(family, adjusted, strict=True):
        r["p_adjusted"] = p
    for r in out:
        r["label"] = _label(plan, r)
    return out


def _label(plan: HumanEvalPlan, r: dict) -> str:
    v = r["verdict"]
    if v is None:
        return "waits: no paired problems"
    if not r["complete"]:
        return f"waits: {r['n']} of {N_PROBLEMS} problems paired"
    if not v.informative:
        return v.label
    if v.kind == "equivalent":
        said = f"no effect larger than {100 * plan.threshold:g} points"
    elif v.kind == "inconclusive" or (v.kind == "effect" and r["primary"] and not r["p_adjusted"] < plan.alpha):
        said = f"inconclusive (could detect only ≥ {100 * v.detectable:.1f} points)"
        if v.kind == "effect":  # the interval excludes 0 but the family's correction takes the effect away
            said = f"inconclusive after {plan.correction} (adjusted p = {r['p_adjusted']:.2g})"
    else:
        said = f"effect ({v.direction})"
    return said if r["primary"] else f"descriptive: {said}"


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}" if math.isfinite(x) else "–"


def _correction(plan: HumanEvalPlan, k: int) -> str:
    said = f"{k} contrast{'' if k == 1 else 's'}"
    if plan.correction == "none":
        return f"no correction ({said})"
    return f"{plan.correction} over the primary models' {said}"


def verdict_markdown(plan: HumanEvalPlan, rows: Sequence[dict]) -> str:
    """The verdict table by the plan's rule, with a line on the rule and one on completeness."""
    res = plan_verdicts(plan, rows)
    lines = [f"Plan `{plan.source}` ({plan.name}, hash {plan.short_hash}, recorded in every row): pass@1 of each arm "
             f"against `{plan.baseline}`, paired per problem (n = {N_PROBLEMS}); threshold {100 * plan.threshold:g} "
             f"points, α = {plan.alpha:g}, exact McNemar, {_correction(plan, sum(r['primary'] for r in res))}; "
             "interval and detectable effect (80% power) from paired_verdict. Points are pass@1 × 100.", "",
             "| model | arm vs baseline | problems (base/arm/paired of 164) | Δ pass@1 points [95% CI] | "
             "detectable | McNemar p (n01/n10) | Holm p | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in res:
        v = r["verdict"]
        role = "" if r["primary"] else " (descriptive)"
        if v is None:
            diff = det = "–"
        else:
            diff = f"{_pts(v.effect)} [{_pts(v.lo)}, {_pts(v.hi)}]"
            det = f"{100 * v.detectable:.1f}" if math.isfinite(v.detectable) else "–"
        mc = f"{r['mcnemar_p']:.2g} ({r['n01']}/{r['n10']})" if math.isfinite(r["mcnemar_p"]) else "–"
        hp = f"{r['p_adjusted']:.2g}" if math.isfinite(r["p_adjusted"]) and r["complete"] else "–"
        lines.append(f"| {r['model']}{role} | {r['arm']} vs {plan.baseline} | {r['n_base']}/{r['n_arm']}/{r['n']} | "
                     f"{diff} | {det} | {mc} | {hp} | {r['label']} |")
    waiting = [r for r in res if r["primary"] and not r["complete"]]
    lines.append("")
    if waiting:
        lines.append(f"**The plan is incomplete: {len(waiting)} of its {sum(r['primary'] for r in res)} primary "
                     f"contrasts have fewer than {N_PROBLEMS} paired problems**; they count in the correction with "
                     "p = 1, and the plan's verdict waits for them.")
    else:
        lines.append("The plan is complete: every primary contrast has all "
                     f"{N_PROBLEMS} problems paired.")
    return "\n".join(lines) + "\n"


def mcnemar_power(n: int, d: float, delta: float, alpha: float) -> float:
    """The probability that the exact two-sided McNemar test (:func:`zyfa.accuracy.scoring.verdict.mcnemar_exact`'s)
    rejects at ``alpha`` over ``n`` paired problems, a share ``d`` of them discordant (pass under one arm only) and a
    net loss ``delta`` (a fraction of problems): the discordant count ~ Binomial(n, d), the losses among N discordant
    ~ Binomial(N, (d + delta) / 2d)."""
    q = (d + delta) / (2 * d)
    total = 0.0
    for big_n in range(1, n + 1):
        w = stats.binom.pmf(big_n, n, d)
        if w < 1e-12:
            continue
        k = np.arange(big_n + 1)
        p = np.minimum(1.0, 2 * stats.binom.cdf(np.minimum(k, big_n - k), big_n, 0.5))
        total += w * float(stats.binom.pmf(k[p < alpha], big_n, q).sum())
    return total


def detectable_loss(n: int, d: float, alpha: float, power: float = POWER) -> float:
    """The smallest pass@1 loss k / n (k whole problems, at most ``d``) that the exact McNemar test finds with
    ``power``; NaN when none reaches it (too few discordant problems)."""
    return next((k / n for k in range(1, round(d * n) + 1)
                 if k / n <= d and mcnemar_power(n, d, k / n, alpha) >= power), math.nan)


def approx_detectable_loss(n: int, d: float, alpha: float, power: float = POWER) -> float:
    """The normal approximation of :func:`detectable_loss`: (z[1 - alpha/2] + z[power]) * sqrt(d / n)."""
    return float((stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)) * math.sqrt(d / n))
