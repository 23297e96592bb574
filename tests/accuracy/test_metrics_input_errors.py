"""compute_metrics and bootstrap_ci reject bad input with one clear line that names the problem."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from zyfa.accuracy.scoring.metrics import bootstrap_ci, compute_metrics


def _message(fn, *args, exc=ValueError, **kwargs) -> str:
    with pytest.raises(exc) as err:
        fn(*args, **kwargs)
    return str(err.value)


def test_shape_mismatch_names_both_shapes():
    ref = torch.zeros(1, 2, 3, 4, dtype=torch.float64)
    assert _message(compute_metrics, torch.zeros(1, 2, 3, 5), ref) == (
        "shape mismatch: out (1, 2, 3, 5) vs out_ref (1, 2, 3, 4)")


@pytest.mark.parametrize("shape", [(), (0,), (2, 0), (0, 3)])
def test_outputs_must_be_non_empty_with_a_head_dim(shape):
    x = torch.zeros(shape, dtype=torch.float64)
    assert _message(compute_metrics, x, x) == (
        f"outputs must be non-empty with a head dim, got shape {tuple(shape)}")


def test_non_finite_reference_counts_nan_and_inf():
    ref = torch.tensor([[1.0, math.nan, math.inf], [-math.inf, math.nan, math.nan]], dtype=torch.float64)
    assert _message(compute_metrics, torch.zeros(2, 3), ref) == (
        "out_ref contains non-finite values (3 NaN, 2 Inf): the reference must be finite")


@pytest.mark.parametrize("which", ["lse", "lse_ref"])
def test_lse_needs_both_or_neither(which):
    x = torch.ones(1, 2)
    assert _message(compute_metrics, x, x, **{which: torch.zeros(1)}) == "give both lse and lse_ref, or neither"


@pytest.mark.parametrize("arg", ["out", "out_ref"])
def test_non_tensor_input_is_a_type_error_naming_the_argument(arg):
    good = torch.ones(1, 2)
    args = {"out": good, "out_ref": good, arg: [[1.0, 1.0]]}
    assert _message(compute_metrics, args["out"], args["out_ref"], exc=TypeError) == (
        f"{arg} must be a torch.Tensor or numpy array, got list")


def test_non_tensor_lse_is_a_type_error_naming_it():
    x = torch.ones(1, 2)
    assert _message(compute_metrics, x, x, lse=(0.0,), lse_ref=torch.zeros(1), exc=TypeError) == (
        "lse must be a torch.Tensor or numpy array, got tuple")
    assert _message(compute_metrics, x, x, lse=torch.zeros(1), lse_ref=np.float64(0.0), exc=TypeError) == (
        "lse_ref must be a torch.Tensor or numpy array, got float64")


def test_complex_input_is_rejected_by_name_and_dtype():
    c = torch.ones(1, 2, dtype=torch.complex64)
    assert _message(compute_metrics, c, torch.ones(1, 2)) == "out must be real, got torch.complex64"
    assert _message(compute_metrics, torch.ones(1, 2), c.numpy().astype(np.complex128)) == (
        "out_ref must be real, got torch.complex128")


def test_bootstrap_ci_rejects_an_empty_sample():
    assert _message(bootstrap_ci, []) == "bootstrap_ci needs at least one value"
    assert _message(bootstrap_ci, np.zeros((3, 0))) == "bootstrap_ci needs at least one value"


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5])
def test_bootstrap_ci_alpha_must_be_inside_zero_one(alpha):
    assert _message(bootstrap_ci, [1.0, 2.0], alpha=alpha) == f"alpha must be in (0, 1), got {alpha}"


@pytest.mark.parametrize("n", [0, -3])
def test_bootstrap_ci_needs_at_least_one_resample(n):
    assert _message(bootstrap_ci, [1.0, 2.0], n=n) == f"n must be >= 1, got {n}"
