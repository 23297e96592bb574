"""Every subcommand refuses a bad argument before importing torch (or scipy): one line on stderr, status 2.

Each case runs ``zyfa.cli.main`` in a fresh interpreter and reads ``sys.modules`` afterwards, so a heavy import
anywhere on the refusal path (a subcommand's module, its ``check_args``, the recipes) fails the test. The time
itself is measured by ``scripts/bench_refusal_time.py`` (not a timed test: the machine is shared).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zyfa.cli import ARGUMENTS, SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "scipy", "triton", "transformers", "matplotlib")

# Run in a fresh interpreter: the refusal's status, stderr and which heavy modules were imported.
PROBE = """
import contextlib, io, json, sys
from zyfa.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    try:
        rc = main(json.loads(sys.argv[1]))
    except SystemExit as e:  # argparse's own refusals
        rc = e.code
print(json.dumps({"rc": rc, "err": err.getvalue(), "heavy": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))

# (argv, a part of the one line). At least one per subcommand (test_every_subcommand_has_a_case).
CASES = [
    (["accuracy", "--seq", "-5"], "seq must be >= 1, got -5"),
    (["accuracy", "--recipes", "zyfa,nope"], "unknown recipe 'nope'"),
    (["accuracy", "--head-dim", "0"], "head_dim must be an int >= 1"),
    (["accuracy", "--seq-q", "0", "--seq-k", "64"], "seq_q must be an int >= 1"),
    (["accuracy", "--inputs", "synthetic:entropy=x"], "entropy must be a number"),
    (["accuracy", "--inputs", "no/such.h5"], "no such input file: no/such.h5"),
    (["accuracy", "--metrics", "bogus"], "unknown metric 'bogus'"),
    (["accuracy", "--platform", "tpu"], "unknown platform 'tpu'"),
    (["accuracy", "--seq", "abc"], "invalid int value: 'abc'"),
    (["recipes", "--bogus"], "unrecognized arguments: --bogus"),
    (["capture", "--model", "nope", "--out", "x.h5"], "unknown model 'nope'"),
    (["capture", "--model", "smollm2", "--out", "x.h5", "--tokens", "0"], "--tokens must be >= 1"),
    (["bench", "--seqlens", "-1"], "--seqlens takes comma-separated token counts >= 1"),
    (["report", "--results", "no/such.jsonl", "--out", "x"], "--results: result file not found: no/such.jsonl"),
    (["study", "--max-seq", "-5"], "--max-seq must be >= 1, got -5"),
    (["study", "--recipes", "nope"], "unknown recipe 'nope'"),
    (["impact", "--tokens", "-1"], "--tokens must be >= 1, got -1"),
    (["impact", "--text", "no/such/prompts.txt"], "no such file"),
    (["longctx", "--lengths", "-5"], "--lengths: '-5' must be at least 1"),
    (["longctx", "--tasks", "nope"], "--tasks: unknown task 'nope'"),
    (["tasks", "--bogus"], "unrecognized arguments: --bogus"),
    (["cliffs", "--max-length", "-1"], "--max-length must be >= 1, got -1"),
    (["compare", "no/a.jsonl", "no/b.jsonl"], "no such file"),
]
# A bad --implementations name or --kernel spec, in every command that takes them: the registry's and the plug-in
# loader's lines, from the torch-free table (accuracy/implementations/names.py) and the spec read without running it.
KERNEL = "examples/fp8_torch_attention.py"
KERNEL_CASES = [
    (["accuracy", "--implementations", "nope"], "unknown implementation 'nope'; built-ins: triton:zyfa,"),
    (["accuracy", "--implementations", "cudnn-fp8,triton:nope"], "unknown recipe 'nope'"),
    (["accuracy", "--implementations", "triton:zyfa:bogus=1"], "no field 'bogus'"),
    (["accuracy", "--implementations", "triton:bf16"],
     "implementation 'triton:bf16': recipe 'bf16': the Triton FP8 kernel does not support q_format='bf16'"),
    (["accuracy", "--implementations", "cute:zyfa"],
     "implementation 'cute:zyfa': recipe 'zyfa': the CuTe FP8 kernel does not support accumulator='fp32'"),
    (["accuracy", "--implementations", "cute:zyfa-hopper:bogus=1"], "no field 'bogus'"),
    (["accuracy", "--kernel", "no/such.py:fn"], "kernel 'no/such.py:fn': no such file no/such.py"),
    (["accuracy", "--kernel", f"{KERNEL}:nofn"], "defines no 'nofn' (the file was not run)"),
    (["accuracy", "--kernel", "nocolon"], "expected module:function or path/to/file.py:function"),
    (["accuracy", "--kernel", f"cudnn-fp8={KERNEL}:attention"], "the name 'cudnn-fp8' is a built-in implementation's"),
    (["accuracy", "--kernel", f"A={KERNEL}:attention", "--kernel", "A=examples/noop_attention.py:attention"],
     "--kernel: the name 'A' is given to two kernels"),
    (["accuracy", "--kernel", f"{KERNEL}:attention", "--kernel-recipe", "nope"], "--kernel-recipe 'nope': unknown"),
    (["accuracy", "--kernel", f"{KERNEL}:attention", "--kernel-timeout", "0"], "--kernel-timeout must be"),
    (["study", "--implementations", "nope"], "unknown implementation 'nope'"),
    (["study", "--kernel", "no/such.py:fn"], "no such file no/such.py"),
    (["study", "--implementations", "cute:fa3"], "the CuTe FP8 kernel does not support exp_method='exp2'"),
    (["impact", "--implementations", "cute:zyfa-hopper:block_n=64"],
     "the CuTe FP8 kernel does not support block_n=64 (supported: 128)"),
    (["cliffs", "--implementations", "triton:nope"], "unknown recipe 'nope'"),
    (["cliffs", "--kernel", f"{KERNEL}:nofn"], "defines no 'nofn'"),
    (["impact", "--implementations", "nope"], "unknown recipe 'nope'"),
    (["impact", "--implementations", "zyfa"], "--implementations: 'zyfa' is a recipe; give it with --recipes"),
    (["impact", "--implementations", "stock"], "--implementations: 'stock' is the model's own attention"),
    (["impact", "--kernel", "no/such.py:fn"], "no such file no/such.py"),
    (["longctx", "--implementations", "stock,nope"], "--implementations: unknown recipe 'nope'"),
    (["longctx", "--implementations", "triton:zyfa:bogus=1"], "--implementations: bad recipe override 'bogus=1'"),
    (["longctx", "--kernel", "no/such.py:fn"], "no such file no/such.py"),
    # the CuTe kernel is compiled per shape: no greedy decoding (zyfa.kernels.cute_plan.NOT_FOR_DECODING)
    (["longctx", "--implementations", "stock,cute:zyfa-hopper", "--generate", "4"],
     "--implementations with --generate: cute:zyfa-hopper: the CuTe FP8 kernel is compiled for each shape"),
    (["tasks", "humaneval", "--implementations", "stock,cute:zyfa-hopper"],
     "--implementations: cute:zyfa-hopper: the CuTe FP8 kernel is compiled for each shape (1.5-3.5 s a compile) "
     "and every decode step has one more key, so greedy decoding would compile a kernel per generated token; the "
     "Triton kernel runs the same recipe spec as triton:zyfa-hopper"),
    (["tasks", "humaneval", "--implementations", "stock,nope"], "--implementations: unknown recipe 'nope'"),
    (["tasks", "humaneval", "--implementations", "stock,zyfa,stock"], "--implementations names one twice"),
    (["tasks", "humaneval", "--kernel", "no/such.py:fn"], "no such file no/such.py"),
    (["bench", "--kernel", "no/such.py:fn"], "--kernel: kernel 'no/such.py:fn': no such file no/such.py"),
    (["bench", "--kernel", f"{KERNEL}:nofn"], "defines no 'nofn'"),
]


def _probe(argv: list[str], cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv,message", CASES + KERNEL_CASES, ids=[" ".join(a) for a, _ in CASES + KERNEL_CASES])
def test_a_bad_argument_is_refused_before_any_heavy_import(argv, message, tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the plug-in cases' files, relative to the folder
    got = _probe(argv, tmp_path)
    assert got["rc"] == 2
    assert message in got["err"]
    assert "Traceback" not in got["err"]
    lines = [line for line in got["err"].splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert len(lines) == 1, got["err"]
    assert got["heavy"] == [], f"imported before refusing: {got['heavy']}"
    assert [p.name for p in tmp_path.iterdir()] == ["examples"], "a refusal wrote a file"


def test_every_subcommand_has_a_case():
    assert {a[0] for a, _ in CASES} == set(SUBCOMMANDS)


def test_every_command_taking_kernels_has_kernel_cases():
    """Each subcommand with --implementations or --kernel has a case of each flag it takes."""
    takes = {}
    for name in SUBCOMMANDS:
        parser = argparse.ArgumentParser()
        importlib.import_module(ARGUMENTS.get(name, SUBCOMMANDS[name][0])).add_arguments(parser)
        text = _all_help(parser)
        takes[name] = {f for f in ("--implementations", "--kernel") if f"{f} " in text}
    covered = {}
    for argv, _ in KERNEL_CASES:
        covered.setdefault(argv[0], set()).update(f for f in ("--implementations", "--kernel") if f in argv)
    assert {n: f for n, f in takes.items() if f} == covered


def _all_help(parser: argparse.ArgumentParser) -> str:
    """A parser's help with its subcommands' (``zyfa tasks humaneval``)."""
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            text += "".join(_all_help(p) for p in action.choices.values())
    return text


# The run's own path, with torch: each command's main() alone, without the dispatch's check_args (one process).
LATE = """
import argparse, contextlib, importlib, io, json, sys
from zyfa.cli import ARGUMENTS, SUBCOMMANDS
out = []
for argv in json.loads(sys.argv[1]):
    name = argv[0]
    parser = argparse.ArgumentParser()
    importlib.import_module(ARGUMENTS.get(name, SUBCOMMANDS[name][0])).add_arguments(parser)
    args = parser.parse_args(argv[1:])
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = importlib.import_module(SUBCOMMANDS[name][0]).main(args)
    out.append({"rc": rc, "err": err.getvalue(), "torch": "torch" in sys.modules})
print(json.dumps(out))
"""


def test_the_refusal_line_is_the_same_before_and_after_torch(tmp_path):
    """The line printed before torch (the dispatch's check_args) is the line the run prints on its own, with the
    registry and the plug-in loader (torch loaded), for every command whose run does not call check_args itself."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    cases = [argv for argv, _ in KERNEL_CASES if argv[0] not in ("cliffs", "bench")]  # their main runs check_args
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", LATE, json.dumps(cases)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    late = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(r["torch"] for r in late)
    for argv, after in zip(cases, late, strict=True):
        before = _probe(argv, tmp_path)
        assert after["rc"] == before["rc"] == 2, (argv, after)
        assert after["err"] == before["err"], argv
    assert [p.name for p in tmp_path.iterdir()] == ["examples"], "a refusal wrote a file"


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_the_module_that_parses_a_subcommand_imports_nothing_heavy(name, tmp_path):
    module = ARGUMENTS.get(name, SUBCOMMANDS[name][0])
    code = f"import sys, {module}; print([m for m in {HEAVY!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"{module} imports {done.stdout.strip()}"


def test_a_good_command_line_still_runs_after_the_checks(tmp_path):
    """The checks do not stand in for the work: a small valid run gets past them and finishes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "zyfa", "accuracy", "--seq-q", "1", "--seq-k", "64", "--heads", "2",
                           "--head-dim", "80", "--causal", "--recipes", "zyfa,bf16", "--device", "cpu",
                           "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "gaussian-b1-h2x2-sq1-sk64-d80-causal-seed0" in done.stdout
    assert "--seq-q 1 --seq-k 64" in done.stdout  # the repro command keeps the shape
