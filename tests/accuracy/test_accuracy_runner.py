"""The runner end to end on small Gaussian inputs with real recipes, and the result files."""

from __future__ import annotations

import json
import math

import pytest
import torch
from zyfa.accuracy.inputs.attention_input import AttentionInput, GaussianSpec, make_gaussian
from zyfa.accuracy.io.provenance import device_name
from zyfa.accuracy.io.results_io import ResultRows, read_results, write_results
from zyfa.accuracy.operator import runner as runner
from zyfa.accuracy.operator.runner import run_accuracy
from zyfa.accuracy.scoring.metrics import compute_metrics
from zyfa.reference.attention import attention_fp64

from zyfa.emulator import emulate


@pytest.fixture(scope="module")
def small_rows():
    # head dim 128 and s_q > 128: the shape AITER runs its hd128 FP8 assembly kernel on (zyfa.dispatch)
    inp = make_gaussian(GaussianSpec(seq=256, head_dim=128, heads_q=2, heads_kv=1, seed=1))
    return inp, run_accuracy([inp], ["fp32", "zyfa", "ck", "aiter"], progress=False)


def test_rows_and_provenance(small_rows):
    inp, rows = small_rows
    assert [r["recipe"] for r in rows] == ["fp32", "zyfa", "ck", "aiter"]
    prov = rows.provenance
    assert prov["run_id"] == rows.run_id and all(r["run_id"] == rows.run_id for r in rows)
    assert prov["recipes"] == ["fp32", "zyfa", "ck", "aiter"] and prov["inputs"] == [inp.name]
    assert {"zyfa_version", "git_commit", "torch", "numpy", "python", "date_utc", "argv"} <= prov.keys()
    assert prov["torch"] == torch.__version__ and prov["device"] == "cpu" and prov["seed"] == 0
    assert prov["device_name"] == device_name("cpu")
    for r in rows:
        assert r["input"] == inp.name and r["input_content_hash"] == inp.meta["content_hash"]
        assert (r["heads_q"], r["heads_kv"], r["seq_q"], r["head_dim"]) == (2, 1, 256, 128)
        assert r["has_nan"] is False
        finite = [k for k in r if k.startswith(("deq_", "orig_")) and not k.endswith("sqnr_db")]
        assert all(math.isfinite(r[k]) for k in finite)
        assert r["time_emulate_s"] > 0 and 0.0 <= r["p_flushed_frac"] < 1.0
    json.dumps(list(rows))  # plain JSON types only


def test_fp32_recipe_matches_the_oracle(small_rows):
    _, rows = small_rows
    fp32 = rows[0]
    assert fp32["deq_rel_l2"] < 1e-6 and fp32["orig_rel_l2"] < 1e-6
    assert fp32["deq_lse_max_abs_err"] < 1e-5
    assert fp32["ref_deq_source"] == "orig"  # nothing quantized: the original reference is the same problem


def test_fp8_recipes_error_levels_and_shared_reference(small_rows):
    _, rows = small_rows
    by = {r["recipe"]: r for r in rows}
    for name in ("zyfa", "ck", "aiter"):
        r = by[name]
        # e4m3fn P (3 mantissa bits) gives a few percent; quantizing Q/K/V adds more against the original
        assert 5e-3 < r["deq_rel_l2"] < 0.1, name
        assert r["orig_rel_l2"] > r["deq_rel_l2"], name
        assert r["deq_sqnr_db"] == pytest.approx(-20 * math.log10(r["deq_rel_l2"]), rel=1e-9)
    # all three quantize Q/K/V per tensor to e4m3fn: one dequantized reference, computed once
    assert by["zyfa"]["ref_deq_source"] == "computed"
    assert by["ck"]["ref_deq_source"] == "shared" and by["aiter"]["ref_deq_source"] == "shared"


def test_shared_reference_equals_a_fresh_one(small_rows):
    inp, rows = small_rows
    em = emulate(inp.q, inp.k, inp.v, "aiter")
    out_ref, lse_ref = attention_fp64(em.q_deq, em.k_deq, em.v_deq)
    fresh = compute_metrics(em.out, out_ref, lse=em.lse, lse_ref=lse_ref)
    row = rows[3]
    assert row["deq_rel_l2"] == fresh["rel_l2"] and row["deq_lse_rmse"] == fresh["lse_rmse"]


def test_different_quantization_gets_its_own_reference():
    inp = make_gaussian(GaussianSpec(seq=128, head_dim=64, heads_q=2, heads_kv=2, seed=2))
    rows = run_accuracy(inp, ["ck", "aiter-triton", "bf16"], progress=False)
    # aiter-triton scales per head, ck per tensor: different dequantized inputs; bf16 inputs are exact in bf16
    assert [r["ref_deq_source"] for r in rows] == ["computed", "computed", "orig"]
    assert rows[2]["deq_rel_l2"] == rows[2]["orig_rel_l2"] < 5e-3


def test_aiter_flushes_small_probabilities_ck_does_not():
    # scores ~ N(0, 1) over 2048 keys: the row max sits ~3.5 above the mean, so some P fall below 2^-10,
    # which AITER's unscaled e4m3fn cast rounds to 0 and CK's x448 scaling keeps
    inp = make_gaussian(GaussianSpec(seq=2048, head_dim=128, heads_q=1, heads_kv=1, std=1.0, seed=0))
    rows = {r["recipe"]: r for r in run_accuracy(inp, ["ck", "aiter"], progress=False)}
    assert rows["ck"]["p_flushed_frac"] == 0.0
    assert rows["aiter"]["p_flushed_frac"] > 1e-4
    assert all(math.isfinite(r["deq_rel_l2"]) for r in rows.values())


def test_nan_output_is_reported_not_raised(monkeypatch):
    real = runner.emulate

    def nan_emulate(*args, **kw):
        em = real(*args, **kw)
        em.out[0, 0, 0, 0] = math.nan
        return em

    monkeypatch.setattr(runner, "emulate", nan_emulate)
    inp = make_gaussian(GaussianSpec(seq=64, head_dim=64, heads_q=1, heads_kv=1))
    (row,) = run_accuracy(inp, "ck", progress=False)
    assert row["has_nan"] is True and math.isnan(row["deq_rel_l2"]) and math.isnan(row["orig_sqnr_db"])
    assert row["nonfinite_frac"] == pytest.approx(1 / (64 * 64))


def test_bad_arguments(monkeypatch):
    inp = make_gaussian(GaussianSpec(seq=16, head_dim=64, heads_q=1, heads_kv=1))
    with pytest.raises(ValueError, match="unknown recipe 'nope'"):
        run_accuracy(inp, ["nope"], progress=False)
    with pytest.raises(ValueError, match="no inputs"):
        run_accuracy([], ["ck"], progress=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without a GPU
    with pytest.raises(ValueError, match="no CUDA device"):
        run_accuracy(inp, ["ck"], device="cuda", progress=False)


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_result_file_round_trip(small_rows, tmp_path, suffix):
    _, rows = small_rows
    extra = dict(rows[0], recipe="synthetic", deq_sqnr_db=math.inf, orig_rel_l2=math.nan,
                 input_content_hash="0123456789012345", window=None, input_spec_head_dim_v=None)
    data = ResultRows([*rows, extra], rows.provenance)
    path = write_results(data, tmp_path / f"results{suffix}")
    back = read_results(path)
    assert back.provenance == rows.provenance and back.run_id == rows.run_id
    assert len(back) == len(data)
    for want, got in zip(data, back, strict=True):
        assert list(got) == list(want)
        bad = {k: (want[k], got[k]) for k in want if not _same(want[k], got[k])}
        assert not bad
    if suffix == ".csv":
        assert (tmp_path / "results.provenance.json").is_file()
        header = path.read_text().splitlines()[0].split(",")
        assert header[:3] == ["run_id", "input", "batch"]
    else:
        first = json.loads(path.read_text().splitlines()[0])
        assert first["record"] == "provenance" and first["run_id"] == rows.run_id


def test_result_file_errors(tmp_path):
    with pytest.raises(ValueError, match=r"\.jsonl or \.csv"):
        write_results([], tmp_path / "r.txt")
    with pytest.raises(FileNotFoundError):
        read_results(tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"record": "provenance"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_results(bad)


def test_runner_passes_the_inputs_softmax_scale():
    """An input's own sm_scale (0.05, not 1/sqrt(64)) reaches the emulator and both oracles: each row's metrics
    equal the ones computed here at that scale, and differ from the ones at the default scale."""
    base = make_gaussian(GaussianSpec(seq=128, head_dim=64, heads_q=2, heads_kv=1, seed=4, causal=True))
    inp = AttentionInput(name="scaled", q=base.q, k=base.k, v=base.v, causal=True, sm_scale=0.05, meta=base.meta)
    rows = {r["recipe"]: r for r in run_accuracy(inp, ["fp32", "zyfa"], progress=False)}
    assert rows["zyfa"]["sm_scale"] == 0.05
    assert rows["fp32"]["orig_rel_l2"] < 1e-6  # the emulator and the oracle saw the same scale
    for scale, same in ((0.05, True), (None, False)):
        em = emulate(inp.q, inp.k, inp.v, "zyfa", causal=True, sm_scale=scale)
        ref_orig = attention_fp64(inp.q, inp.k, inp.v, causal=True, sm_scale=scale)
        ref_deq = attention_fp64(em.q_deq, em.k_deq, em.v_deq, causal=True, sm_scale=scale)
        m_orig = compute_metrics(em.out, ref_orig[0], lse=em.lse, lse_ref=ref_orig[1])
        m_deq = compute_metrics(em.out, ref_deq[0], lse=em.lse, lse_ref=ref_deq[1])
        got = (rows["zyfa"]["orig_rel_l2"], rows["zyfa"]["deq_rel_l2"], rows["zyfa"]["deq_lse_rmse"])
        assert (got == (m_orig["rel_l2"], m_deq["rel_l2"], m_deq["lse_rmse"])) is same, scale
