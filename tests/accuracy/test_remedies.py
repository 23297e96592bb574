"""Quantization remedies (accuracy.remedies): the FA3 outlier experiment's pieces on small inputs."""

from __future__ import annotations

import math

import pytest
import torch

from accuracy.remedies import SCHEMES, fa3_outlier_experiment, main, outlier_gaussian, render, run_scheme, scheme_recipe
from reference.attention import attention_fp64
from zyfa.emulator import emulate
from zyfa.norms import rel_l2


def test_outliers_follow_the_stated_distribution():
    x = outlier_gaussian((200_000,), outlier_frac=0.01, outlier_std=50.0, seed=4)
    assert torch.equal(x, outlier_gaussian((200_000,), outlier_frac=0.01, outlier_std=50.0, seed=4))
    big = (x.abs() > 8).float().mean().item()  # N(0,1) never exceeds 8 here; N(0, 50^2) does 87.6% of the time
    assert 0.01 * 0.876 * 0.85 < big < 0.01 * 0.876 * 1.15
    g = torch.Generator().manual_seed(4)
    assert torch.equal(outlier_gaussian((1000,), outlier_frac=0.0, seed=4), torch.randn(1000, generator=g))
    with pytest.raises(ValueError, match=r"outlier_frac must be in \[0, 1\], got 2"):
        outlier_gaussian((4,), outlier_frac=2)


def test_scheme_recipes_change_only_the_descales():
    t, b = scheme_recipe("fa3", "tensor"), scheme_recipe("fa3", "block")
    assert (t.q_scale, t.k_scale, t.v_scale) == ("tensor",) * 3
    assert (b.q_scale, b.k_scale, b.v_scale, b.v_descale) == ("block", "block", "block", "tile")
    assert (b.scale_block_q, b.scale_block_kv) == (128, 128)
    assert t.p_scale == b.p_scale == "pow2" and t.accumulator == b.accumulator == "matrix_unit"
    with pytest.raises(ValueError, match="'channel'"):
        scheme_recipe("fa3", "channel")


def test_rotation_is_scored_against_the_unrotated_exact_attention():
    # With no quantization (the fp32 control recipe) the rotated run must reproduce the original attention:
    # only the float32 rotation's rounding remains.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 64, 64, generator=g) for _ in range(3))
    row = run_scheme(q, k, v, "hadamard", base="fp32")
    assert row["rotation"] == "random_hadamard" and row["rel_l2"] < 1e-5


def test_block_descales_rescue_a_head_far_below_the_tensor_maximum():
    # Head 1's V is 1e-5 of head 0's: one per-tensor descale pushes it into e4m3's subnormals (step 2^-9 of the
    # scaled range), per-block descales give it its own range. Head 1's output error shows it.
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 128, 64, generator=g) for _ in range(3))
    v[:, 1] *= 1e-5
    ref = attention_fp64(q, k, v)[0]

    def head1_rel(granularity):
        out = emulate(q, k, v, scheme_recipe("fa3", granularity)).out.double()
        return rel_l2(out[:, 1], ref[:, 1])

    tensor, block = head1_rel("tensor"), head1_rel("block")
    assert block < 0.1 and tensor > 5 * block
    rmse = {s: run_scheme(q, k, v, s, reference=ref)["rmse"] for s in ("block", "per-tensor")}
    assert rmse["block"] <= rmse["per-tensor"]


def test_experiment_rows_and_table():
    rows = fa3_outlier_experiment(seq=128, heads=1, head_dim=64, seeds=(0,), schemes=("per-tensor", "hadamard"))
    assert [r["scheme"] for r in rows] == ["per-tensor", "hadamard"]
    assert all(r["seq"] == 128 and r["outlier_frac"] == 1e-3 and r["rmse"] > 0 for r in rows)
    table = render(rows)
    ratio = float(table.splitlines()[-1].split("|")[-2])
    assert math.isclose(ratio, rows[0]["rmse"] / rows[1]["rmse"], rel_tol=1e-2)
    assert set(SCHEMES) == {"per-tensor", "block", "hadamard", "block+hadamard"}
    with pytest.raises(ValueError, match="unknown scheme 'rot'"):
        run_scheme(*(torch.zeros(1, 1, 8, 8),) * 3, "rot")


def test_bad_arguments_give_one_line(capsys):
    assert main(["--recipe", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown recipe 'nope'" in err[0]
    assert main(["--seq", "0"]) == 2
    assert "--seq, --heads and --seeds must be >= 1" in capsys.readouterr().err
