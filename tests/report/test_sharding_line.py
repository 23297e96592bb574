"""A sharded run's report says how it ran: ranks, backend, rows per rank and device, wall time (issue 33)."""

from __future__ import annotations

import json

from zyfa.accuracy.report.blocks import sharding_line

from zyfa.cli import main


def test_sharding_line_from_a_merged_provenance():
    prov = {"world_size": 2, "backend": "gloo", "wall_time_s": 12.34,
            "ranks": [{"rank": 0, "rows": 3, "devices": ["cpu"]}, {"rank": 1, "rows": 2}]}
    assert sharding_line(prov) == "2 ranks (gloo): rank 0 3 rows on cpu; rank 1 2 rows; wall time 12.3 s"
    assert sharding_line({"world_size": 1, "backend": "nccl"}) == "1 rank (nccl)"
    assert sharding_line({"device": "cpu"}) is None  # one process without torchrun: nothing to say


def test_report_of_a_sharded_accuracy_run_names_its_ranks(tmp_path):
    res = tmp_path / "r.jsonl"
    assert main(["accuracy", "--seq", "64", "--heads", "2", "--head-dim", "64", "--recipes", "zyfa,bf16",
                 "--device", "cpu", "--no-progress", "--out", str(res)]) == 0
    lines = res.read_text().splitlines()
    prov = json.loads(lines[0])
    # what accuracy.io.shard's rank 0 adds when it merges (accuracy/operator/cli.py merged_provenance)
    prov.update(world_size=2, backend="gloo", wall_time_s=3.5,
                ranks=[{"rank": 0, "rows": 1, "devices": ["cpu"]}, {"rank": 1, "rows": 1, "devices": ["cpu"]}])
    res.write_text("\n".join([json.dumps(prov), *lines[1:]]) + "\n")
    out = tmp_path / "rep"
    assert main(["report", "--results", str(res), "--out", str(out), "--no-plots"]) == 0
    md = (out / "report.md").read_text()
    assert ("`r.jsonl` was a sharded run (torchrun, docs/SHARDING.md): 2 ranks (gloo): rank 0 1 rows on cpu; "
            "rank 1 1 rows on cpu; wall time 3.5 s.") in md
    plain = tmp_path / "plain"
    res.write_text("\n".join(lines) + "\n")
    assert main(["report", "--results", str(res), "--out", str(plain), "--no-plots"]) == 0
    assert "sharded run" not in (plain / "report.md").read_text()
