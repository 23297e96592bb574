"""Every command takes the one recipe-spec grammar (zyfa.recipes) and refuses a bad spec with the same line.

Each command runs in this process (one child process checks the real exit) on its cheapest path: ``--dry-run``,
a 16-token cliff sweep, ``zyfa bench`` checking its specs before it looks for a GPU; on the CPU. An accepted spec
exits 0 (``zyfa bench``: the GPU line, not a spec refusal); a refused one exits 2 with one line ending in
:func:`zyfa.recipe_spec.get_recipe`'s message, and no traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zyfa.cli import main
from zyfa.recipe_spec import SpecError, get_recipe

ROOT = Path(__file__).resolve().parents[2]
GAUSS = ["--inputs", "gaussian", "--seq", "64", "--head-dim", "64", "--heads", "1", "--device", "cpu"]
CLIFFS = ["--device", "cpu", "--lengths", "16", "--heads", "1", "--head-dim", "64", "--no-progress"]

# command -> (argv before the spec, the flag that takes it, argv after); {out} is a fresh folder.
RECIPE_FLAGS = {
    "accuracy": (["accuracy", *GAUSS, "--dry-run"], "--recipes", []),
    "study": (["study", "--dry-run", "--device", "cpu", "--out", "{out}/st"], "--recipes", []),
    "impact": (["impact", "--models", "smollm2", "--device", "cpu", "--dry-run", "--out", "{out}/i.jsonl"],
               "--recipes", []),
    "longctx": (["longctx", "--models", "smollm2", "--device", "cpu", "--dry-run", "--out", "{out}/l.jsonl"],
                "--implementations", []),
    "cliffs": (["cliffs", *CLIFFS, "--out", "{out}/c"], "--recipes", []),
    "bench": (["bench", "--out", "{out}/b.json"], "--recipes", []),
    "recipes": (["recipes"], None, []),
}
# where real kernels are named: triton:SPEC, cute:SPEC
IMPL_FLAGS = {
    "accuracy": (["accuracy", *GAUSS, "--dry-run", "--recipes", "none"], "--implementations", []),
    "longctx": (["longctx", "--models", "smollm2", "--device", "cpu", "--dry-run", "--out", "{out}/l.jsonl"],
                "--implementations", []),
    "cliffs": (["cliffs", *CLIFFS, "--out", "{out}/c"], "--implementations", []),
    "impact": (["impact", "--models", "smollm2", "--device", "cpu", "--dry-run", "--out", "{out}/i.jsonl"],
               "--implementations", []),
}
BAD = ["zyfa:nosuchfield=1", "zyfa:accum_flush_tiles=maybe", "nosuchrecipe"]


def _argv(table, command: str, spec: str, tmp_path: Path) -> list[str]:
    before, flag, after = table[command]
    return [a.format(out=tmp_path) for a in before] + ([flag] if flag else []) + [spec] + after


@pytest.fixture
def zyfa(tmp_path, capsys, monkeypatch):
    """Run ``zyfa`` in this process on the CPU, in ``tmp_path``: (exit status, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    def run(table, command: str, spec: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main(_argv(table, command, spec, tmp_path))
        got = capsys.readouterr()
        return rc, got.out, got.err

    return run


def _message(spec: str) -> str:
    with pytest.raises(SpecError) as e:
        get_recipe(spec)
    return str(e.value)


def _accepted(command: str, rc: int, err: str) -> None:
    if command == "bench":  # specs checked, then the GPU looked for
        assert rc == 2 and err.strip() == "zyfa bench needs a CUDA GPU (Hopper); none found", err
    else:
        assert rc == 0, err


@pytest.mark.parametrize("spec", ["zyfa:accum_flush_tiles=1", "zyfa@h200",
                                  "zyfa:accumulator=matrix_unit,accum_flush_tiles=1@h200"])
@pytest.mark.parametrize("command", list(RECIPE_FLAGS))
def test_every_command_accepts_the_recipe_specs(command, spec, zyfa):
    rc, out, err = zyfa(RECIPE_FLAGS, command, spec)
    _accepted(command, rc, err)
    if command == "recipes":
        assert out.splitlines()[0] == get_recipe(spec).name


@pytest.mark.parametrize("name", ["triton:fa3:accum_flush_tiles=1", "cute:zyfa-hopper:q_scale=head"])
@pytest.mark.parametrize("command", list(IMPL_FLAGS))
def test_real_kernel_specs_are_accepted_where_real_kernels_are(command, name, zyfa):
    rc, out, err = zyfa(IMPL_FLAGS, command, name)
    if command == "impact":  # impact refuses a kernel this machine cannot run, after parsing its spec
        assert rc == 2 and f"implementation {name} cannot run here: no CUDA device" in err
    elif command in ("longctx", "cliffs"):  # parsed, then refused in one line: no CUDA device here
        assert rc == 2 and f"implementation {name} cannot run here" in err
    else:
        assert rc == 0, err


def _refused(rc: int, out: str, err: str, message: str) -> None:
    lines = (err + out).strip().splitlines()
    assert rc == 2, (rc, out, err)
    assert len(lines) == 1 and "Traceback" not in err, lines
    assert lines[0].startswith("zyfa ") and lines[0].endswith(": " + message), (lines[0], message)


@pytest.mark.parametrize("spec", BAD)
@pytest.mark.parametrize("command", list(RECIPE_FLAGS))
def test_every_command_refuses_a_bad_spec_with_the_same_line(command, spec, zyfa, tmp_path):
    rc, out, err = zyfa(RECIPE_FLAGS, command, spec)
    _refused(rc, out, err, _message(spec))
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("spec", BAD)
@pytest.mark.parametrize("command", list(IMPL_FLAGS))
def test_a_bad_real_kernel_spec_is_refused_with_the_same_line(command, spec, zyfa):
    rc, out, err = zyfa(IMPL_FLAGS, command, f"triton:{spec}")
    _refused(rc, out, err, _message(f"triton:{spec}"))
    rc, out, err = zyfa(IMPL_FLAGS, command, f"cute:{spec}")  # cute: is a namespace of the same grammar
    _refused(rc, out, err, _message(f"cute:{spec}"))


@pytest.mark.parametrize("command", list(IMPL_FLAGS))
def test_a_spec_the_cute_kernel_does_not_take_is_refused_in_one_line(command, zyfa):
    rc, out, err = zyfa(IMPL_FLAGS, command, "cute:zyfa-hopper:accum_flush_tiles=0")
    _refused(rc, out, err, "implementation 'cute:zyfa-hopper:accum_flush_tiles=0': recipe "
                           "'zyfa-hopper:accum_flush_tiles=0': the CuTe FP8 kernel does not support "
                           "accum_flush_tiles=0 (supported: 1)")


def test_the_messages_name_the_field_and_list_the_fields():
    fields = "fields: q_format, k_format"
    assert "no field 'nosuchfield'" in _message("zyfa:nosuchfield=1") and fields in _message("zyfa:nosuchfield=1")
    m = _message("zyfa:accum_flush_tiles=maybe")
    assert "accum_flush_tiles takes an integer, not 'maybe'" in m and fields in m
    assert _message("nosuchrecipe").startswith("unknown recipe 'nosuchrecipe'; known recipes: zyfa, ")


@pytest.mark.parametrize("command", ["accuracy", "longctx"])
def test_the_refusal_is_one_line_and_status_2_in_a_real_process(command, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run([sys.executable, "-m", "zyfa.cli", *_argv(RECIPE_FLAGS, command, BAD[1], tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    _refused(p.returncode, p.stdout, p.stderr, _message(BAD[1]))
