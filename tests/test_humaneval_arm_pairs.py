"""scripts/humaneval_arm_pairs.py on the committed HumanEval plan rows: each pair's difference and discordant counts
as counted here from the rows, its interval around the difference; bad input in one line."""

from __future__ import annotations

import json

import pytest

from tests.load_file import ROOT, load_script

arm_pairs = load_script("humaneval_arm_pairs")
FILES = sorted((ROOT / "reports" / "humaneval-plan").glob("he-*.jsonl"))
MODEL = "qwen25coder-1.5b"


def _passed(impl: str) -> dict[str, bool]:
    out = {}
    for f in FILES:
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") == "humaneval" and r["model"] == MODEL and r["implementation"] == impl:
                out[r["task_id"]] = bool(r["passed"])
    return out


def test_pairs_on_the_committed_rows(capsys):
    assert arm_pairs.main(["--model", MODEL, "--arms", "cudnn-fp8,triton:fa3", *map(str, FILES)]) == 0
    a, b = _passed("cudnn-fp8"), _passed("triton:fa3")
    n01 = sum(not a[k] and b[k] for k in a)
    n10 = sum(a[k] and not b[k] for k in a)
    diff = 100 * (n01 - n10) / len(a)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[2].startswith(f"| triton:fa3 vs cudnn-fp8 | {len(a)} | {diff:+.1f} [")
    assert out[2].endswith(f"({n01}/{n10}) |")
    (e,) = arm_pairs.pairs([json.loads(x) for f in FILES for x in f.read_text().splitlines()
                            if json.loads(x).get("kind") == "humaneval"], MODEL, ["cudnn-fp8", "triton:fa3"])
    assert e["lo"] < e["diff"] < e["hi"] and e["diff"] == pytest.approx(diff)


@pytest.mark.parametrize("argv, says", [
    (["--arms", "stock"], "name two implementations"),
    (["--arms", "stock,no-such-arm"], "no problem has rows of both stock and no-such-arm"),
])
def test_bad_input_is_one_line(capsys, argv, says):
    assert arm_pairs.main(["--model", MODEL, *argv, *map(str, FILES)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
