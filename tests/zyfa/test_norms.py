"""``zyfa.norms``: the one rel-L2, its zero-reference rule, and that the study's metrics give the same number."""

from __future__ import annotations

import math

import pytest
import torch
from zyfa.accuracy.scoring.metrics import compute_metrics

from zyfa.norms import rel_l2, rel_l2_from_terms, rel_l2_per, rel_l2_terms


def _pair(seed=0, shape=(1, 3, 17, 8)):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(shape, generator=g, dtype=torch.float64)
    return (ref + 1e-3 * torch.randn(shape, generator=g, dtype=torch.float64)).float(), ref


def test_value_is_frobenius_ratio_and_matches_compute_metrics():
    out, ref = _pair()
    want = math.sqrt(float(((out.double() - ref) ** 2).sum())) / math.sqrt(float((ref ** 2).sum()))
    assert rel_l2(out, ref) == pytest.approx(want, rel=1e-14)
    assert rel_l2(out, ref) == compute_metrics(out, ref)["rel_l2"]  # the study's rows: the same bits


def test_zero_reference_rule():
    z = torch.zeros(2, 4)
    assert rel_l2(z, z) == 0.0
    assert rel_l2(torch.full((2, 4), 1e-30), z) == math.inf
    assert rel_l2_from_terms(0.0, 0.0) == 0.0 and rel_l2_from_terms(1e-300, 0.0) == math.inf
    assert compute_metrics(torch.full((2, 4), 1e-30), z)["rel_l2"] == math.inf


def test_nonfinite_output_is_nan_and_nonfinite_reference_is_refused():
    out, ref = _pair()
    out[0, 0, 0, 0] = math.inf
    assert math.isnan(rel_l2(out, ref))
    out[0, 0, 0, 0] = math.nan
    assert math.isnan(rel_l2(out, ref))
    bad = ref.clone()
    bad[0, 1, 2, 3] = math.inf
    with pytest.raises(ValueError, match="must be finite"):
        rel_l2(ref, bad)


def test_shape_mismatch_is_refused_not_broadcast():
    with pytest.raises(ValueError, match="shape mismatch"):
        rel_l2(torch.ones(4, 1), torch.ones(1, 4))


def test_per_head_and_terms():
    out, ref = _pair(1)
    per = rel_l2_per(out, ref, 1)
    assert len(per) == 3
    for h in range(3):
        assert per[h] == pytest.approx(rel_l2(out[:, h], ref[:, h]), rel=1e-14)
    out[:, 1] = 0
    ref[:, 1] = 0
    assert rel_l2_per(out, ref, 1)[1] == 0.0
    t = rel_l2_terms(out, ref)
    assert t.dtype == torch.float64 and t.shape == (2,)
    assert rel_l2_from_terms(*t.tolist()) == rel_l2(out, ref)
