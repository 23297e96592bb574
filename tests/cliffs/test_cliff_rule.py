"""The flag rule on synthetic error-against-length curves, and the length grammar."""

from __future__ import annotations

import math
import random

import pytest
from zyfa.accuracy.cliffs.flags import CliffRule, find_flags
from zyfa.accuracy.cliffs.sweep import default_centres, default_lengths, format_lengths, parse_lengths


def _row(L, err, *, impl="k", status="ok", nonfinite=0, reason=None, mask="none", shape="equal"):
    return {"implementation": impl, "impl_kind": "builtin", "recipe": None, "mask": mask, "shape": shape,
            "chunk": None, "seq_q": L, "length": L, "status": status, "reason": reason, "orig_rel_l2": err,
            "nonfinite_rows": nonfinite, "n_rows": 4 * L}


def _curve(lengths, seed=0, level=0.03, noise=0.15):
    """A smooth error curve (slowly rising, +-15% noise), as an FP8 kernel's looks."""
    rng = random.Random(seed)
    return {L: level * (1 + 0.1 * math.log(L)) * (1 + rng.uniform(-noise, noise)) for L in lengths}


def test_planted_cliff_and_nan_row_are_the_only_flags():
    lengths = list(range(1, 401))
    curve = _curve(lengths)
    rows = []
    for L in lengths:
        if L == 300:
            rows.append(_row(L, curve[L] * 5))  # the cliff
        elif L == 200:
            rows.append(_row(L, None, nonfinite=3))  # NaN rows: no error value
        else:
            rows.append(_row(L, curve[L]))
    flags = find_flags(rows)
    assert [(f["length"], f["kind"]) for f in flags] == [(200, "nonfinite"), (300, "jump")]
    jump = flags[1]
    assert jump["n_neighbours"] == 32 and jump["ratio"] == pytest.approx(jump["error"] / jump["neighbour_median"])
    assert 4 < jump["ratio"] < 7
    assert flags[0]["nonfinite_rows"] == 3


def test_rule_thresholds():
    lengths = list(range(1, 101))
    flat = {L: 0.02 for L in lengths}
    # 2.9x is not a jump, 3.1x is
    rows = [_row(L, flat[L] * (2.9 if L == 40 else 3.1 if L == 70 else 1)) for L in lengths]
    assert [(f["length"], f["kind"]) for f in find_flags(rows)] == [(70, "jump")]
    # below the floor nothing is a jump, however large the ratio (an FP32 kernel's noise)
    rows = [_row(L, 1e-7 * (50 if L == 70 else 1)) for L in lengths]
    assert find_flags(rows) == []
    assert [f["length"] for f in find_flags(rows, CliffRule(floor=1e-6))] == [70]


def test_jump_needs_eight_neighbours_and_uses_only_ok_finite_ones():
    # isolated lengths (step 5): only 6 neighbours within +-16, so no jump can be called
    lengths = list(range(5, 200, 5))
    rows = [_row(L, 0.5 if L == 100 else 0.02) for L in lengths]
    assert find_flags(rows) == []
    # step 4: exactly 8 neighbours -> called
    lengths = list(range(4, 200, 4))
    rows = [_row(L, 0.5 if L == 100 else 0.02) for L in lengths]
    assert [f["length"] for f in find_flags(rows)] == [100]
    # the neighbours that are NaN or refused do not count, and they do not hide the jump
    rows = [_row(L, 0.02) for L in range(1, 60)]
    rows[29] = _row(30, 0.2)
    for i in (25, 27, 31, 33):
        rows[i] = _row(i + 1, None, nonfinite=1)
    rows[35] = _row(36, None, status="refused", reason="no")
    kinds = [(f["length"], f["kind"]) for f in find_flags(rows)]
    assert kinds == [(26, "nonfinite"), (28, "nonfinite"), (30, "jump"), (32, "nonfinite"), (34, "nonfinite"),
                     (36, "refused")]


def test_series_are_separate_and_refused_failed_are_flags():
    rows = [_row(L, 0.02, impl="a") for L in range(1, 50)] + [_row(L, 0.02, impl="a", mask="causal")
                                                              for L in range(1, 50)]
    rows[10] = _row(11, 0.2, impl="a")  # no-mask series only
    rows += [_row(L, None, impl="b", status="refused", reason="too long") for L in range(33, 41)]
    rows += [_row(5, None, impl="c", status="failed", reason="bad shape")]
    flags = find_flags(rows)
    assert [(f["implementation"], f["mask"], f["length"], f["kind"]) for f in flags] == [
        ("a", "none", 11, "jump"), *[("b", "none", L, "refused") for L in range(33, 41)], ("c", "none", 5, "failed")]
    assert flags[1]["reason"] == "too long"


def test_metric_choice():
    rows = [{**_row(L, 0.02), "deq_rel_l2": 0.5 if L == 20 else 0.01} for L in range(1, 50)]
    assert find_flags(rows) == []
    assert [f["length"] for f in find_flags(rows, CliffRule(metric="deq_rel_l2"))] == [20]


def test_parse_lengths():
    assert parse_lengths("1-5,10,2000-2012:4") == [1, 2, 3, 4, 5, 10, 2000, 2004, 2008, 2012]
    assert parse_lengths(" 7 , 3,3") == [3, 7]
    for bad in ("", "1-x", "5-2", "0-3", "1-10:0", "1,,2", "-3", "a"):
        with pytest.raises(ValueError) as e:
            parse_lengths(bad)
        assert "\n" not in str(e.value)


def test_format_lengths_round_trip():
    for ls in ([1, 2, 3, 4, 10, 20, 30, 31], list(range(1, 1025)) + list(range(1344, 1473, 4)), [5], [3, 9]):
        assert parse_lengths(format_lengths(ls)) == sorted(ls)


def test_default_ranges():
    centres = default_centres()
    assert centres == [1408, 1792, 2048, 2816, 3584, 4096, 5632, 7168, 8192, 11264, 14336, 16384, 22528, 28672,
                       32768]
    ls = default_lengths()
    assert ls[:1024] == list(range(1, 1025))
    assert set(range(1344, 1473)) <= set(ls) and 1343 not in ls and 1473 not in ls
    assert max(ls) == 32768 and 32704 in ls and 32767 in ls
    assert len(ls) == 1024 + 14 * 129 + 65
    coarse = default_lengths(coarse_step=4)
    assert set(centres) <= set(coarse) and 1345 not in coarse and 1348 in coarse
    assert default_lengths(300) == list(range(1, 301))
    assert max(default_lengths(5000)) == 4160


def test_operator_errors_match_compute_metrics():
    import torch
    from zyfa.accuracy.cliffs.sweep import operator_errors
    from zyfa.accuracy.scoring.metrics import compute_metrics
    from zyfa.reference.attention import attention_fp64

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 9, 64, generator=g) for _ in range(3))
    ref = attention_fp64(q, k, v, causal=True)
    out = ref[0].float() + 1e-3 * torch.randn(ref[0].shape, generator=g)
    lse = ref[1].float() + 1e-4 * torch.randn(ref[1].shape, generator=g)
    m = compute_metrics(out, ref[0], lse=lse, lse_ref=ref[1])
    e = operator_errors(out, lse, ref)
    assert e["rel_l2"] == pytest.approx(m["rel_l2"], rel=1e-9)
    assert e["lse_max_abs_err"] == pytest.approx(m["lse_max_abs_err"], rel=1e-6)
    assert operator_errors(out, None, ref)["lse_max_abs_err"] is None
    bad = out.clone()
    bad[0, 0, 3] = math.nan
    assert operator_errors(bad, lse, ref)["rel_l2"] is None
    masked = lse.clone()
    masked[0, 1, 2] = -math.inf  # a row the kernel calls fully masked, the oracle does not: not comparable
    assert operator_errors(out, masked, ref)["lse_max_abs_err"] is None


def test_head_dims_are_separate_series():
    rows = [{**_row(L, 0.02), "head_dim": hd} for hd in (64, 128) for L in range(1, 50)]
    rows[20] = {**_row(21, 0.2), "head_dim": 64}
    assert [(f["head_dim"], f["length"]) for f in find_flags(rows)] == [(64, 21)]


def test_a_long_list_of_flagged_lengths_is_shortened_in_the_table():
    from zyfa.accuracy.cliffs.section import LENGTHS_CELL_MAX, _lengths_cell

    assert _lengths_cell([7]) == "7" and _lengths_cell(list(range(33, 41))) == "33-40 (8 lengths)"
    many = [n for c in (1408, 1792, 2048, 2816, 3584, 4096, 5632, 22528) for n in range(c - 16, c + 17, 4)]
    cell = _lengths_cell(many)
    assert cell == f"1392..22544, not all ({len(many)} lengths)" and len(cell) < LENGTHS_CELL_MAX
