"""scripts/mutation_cuda.py: the mutants of ``emulate`` a CPU cannot judge, chosen by what they change and judged in
their own copy of the code (here with --cpu-check, the GPU machine runs the gpu test file the same way)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.load_file import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "mutation_cuda.py"
mc = load_script("mutation_cuda")


def test_candidates_are_device_placement_and_the_gpu_chunk_not_statements_set_to_none():
    assert mc.is_candidate("k_pos = torch.arange(s_k, device=dev)", "k_pos = torch.arange(s_k, device=None)")
    assert mc.is_candidate("k_pos = torch.arange(s_k, device=dev)", "k_pos = torch.arange(s_k, )")
    assert mc.is_candidate("t = Tiling(recipe=recipe, dev=dev)", "t = Tiling(recipe=recipe, dev=None)")
    assert mc.is_candidate("q = 2048 if cpu else max(2048, (1 << 24) // n)", "q = 2048 if cpu else max(2048, None)")
    # a whole statement replaced by None fails on any device; a change elsewhere is the CPU's to judge
    assert not mc.is_candidate("k_pos = torch.arange(s_k, device=dev)", "k_pos = None")
    assert not mc.is_candidate("acc = torch.zeros(n, device=dev)  # fp32 (second-level)", "acc = None  # fp32 (s)")
    assert not mc.is_candidate("x = a + b", "x = a - b")
    assert mc.is_sanity("t = Tiling(recipe=recipe, dev=dev)", "t = Tiling(recipe=None, dev=dev)")
    assert not mc.is_sanity("t = Tiling(recipe=recipe, dev=dev)", "t = Tiling(recipe=recipe, dev=None)")
    assert mc.changed_lines("a\nb\nc\n", "a\nB\nc\n") == ("b", "B")


def _folder(tmp: Path, base_text: str, mutants: dict[int, tuple[str, str, bool]]) -> Path:
    """A folder as ``make`` writes it, by hand: each mutant one text replacement in zyfa/emulator.py."""
    out = tmp / "mut"
    (out / "mutants").mkdir(parents=True)
    entries = []
    for n, (old, new, sanity) in mutants.items():
        assert base_text.count(old) == 1, old
        text = base_text.replace(old, new)
        (out / "mutants" / f"emulator_mutmut_{n}.py").write_text(text)
        entries.append({"n": n, "sanity": sanity, "old": old, "new": new, "file": f"mutants/emulator_mutmut_{n}.py",
                        "sha256": hashlib.sha256(text.encode()).hexdigest(), "diff": ""})
    meta = {"function": "emulate", "base_file": "zyfa/emulator.py",
            "base_sha256": hashlib.sha256(base_text.encode()).hexdigest(), "base_commit": None,
            "mutants_of_function": len(entries), "numbering": "by hand", "mutants": entries}
    (out / "mutants.json").write_text(json.dumps(meta))
    (out / "mutprobe.py").write_text(mc.PROBE)
    return out


def test_a_cpu_check_run_kills_a_cpu_visible_mutant_and_lets_a_device_one_survive(tmp_path):
    base = (ROOT / "zyfa" / "emulator.py").read_text()
    folder = _folder(tmp_path, base, {
        1: ("Tiling(recipe=recipe, dev=dev", "Tiling(recipe=None, dev=dev", True),
        2: ('q_chunk = 2048 if dev.type == "cpu"', 'q_chunk = 2049 if dev.type == "cpu"', False),
        3: ("k_pos = torch.arange(s_k, device=dev)", "k_pos = torch.arange(s_k, )", False)})
    out = tmp_path / "summary.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "run", "--mutants", str(folder), "--cpu-check", "--jobs", "2",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    s = json.loads(out.read_text())
    assert s["ok"] and s["baseline"]["verdict"] == "survived" and s["sanity"]["verdict"] == "killed"
    verdicts = {r["n"]: r["verdict"] for r in s["results"]}
    assert verdicts == {2: "killed", 3: "survived"}  # the CPU's chunk is 2048; k_pos on the CPU changes nothing there
    assert s["counts"] == {"killed": 1, "survived": 1}


def test_mutants_of_another_file_are_refused_in_one_line(tmp_path):
    folder = _folder(tmp_path, "def emulate():\n    tiling = Tiling(recipe=recipe, dev=dev)\n",
                     {1: ("recipe=recipe", "recipe=None", True)})
    done = subprocess.run([sys.executable, str(SCRIPT), "run", "--mutants", str(folder), "--out",
                           str(tmp_path / "s.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "is not the file the mutants were made from" in done.stderr
    assert not (tmp_path / "s.json").exists()


@pytest.mark.slow
def test_make_chooses_every_device_placement_mutant_and_one_sanity_mutant(tmp_path):
    pytest.importorskip("mutmut", reason="mutmut (the dev extra) is not installed")
    assert mc.main(["make", "--out", str(tmp_path / "m")]) == 0
    meta = json.loads((tmp_path / "m" / "mutants.json").read_text())
    assert meta["base_sha256"] == hashlib.sha256((ROOT / "zyfa" / "emulator.py").read_bytes()).hexdigest()
    assert sum(e["sanity"] for e in meta["mutants"]) == 1
    olds = {e["old"].split(" = ")[0] for e in meta["mutants"]}
    # the tensors the report's CUDA-only mutants put on the CPU, and the GPU's default chunk
    assert {"k_pos", "out", "lse", "q_pos", "row_valid", "m", "l", "e_run", "acc", "allowed", "q_chunk",
            "tiling", "flushed", "counted"} <= olds
    for e in meta["mutants"]:
        text = (tmp_path / "m" / e["file"]).read_text()
        assert hashlib.sha256(text.encode()).hexdigest() == e["sha256"] and e["diff"].count("\n@@") <= 1
