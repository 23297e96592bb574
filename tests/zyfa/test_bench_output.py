"""Where ``zyfa bench`` writes: ./bench.json by default, never over an existing file unless asked (CPU)."""

from __future__ import annotations

import argparse
import os

import pytest

from zyfa.bench import cli as bench


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    return p.parse_args(list(argv))


def test_default_output_is_bench_json_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stem = bench.output_stem(_args().out)
    assert os.path.abspath(stem + ".json") == str(tmp_path / "bench.json")


def test_folder_and_file_outputs(tmp_path):
    assert bench.output_stem(str(tmp_path)) == str(tmp_path / "bench")
    assert bench.output_stem(str(tmp_path / "new") + "/") == str(tmp_path / "new" / "bench")
    assert bench.output_stem(str(tmp_path / "h200.json")) == str(tmp_path / "h200")
    with pytest.raises(ValueError, match="give a .json file"):
        bench.output_stem(str(tmp_path / "h200.txt"))


@pytest.mark.parametrize("existing", ["bench.json", "bench.md"])
def test_existing_results_are_kept(tmp_path, capsys, existing):
    (tmp_path / existing).write_text("measured before")
    assert bench.main(_args("--out", str(tmp_path / "bench.json"))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists" in err and "--overwrite" in err
    assert (tmp_path / existing).read_text() == "measured before"


def test_bad_out_is_one_line(tmp_path, capsys):
    assert bench.main(_args("--out", str(tmp_path / "bench.csv"))) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench.csv" in err
