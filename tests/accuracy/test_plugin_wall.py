"""A user's kernel behind a wall (issue 44 item 2, faults 2-5; issue 45 item 7): plug-ins run in a worker process.

One real ``zyfa`` process runs six plug-ins in one shared worker: a correct kernel split over two files (named
with ``NAME=``), one that writes into its inputs, one that sleeps past ``--kernel-timeout``, one that calls
``os._exit(0)``, one that changes directory and one that leaves a non-daemon thread. Each faulty one fails its row
with the reason; the run writes its file where it was asked, exits 3 and ends; the correct kernel's row and the
recipe's row are those of a run without the faulty kernels. Then: a kernel that masks only at the probes' size is
``nonconforming`` on a longer scored input (fault 3); ``deq_*`` columns are absent for a plug-in paired with a
recipe (it never received the recipe's inputs); a relative and an absolute path name one kernel.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from accuracy.plugin_load import parse_spec
from accuracy.runner import read_results
from tests.faults import env, zyfa_cmd
from zyfa.cli import main

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "fp8_torch_attention.py") + ":attention"
SIG = "def kern(q, k, v, *, causal, sm_scale, window):\n"
CALL = "    return attention(q, k, v, causal=causal, sm_scale=sm_scale, window=window)\n"
# the correct kernel, in two files: the plug-in imports its helper from its own folder
HELPER = ("import torch\n\n\ndef attention(q, k, v, *, causal, sm_scale, window):\n"
          "    g = q.shape[1] // k.shape[1]\n"
          "    k, v = (t.float().repeat_interleave(g, dim=1) for t in (k, v))\n"
          "    s = (q.float() @ k.transpose(-1, -2)) * sm_scale\n"
          "    pos = torch.arange(q.shape[2]).unsqueeze(1) + (k.shape[2] - q.shape[2])\n"
          "    key = torch.arange(k.shape[2]).unsqueeze(0)\n"
          "    if causal or window is not None:\n"
          "        s = s.masked_fill(key > pos, float('-inf'))\n"
          "    if window is not None:\n"
          "        s = s.masked_fill(key <= pos - window, float('-inf'))\n"
          "    return torch.softmax(s, dim=-1) @ v\n")
FAULTY = {  # name -> (body, the row's error); faults fire on the scored input (64 tokens), not on the probes
    "mutates": ("    q.mul_(2)\n" + CALL, "wrote into its inputs q"),
    "sleeps": ("    if q.shape[2] == 64:\n        time.sleep(60)\n" + CALL, "timed out after 3 s"),
    "exits": ("    if q.shape[2] == 64:\n        os._exit(0)\n" + CALL, "ended its worker process (exit status 0)"),
    "chdirs": ("    if q.shape[2] == 64:\n        os.chdir(os.path.dirname(__file__))\n" + CALL,
               "changed the working directory to"),
    "thread": ("    if q.shape[2] == 64:\n        threading.Thread(target=time.sleep, args=(600,)).start()\n" + CALL,
               "left 1 non-daemon thread(s) running"),
}
SMALL = ["accuracy", "--seq", "64", "--head-dim", "64", "--heads", "2", "--device", "cpu", "--no-progress",
         "--recipes", "fp32"]
MEASURED = ("orig_rel_l2", "orig_max_abs_err", "deq_rel_l2", "status")


def _kernels(folder):
    folder.mkdir()
    (folder / "helper_attention.py").write_text(HELPER)
    specs = {}
    for name, (body, _) in {"good": (CALL, ""), **FAULTY}.items():
        p = folder / f"{name}.py"
        p.write_text(f"import os\nimport threading\nimport time\n\nfrom helper_attention import attention\n\n\n"
                     f"{SIG}{body}")
        specs[name] = f"{p}:kern"
    return specs


def _measured(row):
    return {k: row.get(k) for k in MEASURED}


def test_faulty_plugins_fail_their_rows_and_leave_the_run_whole(tmp_path):
    specs = _kernels(tmp_path / "kernels")
    work = tmp_path / "work"
    work.mkdir()
    argv = [*SMALL, "--kernel", f"mine={specs['good']}"]
    for name in FAULTY:
        argv += ["--kernel", specs[name]]
    p = subprocess.run(zyfa_cmd(*argv, "--kernel-timeout", "3", "--out", "r.jsonl"), cwd=work, env=env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 3, (p.stdout, p.stderr)  # failed rows: every row written, then exit 3
    assert sorted(x.name for x in work.iterdir()) == ["r.jsonl"]  # no partial, no lock, nothing moved
    assert sorted(x.name for x in (tmp_path / "kernels").iterdir() if x.name != "__pycache__") == sorted(
        ["helper_attention.py", "good.py", *(f"{n}.py" for n in FAULTY)])  # the chdir moved no output there
    rows = read_results(work / "r.jsonl")
    by = {r.get("implementation") or r["recipe"]: r for r in rows}
    assert by["mine"]["status"] == "ok", by["mine"]  # NAME= names the rows; the helper file imported
    for name, (_, why) in FAULTY.items():
        row = by[f"plugin:{specs[name]}"]
        assert row["status"] == "failed" and why in row["error"], (name, row)
    prov = json.loads((work / "r.jsonl").read_text().splitlines()[0])
    good_path = specs["good"].rpartition(":")[0]
    assert prov["implementations_plugins"]["mine"]["sha256"] == \
        hashlib.sha256(Path(good_path).read_bytes()).hexdigest()
    assert prov["implementations_plugins"]["mine"]["path"] == good_path
    # the other rows are those of a run without the faulty kernels
    alone = tmp_path / "alone.jsonl"
    assert main([*SMALL, "--kernel", f"mine={specs['good']}", "--out", str(alone)]) == 0
    again = {r.get("implementation") or r["recipe"]: r for r in read_results(alone)}
    assert _measured(again["mine"]) == _measured(by["mine"])
    assert _measured(again["fp32"]) == _measured(by["fp32"])


def test_a_mutating_kernel_spoils_nothing_in_process_either(tmp_path, capsys):
    """--kernel-in-process still hands copies over and checks them: the next, correct kernel stays ok."""
    specs = _kernels(tmp_path / "kernels")
    out = tmp_path / "r.jsonl"
    assert main([*SMALL, "--kernel-in-process", "--kernel", specs["mutates"], "--kernel", specs["good"],
                 "--out", str(out)]) == 3
    rows = read_results(out)
    assert rows[1]["status"] == "failed" and "wrote into its inputs q" in rows[1]["error"]
    assert rows[2]["status"] == "ok" and rows[2]["orig_rel_l2"] < 1e-5, rows[2]
    assert "1 of 3 rows failed" in capsys.readouterr().err


def test_mask_only_at_the_probes_size_is_nonconforming(tmp_path, capsys):
    """Fault 3: masking at <= 128 tokens passes the probes; the scored input of 256 tokens catches it."""
    folder = tmp_path / "k"
    folder.mkdir()
    (folder / "helper_attention.py").write_text(HELPER)
    small_mask = folder / "small_mask.py"
    small_mask.write_text("from helper_attention import attention\n\n\n" + SIG +
                          "    return attention(q, k, v, causal=causal and q.shape[2] <= 128, sm_scale=sm_scale, "
                          "window=window)\n")
    out = tmp_path / "r.jsonl"
    argv = ["accuracy", "--seq", "256", "--head-dim", "64", "--heads", "2", "--causal", "--device", "cpu",
            "--no-progress", "--recipes", "zyfa", "--kernel-in-process", "--kernel", f"{small_mask}:kern",
            "--kernel", EXAMPLE, "--kernel-recipe", "zyfa", "--out", str(out)]
    assert main(argv) == 3
    rows = read_results(out)
    bad, ok = rows[1], rows[2]
    assert bad["status"] == "nonconforming", bad
    assert "scored-input mask check: causal=True ignored at s_q 256, s_k 256" in bad["reason"]
    assert ok["status"] == "ok" and ok["scored_mask_check"] == "passed", ok
    # a plug-in never receives the recipe's inputs: no deq_ columns, its ratio on the original inputs
    assert not any(k.startswith("deq_") for k in ok), sorted(k for k in ok if k.startswith("deq_"))
    assert ok["ratio_basis"] == "orig" and 0.5 < ok["real_emu_ratio"] < 2
    assert rows[0].get("deq_rel_l2") is not None  # the recipe's own row keeps them
    capsys.readouterr()


def test_relative_and_absolute_paths_name_one_kernel(tmp_path, monkeypatch):
    (tmp_path / "k.py").write_text(SIG + "    return q\n")
    monkeypatch.chdir(tmp_path)
    rel, ab = parse_spec("k.py:kern"), parse_spec(f"{tmp_path / 'k.py'}:kern")
    assert rel.name == ab.name == f"plugin:{tmp_path / 'k.py'}:kern" and rel.sha256 == ab.sha256
    assert parse_spec("mine=k.py:kern").name == "mine"
    assert main([*SMALL, "--kernel", "sdpa-fp32=k.py:kern"]) == 2  # a built-in's name is refused
    assert os.listdir(tmp_path) == ["k.py"]


@pytest.mark.gpu
def test_cuda_inputs_cross_by_ipc(tmp_path):
    """On a GPU the worker gets the CUDA tensors by IPC and returns CUDA outputs; a write is still detected."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    specs = _kernels(tmp_path / "kernels")
    out = tmp_path / "r.jsonl"
    code = main([*SMALL[:-4], "--device", "cuda", "--no-progress", "--recipes", "fp32", "--kernel", specs["good"],
                 "--kernel", specs["mutates"], "--out", str(out)])
    rows = read_results(out)
    assert code == 3 and rows[1]["status"] == "ok" and rows[1]["device"].startswith("cuda")
    assert rows[2]["status"] == "failed" and "wrote into its inputs q" in rows[2]["error"]
