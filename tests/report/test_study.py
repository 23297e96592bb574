"""zyfa study's pieces on small real inputs: features, per-head errors, the capture sections of the report."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from zyfa.accuracy.inputs.attention_input import GaussianSpec, capture_inputs, make_gaussian
from zyfa.accuracy.inputs.features import head_errors, input_features
from zyfa.accuracy.io.results_io import write_results
from zyfa.accuracy.operator.runner import run_accuracy
from zyfa.accuracy.report import build, document, results
from zyfa.accuracy.study import run as study_run

from tests.report.conftest import md_tables, numbers

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "datasets" / "smollm2-lee-2048.h5"


def test_features_against_a_direct_computation():
    inp = make_gaussian(GaussianSpec(heads_q=2, heads_kv=1, seq=96, head_dim=64, causal=True, outlier_frac=0.01))
    f = input_features(inp, chunk_size=40)
    q, k = inp.q.double(), inp.k.double()
    s = torch.einsum("bhqd,bkd->bhqk", q, k[:, 0]) / math.sqrt(64)
    s = s.masked_fill(torch.ones(96, 96, dtype=torch.bool).triu(1), -math.inf)
    p = torch.softmax(s, dim=-1)
    ent = -(torch.where(p > 0, p * p.log(), torch.zeros(()))).sum(-1)  # (b, h, q)
    assert f["feat_entropy_heads"] == pytest.approx(ent.mean(dim=(0, 2)).tolist(), rel=1e-4)
    assert f["feat_entropy_nats"] == pytest.approx(float(ent.mean()), rel=1e-4)
    assert f["feat_k_outlier"] == pytest.approx(float(k.abs().max() / k.pow(2).mean().sqrt()), rel=1e-6)


def test_head_errors_agree_with_the_runner():
    inp = make_gaussian(GaussianSpec(heads_q=2, heads_kv=2, seq=128, head_dim=64, seed=3))
    rows = run_accuracy([inp], ["zyfa", "bf16"], progress=False)
    heads = head_errors(inp, ["zyfa", "bf16"])
    for r in rows:
        per = heads[r["recipe"]]["deq_rel_l2_heads"]
        assert len(per) == 2
        # the whole-input error is the norm-weighted combination of the heads' errors
        assert min(per) * 0.999 <= r["deq_rel_l2"] <= max(per) * 1.001


def test_flushed_fraction_is_a_fraction():
    # head dim 128, s_q > 128: where AITER runs the kernel the aiter recipe models (zyfa.dispatch)
    inp = make_gaussian(GaussianSpec(heads_q=2, heads_kv=1, seq=160, head_dim=128, std=3.0))
    rows = study_run.run_study([inp], ["aiter", "zyfa"], device="cpu", progress=False)
    one = run_accuracy([make_gaussian(GaussianSpec(heads_q=1, heads_kv=1, seq=160, head_dim=128, std=3.0))],
                       ["aiter"], progress=False)
    for r in rows:
        assert 0.0 <= r["p_flushed_frac"] <= 1.0
    assert rows[0]["p_flushed_frac"] > 0 and one[0]["p_flushed_frac"] > 0


def test_gaussian_specs_of_the_study():
    default = study_run.gaussian_specs("default")
    assert {s.seq for s in default} == {1024, 2048, 4096}
    assert {(s.head_dim, s.d_v) for s in default} == {(64, 64), (128, 128), (256, 256), (192, 128)}
    assert any(s.causal for s in default) and any(s.outlier_frac > 0 for s in default)
    long = study_run.gaussian_specs("long")
    assert max(s.seq for s in long) == 32768
    assert max(s.seq for s in study_run.gaussian_specs("long", max_seq=8192)) == 8192
    assert len({s.name for s in long}) == len(long)


@pytest.mark.skipif(not SAMPLE.is_file(), reason="shipped sample capture datasets/smollm2-lee-2048.h5 absent")
def test_capture_sections(tmp_path):
    inputs = capture_inputs(SAMPLE, layers=[0, 29], max_tokens=128)
    rows = study_run.run_study(inputs, ["zyfa", "ck"], device="cpu", progress=False, head_recipes=("zyfa", "ck"))
    path = write_results(rows, tmp_path / "results.jsonl")
    doc = build.build_report(results.load_results([path]), command="zyfa report ...", plots=True)
    tables = md_tables(document.render_markdown(doc))
    heads = tables["t-smollm2-heads"]
    assert heads[0] == ["layer, head", "zyfa", "ck"]
    by = {(r["input_layer"], r["recipe"]): r for r in rows}
    for line in heads[1:-1]:
        lay, h = (int(x) for x in line[0][1:].split(" h"))
        for i, name in enumerate(("zyfa", "ck"), 1):
            r = by[(lay, name)]
            want = r["deq_rel_l2_heads"][r["input_q_heads"].index(h)]
            assert line[i] == f"{want:.3e}"
    mean = numbers(heads[-1][1])[0]
    assert mean == pytest.approx(np.mean([v for r in rows if r["recipe"] == "zyfa" for v in r["deq_rel_l2_heads"]]),
                                 rel=6e-3)
    layers = tables["t-smollm2-layers"]
    assert [line[0] for line in layers[1:]] == ["0 (full_attention)", "29 (full_attention)"]
    assert layers[1][1] == f"{by[(0, 'zyfa')]['deq_rel_l2']:.3e}"
    assert "fig_smollm2_heads.png" in doc.images


@pytest.mark.parametrize("argv, message", [
    (["study", "--long"], "no captures in datasets/long/ and no --captures; make them with:\n  zyfa capture"),
    (["study", "--captures", "none", "--gaussian-filter", "["], "unterminated"),
    (["study", "--captures", "missing.h5"], "no such file: missing.h5"),
    (["study", "--captures", "none", "--gaussian-filter", "^$"], "no inputs"),
])
def test_study_bad_input_exits_2(argv, message, capsys, monkeypatch):
    from zyfa.cli import main

    monkeypatch.setattr(study_run, "default_captures", lambda folder="datasets": [])  # as on a fresh checkout

    assert main(argv) == 2
    assert message in capsys.readouterr().err
