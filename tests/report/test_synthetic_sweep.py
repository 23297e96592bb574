"""The synthetic calibration and sweep (accuracy/study/synthetic_sweep.py) on small real inputs: the calibrated
synthetic input reproduces a capture layer's entropy and sink; the sweep's ratio points leave refused peers out;
the command refuses bad input in one line before writing anything and writes its files otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from zyfa.accuracy.inputs.attention_input import capture_inputs
from zyfa.accuracy.inputs.synthetic import SyntheticSpec, make_synthetic
from zyfa.accuracy.study import synthetic_sweep as sw

CAPTURE = Path(__file__).resolve().parents[2] / "datasets" / "smollm2-lee-2048.h5"


def test_calibration_matches_a_capture_layers_entropy_and_sink():
    inp = capture_inputs(CAPTURE, layers=[14], max_tokens=128)[0]
    cap = sw.input_stats(inp)
    assert cap["p_flushed_frac"] > 0.3  # a peaked real layer: the regime Gaussian inputs never reach
    spec, _ = sw.matching_spec(inp, cap)
    syn = sw.input_stats(make_synthetic(spec))
    assert abs(syn["entropy_nats"] - cap["entropy_nats"]) < 0.05
    assert abs(syn["sink_mass"] - cap["sink_mass"]) < 0.02
    assert spec.head_dim == 64 and spec.heads == inp.shape["heads_q"] and spec.seq == 128


def test_bias_for_ratio_reaches_a_reachable_ratio_and_says_when_it_cannot():
    n, b, ok = sw._bias_for_ratio(6.0, 128, 2048)
    z = (2 * __import__("math").log(4096)) ** 0.5
    assert ok and abs((b + z) / (1 + n * b * b / 128) ** 0.5 - 6.0) < 0.01
    assert sw._bias_for_ratio(3.0, 128, 2048) == (0, 0.0, True)
    assert sw._bias_for_ratio(40.0, 64, 2048)[2] is False


def test_sweep_points_are_zyfa_over_each_peer_and_skip_refused_and_unreachable():
    specs = sw.sweep_specs(entropies=[1.0, 9.0], head_dims=[64, 128], seq=160, heads=1, kv_heads=1)
    rows, skipped = sw.run_sweep(specs, ["zyfa", "ck", "aiter"], log=lambda *_: None)
    assert len(skipped) == 2 and all("not reachable" in s for s in skipped)  # 9 nats > uniform over 160 keys
    pts = sw.ratio_points(rows)
    assert {(p["head_dim"], p["peer"]) for p in pts} == {(64, "ck"), (128, "ck"), (128, "aiter")}
    by = {(r["head_dim"], r["recipe"]): r for r in rows}
    for p in pts:
        want = by[(p["head_dim"], "zyfa")]["deq_rel_l2"] / by[(p["head_dim"], p["peer"])]["deq_rel_l2"]
        assert p["ratio"] == pytest.approx(want)
        assert abs(p["entropy_nats"] - 1.0) < 0.05 and 0 < p["p_flushed_frac"] < 1
    assert by[(64, "aiter")]["status"] == "refused"
    assert sw.plot_ratios(pts, "p_flushed_frac").startswith(b"\x89PNG")


def test_command_refuses_bad_input_before_writing_and_writes_its_files(tmp_path, capsys):
    out = tmp_path / "s"
    assert sw.main(["--out", str(out), "--captures", "nope.h5"]) == 2
    assert capsys.readouterr().err.strip() == "synthetic_sweep: error: no such capture file: nope.h5"
    assert sw.main(["--out", str(out), "--recipes", "zyfa,bogus"]) == 2
    assert "unknown recipe 'bogus'" in capsys.readouterr().err and not out.exists()
    assert sw.main(["--out", str(out), "--seq", "128", "--heads", "1", "--entropies", "1.5", "--head-dims", "128",
                    "--recipes", "zyfa,ck", "--captures", str(CAPTURE), "--max-tokens", "64"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"calibration.md", "calibration.json", "sweep.jsonl", "sweep.md", "fig_ratio_vs_entropy.png",
            "fig_ratio_vs_p_flushed.png"} <= names
    cal = json.loads((out / "calibration.json").read_text())
    assert len(cal["rows"]) == 3 and cal["provenance"]["command"].startswith("python -m zyfa.accuracy.study")
    assert "synthetic-b1-h1x1-s128-d128-causal-H1.5" in (out / "sweep.md").read_text()
    assert SyntheticSpec(entropy=1.5, seq=128, heads=1, kv_heads=1, rope=1).name in (out / "sweep.md").read_text()


@pytest.mark.gpu
def test_calibration_and_sweep_on_cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    spec = SyntheticSpec(entropy=2.0, sink=0.3, k_outliers=2, k_bias=20.0, seq=1024, heads=4, kv_heads=1,
                         head_dim=128, rope=1)
    cpu, gpu = make_synthetic(spec), make_synthetic(spec, device="cuda")
    assert abs(gpu.meta["realised_entropy_nats"] - 2.0) < 0.05 and abs(gpu.meta["realised_sink_mass"] - 0.3) < 0.02
    assert abs(gpu.meta["temperature"] / cpu.meta["temperature"] - 1) < 2e-3  # at most a grid step or two apart
    rows, skipped = sw.run_sweep([spec], ["zyfa", "ck", "aiter", "triton-amd"], device="cuda", log=lambda *_: None)
    assert not skipped and [r["recipe"] for r in rows] == ["zyfa", "ck", "aiter", "triton-amd"]
    assert all(r["device"].startswith("cuda") and r["deq_rel_l2"] > 0 for r in rows)
    assert len(sw.ratio_points(rows)) == 3
