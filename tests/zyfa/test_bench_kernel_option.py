"""``zyfa bench --kernel``: a user's kernel named and checked before any GPU work; refused in one line on a CPU."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zyfa.bench.cli import command_line, parse_kernel_arg
from zyfa.bench.table import cute_lines, plugin_lines, ratio_cell, to_markdown

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fp8_torch_attention.py"


def _bench(*argv, cwd):
    # the tree first, then what the machine already had on the path (the GPU machine's peer packages in /tmp/site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "zyfa", "bench", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_kernel_argument_names_and_checks_the_kernel(tmp_path):
    assert parse_kernel_arg(f"{EXAMPLE}:attention") == ("attention", f"{EXAMPLE}:attention")
    assert parse_kernel_arg(f"mine={EXAMPLE}:attention") == ("mine", f"mine={EXAMPLE}:attention")
    with pytest.raises(ValueError, match="no such file"):
        parse_kernel_arg(f"{tmp_path}/absent.py:attention")
    with pytest.raises(ValueError, match="defines no 'nothing'"):
        parse_kernel_arg(f"{EXAMPLE}:nothing")
    with pytest.raises(ValueError, match="expected"):
        parse_kernel_arg("no-colon-here")


def test_the_recorded_command_runs_again_in_a_shell():
    argv = ["zyfa", "bench", "--cute-recipes", "zyfa-hopper;zyfa-hopper:rowsum=rounded_mma", "--out", "my dir/b.json"]
    line = command_line(argv)
    assert line == "zyfa bench --cute-recipes 'zyfa-hopper;zyfa-hopper:rowsum=rounded_mma' --out 'my dir/b.json'"
    assert shlex.split(line)[2:] == argv[2:]
    assert command_line(["/x/zyfa/bench/__main__.py", "--repeats", "5"]) == "zyfa bench --repeats 5"


@pytest.mark.parametrize("argv, line", [
    (["--kernel", "absent.py:fn"], "no such file absent.py"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--peers", "sdpa-mystery"], "--peers: unknown sdpa-mystery"),
    (["--cute-recipes", "fa3"], "--cute-recipes: recipe 'fa3': the CuTe FP8 kernel does not support exp_method="),
    (["--cute-recipes", "zyfa-hopper;zyfa-hopper:rowsum=fp32"],
     "--cute-recipes: recipe 'zyfa-hopper:rowsum=fp32': the CuTe FP8 kernel does not support rowsum='fp32'"),
])
def test_bad_arguments_are_refused_in_one_line(tmp_path, argv, line):
    r = _bench(*argv, "--out", str(tmp_path / "b.json"), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and line in r.stderr, r.stderr
    assert not (tmp_path / "b.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_a_valid_kernel_on_a_cpu_is_refused_in_one_line(tmp_path):
    r = _bench("--kernel", f"mine={EXAMPLE}:attention", "--out", str(tmp_path / "b.json"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == "zyfa bench needs a CUDA GPU (Hopper); none found"


def _row(impl, recipe, ms, **kw):
    base = {"input": "gaussian", "b": 1, "h": 16, "h_kv": 16, "s": 8192, "d_qk": 128, "d_v": 128, "causal": False}
    fl = 4 * 16 * 8192 * 8192 * 128
    return dict(base, impl=impl, recipe=recipe, ms=ms, ms_min=ms * 0.98, ms_max=ms * 1.03, repeats=5,
                tflops=fl / ms / 1e9, rel_l2_vs_sdpa_bf16=0.03, **kw)


def test_plugin_rows_render_with_their_ratios_against_the_peers():
    vs = {"cudnn-fp8": {"median": 0.91, "min": 0.88, "max": 0.95, "n": 5, "matched_clock_median": 0.97}}
    rows = [_row("cudnn-fp8", "cudnn-fp8", 1.0),
            _row("plugin:mine", "-", 1.1, vs=vs, rel_l2_fp8_out_vs_sdpa_bf16=0.04),
            _row("plugin:broken", "-", 1.0) | {"error": "RuntimeError: boom"}]
    assert ratio_cell(rows[1], "cudnn-fp8") == "0.91 [0.88–0.95] (clock-matched 0.97)"
    text = "\n".join(plugin_lines(rows))
    assert "| mine | gaussian |" in text and "0.91 [0.88–0.95]" in text and "failed: RuntimeError: boom" in text
    meta = {"device": "H200", "command": "zyfa bench", "date": "d", "git_commit": "c", "versions": {},
            "inputs_note": "n", "repeats": 5}
    md = to_markdown(meta, rows)
    assert "## Your kernels" in md and "rotating order, 5 repeats" in md and "| W |" not in md


def test_cute_rows_render_with_v_transpose_included_and_their_ratios():
    vs = {"cudnn-fp8": {"median": 1.02, "min": 0.99, "max": 1.04, "n": 5, "matched_clock_median": 1.01}}
    rows = [_row("cudnn-fp8", "cudnn-fp8", 1.0),
            _row("cute-fp8", "zyfa-hopper", 1.0, vs_incl_transpose=vs, tflops_incl_transpose=900.0,
                 tflops_incl_transpose_min=880.0, tflops_incl_transpose_max=910.0),
            _row("cute-fp8", "zyfa-hopper", 1.0) | {"d_qk": 256, "d_v": 256,
                                                   "error": "ValueError: the CuTe FP8 kernel supports head dims"}]
    text = "\n".join(cute_lines(rows))
    assert "## Our CuTe DSL kernel" in text
    assert "| zyfa-hopper | gaussian | h16/16 d128/128 | 8192 | non-causal | 900 | 880–910 |" in text
    assert "1.02 [0.99–1.04] (clock-matched 1.01)" in text and "failed: ValueError: the CuTe" in text
    assert cute_lines([rows[0]]) == [] and "## Your kernels" not in "\n".join(cute_lines(rows))


def test_a_bench_file_from_before_the_interleaved_bench_says_so_and_old_peer_names_are_refused():
    meta = {"device": "H200", "command": "c", "date": "d", "git_commit": "g", "versions": {}, "inputs_note": "n"}
    rows = [_row("sdpa-bf16:cudnn", "bf16", 1.5), _row("triton-fp8", "zyfa-hopper", 1.0, tflops_incl_transpose=1000.0)]
    md = to_markdown(meta, rows)
    assert "sdpa-bf16:cudnn" in md and "fixed order" in md
    old = [dict(rows[0], impl="sdpa-cudnn"), rows[1]]  # a file not migrated (scripts/migrate_rows.py)
    with pytest.raises(ValueError, match=r"^bench row 0: peer 'sdpa-cudnn' under its old name \(now "
                                         r"'sdpa-bf16:cudnn'\), written before a rename; migrate the file once with "
                                         r"`python scripts/migrate_rows.py`$"):
        to_markdown(meta, old)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_times_a_users_kernel_interleaved_with_the_peers(tmp_path):
    import json

    out = tmp_path / "b.json"
    r = _bench("--shapes", "hd64", "--seqlens", "1024", "--causal", "false", "--recipes", "zyfa-hopper",
               "--recipes-other", "same", "--peers", "sdpa-bf16:cudnn,cudnn-fp8", "--repeats", "2",
               "--captured", "none", "--kernel", f"mine={EXAMPLE}:attention", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    by = {row["impl"]: row for row in rows}
    assert set(by) == {"triton-fp8", "sdpa-bf16:cudnn", "cudnn-fp8", "plugin:mine"}, [r.get("error") for r in rows]
    for row in rows:
        assert "error" not in row and row["repeats"] == 2 and row["ms_min"] <= row["ms"] <= row["ms_max"]
    assert set(by["plugin:mine"]["vs"]) == {"sdpa-bf16:cudnn", "cudnn-fp8"}
    assert by["triton-fp8"]["vs_incl_transpose"]["cudnn-fp8"]["n"] == 2
    assert "## Your kernels" in (tmp_path / "b.md").read_text()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bench_times_the_cute_kernel_beside_the_triton_kernel(tmp_path):
    """The CuTe DSL kernel in the same interleaving (its first bench run; docs/KERNEL.md): a row per case, checked
    against SDPA before it is timed; a failure is its row's error, never the run's."""
    import json

    pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl (CuTe DSL) is not importable")
    out = tmp_path / "b.json"
    r = _bench("--shapes", "hd128", "--seqlens", "2048", "--causal", "both", "--recipes", "zyfa-hopper",
               "--cute-recipes", "zyfa-hopper", "--peers", "cudnn-fp8", "--repeats", "2", "--captured", "none",
               "--out", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [row for row in json.loads(out.read_text())["rows"] if row["impl"] == "cute-fp8"]
    assert len(rows) == 2 and all("error" not in row for row in rows), [row.get("error") for row in rows]
    assert all(row["vs_incl_transpose"]["cudnn-fp8"]["n"] == 2 for row in rows)
