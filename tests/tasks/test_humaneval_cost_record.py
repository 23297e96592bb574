"""``zyfa tasks humaneval`` records its estimate beside its measured time (accuracy/io/cost_model.py): the units of the
rows a run made, from their prompt and generated tokens; a resumed run adds its own record."""

from __future__ import annotations

import json

import pytest
from zyfa.accuracy.io.cost_model import generation_units, rate, records_in_file

from zyfa.cli import main


def test_each_run_records_its_generation_units(tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="humaneval needs the 'capture' extra (transformers, gguf)")
    import zyfa.capture.models

    model = zyfa.capture.models.load_model("smollm2")
    monkeypatch.setattr(zyfa.capture.models, "load_model", lambda name, **kw: model)
    out = tmp_path / "he.jsonl"
    argv = ["tasks", "humaneval", "--model", "smollm2", "--problems", "1", "--max-new-tokens", "4", "--device", "cpu",
            "--no-progress", "--out", str(out)]
    assert main([*argv, "--implementations", "stock"]) == 0
    assert main([*argv, "--implementations", "stock,sdpa-fp32", "--resume"]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    rows = [r for r in lines if r.get("kind") == "humaneval"]
    assert [r["implementation"] for r in rows] == ["stock", "sdpa-fp32"]
    first, second = records_in_file(out)
    for rec, row in zip((first, second), rows, strict=True):
        units = generation_units(row["prompt_tokens"], row["generated_tokens"])
        assert rec["command"] == "tasks" and rec["device_type"] == "cpu" and rec["cells"] == 1
        assert rec["units"] == units > 0
        assert rec["estimate_s"] == pytest.approx(units / rate("tasks", "cpu"), abs=1e-3)
        assert 0 < rec["measured_s"] < 600
        assert rec["work"] == {"rows": 1, "prompt_tokens": row["prompt_tokens"],
                               "generated_tokens": row["generated_tokens"], "model": "smollm2"}
    assert generation_units(10, 0) == 10 * 2058 and generation_units(0, 2) == 2 * (1 + 2048)
