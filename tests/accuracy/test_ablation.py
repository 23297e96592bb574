"""One-factor ablations (accuracy.scoring.ablation, ``zyfa accuracy --ablate``): the expansion, the row tags, the
pairing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from zyfa.accuracy.scoring.ablation import ablation_pairs, parse_ablation

from zyfa.cli import main
from zyfa.recipe_spec import SpecError, get_recipe

CAPTURE = "datasets/smollm2-lee-2048.h5"


def test_an_ablation_sets_only_its_field_and_keeps_the_base_overrides_and_platform():
    a = parse_ablation("zyfa@h200:accumulator=matrix_unit", "accum_flush_tiles=0,1")
    assert a.base == "zyfa:accumulator=matrix_unit@h200" and a.field == "accum_flush_tiles"
    assert a.specs == ("zyfa:accumulator=matrix_unit,accum_flush_tiles=0@h200",
                       "zyfa:accumulator=matrix_unit,accum_flush_tiles=1@h200")
    r0, r1 = (get_recipe(s) for s in a.specs)
    assert r0.replace(name="x", accum_flush_tiles=1) == r1.replace(name="x")  # one field apart
    assert r0.platform == "h200" and r0.accumulator == "matrix_unit"
    # a field the base already sets is replaced, not repeated
    assert parse_ablation("fa3:accum_flush_tiles=4", "accum_flush_tiles=0,1").specs == (
        "fa3:accum_flush_tiles=0", "fa3:accum_flush_tiles=1")
    t = parse_ablation("triton:fa3", "accum_flush_tiles=0,1")
    assert t.specs == ("triton:fa3:accum_flush_tiles=0", "triton:fa3:accum_flush_tiles=1")
    assert parse_ablation("zyfa", "k_smoothing=0,1").values == ("false", "true")  # as the grammar writes them
    c = parse_ablation("cute:zyfa-hopper", "q_scale=tensor,head")  # the CuTe kernel's namespace: the same grammar
    assert c.specs == ("cute:zyfa-hopper:q_scale=tensor", "cute:zyfa-hopper:q_scale=head")


def test_accuracy_ablate_a_field_the_cute_kernel_does_not_take_is_its_plans_one_line(tmp_path, capsys):
    """``--ablate cute:...`` reads the base by the grammar (it was refused as "unknown recipe 'cute'"); a value the
    CuTe kernel cannot honour is refused by its plan in one line, before any file."""
    out = tmp_path / "r.jsonl"
    assert main(["accuracy", "--inputs", CAPTURE, "--ablate", "cute:zyfa-hopper", "accum_flush_tiles=0,1",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the CuTe FP8 kernel does not support accum_flush_tiles=0" in err[0], err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("base, assignment, match", [
    ("zyfa", "nosuchfield=0,1", "no field 'nosuchfield'; fields: q_format, "),
    ("zyfa", "accum_flush_tiles=0,maybe", "accum_flush_tiles takes an integer, not 'maybe'; fields: "),
    ("zyfa", "accum_flush_tiles=1", "two or more different values"),
    ("zyfa", "accum_flush_tiles=1,1", "two or more different values"),
    ("zyfa", "accum_flush_tiles", "not FIELD=V1,V2"),
    ("nosuchrecipe", "accum_flush_tiles=0,1", "unknown recipe 'nosuchrecipe'"),
])
def test_a_bad_ablation_is_refused_in_one_line(base, assignment, match):
    with pytest.raises(SpecError, match=match) as e:
        parse_ablation(base, assignment)
    assert "\n" not in str(e.value)


def _rows(path) -> list[dict]:
    return [r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip()) if "recipe" in r]


def test_accuracy_ablate_rows_pair_per_input_and_differ(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    rc = main(["accuracy", "--inputs", CAPTURE, "--layers", "0,14", "--heads", "0", "--max-tokens", "128",
               "--device", "cpu", "--no-progress", "--ablate", "zyfa", "p_scale=pow2_block,none", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = _rows(out)
    assert [r["recipe"] for r in rows] == ["zyfa:p_scale=pow2_block", "zyfa:p_scale=none"] * 2  # no default recipes
    assert {(r["ablation_base"], r["ablation_field"]) for r in rows} == {("zyfa", "p_scale")}
    [pairs] = ablation_pairs(rows, "deq_rel_l2")
    assert pairs.values == ["pow2_block", "none"] and len(pairs.unit_ids) == 2 and not pairs.dropped
    assert pairs.unit_ids == list(dict.fromkeys(r["input"] for r in rows))
    by = {(r["input"], r["ablation_value"]): r["deq_rel_l2"] for r in rows}
    assert np.array_equal(pairs.diff(), [by[(u, "none")] - by[(u, "pow2_block")] for u in pairs.unit_ids])
    assert (pairs.diff() > 0).all()  # P unscaled loses more to FP8 than the per-block exponents, on every input


def test_accuracy_ablate_the_flush_on_the_h200s_accumulator_changes_the_error(tmp_path, capsys):
    """The field the issue asks about: accum_flush_tiles, on the H200's truncating accumulator (32-key tiles, so
    128 keys make 4 tiles to flush between)."""
    out = tmp_path / "r.jsonl"
    rc = main(["accuracy", "--inputs", "gaussian", "--seq", "128", "--head-dim", "64", "--heads", "1", "--device",
               "cpu", "--no-progress", "--ablate", "zyfa@h200:accumulator=matrix_unit,block_n=32",
               "accum_flush_tiles=0,1", "--recipes", "bf16", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = _rows(out)
    assert "ablation_field" not in rows[0] and rows[0]["recipe"] == "bf16"  # a plain recipe beside: untagged
    [pairs] = ablation_pairs(rows, "deq_rel_l2")
    assert pairs.base == "zyfa:accumulator=matrix_unit,block_n=32@h200" and pairs.values == ["0", "1"]
    assert pairs.diff()[0] != 0


def _row(inp, value, err, **kw):
    return {"input": inp, "ablation_base": "fa3", "ablation_field": "accum_flush_tiles", "ablation_value": value,
            "deq_rel_l2": err, **kw}


def test_pairs_leave_out_units_missing_a_value_or_not_ok_and_refuse_a_unit_twice():
    rows = [_row("a", "0", 1.0), _row("a", "1", 3.0), _row("b", "0", 2.0), _row("c", "0", 1.0),
            _row("c", "1", 5.0, status="failed"), _row("d", "1", 2.0), _row("d", "0", float("nan")),
            {"input": "a", "recipe": "bf16", "deq_rel_l2": 9.0}]
    [p] = ablation_pairs(rows, "deq_rel_l2")
    assert p.unit_ids == ["a"] and p.dropped == ["b", "c", "d"]
    assert p.columns["0"].tolist() == [1.0] and p.diff().tolist() == [2.0] and p.diff("1", "0").tolist() == [-2.0]
    with pytest.raises(ValueError, match="unit 'a' has two rows"):
        ablation_pairs([*rows, _row("a", "0", 1.5)], "deq_rel_l2")


@pytest.mark.gpu
def test_gpu_ablate_our_kernel_flush_pairs_real_rows_with_their_emulations(tmp_path, capsys):
    """On the H200: ``--ablate triton:fa3 accum_flush_tiles=0,1`` runs our kernel twice (only the flush changed),
    each real row ok and paired with the kernel's own emulation of its spec."""
    out = tmp_path / "r.jsonl"
    rc = main(["accuracy", "--inputs", "gaussian", "--seq", "2048", "--head-dim", "128", "--heads", "2",
               "--device", "cuda", "--no-progress", "--ablate", "triton:fa3", "accum_flush_tiles=0,1",
               "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = _rows(out)
    assert [r["implementation"] for r in rows] == ["triton:fa3:accum_flush_tiles=0", "triton:fa3:accum_flush_tiles=1"]
    assert all(r["status"] == "ok" and r["paired_spec"] == r["implementation"] for r in rows)
    [p] = ablation_pairs(rows, "deq_rel_l2")
    assert p.base == "triton:fa3" and p.values == ["0", "1"] and len(p.unit_ids) == 1
    assert p.diff()[0] != 0  # flushing the wgmma accumulator every tile changes the kernel's error
