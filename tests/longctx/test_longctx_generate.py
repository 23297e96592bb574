"""``zyfa longctx --generate`` on the RULER-style tasks (SmolLM2, 160 tokens): both scores in every row, fact ids,
equal coverage recorded, and the difficulty table of ``--calibrate``."""

from __future__ import annotations

import json

from zyfa.accuracy.longctx.calibrate import difficulty_table

from zyfa.cli import main


def test_generated_answers_beside_teacher_forced_and_calibrate(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    argv = ["longctx", "--models", "smollm2", "--tasks", "niah,multikey", "--lengths", "160", "--depths", "0.5",
            "--seeds", "2", "--implementations", "stock,sdpa-fp32", "--generate", "4", "--fallback", "stock",
            "--device", "cpu", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    rows = [r for r in map(json.loads, out.read_text().splitlines()) if r.get("kind") == "longctx"]
    assert len(rows) == 2 * 2 * 2
    assert {r["fact_id"] for r in rows} == {"niah/s0", "niah/s1", "multikey/s0", "multikey/s1"}
    for r in rows:
        assert r["status"] == "ok" and isinstance(r["exact"], bool) and isinstance(r["gen_contains"], bool)
        assert r["haystack"] == "paulgraham" and r["coverage"].startswith("equal: every implementation")
        assert isinstance(r["gen_text"], str) and 1 <= r["gen_tokens"] <= len(r["answer_text"]) + 4
    sdpa = {r["input"]: r for r in rows if r["implementation"] == "sdpa-fp32"}
    for r in rows:
        if r["implementation"] == "stock":  # fp32 both: the same generated answer
            assert r["gen_text"] == sdpa[r["input"]]["gen_text"]
            assert r["layers_by_impl"] == {"stock sdpa (fp32)": list(range(30))}
    assert all(r["gen_decode"] == "cached" and r["layers_by_impl"] == {"sdpa-fp32": list(range(30))}
               for r in sdpa.values())
    # a teacher-forced exact match is a greedy answer: the generated text starts with it
    assert all(r["gen_exact"] for r in rows if r["exact"])
    table = difficulty_table(rows, "stock")
    assert [(c["task"], c["facts"], c["prompts"]) for c in table] == [("multikey", 2, 2), ("niah", 2, 2)]
    capsys.readouterr()
    assert main(["longctx", "--calibrate", str(out), "--baseline", "stock"]) == 0
    assert "| smollm2 | niah | 160 | 2 | 2 |" in capsys.readouterr().out
    assert main(["longctx", "--calibrate", str(out), "--baseline", "nosuch"]) == 2
    assert "no scored rows of nosuch" in capsys.readouterr().err
