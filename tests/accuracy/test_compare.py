"""``zyfa compare`` on result files made here by ``zyfa accuracy``: a plug-in changed between two runs (BF16
attention "before", per-tensor FP8 "after", one file path), the same kernel named by a relative and an absolute
path, a study's per-head rows, bench files, and bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from zyfa.accuracy.study.compare import compare, compare_speed, kernel_key, load_results, render

from zyfa.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fp8_torch_attention.py"
CAPTURE = ROOT / "datasets" / "smollm2-lee-2048.h5"  # 3 layers x 3 heads; 64 tokens here
BF16_BODY = '''
def _fake_quant(x: torch.Tensor) -> torch.Tensor:
    """'Before': no FP8, a BF16 round trip."""
    return x.to(torch.bfloat16).float()
'''


def _accuracy(out: Path, kernel: str, *extra: str) -> None:
    code = main(["accuracy", "--inputs", str(CAPTURE), "--max-tokens", "64", "--recipes", "bf16,zyfa", "--kernel",
                 kernel, "--kernel-recipe", "zyfa", "--device", "cpu", "--no-progress", "--allow-failed",
                 "--out", str(out), *extra])
    assert code == 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A: mykernel.py in BF16 (relative path); B: the same file, now FP8 (absolute path); C: B's file again,
    relative path; E: C's file copied to renamed.py; D: mykernel.py now raises."""
    d = tmp_path_factory.mktemp("compare")
    src = EXAMPLE.read_text()
    start, end = src.index("def _fake_quant"), src.index("def attention")
    kernel = d / "mykernel.py"
    kernel.write_text(src[:start] + BF16_BODY.lstrip() + "\n\n" + src[end:])
    cwd = os.getcwd()
    os.chdir(d)
    try:
        _accuracy(d / "a.jsonl", "mykernel.py:attention")
        shutil.copy(EXAMPLE, kernel)
        _accuracy(d / "b.jsonl", f"{kernel}:attention")
        _accuracy(d / "c.jsonl", "mykernel.py:attention")
        shutil.copy(kernel, d / "renamed.py")
        _accuracy(d / "e.jsonl", "renamed.py:attention")
        kernel.write_text(src.replace('    h, h_kv = q.shape[1], k.shape[1]\n',
                                      '    raise RuntimeError("planted: out of shared memory")\n', 1))
        _accuracy(d / "d.jsonl", "mykernel.py:attention")
    finally:
        os.chdir(cwd)
    return d


def test_a_changed_kernel_is_named_and_its_change_measured(runs, capsys):
    cmp = compare(load_results(runs / "a.jsonl"), load_results(runs / "b.jsonl"))
    by = {c.key: c for c in cmp.impls}
    assert set(by) == {"bf16", "zyfa", "plugin:mykernel.py:attention"}
    k = by["plugin:mykernel.py:attention"]
    # a plug-in is named by its absolute path however it was typed (relative in A, absolute in B)
    assert k.names == (f"plugin:{runs / 'mykernel.py'}:attention",) * 2
    assert k.kernel_changed is True
    v = k.verdicts["orig_rel_l2"]
    assert (v.n_units, v.n_clusters) == (3, 3)  # one unit per captured layer
    assert set(k.verdicts) == {"orig_rel_l2"}  # deq_'s reference is on inputs a plug-in never received
    assert v.kind == "effect" and v.direction == "worse" and v.effect > 2  # FP8 adds error to BF16
    # the BF16 kernel paired with zyfa's emulation is far below it: suspect in A, ok in B
    assert set(k.status[0]) == {"suspect"} and set(k.status[1]) == {"ok"}
    for recipe in ("bf16", "zyfa"):  # the recipes did not change: the same error, an interval inside 1 ± 2%
        assert by[recipe].verdicts["deq_rel_l2"].kind == "equivalent"
        assert by[recipe].verdicts["deq_rel_l2"].effect == pytest.approx(1.0)
    assert main(["compare", str(runs / "a.jsonl"), str(runs / "b.jsonl")]) == 0
    md = capsys.readouterr().out
    assert "**The kernel `plugin:mykernel.py:attention` changed between the runs**" in md
    assert "| plugin:mykernel.py:attention | orig_rel_l2 | 3 |" in md and "effect (worse)" in md
    assert "suspect 3: its error is" in md


def test_a_relative_and_an_absolute_path_are_one_kernel(runs, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", str(runs / "b.jsonl"), str(runs / "c.jsonl"), "--out", str(out)]) == 0
    md = (out / "compare.md").read_text()
    cmp = compare(load_results(runs / "b.jsonl"), load_results(runs / "c.jsonl"))
    (k,) = [c for c in cmp.impls if c.key.startswith("plugin:")]
    assert k.kernel_changed is False and k.verdicts["orig_rel_l2"].kind == "equivalent"
    assert "changed between the runs" not in md and f"same ({k.sha[0][:12]})" in md
    assert "implementations only in" not in md
    # --out refuses to replace its file without --force
    assert main(["compare", str(runs / "a.jsonl"), str(runs / "c.jsonl"), "--out", str(out)]) == 2
    assert (out / "compare.md").read_text() == md
    assert main(["compare", str(runs / "a.jsonl"), str(runs / "c.jsonl"), "--out", str(out), "--force"]) == 0
    assert (out / "compare.md").read_text() != md


def test_a_failed_side_shows_its_reason_and_no_ratio(runs, capsys):
    cmp = compare(load_results(runs / "c.jsonl"), load_results(runs / "d.jsonl"))
    (k,) = [c for c in cmp.impls if c.key.startswith("plugin:")]
    assert not k.verdicts and k.dropped == {"orig_rel_l2": 3} and set(k.status[1]) == {"failed"}
    assert main(["compare", str(runs / "c.jsonl"), str(runs / "d.jsonl")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| plugin:mykernel.py:attention |"))
    assert "not compared: no input with an error on both sides" in line and "| ok 3 | failed 3: " in line
    assert "planted: out of shared memory" in line
    # a failed row carries the file hash only where the run's provenance records its plug-ins
    assert ("**changed**" if k.sha[1] else f"hash on one side only ({k.sha[0][:12]})") in line


def test_a_renamed_file_with_the_same_contents_is_the_same_kernel(runs, capsys):
    cmp = compare(load_results(runs / "c.jsonl"), load_results(runs / "e.jsonl"))
    (k,) = [c for c in cmp.impls if c.key.startswith("plugin:")]
    assert k.key == "plugin:mykernel.py:attention" and k.names[1] == f"plugin:{runs / 'renamed.py'}:attention"
    assert k.kernel_changed is False and not cmp.only_a and not cmp.only_b
    assert "are the same kernel `plugin:mykernel.py:attention` (the same file contents)" in render(cmp)
    # different contents under two names: two kernels, each in one file only
    cmp = compare(load_results(runs / "a.jsonl"), load_results(runs / "e.jsonl"))
    assert cmp.only_a == ["plugin:mykernel.py:attention"] and cmp.only_b == ["plugin:renamed.py:attention"]


def test_study_rows_per_head_are_clustered():
    study = ROOT / "reports" / "study" / "results.jsonl"
    side = load_results(study)
    cmp = compare(side, side)
    zyfa = next(c for c in cmp.impls if c.key == "zyfa").verdicts["deq_rel_l2"]
    rows = [r for r in side.rows if r.get("recipe") == "zyfa" and not r.get("real")]
    heads = sum(len(r["deq_rel_l2_heads"]) if len(r.get("deq_rel_l2_heads") or []) > 1 else 1 for r in rows)
    assert zyfa.n_units == heads > zyfa.n_clusters == len(rows)  # heads of one input: one cluster
    assert zyfa.kind == "equivalent" and zyfa.effect == pytest.approx(1.0)
    assert "## What differs" in render(cmp) and "| run |" not in render(cmp)


def test_speed_from_two_bench_files(tmp_path):
    bench = ROOT / "reports" / "bench" / "bench.json"
    data = json.loads(bench.read_text())
    slow = [r for r in data["rows"] if r.get("impl") == "cudnn-fp8" and r.get("ms")]
    assert len(slow) >= 2
    for r in slow:  # planted: cuDNN FP8 twice as slow in B
        r["ms"] *= 2
    data["meta"]["git_commit"] = "0" * 40
    b = tmp_path / "b.json"
    b.write_text(json.dumps(data))
    speed, meta_diff = compare_speed(bench, b)
    by = {(s["impl"], s["recipe"]): s for s in speed}
    cudnn = next(s for (impl, _), s in by.items() if impl == "cudnn-fp8")
    assert cudnn["median_ratio"] == pytest.approx(2.0) and cudnn["verdict"].direction == "worse"
    others = [s for s in speed if s["impl"] != "cudnn-fp8"]
    assert others and all(s["median_ratio"] == pytest.approx(1.0) for s in others)
    assert [k for k, _, _ in meta_diff] == ["git_commit"]


def test_bad_input_is_one_line_and_writes_nothing(runs, tmp_path, capsys):
    out = tmp_path / "never"
    gauss = tmp_path / "g.jsonl"
    assert main(["accuracy", "--inputs", "gaussian", "--seq", "64", "--head-dim", "64", "--heads", "1",
                 "--recipes", "bf16", "--device", "cpu", "--no-progress", "--out", str(gauss)]) == 0
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"hello": 1}\n')
    cases = [
        ([str(tmp_path / "missing.jsonl"), str(runs / "a.jsonl")], "no such file"),
        ([str(notes), str(runs / "a.jsonl")], "not a zyfa accuracy result row"),
        ([str(ROOT / "README.md"), str(runs / "a.jsonl")], "not a result file"),
        ([str(gauss), str(runs / "a.jsonl")], "no implementation run on an input both hold"),
        ([str(runs / "a.jsonl"), str(runs / "b.jsonl"), "--bench", str(notes), str(notes)], "no 'rows' list"),
    ]
    capsys.readouterr()
    for argv, what in cases:
        assert main(["compare", *argv, "--out", str(out)]) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and what in err and "Traceback" not in err, err
        assert not out.exists()


def test_kernel_key():
    assert kernel_key("plugin:/home/me/k/mykernel.py:attention") == "plugin:mykernel.py:attention"
    assert kernel_key("plugin:../k/mykernel.py:attention") == "plugin:mykernel.py:attention"
    assert kernel_key("plugin:mypkg.kernels:attention") == "plugin:mypkg.kernels:attention"
    assert kernel_key("fast-v2") == "fast-v2" and kernel_key("triton:zyfa") == "triton:zyfa"


def test_a_missing_file_is_refused_before_the_statistics_are_imported(tmp_path):
    code = ("import sys; from zyfa.cli import main; rc = main(['compare', 'missing.jsonl', 'b.jsonl']); "
            "print(rc, sorted(m for m in ('scipy', 'torch', 'zyfa.accuracy.scoring.verdict') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.stdout.strip() == "2 []", res.stdout + res.stderr
    assert res.stderr.strip() == "zyfa compare: error: no such file: missing.jsonl"
