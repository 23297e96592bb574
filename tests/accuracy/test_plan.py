"""zyfa.accuracy.scoring.plan: parsing, the canonical hash, validation in one line before any work, and rows refused
when the
plan changed after them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from zyfa.accuracy.implementations.base import unsupported_reason
from zyfa.accuracy.implementations.registry import get_implementation
from zyfa.accuracy.inputs.attention_input import AttentionInput
from zyfa.accuracy.longctx.cli import implementation_kind
from zyfa.accuracy.longctx.tasks import TASKS
from zyfa.accuracy.longctx.verdicts import plan_verdicts
from zyfa.accuracy.scoring.plan import (
    GENERATED,
    METRICS,
    MIN_FACTS,
    PlanError,
    check_plan,
    check_rows,
    load_plan,
    parse_plan,
)
from zyfa.capture.models import MODELS

from zyfa.recipe_spec import get_recipe

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
name = "t"
models = ["smollm2"]
tasks = ["needle"]
lengths = ["2k", 4096]
depths = [0.0, 1.0]
facts = 50
baselines = ["sdpa-fp32"]

[primary]
a = "fa3"
b = "fa3:accum_flush_tiles=1"

[metrics]
answer_logprob = 0.05
exact = 0.05

[[exploratory]]
a = "zyfa-hopper:accum_flush_tiles=0"
b = "zyfa-hopper"
"""


def _kind(name: str) -> str:
    """A registry stand-in with the real rule's shape: emulator recipe names, 'triton:' kernels, others unknown."""
    from zyfa.recipe_spec import get_recipe

    if name.startswith("triton:") and ":" not in name[len("triton:"):]:
        return "kernel"
    if name == "sdpa-fp32":
        return "kernel"
    get_recipe(name.split(":")[0])  # ValueError for an unknown recipe
    return "emulator"


def _write(tmp_path, text, name="plan.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_good_plan_parses_and_validates(tmp_path):
    plan = load_plan(_write(tmp_path, GOOD))
    assert plan.lengths == (2048, 4096) and plan.facts == 50 and plan.alpha == 0.05 and plan.correction == "holm"
    assert plan.primary.a == "fa3" and not plan.primary.exploratory
    assert plan.exploratory[0].exploratory and plan.exploratory[0].label.endswith("(exploratory)")
    assert plan.implementations == ["sdpa-fp32", "fa3", "fa3:accum_flush_tiles=1", "zyfa-hopper:accum_flush_tiles=0",
                                    "zyfa-hopper"]
    check_plan(plan, tasks=("needle", "passkey"), implementation_kind=_kind)


def test_hash_ignores_layout_and_comments_but_not_values(tmp_path):
    a = load_plan(_write(tmp_path, GOOD, "a.toml"))
    b = load_plan(_write(tmp_path, "# a comment\n" + GOOD.replace("facts = 50", "facts    =   50  # per cell"),
                         "b.toml"))
    c = load_plan(_write(tmp_path, GOOD.replace("exact = 0.05", "exact = 0.06"), "c.toml"))
    assert a.hash == b.hash and a.hash != c.hash and len(a.hash) == 64


@pytest.mark.parametrize("edit, line", [
    (("facts = 50", "facts = 3"), f"facts = 3 is below {MIN_FACTS} per cell"),
    (("facts = 50", "facts = 3\npilot = true"), None),
    (("answer_logprob = 0.05", "perplexity = 0.05"), "unknown metric 'perplexity'"),
    (("exact = 0.05", "exact = 0"), "metric exact's threshold must be a positive number"),
    (('lengths = ["2k", 4096]', 'lengths = ["2q"]'), "lengths: '2q' is not a length"),
    (('b = "fa3:accum_flush_tiles=1"', 'b = "fa3"'), "[primary] compares fa3 with itself"),
    (("[primary]", "[primery]"), "unknown key 'primery'"),
    (("name = \"t\"", "name = \"t\"\nalpha = 1.5"), "alpha must be a number in (0, 1)"),
    (("name = \"t\"", "name = \"t\"\ncorrection = \"bonferoni\""), "correction 'bonferoni' is not one of"),
    (("depths = [0.0, 1.0]", "depths = [0.0, 1.5]"), "depths must be a non-empty list of fractions"),
    (("facts = 50", "facts = 50\nfirst_fact = -1"), "first_fact must be a non-negative integer"),
    (("facts = 50", "facts = 50\nfirst_fact = true"), "first_fact must be a non-negative integer"),
])
def test_shape_problems_are_one_line(tmp_path, edit, line):
    text = GOOD.replace(*edit)
    assert text != GOOD
    if line is None:
        assert load_plan(_write(tmp_path, text)).pilot
        return
    with pytest.raises(PlanError) as e:
        load_plan(_write(tmp_path, text))
    msg = str(e.value)
    assert line in msg and "\n" not in msg and msg.startswith("plan ")


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(PlanError, match="cannot read it"):
        load_plan(tmp_path / "missing.toml")
    with pytest.raises(PlanError, match="not valid TOML"):
        load_plan(_write(tmp_path, "name = \n"))


@pytest.mark.parametrize("edit, line", [
    (('tasks = ["needle"]', 'tasks = ["needle", "ruler"]'), "unknown task 'ruler'; tasks: needle, passkey"),
    (('lengths = ["2k", 4096]', 'lengths = ["2k", "16k"]'), "length 16384 is above smollm2's context of 8192"),
    (('models = ["smollm2"]', 'models = ["llama9"]'), "unknown model 'llama9'"),
    (('a = "fa3"', 'a = "fa9"'), "unknown implementation 'fa9'"),
    (('name = "t"', 'name = "t"\ntext = "lorem"'), "unknown text 'lorem'; texts: "),
    (('a = "fa3"', 'a = "triton:fa3"'),
     "the primary contrast is not one factor: triton:fa3 runs as kernel and fa3:accum_flush_tiles=1 as emulator"),
])
def test_registry_problems_are_one_line_before_any_work(tmp_path, edit, line):
    plan = load_plan(_write(tmp_path, GOOD.replace(*edit)))
    with pytest.raises(PlanError) as e:
        check_plan(plan, tasks=("needle", "passkey"), implementation_kind=_kind)
    assert line in str(e.value) and "\n" not in str(e.value)


def test_rows_from_a_changed_plan_are_refused(tmp_path):
    path = _write(tmp_path, GOOD)
    plan = load_plan(path)
    rows = [{"kind": "longctx", "plan_hash": plan.hash} for _ in range(4)]
    check_rows(plan, rows)  # the same plan: accepted
    path.write_text(GOOD.replace("exact = 0.05", "exact = 0.02"))  # the threshold moved after the data
    changed = load_plan(path)
    with pytest.raises(PlanError) as e:
        check_rows(changed, rows, "r.jsonl")
    assert str(e.value) == (f"r.jsonl: 4 of 4 rows were written under plan hash {plan.hash[:12]}, but {path} now "
                            f"hashes to {changed.hash[:12]}: the plan changed after its rows were written (restore "
                            "it, or run the new plan into a new --out)")
    with pytest.raises(PlanError, match="2 of 2 rows carry no plan hash"):
        check_rows(plan, [{}, {}])


def test_the_shipped_accumulator_plan():
    plan = load_plan(ROOT / "studies" / "accumulator.toml")
    assert plan.primary.a == "triton:fa3" and plan.primary.b == "triton:fa3:accum_flush_tiles=1"
    assert plan.facts >= MIN_FACTS and not plan.pilot and plan.correction == "holm"
    assert plan.tasks == ("niah", "multikey") and plan.lengths == (8192, 16384, 32768)
    check_plan(plan, tasks=("niah", "multikey"), implementation_kind=lambda n: "kernel")


@pytest.mark.parametrize("name", ["accumulator.toml", "accumulator-hd128.toml", "accumulator-smollm2.toml",
                                  "fp8-retrieval-hd128.toml", "fp8-retrieval-generated.toml", "longctx-1.5b.toml"])
def test_every_shipped_longctx_plan_checks(name):
    """Every committed long-context plan parses and passes the registry checks (models, lengths within context)."""
    plan = load_plan(ROOT / "studies" / name)
    assert plan.facts >= MIN_FACTS and not plan.pilot
    check_plan(plan, tasks=("niah", "multikey"), implementation_kind=lambda n: "kernel")
    # the family the report's correction runs over (one entry per primary cell-metric, rows or not) is the one the
    # findings' design clause names (plan.primary_family)
    primary = [v for v in plan_verdicts(plan, []) if not v["contrast"].exploratory]
    assert len(primary) == plan.primary_family


def test_a_later_plan_takes_fresh_facts(tmp_path):
    """first_fact moves the facts' seeds (default 0), so a plan written after another's rows can take facts none of
    them used; it is part of the hash."""
    first = load_plan(_write(tmp_path, GOOD))
    later = load_plan(_write(tmp_path, GOOD.replace("facts = 50", "facts = 50\nfirst_fact = 50"), "later.toml"))
    assert first.first_fact == 0 and later.first_fact == 50 and first.hash != later.hash
    fresh = set(range(later.first_fact, later.first_fact + later.facts))
    assert fresh.isdisjoint(range(first.first_fact, first.first_fact + first.facts))


def test_parse_plan_from_data():
    plan = parse_plan({"name": "d", "models": ["gemma3"], "tasks": ["passkey"], "lengths": [32768], "facts": 60,
                       "primary": {"a": "fa3", "b": "zyfa"}, "metrics": {"exact": 0.1}})
    assert plan.depths == tuple(i / 10 for i in range(11)) and plan.source == "<plan>"
    with pytest.raises(PlanError, match="no \\[primary\\] contrast"):
        parse_plan({"name": "d"})


GEN = GOOD.replace("exact = 0.05", "exact = 0.05\ngen_exact = 0.05").replace("facts = 50", "facts = 50\ngenerate = 3")


def test_a_generated_metric_with_generate_parses_and_hashes_its_n(tmp_path):
    """gen_exact (the greedily generated answer's exact match) is a metric of the plan grammar once the plan says how
    many tokens to generate; generate is part of the hash."""
    plan = load_plan(_write(tmp_path, GEN))
    assert plan.generate == 3 and plan.metrics["gen_exact"] == 0.05
    assert METRICS["gen_exact"].label == "generated exact match" and METRICS["gen_exact"].higher_is_better
    assert METRICS["gen_exact"].unit == "fraction of prompts" and set(GENERATED) == {"gen_exact", "gen_contains"}
    other = load_plan(_write(tmp_path, GEN.replace("generate = 3", "generate = 4"), "other.toml"))
    assert other.hash != plan.hash
    assert load_plan(_write(tmp_path, GOOD, "plain.toml")).generate == 0
    # generate without a generated metric: allowed (the report's descriptive gen column)
    assert load_plan(_write(tmp_path, GOOD.replace("facts = 50", "facts = 50\ngenerate = 2"), "g.toml")).generate == 2
    contains = load_plan(_write(tmp_path, GEN.replace("gen_exact", "gen_contains"), "c.toml"))
    assert set(contains.metrics) == {"answer_logprob", "exact", "gen_contains"}


@pytest.mark.parametrize("edit, line", [
    (("generate = 3", ""), "metric gen_exact scores generated answers: say how many tokens to generate past the "
                           "answer's length with generate = N (N >= 1)"),
    (("generate = 3", "generate = 0"), "generate must be a positive integer"),
    (("generate = 3", "generate = -2"), "generate must be a positive integer"),
    (("generate = 3", "generate = true"), "generate must be a positive integer"),
    (("generate = 3", 'generate = "3"'), "generate must be a positive integer"),
    (("gen_exact = 0.05", "gen_recall = 0.05"), "unknown metric 'gen_recall'; metrics: answer_logprob, exact, "
                                                "gen_exact, gen_contains"),
])
def test_generated_metric_problems_are_one_line(tmp_path, edit, line):
    text = GEN.replace(*edit)
    assert text != GEN
    with pytest.raises(PlanError) as e:
        load_plan(_write(tmp_path, text))
    assert line in str(e.value) and "\n" not in str(e.value)


def test_the_generated_answers_plan_takes_fresh_facts_on_the_same_contrast():
    """studies/fp8-retrieval-generated.toml: fp8-retrieval-hd128's primary contrast on its model, judged on the
    generated answer's exact match, on facts no earlier plan of that model used."""
    gen = load_plan(ROOT / "studies" / "fp8-retrieval-generated.toml")
    tf = load_plan(ROOT / "studies" / "fp8-retrieval-hd128.toml")
    assert (gen.primary, gen.models, gen.tasks) == (tf.primary, tf.models, tf.tasks)
    assert gen.lengths == (4096, 8192) and gen.generate >= 1 and set(gen.metrics) == {"gen_exact", "answer_logprob"}
    facts = set(range(gen.first_fact, gen.first_fact + gen.facts))
    for name in ("fp8-retrieval-hd128.toml", "accumulator-hd128.toml"):
        other = load_plan(ROOT / "studies" / name)
        assert gen.models[0] in other.models
        assert facts.isdisjoint(range(other.first_fact, other.first_fact + other.facts)), name


def test_the_1_5b_grid_plan_takes_its_shape_fresh_facts_and_one_factor():
    """studies/longctx-1.5b.toml (issue 41, item 8): the 1.5B to its 32K context; the registry's checks (the CLI's
    own, torch imported) pass; every implementation takes head dim 128 with GQA 12:2 and a plain causal mask at 32K;
    the primary changes K smoothing only; its facts are none of the earlier plans' of this model."""
    plan = load_plan(ROOT / "studies" / "longctx-1.5b.toml")
    check_plan(plan, tasks=TASKS, implementation_kind=implementation_kind)
    model = MODELS["qwen25coder-1.5b"]
    assert plan.models == ("qwen25coder-1.5b",) and max(plan.lengths) == model.max_context == 32768
    assert plan.facts >= MIN_FACTS and not plan.pilot and plan.correction == "holm" and plan.generate == 0
    assert len(plan.implementations) == 12 and plan.implementations[0] == "stock"
    n = max(plan.lengths)
    q = torch.empty(1, model.heads_q, n, model.head_dim, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(1, 2, n, model.head_dim, dtype=torch.bfloat16, device="meta")
    x = AttentionInput("layer0", q, kv, kv, causal=True, window=None, sm_scale=model.head_dim ** -0.5)
    for name in plan.implementations:
        if implementation_kind(name) == "kernel":
            assert unsupported_reason(get_implementation(name), x) is None, name
    # one factor: the two arms' recipes differ in k_smoothing alone
    a, b = (get_recipe(c.split(":", 1)[1]) for c in (plan.primary.a, plan.primary.b))
    diff = {f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)} - {"name", "source"}
    assert diff == {"k_smoothing"} and b.k_smoothing and not a.k_smoothing
    facts = set(range(plan.first_fact, plan.first_fact + plan.facts))
    for name in ("accumulator-hd128.toml", "fp8-retrieval-hd128.toml", "fp8-retrieval-generated.toml"):
        other = load_plan(ROOT / "studies" / name)
        assert facts.isdisjoint(range(other.first_fact, other.first_fact + other.facts)), name
