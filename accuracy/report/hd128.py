"""The hd128 claims study as a report section: its two plan files, the claims table with layer-clustered
intervals, and the sensitivity of the verdicts to our reading of technique 1.

Plans (TOML, written before the figures they decide; the rows record nothing of them, the report states each
plan's hash): ``studies/hd128-claims-clustered.toml`` (the claims, their ranges, the verdict's interval over layers;
it supersedes ``studies/hd128-claims.toml``, kept as first declared) and ``studies/hd128-sensitivity-all.toml`` (the
technique-1 variants as recipe specs, each taking zyfa's place, on all 28 layers; it supersedes
``studies/hd128-sensitivity.toml``, which ran them on the 14 even layers and is kept with its rows). The figures and
the rule are :mod:`zyfa.accuracy.report.claims`'.

Exposed: ``SensitivityPlan``, ``PlanFileError``, ``load_sensitivity_plan(path)``, ``plan_file_hash(path)``,
``read_plan_file(path)``, ``sensitivity_figures(rows, plan=None)``,
``hd128_section(rows, *, sensitivity_plan=..., claims_plan=...) -> add(doc, plots)``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zyfa.accuracy.report.claims import VARIANTS, claims_section, sensitivity
from zyfa.accuracy.report.document import Doc
from zyfa.accuracy.scoring.plan import plan_hash

from zyfa.recipe_spec import get_recipe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["CLAIMS_PLAN", "SENSITIVITY_PLAN", "SENSITIVITY_RESULTS", "PlanFileError", "SensitivityPlan",
           "hd128_section", "load_sensitivity_plan", "plan_file_hash", "read_plan_file", "sensitivity_figures"]

ROOT = Path(__file__).resolve().parents[2]
CLAIMS_PLAN = ROOT / "studies" / "hd128-claims-clustered.toml"
SENSITIVITY_PLAN = ROOT / "studies" / "hd128-sensitivity-all.toml"
#: the rows of SENSITIVITY_PLAN's variants (the H200's emulator; within 2.2e-5 of the CPU's on the even layers)
SENSITIVITY_RESULTS = ROOT / "reports" / "hd128" / "sensitivity-all.jsonl"


class PlanFileError(ValueError):
    """A plan file that cannot be read or used (one line naming the file and the problem)."""


def _read(path: str | Path) -> dict:
    p = Path(path)
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise PlanFileError(f"plan {p}: cannot read it ({e.strerror or e})") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise PlanFileError(f"plan {p}: not valid TOML ({str(e).splitlines()[0]})") from None


def read_plan_file(path: str | Path) -> dict:
    """A plan file's parsed TOML. Raises :class:`PlanFileError` (one line naming the file) when it cannot be read."""
    return _read(path)


def plan_file_hash(path: str | Path) -> str:
    """The plan's hash as :func:`zyfa.accuracy.scoring.plan.plan_hash` computes it (parsed content; comments do not
    count)."""
    return plan_hash(_read(path))


@dataclass(frozen=True)
class SensitivityPlan:
    source: str
    name: str
    hash: str
    variants: tuple[tuple[str, str], ...]  # (label, recipe spec as written)
    run: tuple[str, ...]  # the specs this plan runs (the others have rows already)
    layers: str | tuple[int, ...]
    results: str

    def names(self, spec: str) -> str:
        """The recipe name rows carry for ``spec``."""
        return get_recipe(spec).name


def load_sensitivity_plan(path: str | Path = SENSITIVITY_PLAN) -> SensitivityPlan:
    """Read and check a sensitivity plan: every variant a recipe spec the grammar takes, every spec to run among
    the variants, ``zyfa`` (the assumption itself) among them.

    Raises:
        PlanFileError: one line naming the file and the first problem.
    """
    data = _read(path)
    src = str(path)
    variants = data.get("variants")
    if not isinstance(variants, dict) or not variants or not all(
            isinstance(v, str) and v.strip() for v in variants.values()):
        raise PlanFileError(f"plan {src}: [variants] must map each label to a recipe spec")
    for label, spec in variants.items():
        try:
            get_recipe(spec)
        except ValueError as e:
            raise PlanFileError(f"plan {src}: variant {label!r}: {str(e).splitlines()[0]}") from None
    if "zyfa" not in variants.values():
        raise PlanFileError(f"plan {src}: the variants must hold zyfa itself (the assumption they are set against)")
    run = data.get("run", [])
    if not isinstance(run, list) or not all(isinstance(s, str) for s in run):
        raise PlanFileError(f"plan {src}: run must be a list of recipe specs")
    stray = [s for s in run if s not in variants.values()]
    if stray:
        raise PlanFileError(f"plan {src}: run names {stray[0]!r}, which is not one of its variants")
    layers = data.get("layers", "all")
    if layers != "all" and not (isinstance(layers, list) and layers and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in layers)):
        raise PlanFileError(f"plan {src}: layers must be \"all\" or a list of layer indices")
    return SensitivityPlan(source=src, name=str(data.get("name", Path(src).stem)), hash=plan_hash(data),
                           variants=tuple(variants.items()), run=tuple(run),
                           layers=layers if layers == "all" else tuple(layers),
                           results=str(data.get("results", "")))


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _variants(plan: SensitivityPlan) -> tuple:
    # each plan spec with its named alias from VARIANTS, so rows made under either name count
    return tuple((label, next((names for _, names in VARIANTS if spec in names), (spec,)))
                 for label, spec in plan.variants)


def _plan_rows(rows: Sequence[dict], plan: SensitivityPlan) -> list[dict]:
    if plan.layers == "all":
        return list(rows)
    keep = set(plan.layers)
    return [r for r in rows if r.get("input_source") != "capture" or r.get("input_layer") in keep]


def sensitivity_figures(rows: Sequence[dict], plan: SensitivityPlan | None = None) -> list[dict]:
    """:func:`zyfa.accuracy.report.claims.sensitivity` over the plan's variants, on its layers."""
    plan = plan or load_sensitivity_plan()
    return sensitivity(_plan_rows(rows, plan), _variants(plan))


def hd128_section(rows: Sequence[dict], *, sensitivity_plan: str | Path = SENSITIVITY_PLAN,
                  claims_plan: str | Path = CLAIMS_PLAN):
    """The claims section (``add(doc, plots)``) with the plans that decide it named by path and hash, and the
    sensitivity table over the variants of ``sensitivity_plan``, on its layers."""
    plan = load_sensitivity_plan(sensitivity_plan)
    note = "" if plan.layers == "all" else (
        f"Every variant, zyfa included, on the plan's {len(plan.layers)} layers "
        f"({', '.join(map(str, sorted(plan.layers)))}).")
    inner = claims_section(rows, variants=_variants(plan), sensitivity_rows=_plan_rows(rows, plan),
                           sensitivity_note=note)
    claims_hash = plan_file_hash(claims_plan)

    def add(doc: Doc, plots: bool) -> None:
        inner(doc, plots)
        doc.p(f"Plans: the claims and the verdict's interval from `{_rel(Path(claims_plan))}` (hash "
              f"{claims_hash[:12]}; it supersedes `studies/hd128-claims.toml`, whose verdicts were over layer × head "
              f"units); the technique-1 variants from `{_rel(Path(sensitivity_plan))}` (hash {plan.hash[:12]}), "
              "each file's header says what had been computed when it was written.")

    return add
