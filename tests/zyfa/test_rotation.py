"""Hadamard rotation of Q and K (zyfa.rotation): expected values written out by hand or from float64 algebra."""

from __future__ import annotations

import math

import pytest
import torch

from zyfa.rotation import KINDS, fwht, hadamard_matrix, rotate_qk, rotation_matrix


def test_hadamard_4_is_the_sylvester_matrix_over_two():
    expected = torch.tensor([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]], dtype=torch.float64) / 2
    assert torch.equal(hadamard_matrix(4), expected)
    assert torch.equal(hadamard_matrix(1), torch.ones(1, 1, dtype=torch.float64))


@pytest.mark.parametrize("d", [2, 8, 64, 128, 256])
def test_hadamard_is_symmetric_and_orthogonal(d):
    h = hadamard_matrix(d)
    assert torch.equal(h, h.T)
    assert torch.allclose(h @ h.T, torch.eye(d, dtype=torch.float64), atol=1e-13, rtol=0)
    assert torch.all(h.abs() == 1 / math.sqrt(d))


@pytest.mark.parametrize("d", [1, 2, 16, 128])
def test_fast_transform_equals_the_matrix_product(d):
    x = torch.randn(3, 5, d, dtype=torch.float64, generator=torch.Generator().manual_seed(d))
    assert torch.allclose(fwht(x), x @ hadamard_matrix(d), atol=1e-12, rtol=0)


@pytest.mark.parametrize("kind", ["hadamard", "random_hadamard"])
def test_rotation_leaves_scores_unchanged(kind):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 7, 64, dtype=torch.float64, generator=g)
    k = torch.randn(1, 2, 9, 64, dtype=torch.float64, generator=g)
    qr, kr = rotate_qk(q, k, kind, seed=3)
    assert qr.dtype == torch.float64 and qr.shape == q.shape and kr.shape == k.shape
    assert torch.allclose(qr @ kr.transpose(-1, -2), q @ k.transpose(-1, -2), atol=1e-12, rtol=0)
    m = rotation_matrix(64, kind, seed=3)
    assert torch.allclose(qr, q @ m, atol=1e-12, rtol=0) and torch.allclose(kr, k @ m, atol=1e-12, rtol=0)


def test_an_outlier_channel_is_spread_evenly():
    # a single channel of magnitude 100: after the normalised Hadamard, every channel has |100| / sqrt(d)
    x = torch.zeros(1, 128, dtype=torch.float64)
    x[0, 5] = 100.0
    y, _ = rotate_qk(x, x, "hadamard")
    assert torch.allclose(y.abs(), torch.full_like(y, 100 / math.sqrt(128)), atol=1e-12, rtol=0)


def test_random_signs_follow_the_seed():
    m1, m2, m3 = (rotation_matrix(32, "random_hadamard", seed=s) for s in (7, 7, 8))
    assert torch.equal(m1, m2) and not torch.equal(m1, m3)
    h = hadamard_matrix(32)
    signs = (m1 / h)[:, 0]  # row i of D·H is s_i times row i of H
    assert set(signs.tolist()) == {-1.0, 1.0} and torch.equal(m1, signs[:, None] * h)


def test_none_returns_the_inputs_and_float32_stays_float32():
    q = torch.randn(2, 16)
    assert rotate_qk(q, q, "none")[0] is q
    assert rotation_matrix(16, "none") is None
    assert rotate_qk(q.bfloat16(), q, "hadamard")[0].dtype == torch.float32
    assert KINDS == ("none", "hadamard", "random_hadamard")


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match="power-of-two head dim, got 192"):
        rotate_qk(torch.zeros(1, 192), torch.zeros(1, 192), "hadamard")
    with pytest.raises(ValueError, match="'givens' is not one of"):
        rotate_qk(torch.zeros(1, 8), torch.zeros(1, 8), "givens")
    with pytest.raises(ValueError, match="head dims differ: 8 vs 16"):
        rotate_qk(torch.zeros(1, 8), torch.zeros(1, 16), "hadamard")
    with pytest.raises(ValueError, match="positive int"):
        hadamard_matrix(0)


def test_a_rotating_recipe_rotates_before_quantizing_and_refuses_other_head_dims():
    from zyfa.emulator import emulate, quantize_inputs
    from zyfa.kernels.attention_fp8 import recipe_from_spec
    from zyfa.recipe_spec import get_recipe

    r = recipe_from_spec("zyfa:qk_rotation=random_hadamard,rotation_seed=3")
    assert (r.qk_rotation, r.rotation_seed) == ("random_hadamard", 3)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 32, 64, generator=g) for _ in range(3))
    qi = quantize_inputs(q, k, v, r)
    qr, kr = rotate_qk(q, k, "random_hadamard", seed=3)
    plain = quantize_inputs(qr, kr, v, get_recipe("zyfa"))  # rotating first by hand gives the same values
    assert torch.equal(qi.q_values, plain.q_values) and torch.equal(qi.k_values, plain.k_values)
    assert torch.equal(qi.v_values, plain.v_values)
    with pytest.raises(ValueError, match="power-of-two head dim, got 192"):
        emulate(torch.zeros(1, 1, 8, 192), torch.zeros(1, 1, 8, 192), torch.zeros(1, 1, 8, 128), r)
    with pytest.raises(ValueError, match="qk_rotation='givens' is not one of"):
        get_recipe("zyfa").replace(qk_rotation="givens")
