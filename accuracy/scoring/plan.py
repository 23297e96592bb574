"""Study plans: the rule decided before the data (/work/shared/research/study_methods.md §3).

A plan is a TOML file that names the primary contrast (two implementation specs that differ in one factor), the
metrics, the threshold of a meaningful effect per metric, alpha and the correction over several contrasts, and the
grid (models, tasks, lengths, depths, facts); other contrasts are listed as exploratory. ``zyfa longctx --plan FILE``
runs it and records the plan's hash in every row; the report states the verdict by the plan's rule and refuses rows
written under another hash. Example (``studies/accumulator.toml``)::

    name = "accumulator"
    alpha = 0.05
    correction = "holm"
    models = ["smollm2"]
    tasks = ["needle"]
    lengths = ["4k", 8192]
    depths = [0.0, 0.5, 1.0]
    facts = 50                     # distinct facts (seeds) per cell: the independent unit
    first_fact = 0                 # optional: the first fact's seed (a later plan takes fresh facts, e.g. 50)
    baselines = ["sdpa-fp32"]      # run beside the contrasts, not compared by the rule

    [primary]
    a = "triton:fa3"
    b = "triton:fa3:accum_flush_tiles=1"

    [metrics]                      # metric = threshold of a meaningful effect (b - a)
    answer_logprob = 0.05          # nats of log p(answer)
    exact = 0.05                   # points of exact match (a fraction)

    [[exploratory]]
    a = "triton:zyfa-hopper:accum_flush_tiles=0"
    b = "triton:zyfa-hopper"

Metrics (:data:`METRICS`): ``answer_logprob`` and ``exact`` are teacher-forced (the answer scored inside the
prefill); ``gen_exact`` and ``gen_contains`` score the answer the model generates greedily with the implementation
in every step. A plan that judges a generated metric must set ``generate = N`` (N >= 1: decode at most
len(answer) + N tokens, ``zyfa longctx --generate N``); a plan may set ``generate`` without one (the report's
descriptive "gen" column).

The hash is the SHA-256 of the plan's parsed content as canonical JSON (sorted keys), so comments and layout do not
change it and any value does (``generate`` included). ``facts`` below :data:`MIN_FACTS` is refused unless
``pilot = true`` (a pilot's verdicts say so).

Exposed: ``Plan``, ``Contrast``, ``PlanError``, ``Metric``, ``METRICS``, ``GENERATED``, ``MIN_FACTS``,
``load_plan(path)``, ``parse_plan(data, source)``, ``plan_hash(data)``,
``check_plan(plan, *, tasks, implementation_kind)``, ``check_rows(plan, rows, source)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from zyfa.capture.models import UnknownModelError, get_model_spec
from zyfa.capture.text import TEXTS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["GENERATED", "METRICS", "MIN_FACTS", "Contrast", "Metric", "Plan", "PlanError", "check_plan", "check_rows",
           "load_plan", "parse_plan", "plan_hash"]

MIN_FACTS = 50
CORRECTIONS = ("holm", "none")


class Metric(NamedTuple):
    """A metric a plan may judge: ``label`` (what the report calls it), ``higher_is_better``, ``unit`` (of its
    threshold) and ``phrase`` (how a finding's condition names it, unit and meaning included)."""

    label: str
    higher_is_better: bool
    unit: str
    phrase: str


# metric (a row field of zyfa longctx) -> how it is judged and named. The gen_ metrics score the answer decoded
# greedily with the implementation in the prefill and every decode step (zyfa longctx --generate N,
# accuracy.longctx.tasks.score_generated); a plan that judges one says how many tokens to generate (``generate``).
METRICS = {
    "answer_logprob": Metric("Δ log p(answer)", True, "nats", "Δ log p(answer) (nats, summed over the answer)"),
    "exact": Metric("exact match", True, "fraction of prompts", "exact match"),
    "gen_exact": Metric("generated exact match", True, "fraction of prompts",
                        "generated exact match (fraction of prompts whose greedily decoded answer, the implementation "
                        "in every decode step, starts with the expected answer)"),
    "gen_contains": Metric("generated answer holds every part", True, "fraction of prompts",
                           "generated answer holding every part (fraction of prompts whose greedily decoded answer "
                           "contains every part of the expected one, e.g. multikey's number, niah's 'sandwich' and "
                           "'Dolores Park')"),
}
GENERATED = tuple(m for m in METRICS if m.startswith("gen_"))  # the metrics that need generated answers
_KEYS = {"name", "description", "alpha", "correction", "models", "tasks", "lengths", "depths", "facts", "first_fact",
         "baselines", "primary", "metrics", "exploratory", "pilot", "text", "dtype", "fallback", "generate"}


class PlanError(ValueError):
    """A plan that cannot be run or used (one line naming the file and the problem)."""


@dataclass(frozen=True)
class Contrast:
    """``b`` against ``a`` (effect = b - a per unit); ``exploratory`` contrasts are outside the plan's rule."""

    a: str
    b: str
    exploratory: bool = False

    @property
    def label(self) -> str:
        return f"{self.b} vs {self.a}" + (" (exploratory)" if self.exploratory else "")


@dataclass(frozen=True)
class Plan:
    name: str
    source: str
    hash: str
    primary: Contrast
    exploratory: tuple[Contrast, ...]
    metrics: dict[str, float]  # metric -> threshold
    alpha: float
    correction: str
    models: tuple[str, ...]
    tasks: tuple[str, ...]
    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    facts: int
    baselines: tuple[str, ...] = ()
    first_fact: int = 0  # the facts are seeds first_fact .. first_fact + facts - 1 (fresh facts for a later plan)
    pilot: bool = False
    description: str = ""
    text: str | None = None
    dtype: str | None = None
    fallback: str | None = None
    generate: int = 0  # tokens generated past the answer's length (zyfa longctx --generate N); 0: none

    @property
    def contrasts(self) -> tuple[Contrast, ...]:
        return (self.primary, *self.exploratory)

    @property
    def implementations(self) -> list[str]:
        """Every implementation the plan runs, baselines first, each once."""
        names = [*self.baselines]
        for c in self.contrasts:
            names += [c.a, c.b]
        return list(dict.fromkeys(names))

    @property
    def short_hash(self) -> str:
        return self.hash[:12]

    @property
    def primary_family(self) -> int:
        """The primary contrast's cell-metrics (models × tasks × lengths × metrics): the family its correction runs
        over once every cell has rows (``accuracy.longctx.verdicts.plan_verdicts``)."""
        return len(self.models) * len(self.tasks) * len(self.lengths) * len(self.metrics)


def plan_hash(data: dict) -> str:
    """SHA-256 of the parsed plan as canonical JSON (sorted keys, no whitespace)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def load_plan(path: str | Path) -> Plan:
    """Read and parse a plan file. Raises :class:`PlanError` (one line) for a missing or malformed file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise PlanError(f"plan {p}: cannot read it ({e.strerror or e})") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise PlanError(f"plan {p}: not valid TOML ({str(e).splitlines()[0]})") from None
    return parse_plan(data, str(p))


def _strings(data: dict, key: str, source: str, *, required: bool = True) -> tuple[str, ...]:
    v = data.get(key)
    if v is None and not required:
        return ()
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x.strip() for x in v):
        raise PlanError(f"plan {source}: {key} must be a non-empty list of names")
    if len(set(v)) != len(v):
        raise PlanError(f"plan {source}: {key} repeats a name")
    return tuple(x.strip() for x in v)


def _length(x, source: str) -> int:
    if isinstance(x, bool):
        raise PlanError(f"plan {source}: lengths: {x!r} is not a length")
    if isinstance(x, int):
        n = x
    elif isinstance(x, str) and x.strip().lower().endswith("k") and x.strip()[:-1].isdigit():
        n = int(x.strip()[:-1]) * 1024
    elif isinstance(x, str) and x.strip().isdigit():
        n = int(x.strip())
    else:
        raise PlanError(f"plan {source}: lengths: {x!r} is not a length in tokens (an integer or e.g. '8k')")
    if n < 1:
        raise PlanError(f"plan {source}: lengths: {x!r} must be at least 1 token")
    return n


def _contrast(v, where: str, source: str, exploratory: bool) -> Contrast:
    if not isinstance(v, dict) or set(v) - {"a", "b", "note"} or not all(
            isinstance(v.get(k), str) and v[k].strip() for k in ("a", "b")):
        raise PlanError(f"plan {source}: {where} must be a table with a = \"SPEC\" and b = \"SPEC\" (and an optional "
                        "note)")
    if v["a"].strip() == v["b"].strip():
        raise PlanError(f"plan {source}: {where} compares {v['a']} with itself")
    return Contrast(v["a"].strip(), v["b"].strip(), exploratory)


def parse_plan(data: dict, source: str = "<plan>") -> Plan:
    """A :class:`Plan` from parsed TOML; checks the plan's own shape (not the registry: :func:`check_plan`).

    Raises:
        PlanError: one line naming the file and the first problem.
    """
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise PlanError(f"plan {source}: unknown key {unknown[0]!r}; keys: {', '.join(sorted(_KEYS))}")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise PlanError(f"plan {source}: name must be a non-empty string")
    if "primary" not in data:
        raise PlanError(f"plan {source}: no [primary] contrast (a = \"SPEC\", b = \"SPEC\")")
    primary = _contrast(data["primary"], "[primary]", source, False)
    expl_raw = data.get("exploratory", [])
    if not isinstance(expl_raw, list):
        raise PlanError(f"plan {source}: exploratory must be an array of tables ([[exploratory]])")
    exploratory = tuple(_contrast(v, f"[[exploratory]] #{i + 1}", source, True) for i, v in enumerate(expl_raw))
    metrics = data.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise PlanError(f"plan {source}: [metrics] must map each metric to its threshold "
                        f"(metrics: {', '.join(METRICS)})")
    for m, t in metrics.items():
        if m not in METRICS:
            raise PlanError(f"plan {source}: unknown metric {m!r}; metrics: {', '.join(METRICS)}")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t > 0 and math.isfinite(t)):
            raise PlanError(f"plan {source}: metric {m}'s threshold must be a positive number, not {t!r}")
    alpha = data.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise PlanError(f"plan {source}: alpha must be a number in (0, 1), not {alpha!r}")
    correction = data.get("correction", "holm")
    if correction not in CORRECTIONS:
        raise PlanError(f"plan {source}: correction {correction!r} is not one of {', '.join(CORRECTIONS)}")
    lengths_raw = data.get("lengths")
    if not isinstance(lengths_raw, list) or not lengths_raw:
        raise PlanError(f"plan {source}: lengths must be a non-empty list of lengths in tokens")
    lengths = tuple(_length(x, source) for x in lengths_raw)
    depths_raw = data.get("depths", [i / 10 for i in range(11)])
    if (not isinstance(depths_raw, list) or not depths_raw
            or not all(isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d <= 1 for d in depths_raw)):
        raise PlanError(f"plan {source}: depths must be a non-empty list of fractions in [0, 1]")
    facts = data.get("facts")
    if isinstance(facts, bool) or not isinstance(facts, int) or facts < 1:
        raise PlanError(f"plan {source}: facts must be a positive integer (distinct facts per cell), not {facts!r}")
    first_fact = data.get("first_fact", 0)
    if isinstance(first_fact, bool) or not isinstance(first_fact, int) or first_fact < 0:
        raise PlanError(f"plan {source}: first_fact must be a non-negative integer (the first fact's seed), "
                        f"not {first_fact!r}")
    pilot = data.get("pilot", False)
    if not isinstance(pilot, bool):
        raise PlanError(f"plan {source}: pilot must be true or false")
    if facts < MIN_FACTS and not pilot:
        raise PlanError(f"plan {source}: facts = {facts} is below {MIN_FACTS} per cell (the fact is the independent "
                        "unit; fewer cannot detect a few points); raise it, or set pilot = true")
    generate = data.get("generate", 0)
    if "generate" in data and (isinstance(generate, bool) or not isinstance(generate, int) or generate < 1):
        raise PlanError(f"plan {source}: generate must be a positive integer (tokens decoded past the answer's "
                        f"length, as zyfa longctx --generate N), not {generate!r}")
    gen = [m for m in metrics if m in GENERATED]
    if gen and not generate:
        raise PlanError(f"plan {source}: metric {gen[0]} scores generated answers: say how many tokens to generate "
                        "past the answer's length with generate = N (N >= 1)")
    for key in ("description", "text", "dtype", "fallback"):
        if key in data and not isinstance(data[key], str):
            raise PlanError(f"plan {source}: {key} must be a string")
    for key, allowed in (("dtype", ("fp32", "bf16")), ("fallback", ("none", "stock"))):
        if key in data and data[key] not in allowed:
            raise PlanError(f"plan {source}: {key} {data[key]!r} is not one of {', '.join(allowed)}")
    return Plan(name=name.strip(), source=source, hash=plan_hash(data), primary=primary, exploratory=exploratory,
                metrics={m: float(t) for m, t in metrics.items()}, alpha=float(alpha), correction=correction,
                models=_strings(data, "models", source), tasks=_strings(data, "tasks", source), lengths=lengths,
                depths=tuple(float(d) for d in depths_raw), facts=facts, first_fact=first_fact,
                baselines=_strings(data, "baselines", source, required=False), pilot=pilot,
                description=data.get("description", ""), text=data.get("text"), dtype=data.get("dtype"),
                fallback=data.get("fallback"), generate=generate)


def check_plan(plan: Plan, *, tasks: Iterable[str], implementation_kind: Callable[[str], str]) -> None:
    """Check a plan against what exists, before any work: the haystack text, each task among ``tasks``, each model
    in the registry
    with every length within its context (:func:`zyfa.capture.models.get_model_spec`), each implementation known
    (``implementation_kind(spec)`` returns what runs it, e.g. "kernel" or "emulator", and raises ValueError for an
    unknown spec), and the primary contrast's arms run by the same kind (a kernel against an emulation is not one
    factor).

    Raises:
        PlanError: one line naming the file and the first problem.
    """
    if plan.text is not None and plan.text not in TEXTS:
        raise PlanError(f"plan {plan.source}: unknown text {plan.text!r}; texts: {', '.join(sorted(TEXTS))}")
    known = tuple(tasks)
    for t in plan.tasks:
        if t not in known:
            raise PlanError(f"plan {plan.source}: unknown task {t!r}; tasks: {', '.join(known)}")
    for m in plan.models:
        try:
            spec = get_model_spec(m)
        except UnknownModelError as e:
            raise PlanError(f"plan {plan.source}: {e}") from None
        over = [n for n in plan.lengths if n > spec.max_context]
        if over:
            raise PlanError(f"plan {plan.source}: length {over[0]} is above {m}'s context of {spec.max_context} "
                            "tokens")
    kinds = {}
    for name in plan.implementations:
        try:
            kinds[name] = implementation_kind(name)
        except ValueError as e:
            raise PlanError(f"plan {plan.source}: unknown implementation {name!r} ({str(e).splitlines()[0]})") from None
    a, b = plan.primary.a, plan.primary.b
    if kinds[a] != kinds[b]:
        raise PlanError(f"plan {plan.source}: the primary contrast is not one factor: {a} runs as {kinds[a]} and "
                        f"{b} as {kinds[b]}")


def check_rows(plan: Plan, rows: Sequence[dict], source: str = "rows") -> None:
    """Refuse rows not written under ``plan`` as it is now: every row must carry ``plan_hash`` equal to the plan's
    hash (a plan edited after its rows were written no longer matches them).

    Raises:
        PlanError: one line with the count and both hashes.
    """
    other = [r for r in rows if r.get("plan_hash") != plan.hash]
    if not other:
        return
    hashes = sorted({str(r.get("plan_hash")) for r in other})
    if hashes == ["None"]:
        raise PlanError(f"{source}: {len(other)} of {len(rows)} rows carry no plan hash: they were not written under "
                        f"plan {plan.source}")
    raise PlanError(f"{source}: {len(other)} of {len(rows)} rows were written under plan hash "
                    f"{hashes[0][:12]}, but {plan.source} now hashes to {plan.short_hash}: the plan changed after "
                    "its rows were written (restore it, or run the new plan into a new --out)")
