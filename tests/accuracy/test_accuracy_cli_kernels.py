"""``zyfa accuracy --kernel`` / ``--implementations`` through the real command entry point, on a CPU: the example
plug-in beside its paired recipe, a failing kernel that does not stop the run, built-ins this machine lacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from zyfa.accuracy.inputs.attention_input import GaussianSpec, make_gaussian
from zyfa.accuracy.io.results_io import read_results
from zyfa.reference.attention import attention_fp64

from zyfa.cli import main
from zyfa.norms import rel_l2

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "fp8_torch_attention.py") + ":attention"
SMALL = ["accuracy", "--seq", "128", "--head-dim", "64", "--heads", "4", "--kv-heads", "2", "--causal",
         "--device", "cpu", "--no-progress"]


def _independent_example_error(spec: GaussianSpec) -> float:
    """The example's error against FP64, recomputed here: per-tensor e4m3 by PyTorch's cast, FP64 attention."""
    x = make_gaussian(spec)

    def fq(t):
        t = t.double()
        s = 448.0 / t.abs().max()
        return (t * s).to(torch.float8_e4m3fn).double() / s

    out = attention_fp64(fq(x.q), fq(x.k), fq(x.v), causal=True)[0]
    ref = attention_fp64(x.q, x.k, x.v, causal=True)[0]
    return rel_l2(out, ref)


def test_example_plugin_through_zyfa_accuracy(tmp_path, capsys):
    bad = tmp_path / "bad_kernel.py"
    bad.write_text("def attn(q, k, v, *, causal, sm_scale, window):\n    return q * float('nan')\n")
    out = tmp_path / "r.jsonl"
    argv = [*SMALL, "--recipes", "zyfa", "--kernel", EXAMPLE, "--kernel", f"{bad}:attn", "--kernel-recipe",
            "zyfa", "--kernel-recipe", "ck", "--implementations", "cudnn-fp8", "--out", str(out)]
    assert main(argv) == 3  # a failed row: every row written, then exit 3
    text = capsys.readouterr().out
    labels = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")][1:]
    assert labels[0] == "zyfa" and labels[1] == f"plugin:{EXAMPLE}" and labels[2] == f"plugin:{bad}:attn"
    assert f"failed: plugin:{bad}:attn on gaussian-b1-h4x2-s128-d64-causal-seed0: kernel '{bad}:attn' returned" \
           in text and "non-finite output value(s)" in text
    if not torch.cuda.is_available():
        assert "no GPU: 1 GPU implementation skipped (cudnn-fp8)" in text
    assert f"--kernel {EXAMPLE} --kernel {bad}:attn --kernel-recipe zyfa --kernel-recipe ck" in text  # repro

    rows = read_results(out)
    assert [(r.get("implementation"), r["recipe"]) for r in rows] == [
        (None, "zyfa"), (f"plugin:{EXAMPLE}", "zyfa"), (f"plugin:{bad}:attn", "ck")]
    ex = rows[1]
    assert ex["real"] is True and ex["status"] == "ok" and ex["quantizes"] == "self"
    expected = _independent_example_error(GaussianSpec(seq=128, heads_q=4, heads_kv=2, head_dim=64, causal=True))
    assert ex["orig_rel_l2"] == pytest.approx(expected, rel=1e-4)
    assert ex["emu_orig_rel_l2"] == pytest.approx(rows[0]["orig_rel_l2"], rel=1e-3)  # the zyfa row's error
    assert ex["real_emu_ratio"] == pytest.approx(expected / rows[0]["orig_rel_l2"], rel=1e-3)
    assert rows[2]["status"] == "failed" and "NaN" in rows[2]["error"]
    prov = json.loads(out.read_text().splitlines()[0])
    if not torch.cuda.is_available():
        assert prov["implementations_unavailable"] == {"cudnn-fp8": "no CUDA device"}


def test_resume_keeps_real_rows(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    argv = [*SMALL, "--recipes", "ck", "--kernel", EXAMPLE, "--out", str(out)]
    assert main(argv) == 0
    first = read_results(out)
    assert main([*argv, "--resume"]) == 0  # nothing left to run: the same rows
    again = read_results(out)
    assert [(r["recipe"], r.get("implementation"), r.get("orig_rel_l2")) for r in again] == \
        [(r["recipe"], r.get("implementation"), r.get("orig_rel_l2")) for r in first]


@pytest.mark.parametrize("extra, message", [
    (["--kernel-recipe", "zyfa"], "--kernel-recipe pairs a --kernel with a recipe; no --kernel given"),
    (["--implementations", "cudnn-fp9"], "unknown implementation 'cudnn-fp9'"),
    (["--kernel", EXAMPLE, "--kernel-recipe", "nope"], "--kernel-recipe 'nope': unknown recipe"),
    (["--kernel", EXAMPLE, "--kernel", EXAMPLE, "--kernel", EXAMPLE, "--kernel-recipe", "zyfa", "--kernel-recipe",
      "ck"], "--kernel-recipe given 2 times for 3 --kernel"),
])
def test_bad_kernel_options_one_line(extra, message, capsys):
    code = main([*SMALL, "--recipes", "ck", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
