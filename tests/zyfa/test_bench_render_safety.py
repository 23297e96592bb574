"""``zyfa bench --render`` never empties or truncates the Markdown: it renders to a string, then replaces the
file atomically; a missing, foreign or malformed JSON is one clear line (exit 2) and the Markdown is untouched."""

from __future__ import annotations

import json

import pytest

from zyfa.cli import main as zyfa

META = {"device": "NVIDIA H200", "command": "zyfa bench", "date": "2026-11-30T00:00:00+00:00",
        "git_commit": "abc", "versions": {"torch": "2.13"}, "inputs_note": "Gaussian"}
ROW = {"input": "gaussian", "h": 16, "h_kv": 16, "d_qk": 128, "d_v": 128, "s": 1024, "causal": False,
       "impl": "triton-fp8", "recipe": "zyfa-hopper", "tflops": 500.0, "ms": 0.1}
OLD_MD = "# the committed Markdown\n" + "a line\n" * 50


def _files(tmp_path, data: str):
    js, md = tmp_path / "bench.json", tmp_path / "bench.md"
    js.write_text(data)
    md.write_text(OLD_MD)
    return js, md


def test_good_file_is_rendered(tmp_path, capsys):
    js, md = _files(tmp_path, json.dumps({"meta": META, "rows": [ROW]}))
    assert zyfa(["bench", "--render", str(js)]) == 0
    text = md.read_text()
    assert text.startswith("# Benchmark: FP8 attention on NVIDIA H200")
    assert "| gaussian | h16/16 d128/128 | 1024 |" in text
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["bench.json", "bench.md"]  # no temporary left


@pytest.mark.parametrize("data, words", [
    (json.dumps({"meta": {k: v for k, v in META.items() if k != "device"}, "rows": [ROW]}), "no 'device' field"),
    (json.dumps({"meta": META, "rows": [{"input": "gaussian"}]}), "no 'h' field"),
    ('{"meta": {"device": ', "not JSON"),
    (json.dumps([1, 2, 3]), "not a zyfa bench file"),
    (json.dumps({"meta": META, "rows": "many"}), "not a zyfa bench file"),
    ("\xff\xfe", "not"),
])
def test_bad_file_leaves_the_markdown(tmp_path, capsys, data, words):
    js, md = _files(tmp_path, data)
    assert zyfa(["bench", "--render", str(js)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert words in err and "bench.json" in err
    assert md.read_text() == OLD_MD


def test_missing_file_is_one_line(tmp_path, capsys):
    assert zyfa(["bench", "--render", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "none.json" in err
