"""``zyfa accuracy`` through the real command entry point: the table, result files, and clear errors."""

from __future__ import annotations

import pytest
from zyfa.accuracy.io.results_io import read_results

from zyfa.cli import main

SMALL = ["accuracy", "--seq", "128", "--head-dim", "64", "--heads", "2", "--kv-heads", "1", "--device", "cpu",
         "--no-progress"]


def test_table_and_result_file(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert main([*SMALL, "--recipes", "fp32,ck", "--causal", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| recipe"))
    for col in ("deq_rel_l2", "orig_rel_l2", "deq_sqnr_db", "deq_max_abs_err", "deq_row_rel_err_p99",
                "deq_lse_max_abs_err", "p_flushed_frac", "time_emulate_s"):
        assert col in header
    body = [line for line in lines if line.startswith(("| fp32", "| ck"))]
    assert [b.split("|")[1].strip() for b in body] == ["fp32", "ck"]  # in the order given
    assert "gaussian-b1-h2x1-s128-d64-causal-seed0" in text
    assert "repro: zyfa accuracy --inputs gaussian --recipes fp32,ck --seq 128" in text
    rows = read_results(out)
    assert [r["recipe"] for r in rows] == ["fp32", "ck"] and rows[0]["causal"] is True
    assert rows[0]["deq_rel_l2"] < 1e-6
    assert rows.provenance["argv"]  # the command line is recorded


def test_metrics_option_selects_columns(capsys):
    assert main([*SMALL, "--recipes", "bf16", "--metrics", "rel_l2,cosine,has_nan"]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| recipe"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols == ["recipe", "deq_rel_l2", "orig_rel_l2", "deq_cosine", "orig_cosine", "has_nan"]


def test_capture_inputs_aggregate_per_recipe(tiny_capture, capsys):
    path = tiny_capture(layers=(0, 1))
    args = ["accuracy", "--inputs", str(path), "--layers", "0,1", "--heads", "0,1,2", "--max-tokens", "64",
            "--recipes", "ck,fp32", "--no-progress", "--device", "cpu"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "2 inputs (TinyModel-L0-full-h0.1.2-s64, ..., TinyModel-L1-sliding-h0.1.2-s64)" in text
    table = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    assert table[0][:3] == ["recipe", "inputs", "deq_rel_l2"]
    assert [r[:2] for r in table[1:]] == [["ck", "2"], ["fp32", "2"]]
    assert "mean over inputs" in text
    assert main([*args, "--per-input"]) == 0
    assert "TinyModel-L1-sliding-h0.1.2-s64" in capsys.readouterr().out.split("input:")[1]


@pytest.mark.parametrize("argv,message", [
    (["--recipes", "zyfa,nope"], "unknown recipe 'nope'"),
    (["--head-dim", "0"], "head_dim must be an int >= 1, got 0"),
    (["--seq", "8", "--seq-q", "1"], "give either --seq or --seq-q/--seq-k"),
    (["--heads", "4", "--kv-heads", "3"], "multiple of heads_kv"),
    (["--inputs", "no/such/capture.h5"], "no such input file: no/such/capture.h5"),
    (["--layers", "0"], "--layers and --max-tokens apply to capture inputs"),
    (["--heads", "0,1"], "--heads is the number of query heads"),
    (["--metrics", "rel_l2,bogus"], "unknown metric 'bogus'"),
    (["--out", "results.txt"], "--out must end in .jsonl or .csv"),
    (["--seq", "0"], "seq must be >= 1"),
])
def test_bad_input_exits_2_with_one_clear_line(argv, message, capsys):
    assert main(["accuracy", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("zyfa accuracy: error:") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_gaussian_flags_rejected_for_captures(tiny_capture, capsys):
    path = tiny_capture(layers=(0,))
    assert main(["accuracy", "--inputs", str(path), "--seq", "64", "--causal"]) == 2
    assert "--seq, --causal apply to Gaussian inputs" in capsys.readouterr().err
