"""CPU tests of one real implementation's row (accuracy/implementations/real_rows.py): metrics against the oracle and
the
paired emulation, failures and unsupported inputs recorded, not raised."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from zyfa.accuracy.implementations.plugins import load_plugin
from zyfa.accuracy.implementations.real_rows import implementation_row, row_label
from zyfa.accuracy.implementations.registry import get_implementation
from zyfa.accuracy.inputs.attention_input import GaussianSpec, make_gaussian
from zyfa.reference.attention import attention_fp64

from tests.load_file import load_module
from zyfa.emulator import emulate
from zyfa.norms import rel_l2

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fp8_torch_attention.py"
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def x():
    return make_gaussian(GaussianSpec(seq=80, heads_q=4, heads_kv=2, head_dim=64, causal=True, seed=3))


def _paired(x):
    def paired(spec):
        em = emulate(x.q, x.k, x.v, spec, causal=x.causal, window=x.window)
        ref = attention_fp64(em.q_deq, em.k_deq, em.v_deq, causal=x.causal, window=x.window)
        return em.out, em.lse, ref

    return paired


def test_plugin_row_paired_with_a_recipe(x):
    ref_orig = attention_fp64(x.q, x.k, x.v, causal=True)
    row = implementation_row(load_plugin(f"{EXAMPLE}:attention", recipe="zyfa"), x, base={"input": x.name},
                             ref_orig=ref_orig, paired=_paired(x), device=CPU)
    assert row["status"] == "ok" and row["real"] is True and row["implementation"] == f"plugin:{EXAMPLE}:attention"
    assert row["recipe"] == "zyfa" and row["quantizes"] == "self" and row["ratio_basis"] == "orig"
    assert row_label(row) == row["implementation"]
    # independent numbers: the example's output recomputed here, the emulation run here
    mod = load_module(EXAMPLE, "ex_copy")
    out, _ = mod.attention(x.q, x.k, x.v, causal=True, sm_scale=64 ** -0.5, window=None)
    em = emulate(x.q, x.k, x.v, "zyfa", causal=True)
    assert row["orig_rel_l2"] == pytest.approx(rel_l2(out, ref_orig[0]), rel=1e-9)
    assert row["emu_orig_rel_l2"] == pytest.approx(rel_l2(em.out, ref_orig[0]), rel=1e-9)
    assert row["real_emu_ratio"] == pytest.approx(row["orig_rel_l2"] / row["emu_orig_rel_l2"], rel=1e-12)
    assert row["real_vs_emu_rel_l2"] == pytest.approx(rel_l2(out, em.out), rel=1e-9)
    assert "orig_lse_max_abs_err" in row
    assert not [k for k in row if k.startswith("deq_")]  # it never received the recipe's inputs
    # per-tensor FP8 like zyfa's quantizer: total errors of the same order
    assert 0.5 < row["real_emu_ratio"] < 2.0


def test_failing_kernel_row_names_it(tmp_path, x):
    p = tmp_path / "bad.py"
    p.write_text("def attn(q, k, v, *, causal, sm_scale, window):\n    raise RuntimeError('out of shared memory')\n")
    row = implementation_row(load_plugin(f"{p}:attn"), x, base={}, ref_orig=attention_fp64(x.q, x.k, x.v),
                             paired=_paired(x), device=CPU)
    assert row["status"] == "failed"
    assert row["error"] == f"kernel '{p}:attn' raised RuntimeError: out of shared memory"
    assert "orig_rel_l2" not in row


def test_unsupported_input_is_recorded():
    xw = make_gaussian(GaussianSpec(seq=64, heads_q=2, heads_kv=2, head_dim=64, causal=True, window=8))
    row = implementation_row(get_implementation("sdpa-bf16:flash"), xw, base={}, ref_orig=(None, None),
                             paired=None, device=CPU)
    assert row["status"] == "unsupported" and "sliding window (8 keys)" in row["reason"]
    assert row["recipe"] == "bf16" and row["quantizes"] == "none"
