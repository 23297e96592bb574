"""``zyfa cliffs`` end to end on CPU: a real sweep writing JSONL + PNG + Markdown, plug-ins with planted NaN rows,
refusals and a cliff, the oracle shared across implementations, re-rendering, resume after a kill, and one-line
errors for bad input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from zyfa.accuracy.cliffs.flags import find_flags, read_sweeps
from zyfa.accuracy.cliffs.sweep import ROW_KEYS, GaussianSource, run_cliffs, subjects
from zyfa.accuracy.inputs.attention_input import GaussianSpec
from zyfa.accuracy.io.results_io import run_provenances

from tests.faults import kill_when, run_zyfa
from zyfa.cli import main

PLUGINS = Path(__file__).with_name("plugins.py")
SMALL = ["--head-dim", "64", "--heads", "2", "--kv-heads", "1", "--device", "cpu", "--no-progress"]


def kernel(fn: str) -> str:
    return f"{PLUGINS}:{fn}"


def read(folder: Path) -> tuple[list[dict], dict]:
    lines = [json.loads(x) for x in (folder / "cliffs.jsonl").read_text().splitlines()]
    assert lines[0]["record"] == "provenance"
    return lines[1:], lines[0]


def flags_of(folder: Path) -> list[tuple]:
    rows, _ = read(folder)
    return [(f["implementation"], f["mask"], f["shape"], f["length"], f["kind"]) for f in find_flags(rows)]


def test_small_sweep_two_recipes_both_masks_and_chunked(tmp_path, capsys):
    out = tmp_path / "c"
    code = main(["cliffs", "--recipes", "zyfa,fa3", "--lengths", "1-40", "--mask", "both", "--shapes", "both",
                 "--chunk", "16", *SMALL, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows, prov = read(out)
    # 2 recipes x (40 equal + 24 chunked lengths) x 2 masks
    assert len(rows) == 2 * (40 + 24) * 2
    assert all(tuple(r) == ROW_KEYS for r in rows)
    assert {r["status"] for r in rows} == {"ok"}
    assert all(r["nonfinite_rows"] == 0 for r in rows)
    for r in rows:
        assert 0 < r["deq_rel_l2"] < r["orig_rel_l2"] < 0.2, r  # the kernel's own error below the total
        assert r["orig_lse_max_abs_err"] is not None and r["deq_lse_max_abs_err"] is not None
        assert r["seq_k"] == r["length"] and r["seq_q"] == (16 if r["shape"] == "chunk" else r["length"])
        assert r["heads_q"] == 2 and r["heads_kv"] == 1 and r["causal"] == (r["mask"] == "causal")
    chunked = [r for r in rows if r["shape"] == "chunk"]
    assert min(r["length"] for r in chunked) == 17 and all(r["chunk"] == 16 for r in chunked)
    # provenance: versions, commit, device, seed, the rule, input hashes of every length
    for key in ("zyfa_version", "git_commit", "torch", "device", "device_name", "seed", "rule", "input_hashes"):
        assert key in prov, key
    assert prov["lengths"] == "1-40" and len(prov["input_hashes"]) == 40
    assert {r["input_hash"] for r in rows if r["length"] == 7} == {prov["input_hashes"]["7"]}
    png = (out / "cliffs.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    md = (out / "cliffs.md").read_text()
    assert "## Error against length" in md and "![" in md and "cliffs.png" in md
    printed = capsys.readouterr().out
    assert "zyfa: " in printed and "fa3: " in printed and "wrote 256 rows" in printed


def test_oracle_computed_once_per_point_and_quantization(monkeypatch):
    from zyfa.reference import attention as ra
    calls = []
    real = ra.attention_fp64

    def counting(*a, **k):
        calls.append(a[0].shape)
        return real(*a, **k)

    monkeypatch.setattr(ra, "attention_fp64", counting)
    subs = subjects(["zyfa", "zyfa-exp2"])  # both quantize Q, K, V alike: one dequantized reference for the two
    src = GaussianSource(GaussianSpec(heads_q=1, heads_kv=1, head_dim=64, seq=1))
    rows, _ = run_cliffs(src, subs, [3, 5], masks=["none", "causal"], device="cpu", progress=False)
    assert len(rows) == 2 * 2 * 2
    assert len(calls) == 4 * 2  # per point: the original inputs once, the shared dequantized ones once


def test_plugin_nan_rows_flagged_at_multiples_of_16_exactly(tmp_path):
    out = tmp_path / "nan"
    assert main(["cliffs", "--kernel", kernel("nan_at_16"), "--lengths", "1-64", *SMALL, "--out", str(out)]) == 0
    assert flags_of(out) == [(f"plugin:{kernel('nan_at_16')}", "none", "equal", L, "nonfinite")
                             for L in (16, 32, 48, 64)]
    rows, prov = read(out)
    by = {r["length"]: r for r in rows}
    assert by[16]["nonfinite_rows"] == 2 and by[16]["orig_rel_l2"] is None and by[16]["status"] == "ok"
    assert by[17]["nonfinite_rows"] == 0 and by[17]["orig_rel_l2"] < 1e-5
    md = (out / "cliffs.md").read_text()
    assert "nonfinite" in md and "2 of 32 rows NaN/Inf" in md
    # the reproducer line is a command that reproduces the flag on its own
    rep = next(x for x in md.splitlines() if x.startswith("zyfa cliffs") and "--lengths 16 " in x)
    args = rep.split()[1:]
    i = args.index("--out")
    args[i + 1] = str(tmp_path / "rep")
    assert main([*args, "--no-progress"]) == 0
    assert [f[3:] for f in flags_of(tmp_path / "rep")] == [(16, "nonfinite")]


def test_plugin_refusing_long_lengths_is_flagged_refused(tmp_path, capsys):
    out = tmp_path / "ref"
    spec = kernel("refuse_above_32")
    assert main(["cliffs", "--kernel", spec, "--lengths", "1-40", "--mask", "both", *SMALL, "--out", str(out)]) == 0
    flags = flags_of(out)
    assert flags == [(f"plugin:{spec}", m, "equal", L, "refused") for m in ("causal", "none") for L in range(33, 41)]
    rows, _ = read(out)
    refused = [r for r in rows if r["status"] == "refused"]
    assert len(refused) == 16 and all("above 32 not supported" in r["reason"] for r in refused)
    md = (out / "cliffs.md").read_text()
    assert "33-40 (8 lengths)" in md and "refused" in md
    assert "refused at 16 length(s)" in capsys.readouterr().out


def test_planted_cliff_through_a_plugin_and_render_only(tmp_path):
    out = tmp_path / "cl"
    spec = kernel("cliff_at_24")
    assert main(["cliffs", "--kernel", spec, "--kernel-recipe", "zyfa", "--lengths", "1-48", *SMALL,
                 "--out", str(out)]) == 0
    assert flags_of(out) == [(f"plugin:{spec}", "none", "equal", 24, "jump")]
    rows, _ = read(out)
    assert all(r["deq_rel_l2"] is not None and r["recipe"] == "zyfa" for r in rows)  # paired: scored on deq too
    md = (out / "cliffs.md").read_text()
    assert "--lengths 8-40" in md  # a jump's reproducer sweeps the window the rule needs
    assert "zyfa accuracy --inputs gaussian" in md and "--seq 24" in md
    # re-rendering the JSONL alone gives the same Markdown, and runs nothing
    other = tmp_path / "rendered"
    assert main(["cliffs", "--render", str(out / "cliffs.jsonl"), "--out", str(other)]) == 0
    assert (other / "cliffs.md").read_text() == md
    assert (other / "cliffs.png").read_bytes()[:4] == b"\x89PNG"
    assert not (other / "cliffs.jsonl").exists()
    # the flagged rows alone give the same flags (and the same table)
    small = tmp_path / "flagged.jsonl"
    assert main(["cliffs", "--render", str(out / "cliffs.jsonl"), "--out", str(other), "--flagged-out",
                 str(small)]) == 0
    kept, _ = read_sweeps(str(small))
    assert sorted(r["length"] for r in kept) == list(range(8, 41))
    assert flags_of(out) == [(f["implementation"], f["mask"], f["shape"], f["length"], f["kind"])
                             for f in find_flags(kept)]


def test_capture_prefixes(tmp_path):
    from tests.accuracy.conftest import write_tiny_capture

    cap = write_tiny_capture(tmp_path / "tiny.h5", layers=(0,))
    out = tmp_path / "cap"
    assert main(["cliffs", "--inputs", str(cap), "--layer", "0", "--heads", "0,1,2", "--kernel", kernel("exact"),
                 "--lengths", "1-20", "--device", "cpu", "--no-progress", "--out", str(out)]) == 0
    rows, prov = read(out)
    assert len(rows) == 20 and {r["mask"] for r in rows} == {"causal"}  # the capture's own mask by default
    assert rows[4]["input"] == "TinyModel-L0-full-h0.1.2-s5" and rows[4]["heads_q"] == 3
    assert prov["input_source"]["source"] == "capture" and prov["input_source"]["file_sha256"]
    assert all(r["orig_rel_l2"] < 1e-5 for r in rows)
    code = main(["cliffs", "--inputs", str(cap), "--kernel", kernel("exact"), "--lengths", "90-100",
                 "--device", "cpu", "--no-progress", "--out", str(tmp_path / "long")])
    assert code == 2


def _same(rows):
    return [{k: v for k, v in r.items() if k not in ("seconds", "oracle_seconds", "run_id")} for r in rows]


def test_kill_then_resume_gives_the_same_rows(tmp_path, monkeypatch):
    # one commit named for every run: from a modified checkout, the resumed sweep (two runs) would rightly carry the
    # dirty-tree notice that the uninterrupted one (one run) has not
    monkeypatch.setenv("ZYFA_GIT_COMMIT", "0123456789abcdef0123456789abcdef01234567")
    args = ["cliffs", "--kernel", kernel("nan_at_16"), "--recipes", "zyfa", "--lengths", "1-24", "--mask", "both",
            *SMALL]
    full = run_zyfa(*args, "--out", "full", cwd=tmp_path)
    assert full.returncode == 0, full.stderr
    expected, _ = read(tmp_path / "full")
    assert len(expected) == 96
    partial = tmp_path / "r" / "cliffs.jsonl.partial"
    (tmp_path / "r").mkdir()
    at = kill_when([*args, "--out", "r"], tmp_path, partial, 1 + random.randrange(10, 60))
    if at != -2:
        assert partial.is_file() and not (tmp_path / "r" / "cliffs.jsonl").exists()
        # what a cut run kept renders on its own, said to be partial
        assert main(["cliffs", "--render", str(partial), "--out", str(tmp_path / "cut")]) == 0
        assert "cut short" in (tmp_path / "cut" / "cliffs.md").read_text()
        refused = run_zyfa(*args, "--out", "r", cwd=tmp_path)
        assert refused.returncode == 2 and "--resume" in refused.stderr
        res = run_zyfa(*args, "--out", "r", "--resume", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert "resuming" in res.stdout
    assert not partial.exists()
    rows, prov = read(tmp_path / "r")
    assert _same(rows) == _same(expected)
    # a resumed sweep: its rows carry the run_id of the segment that made each, all named by the provenance
    assert {r["run_id"] for r in rows} <= {p["run_id"] for p in run_provenances(prov)}

    def md(folder):  # the summary line carries the run's date
        return [x for x in (folder / "cliffs.md").read_text().splitlines() if "rows: Gaussian" not in x]

    assert md(tmp_path / "r") == md(tmp_path / "full")


@pytest.mark.parametrize("argv, message", [
    (["--implementations", "no-such-kernel"], "unknown implementation 'no-such-kernel'"),
    (["--recipes", "zyfa", "--lengths", "1-x"], "--lengths: bad item '1-x'"),
    (["--recipes", "zyfa", "--lengths", "9-3"], "--lengths: bad item '9-3'"),
    (["--recipes", "no-such-recipe"], "no-such-recipe"),
    ([], "nothing to sweep"),
    (["--recipes", "zyfa", "--chunk", "16"], "--chunk sets the chunk shape"),
    (["--recipes", "zyfa", "--metric", "cosine"], "--metric 'cosine'"),
    (["--recipes", "zyfa", "--lengths", "5-9", "--max-length", "4"], "no length at or below --max-length 4"),
    (["--recipes", "zyfa", "--inputs", "missing.h5"], "no such input file: missing.h5"),
    (["--recipes", "zyfa", "--layer", "3"], "--layer applies to a capture"),
    (["--recipes", "zyfa", "--force", "--resume"], "--force and --resume exclude each other"),
    (["--render", "missing.jsonl"], "--render: no such file missing.jsonl"),
    (["--recipes", "zyfa", "--lengths", "40000", "--heads", "64", "--head-dim", "256", "--device", "cpu"],
     "needs about"),
])
def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["cliffs", *argv, "--no-progress", "--out", "o"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zyfa cliffs: error: ") and message in err, err
    assert "Traceback" not in err


def test_existing_output_is_refused_without_force_or_resume(tmp_path, capsys):
    args = ["cliffs", "--kernel", kernel("exact"), "--lengths", "1-3", *SMALL, "--out", str(tmp_path / "o")]
    assert main(args) == 0
    before = (tmp_path / "o" / "cliffs.jsonl").read_bytes()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists: add --resume to continue it, --force to start over" in err
    assert (tmp_path / "o" / "cliffs.jsonl").read_bytes() == before
    assert main([*args, "--force"]) == 0
    assert main([*args, "--resume"]) == 0  # a finished run: nothing left to do, same rows
    rows, _ = read(tmp_path / "o")
    assert [r["length"] for r in rows] == [1, 2, 3]
    # a different plan refuses to resume another run's rows
    assert main([*args[:4], "1-2", *args[5:], "--resume"]) == 2
    assert "holds rows this run would not make" in capsys.readouterr().err


def test_render_refuses_a_file_that_is_not_a_sweep(tmp_path, capsys):
    other = tmp_path / "r.jsonl"
    other.write_text(json.dumps({"record": "provenance", "run_id": "x"}) + "\n"
                     + json.dumps({"input": "a", "recipe": "zyfa"}) + "\n")
    assert main(["cliffs", "--render", str(other), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a zyfa cliffs result file" in err


def test_render_merges_several_sweeps(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["cliffs", "--kernel", kernel("nan_at_16"), "--lengths", "1-20", *SMALL, "--out", str(a)]) == 0
    # "all" sweeps what runs here and lists the rest as not run (a kernel named alone that cannot run is refused)
    assert main(["cliffs", "--kernel", kernel("exact"), "--implementations", "all", "--lengths", "10-30",
                 *SMALL, "--out", str(b)]) == 0
    merged = tmp_path / "m"
    assert main(["cliffs", "--render", f"{a / 'cliffs.jsonl'},{b / 'cliffs.jsonl'}", "--out", str(merged)]) == 0
    md = (merged / "cliffs.md").read_text()
    assert "nan_at_16" in md and "No flags: " in md and "plugins.py:exact" in md
    assert "Not run: " in md and "`cudnn-fp8`" in md and "1-20" in md and "10-30" in md
    # the table alone, for another report (zyfa study, zyfa longctx), from the same files
    from zyfa.accuracy.cliffs.section import TABLE_HEADER, flag_table

    header, body = flag_table(f"{a / 'cliffs.jsonl'},{b / 'cliffs.jsonl'}")
    assert tuple(header) == TABLE_HEADER and [r[2] for r in body] == ["16"] and body[0][3] == "nonfinite"
