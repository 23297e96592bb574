"""``zyfa accuracy --out`` under SIGKILL: a killed run keeps every row it finished, and ``--resume`` ends with the
same rows as an uninterrupted run (provenance and wall times aside)."""

from __future__ import annotations

import json
import random

from zyfa.accuracy.io.results_io import run_provenances

from tests.faults import kill_when, result_rows, rows_match, run_zyfa

ARGS = ["accuracy", "--seq", "256", "--heads", "2", "--head-dim", "64", "--causal", "--no-progress",
        "--recipes", "zyfa,ck,aiter,fp32,bf16,zyfa-exp2,triton-amd"]
N_ROWS = 7


def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    full = run_zyfa(*ARGS, "--out", "full.jsonl", cwd=tmp_path)
    assert full.returncode == 0, full.stderr
    expected = result_rows(tmp_path / "full.jsonl")
    assert len(expected) == N_ROWS

    out, partial = tmp_path / "r.jsonl", tmp_path / "r.jsonl.partial"
    seed = random.randrange(1 << 30)  # a different kill point each run: the property holds at every point
    rng = random.Random(seed)
    seen: list[dict] = []
    # 1) killed right at the creation of the partial file, 2) after a random number of rows (+ a random delay)
    for lines in (0, 1 + rng.randrange(1, N_ROWS - 1)):
        args = [*ARGS, "--out", "r.jsonl"] + (["--resume"] if partial.exists() else [])
        at = kill_when(args, tmp_path, partial, lines, extra_delay=rng.uniform(0, 0.3))
        if at == -2:  # it finished before the kill point: nothing to check at this point
            break
        if out.exists():  # the kill landed after the finished file was renamed into place (the run was done)
            assert not partial.exists() and rows_match(result_rows(out), expected), (
                f"a finished-looking --out (seed {seed})")
            break
        kept = result_rows(partial)
        assert kept[:len(seen)] == seen, f"rows written before the kill were lost (seed {seed})"
        assert rows_match(kept, expected[:len(kept)]), f"kept rows differ from an uninterrupted run's (seed {seed})"
        seen = kept
    if partial.exists():
        res = run_zyfa(*ARGS, "--out", "r.jsonl", "--resume", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    assert not partial.exists()
    assert rows_match(result_rows(out), expected)
    header = json.loads(out.read_text().splitlines()[0])
    assert header["record"] == "provenance" and header["run_id"]
    # each segment (the first run, each resume) has its own run_id; every row carries its maker's, which the
    # finished file's provenance names (the latest segment's, listing the earlier ones)
    segments = [p["run_id"] for p in run_provenances(header)]
    assert len(set(segments)) == len(segments) and segments[-1] == header["run_id"]
    run_ids = [json.loads(line)["run_id"] for line in out.read_text().splitlines()[1:]]
    assert set(run_ids) <= set(segments), f"a row names no segment of its file (seed {seed})"
