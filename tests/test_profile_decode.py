"""scripts/profile_decode.py: the per-token cost of a decode step under an implementation, on the CPU with the real
SmolLM2 and the real greedy decoder (the sync count is CUDA's and reads None here); bad input refused in one line
before the model loads."""

from __future__ import annotations

import json
import math

import pytest

from tests.load_file import load_script

profile_decode = load_script("profile_decode")


@pytest.mark.parametrize("argv, says", [
    (["--model", "nope"], "unknown model 'nope'"),
    (["--tokens", "1"], "--tokens must be at least 2"),
    (["--implementations", "no-such-kernel"], "no-such-kernel"),
    (["--problem", "164"], "--problem 164: give 0..163"),
])
def test_bad_input_is_one_line(capsys, argv, says):
    assert profile_decode.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "Traceback" not in err[0]


def test_an_existing_out_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    out.write_text("earlier rows\n")
    assert profile_decode.main(["--model", "smollm2", "--implementations", "stock", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists" in err[0] and out.read_text() == "earlier rows\n"


def test_stock_and_an_emulated_recipe_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    assert profile_decode.main(["--model", "smollm2", "--implementations", "stock,bf16", "--tokens", "2",
                                "--dtype", "fp32", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["implementation"] for r in rows] == ["stock", "bf16"]
    for r in rows:
        assert r["tokens"] == 2 and r["syncs_per_token"] is None and r["device"] == "cpu"
        assert r["operators_per_token"] > 100  # a 30-layer model's step is thousands of operators
        # a difference of two timings (no time budget here: under load one step's estimate may even come out < 0)
        assert r["prompt_tokens"] > 10 and math.isfinite(r["seconds_per_token"])
    # the emulated recipe replaces each layer's attention by many more operators than the model's own
    assert rows[1]["operators_per_token"] > rows[0]["operators_per_token"]
    # which operators a step adds, by name: the emulated recipe's attention is made of aten operators
    assert all(k.startswith("aten::") and v > 0 for k, v in rows[1]["top_operators_per_token"].items())
    assert rows[1]["sync_sites_per_token"] is None
    table = capsys.readouterr().out
    assert "| stock | 2 |" in table and "| bf16 | 2 |" in table
    assert "bf16, top operators per token:" in table


def test_per_token_growth_keeps_the_largest():
    one = profile_decode.Counter({"a.py:1": 3, "b.py:2": 1})
    many = profile_decode.Counter({"a.py:1": 3 + 2 * 9, "b.py:2": 1 + 4 * 9, "c.py:3": 9})
    assert profile_decode._per_token(many, one, 9) == {"b.py:2": 4.0, "a.py:1": 2.0, "c.py:3": 1.0}
    assert profile_decode._per_token(many, one, 9, top=1) == {"b.py:2": 4.0}
    assert profile_decode._per_token(one, one, 9) == {}  # nothing grows: the prefill's own counts cancel
