"""A user's kernel behind a wall (issue 44 item 2, faults 2-5; issue 45 item 7): plug-ins run in a worker process.

- Faults 4 and 5: one real ``zyfa`` process runs the correct example kernel beside five faulty ones in one shared
  worker: one sleeping past ``--kernel-timeout``, one calling ``os._exit(0)``, one changing directory, one leaving
  a non-daemon thread, one raising ``SystemExit``. Each faulty one fails its row with the reason; the run writes
  its file where it was asked, exits 3 and ends; the example's row and the recipe's row are those of a run without
  the faulty kernels.
- Fault 2: a kernel writing into its inputs fails its rows ("wrote into its inputs"), and the correct kernel after
  it stays ``ok`` with the error of a run without it (worker and in-process).
- Fault 3: a kernel that masks only at the probes' size (128 tokens) is ``nonconforming`` on a scored input of 256.
- Issue 45 item 7: a kernel split over two files imports its helper from its folder, ``NAME=`` names its rows,
  provenance holds its path and SHA-256, a relative and an absolute path name one kernel, a plug-in paired with a
  recipe has no ``deq_*`` columns.
The faulty kernels misbehave on the scored input only (64 tokens; the probes have 128), so each fault costs one
worker restart; the worker is shared by the tests of one pytest process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from zyfa.accuracy.io.results_io import read_results

from tests.faults import env, zyfa_cmd
from zyfa.cli import main

EXAMPLE_FILE = Path(__file__).resolve().parents[2] / "examples" / "fp8_torch_attention.py"
EXAMPLE = f"{EXAMPLE_FILE}:attention"
SIG = "def kern(q, k, v, *, causal, sm_scale, window):\n"
CALL = "    return attention(q, k, v, causal=causal, sm_scale=sm_scale, window=window)\n"
FAULTY = {  # name -> (body, the row's error); each fires on the scored input (64 tokens), not on the probes
    "sleeps": ("    if q.shape[2] == 64:\n        time.sleep(60)\n" + CALL, "timed out after 3 s"),
    "exits": ("    if q.shape[2] == 64:\n        os._exit(0)\n" + CALL, "ended its worker process (exit status 0)"),
    "chdirs": ("    if q.shape[2] == 64:\n        os.chdir(os.path.dirname(__file__))\n" + CALL,
               "changed the working directory to"),
    "thread": ("    if q.shape[2] == 64:\n        threading.Thread(target=time.sleep, args=(600,)).start()\n" + CALL,
               "left 1 non-daemon thread(s) running"),
    "sys_exit": ("    if q.shape[2] == 64:\n        sys.exit(0)\n" + CALL, "raised SystemExit"),
}
MUTATES = "    q.mul_(2)\n    v[..., 0] = 0\n" + CALL
SMALL = ["accuracy", "--seq", "64", "--head-dim", "64", "--heads", "2", "--device", "cpu", "--no-progress",
         "--recipes", "fp32"]
MEASURED = ("orig_rel_l2", "orig_max_abs_err", "orig_lse_max_abs_err", "deq_rel_l2", "status")


def _kernel(folder: Path, name: str, body: str) -> str:
    """A one-file plug-in: the example kernel's source, then ``kern`` with ``body``."""
    folder.mkdir(exist_ok=True)
    p = folder / f"{name}.py"
    p.write_text(EXAMPLE_FILE.read_text() + f"\nimport os\nimport sys\nimport threading\nimport time\n\n\n{SIG}{body}")
    return f"{p}:kern"


def _by_name(rows):
    return {r.get("implementation") or r["recipe"]: r for r in rows}


def _measured(row):
    return {k: row.get(k) for k in MEASURED}


def test_faulty_plugins_fail_their_rows_and_leave_the_run_whole(tmp_path):
    """Faults 4 and 5: os._exit, a hang, a chdir, a stray thread (and sys.exit) in a real zyfa process."""
    folder = tmp_path / "kernels"
    specs = {name: _kernel(folder, name, body) for name, (body, _) in FAULTY.items()}
    work = tmp_path / "work"
    work.mkdir()
    argv = [*SMALL, "--kernel", EXAMPLE]
    for spec in specs.values():
        argv += ["--kernel", spec]
    p = subprocess.run(zyfa_cmd(*argv, "--kernel-timeout", "3", "--out", "r.jsonl"), cwd=work, env=env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 3, (p.stdout, p.stderr)  # failed rows: every row written, then exit 3
    assert "5 of 7 rows failed (5 failed)" in p.stderr, p.stderr
    assert sorted(x.name for x in work.iterdir()) == ["r.jsonl"]  # no partial, no lock left
    assert not [x for x in folder.iterdir() if x.suffix != ".py" and x.name != "__pycache__"]  # nothing moved
    rows = _by_name(read_results(work / "r.jsonl"))
    for name, (_, why) in FAULTY.items():
        row = rows[f"plugin:{specs[name]}"]
        assert row["status"] == "failed" and why in row["error"], (name, row)
    # the other rows are those of a run without the faulty kernels
    alone = tmp_path / "alone.jsonl"
    assert main([*SMALL, "--kernel", EXAMPLE, "--out", str(alone)]) == 0
    again = _by_name(read_results(alone))
    assert _measured(again[f"plugin:{EXAMPLE}"]) == _measured(rows[f"plugin:{EXAMPLE}"])
    assert _measured(again["fp32"]) == _measured(rows["fp32"])


@pytest.mark.parametrize("where", [[], ["--kernel-in-process"]], ids=["worker", "in-process"])
def test_a_kernel_writing_into_its_inputs_fails_and_spoils_nothing(tmp_path, capsys, where):
    """Fault 2: the writer fails its row; the correct kernel after it is ok, with the error of a run alone."""
    spec = _kernel(tmp_path / "k", "mutates", MUTATES)
    out = tmp_path / "r.jsonl"
    assert main([*SMALL, *where, "--kernel", spec, "--kernel", EXAMPLE, "--out", str(out)]) == 3
    rows = _by_name(read_results(out))
    assert rows[f"plugin:{spec}"]["status"] == "failed"
    assert "wrote into its inputs q, v" in rows[f"plugin:{spec}"]["error"]
    alone = tmp_path / "alone.jsonl"
    assert main([*SMALL, *where, "--kernel", EXAMPLE, "--out", str(alone)]) == 0
    assert _measured(rows[f"plugin:{EXAMPLE}"]) == _measured(_by_name(read_results(alone))[f"plugin:{EXAMPLE}"])
    assert rows[f"plugin:{EXAMPLE}"]["status"] == "ok"
    capsys.readouterr()


def test_mask_only_at_the_probes_size_is_nonconforming(tmp_path, capsys):
    """Fault 3: masking at <= 128 tokens passes the probes; the scored input of 256 tokens catches it. The
    correct kernel, paired with a recipe, passes the check and has no deq_ columns."""
    spec = _kernel(tmp_path / "k", "small_mask",
                   "    return attention(q, k, v, causal=causal and q.shape[2] <= 128, sm_scale=sm_scale, "
                   "window=window)\n")
    out = tmp_path / "r.jsonl"
    argv = ["accuracy", "--seq", "256", "--head-dim", "64", "--heads", "2", "--causal", "--device", "cpu",
            "--no-progress", "--recipes", "zyfa", "--kernel", spec, "--kernel", EXAMPLE, "--kernel-recipe", "zyfa",
            "--out", str(out)]
    assert main(argv) == 3
    rows = read_results(out)
    bad, ok = rows[1], rows[2]
    assert bad["status"] == "nonconforming", bad
    assert "scored-input mask check: causal=True ignored at s_q 256, s_k 256" in bad["reason"]
    assert ok["status"] == "ok" and ok["scored_mask_check"] == "passed", ok
    # a plug-in never receives the recipe's inputs: no deq_ columns, its ratio on the original inputs
    assert not [k for k in ok if k.startswith("deq_")] and ok["ratio_basis"] == "orig"
    assert 0.5 < ok["real_emu_ratio"] < 2
    assert rows[0].get("deq_rel_l2") is not None  # the recipe's own row keeps them
    capsys.readouterr()


def test_a_kernel_split_over_two_files_named_and_identified(tmp_path, monkeypatch, capsys):
    """Issue 45 items 5 and 7: the plug-in's folder is importable in the worker; NAME= names the rows; provenance
    holds the resolved path and SHA-256; a relative path names the same kernel as the absolute one."""
    folder = tmp_path / "kern"
    folder.mkdir()
    (folder / "my_helpers.py").write_text(EXAMPLE_FILE.read_text())
    main_file = folder / "my_kernel.py"
    main_file.write_text("from my_helpers import attention\n\n\n" + SIG + CALL)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.jsonl"
    assert main([*SMALL, "--kernel", "mine=kern/my_kernel.py:kern", "--kernel", "kern/my_kernel.py:kern",
                 "--out", str(out)]) == 0
    rows = read_results(out)
    assert [r.get("implementation") for r in rows] == [None, "mine", f"plugin:{main_file}:kern"]
    assert rows[1]["status"] == rows[2]["status"] == "ok"
    plug = json.loads(out.read_text().splitlines()[0])["implementations_plugins"]
    assert plug["mine"]["path"] == str(main_file) and plug["mine"]["spec"] == "mine=kern/my_kernel.py:kern"
    assert plug["mine"]["sha256"] == hashlib.sha256(main_file.read_bytes()).hexdigest()
    # relative and absolute: one kernel, so a resume with the absolute path has nothing left to run
    assert main([*SMALL, "--kernel", "mine=kern/my_kernel.py:kern", "--kernel", f"{main_file}:kern",
                 "--out", str(out), "--resume"]) == 0
    assert read_results(out) == rows
    # a built-in's name is refused in one line, before anything is written
    capsys.readouterr()
    assert main([*SMALL, "--kernel", "sdpa-fp32=kern/my_kernel.py:kern", "--out", "x.jsonl"]) == 2
    assert "is a built-in implementation's" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["kern", "r.jsonl"]


@pytest.mark.gpu
def test_cuda_inputs_cross_by_ipc(tmp_path, capsys):
    """On a GPU the worker gets CUDA tensors by IPC and returns CUDA outputs; a write into them is detected."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    spec = _kernel(tmp_path / "k", "mutates", MUTATES)
    out = tmp_path / "r.jsonl"
    argv = [*SMALL[:-5], "--device", "cuda", "--no-progress", "--recipes", "fp32", "--kernel", EXAMPLE,
            "--kernel", spec, "--out", str(out)]
    assert main(argv) == 3
    rows = read_results(out)
    assert rows[1]["status"] == "ok" and rows[1]["device"].startswith("cuda")
    assert rows[2]["status"] == "failed" and "wrote into its inputs q, v" in rows[2]["error"]
    capsys.readouterr()


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_bad_kernel_timeout_is_one_line_before_anything_is_written(tmp_path, capsys, value):
    out = tmp_path / "r.jsonl"
    assert main([*SMALL, "--kernel", EXAMPLE, "--kernel-timeout", value, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--kernel-timeout must be a number of seconds > 0" in err
    assert not list(tmp_path.iterdir())
