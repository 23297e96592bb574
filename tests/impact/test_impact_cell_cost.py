"""What ``zyfa impact --dry-run`` charges a cell (accuracy/impact/cli.py ``cell_cost``): the model's forward plus
the attention swapped into it, costed by the accuracy command's own cost (``zyfa.accuracy.operator.cli.cell_cost``),
so that an emulated FP8 recipe costs more than the stock model and a truncating one more again on the CPU."""

from __future__ import annotations

import json

import pytest
from zyfa.accuracy.impact.cli import (
    attention_seconds,
    cell_cost,
    impact_truncating_scale,
    layer_shape,
    pass_cost,
    row_cost,
)
from zyfa.accuracy.io.cost_model import IMPACT_TRUNCATING_SCALE, rate
from zyfa.accuracy.operator.cli import cell_cost as attention_cost
from zyfa.capture.models import MODELS

from zyfa.recipe_spec import get_recipe

N = 512


def window(recipe: str, model: str = "smollm2") -> tuple:
    return ("window", model, 0, recipe)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_an_fp8_recipe_cell_costs_more_than_the_stock_pass(device):
    stock = pass_cost("smollm2", None, N, MODELS["smollm2"].layers, device)
    for recipe in ("zyfa", "ck", "fa3"):
        assert cell_cost(window(recipe), N, None, device) > stock


def test_a_truncating_recipe_costs_more_than_a_plain_one_on_the_cpu_only():
    assert cell_cost(window("fa3"), N, None, "cpu") > cell_cost(window("zyfa"), N, None, "cpu")
    assert cell_cost(window("zyfa-hopper"), N, None, "cpu") > cell_cost(window("zyfa"), N, None, "cpu")
    # on a GPU the accuracy cost model keeps the plain unit for truncating recipes, and so does impact
    assert attention_cost({"batch": 1, "heads_q": 1, "seq_q": 8, "seq_k": 8, "head_dim": 64}, "fa3", "cuda") == \
        attention_cost({"batch": 1, "heads_q": 1, "seq_q": 8, "seq_k": 8, "head_dim": 64}, "zyfa", "cuda")
    assert cell_cost(window("fa3"), N, None, "cuda") == cell_cost(window("zyfa"), N, None, "cuda")


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize(("recipe", "device"), [("zyfa", "cpu"), ("fa3", "cpu"), ("fa3", "cuda")])
def test_the_attention_term_is_the_accuracy_cost_of_each_swapped_layer(model, recipe, device):
    """A window cell: the stock pass plus, per layer, the accuracy command's cost of that layer's attention
    (query heads x n x n scores at the model's head dim; a truncating recipe's scaled on the CPU), at the impact
    rate; a sweep cell: one pass per swept
    layer, one layer swapped in each."""
    spec = MODELS[model]
    shape = {"batch": 1, "heads_q": spec.heads_q, "seq_q": N, "seq_k": N, "head_dim": spec.head_dim}
    per_layer_s = attention_cost(shape, recipe, device) / rate("accuracy", device)
    if any(get_recipe(recipe).truncated_gemms()):  # scaled where impact has a fitted scale (the CPU)
        per_layer_s *= IMPACT_TRUNCATING_SCALE.get(device, 1.0)
    stock = pass_cost(model, None, N, spec.layers, device)
    assert cell_cost(window(recipe, model), N, None, device) == pytest.approx(
        stock + spec.layers * per_layer_s * rate("impact", device))
    sweep = cell_cost(("layer", model, 0, recipe), N, [0, 3], device)
    assert sweep == pytest.approx(2 * (stock + per_layer_s * rate("impact", device)))
    assert cell_cost(("layer", model, 0, recipe), N, None, device) == pytest.approx(spec.layers * sweep / 2)


def test_a_kernel_cell_is_costed_as_a_real_implementation_and_rows_as_their_cells():
    """A real implementation's cell counts its attention at the plain unit (as the accuracy command counts a
    kernel's row), and a run's record costs each row it made as the cell it came from."""
    kernel = cell_cost(window("triton:fa3"), N, None, "cpu", kernels=["triton:fa3"])
    assert kernel == cell_cost(window("zyfa"), N, None, "cpu") < cell_cost(window("fa3"), N, None, "cpu")
    base = {"model": "smollm2", "n_tokens": N, "window": 0}
    assert row_cost({**base, "kind": "impact_window", "recipe": "fa3"}) == cell_cost(window("fa3"), N, None)
    assert row_cost({**base, "kind": "impact_window", "recipe": "triton:fa3", "implementation": "triton:fa3"}) == kernel
    assert row_cost({**base, "kind": "impact_layer", "recipe": "fa3", "layer": 4}) == cell_cost(
        ("layer", "smollm2", 0, "fa3"), N, [4])


def test_the_impact_truncating_scale_is_fitted_from_the_rows_emulation_time(tmp_path):
    """impact_truncating_scale reads each truncating window row's emulation time (seconds less the stock pass)
    against attention_seconds' unscaled estimate; other rows are not fitted on."""
    unscaled = MODELS["smollm2"].layers * attention_seconds(layer_shape("smollm2", N), "fa3", "cpu",
                                                              scale_truncating=False)
    base = {"kind": "impact_window", "model": "smollm2", "n_tokens": N, "window": 0, "seconds_stock": 2.0,
            "layer": None, "text": "lee", "kl_mean": 1e-3, "ppl_ratio": 1.01, "delta_ppl": 0.2, "ppl_stock": 20.0,
            "kl_p99": 1e-2, "top1_agree": 0.95, "p_flushed_mean": 0.1, "p_flushed_checked": True,
            "provenance": {"date_utc": "2026-12-06T01:00:00Z", "argv": ["cli.py", "impact"], "num_q_heads": 9}}
    rows = [{**base, "recipe": "fa3", "seconds": 2.0 + 0.25 * unscaled},
            {**base, "recipe": "fa3:accum_flush_tiles=1", "seconds": 2.0 + 0.04 * unscaled},
            {**base, "recipe": "zyfa", "seconds": 99.0},
            {**base, "recipe": "triton:fa3", "implementation": "triton:fa3", "seconds": 99.0}]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert impact_truncating_scale([path]) == pytest.approx(0.1)  # sqrt(0.25 x 0.04)
    scaled = attention_seconds(layer_shape("smollm2", N), "fa3", "cpu")
    assert scaled == pytest.approx(IMPACT_TRUNCATING_SCALE["cpu"] * unscaled / MODELS["smollm2"].layers)
    empty = tmp_path / "none.jsonl"
    empty.write_text(json.dumps(rows[2]) + "\n")
    with pytest.raises(ValueError, match="no window row of a truncating recipe"):
        impact_truncating_scale([empty])
