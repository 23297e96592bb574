"""Exit codes and plug-in faults of ``zyfa accuracy`` (issue 32), through the real command entry point.

- A run with failed rows writes every row, counts them on stderr and exits 3; ``--allow-failed`` gives 0.
- A plug-in that raises SystemExit (``sys.exit(0)``) fails its own rows; the run goes on and finishes.
- A plug-in whose function does not exist is refused before any work (exit 2, one line) and its file's
  top-level code is not run; ``--help`` says that ``--kernel`` runs the named file.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from zyfa.accuracy.io.results_io import read_results

from tests.faults import env, zyfa_cmd
from zyfa.cli import main

SMALL = ["accuracy", "--seq", "64", "--head-dim", "64", "--heads", "2", "--device", "cpu", "--no-progress",
         "--recipes", "fp32"]
KERNELS = {
    "raises": "    raise RuntimeError('boom')\n",
    "shape": "    return q[:, :, :1]\n",
    "nan": "    return q * float('nan')\n",
    "none": "    return None\n",
    "exits": "    import sys\n    sys.exit(0)\n",
}


def _kernel(tmp_path, name, body):
    p = tmp_path / f"{name}.py"
    p.write_text(f"def attention(q, k, v, *, causal, sm_scale, window):\n{body}")
    return f"{p}:attention"


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_failed_rows_exit_3_after_writing_every_row(tmp_path, capsys, name):
    out = tmp_path / "r.jsonl"
    argv = [*SMALL, "--kernel", _kernel(tmp_path, name, KERNELS[name]), "--out", str(out)]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "1 of 2 rows failed (1 failed)" in err and "exit 3" in err and "Traceback" not in err, err
    rows = read_results(out)  # the finished file holds every row, the failed one too
    assert [r.get("status") for r in rows] == [None, "failed"]
    assert not (tmp_path / "r.jsonl.partial").exists()
    if name == "exits":
        assert "raised SystemExit" in rows[1]["error"]
    assert main([*argv, "--force", "--allow-failed"]) == 0
    assert "--allow-failed" in capsys.readouterr().err


def test_system_exit_in_a_plugin_does_not_end_the_process(tmp_path):
    """In a real process: the run goes on past the plug-in's sys.exit(0), prints its table and exits 3."""
    spec = _kernel(tmp_path, "exits", KERNELS["exits"])
    p = subprocess.run(zyfa_cmd(*SMALL, "--kernel", spec, "--out", "r.jsonl"), cwd=tmp_path, env=env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert "wrote 2 rows" in p.stdout and "raised SystemExit" in p.stdout
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["status"] == "failed"


def test_missing_function_is_refused_before_the_file_runs(tmp_path, capsys):
    marker = tmp_path / "ran.txt"
    p = tmp_path / "kern.py"
    p.write_text(f"open({str(marker)!r}, 'w').write('top-level code ran')\n"
                 "def attention(q, k, v, *, causal, sm_scale, window):\n    return q\n")
    out = tmp_path / "r.jsonl"
    assert main([*SMALL, "--kernel", f"{p}:attn", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"kernel '{p}:attn'" in err and "defines no 'attn'" in err, err
    assert not marker.exists()  # the file was not executed
    assert sorted(x.name for x in tmp_path.iterdir()) == ["kern.py"]  # nothing written
    # a module spec too
    assert main([*SMALL, "--kernel", "examples.fp8_torch_attention:nope"]) == 2
    assert "defines no 'nope'" in capsys.readouterr().err


def test_help_says_kernel_runs_the_file(capsys):
    with pytest.raises(SystemExit):
        main(["accuracy", "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps (and hyphenates) the help
    assert "runsitstop-levelcode,inaworkerprocess(inthisprocesswith--kernel-in-process)" in text
    assert "--allow-failed" in text and "--kernel-timeout" in text
