"""scripts/migrate_rows.py, the one-time migration of result files, on planted old rows: what each migration rewrites
(and the history it keeps), idempotence byte for byte, --check, and the readers' one-line refusal of a row that was
not migrated (zyfa report, the impact reader, the bench table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from zyfa.accuracy.io.schemas import SchemaError, check_any_row, unmigrated_form

from tests.load_file import load_script
from zyfa.bench.table import checked_rows

ROOT = Path(__file__).resolve().parents[1]
OLD_SPEC = "triton-amd:p_scale=tile_amax,accumulator=hopper_fp8,accum_flush_tiles=1"
NEW_SPEC = "triton-amd:p_scale=tile_amax,accumulator=matrix_unit,accum_flush_tiles=1"
PROV = {"record": "provenance", "git_commit": "0" * 40, "argv": ["cli.py", "accuracy", "--recipes", OLD_SPEC]}


@pytest.fixture(scope="module")
def migrate():
    return load_script("migrate_rows")


def _impact(recipe, date, pf, **kw):
    return {"kind": "impact_window", "model": "m", "recipe": recipe, "window": 0, "layer": None, "n_tokens": 64,
            "text": "lee", "p_flushed_mean": pf, "seconds": 10.0,
            "provenance": {"date_utc": date, "argv": ["cli.py", "impact", "--out", "a.jsonl"], "num_q_heads": 9},
            **kw}


@pytest.fixture
def old_files(tmp_path):
    """A study row and a real row under the old accumulator name, a long-context row with an old accumulation label,
    impact rows of a pre-fix process and of a later one, and a bench file with the old peer names."""
    d = tmp_path / "reports"
    d.mkdir()
    study = [PROV,
             {"input": "x", "recipe": OLD_SPEC, "recipe_short": "accumulator=hopper_fp8,accum_flush_tiles=1",
              "implementation": None, "deq_rel_l2": float("nan")},
             {"input": "x", "recipe": "zyfa", "recipe_short": "defaults", "implementation": None, "deq_rel_l2": 0.01},
             {"input": "x", "recipe": OLD_SPEC, "implementation": "flash-attn-triton-amd", "real": True,
              "paired_spec": OLD_SPEC + "@h200"}]
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in study) + '{"input": "cut off by a ki')
    longctx = [{"kind": "longctx", "accumulation": "hopper_fp8 flushed every 1 KV tile", "recipe": "zyfa"},
               {"kind": "longctx", "accumulation": "fp32 via k=32 flushes", "recipe": "zyfa"}]
    (d / "longctx.jsonl").write_text("".join(json.dumps(r) + "\n" for r in longctx))
    impact = [_impact("zyfa", "2026-11-29T22:00:00Z", 4.5),  # a process started before 2f53d66: / 9 heads
              _impact("ck", "2026-11-29T22:01:00Z", 0.0),  # the same process: 0 is 0 however counted
              dict(_impact("aiter", "2026-11-30T03:00:00Z", 0.3), provenance={  # a later process
                  "date_utc": "2026-11-30T03:00:00Z", "argv": ["cli.py", "impact", "--later"], "num_q_heads": 9}),
              _impact("fa3", "2026-11-29T22:02:00Z", 0.2, p_flushed_checked=True)]  # checked when written
    (d / "impact.jsonl").write_text("".join(json.dumps(r) + "\n" for r in impact))
    bench = {"meta": {"command": "zyfa bench --peers sdpa-cudnn --recipes " + OLD_SPEC},
             "rows": [{"impl": "sdpa-cudnn", "recipe": "bf16"}, {"impl": "triton-fp8", "recipe": OLD_SPEC},
                      {"impl": "cudnn-fp8", "recipe": "cudnn-fp8"}]}
    (d / "bench.json").write_text(json.dumps(bench, indent=1))
    (d / "notes.json").write_text(json.dumps({"rows": [{"impl": "sdpa-cudnn"}]}))  # not a bench file: left alone
    return d


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def test_each_migration_rewrites_its_form_and_notes_it(migrate, old_files, capsys):
    d = old_files
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert migrate.main([str(d)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sorted(line.split(": ", 1)[1] for line in out[:-1]) == [
        "accumulator-name 1 rows", "accumulator-name 1 rows, bench-peer-names 1 rows",
        "accumulator-name 2 rows", "p_flushed-per-head 3 rows"]
    assert out[-1] == "4 files changed: accumulator-name 4 rows, bench-peer-names 1 rows, p_flushed-per-head 3 rows"

    prov, old, current, real = _lines(d / "results.jsonl")
    assert prov == PROV  # the command line as it was typed: history
    assert old["recipe"] == NEW_SPEC and old["recipe_short"] == "accumulator=matrix_unit,accum_flush_tiles=1"
    assert old["migrated"] == "accumulator hopper_fp8 renamed matrix_unit" and old["deq_rel_l2"] != old["deq_rel_l2"]
    assert real["paired_spec"] == NEW_SPEC + "@h200" and real["recipe"] == NEW_SPEC
    assert "migrated" not in current
    assert (d / "results.jsonl").read_text().endswith('{"input": "cut off by a ki')  # a killed run's line kept
    assert (d / "results.jsonl").read_text().splitlines()[2] == before["results.jsonl"].decode().splitlines()[2]

    acc, fp32 = _lines(d / "longctx.jsonl")
    assert acc["accumulation"] == "matrix_unit flushed every 1 KV tile" and "migrated" not in fp32

    pre, zero, later, checked = _lines(d / "impact.jsonl")
    assert pre["p_flushed_mean"] == pytest.approx(0.5) and pre["p_flushed_mean_raw"] == 4.5
    assert "2f53d66" in pre["p_flushed_mean_note"] and pre["migrated"] == "p_flushed_mean per head (pre-2f53d66)"
    assert zero["p_flushed_mean"] == 0.0 and zero["p_flushed_checked"] is True and "however counted" in zero["migrated"]
    assert later["p_flushed_mean"] == 0.3 and later["p_flushed_checked"] is True
    assert "after 2f53d66" in later["migrated"]
    assert checked == _impact("fa3", "2026-11-29T22:02:00Z", 0.2, p_flushed_checked=True)

    bench = json.loads((d / "bench.json").read_text())
    assert [r["impl"] for r in bench["rows"]] == ["sdpa-bf16:cudnn", "triton-fp8", "cudnn-fp8"]
    assert bench["rows"][1]["recipe"] == NEW_SPEC and bench["meta"]["command"].endswith(OLD_SPEC)
    assert "sdpa-cudnn -> sdpa-bf16:cudnn" in bench["rows"][0]["migrated"] and "migrated" not in bench["rows"][2]
    assert (d / "notes.json").read_bytes() == before["notes.json"]
    assert not [p for p in d.iterdir() if p.name not in before]  # no temporary file left


def test_a_second_run_changes_nothing(migrate, old_files, capsys):
    assert migrate.main([str(old_files)]) == 0
    once = {p.name: p.read_bytes() for p in old_files.iterdir()}
    capsys.readouterr()
    assert migrate.main([str(old_files)]) == 0
    assert capsys.readouterr().out == "0 files changed (every row is in the current form)\n"
    assert {p.name: p.read_bytes() for p in old_files.iterdir()} == once
    assert migrate.main(["--check", str(old_files)]) == 0


def test_check_writes_nothing_and_fails_while_a_file_would_change(migrate, old_files, capsys):
    before = {p.name: p.read_bytes() for p in old_files.iterdir()}
    assert migrate.main(["--check", str(old_files)]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("4 files would change: ")
    assert {p.name: p.read_bytes() for p in old_files.iterdir()} == before


def test_a_missing_target_is_one_line(migrate, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        migrate.main([str(tmp_path / "nowhere")])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"migrate_rows: {tmp_path / 'nowhere'}: no such file or folder\n"


def test_the_committed_files_are_migrated(migrate, capsys):
    assert migrate.main(["--check", str(ROOT / "reports"), str(ROOT / "tests")]) == 0, capsys.readouterr().out


def test_readers_refuse_an_unmigrated_row_in_one_line(old_files, tmp_path, capsys):
    from zyfa.cli import main

    row = {"input": "x", "recipe": OLD_SPEC, "implementation": None}
    assert unmigrated_form(row) == "accumulator-name"
    assert unmigrated_form({"kind": "longctx", "accumulation": "hopper_fp8 never flushed"}) == "accumulator-name"
    assert unmigrated_form({"input": "x", "recipe": NEW_SPEC, "migrated": "accumulator hopper_fp8 renamed"}) is None
    assert unmigrated_form(_impact("zyfa", "2026-12-01T00:00:00Z", 0.1)) == "p_flushed-per-head"
    with pytest.raises(SchemaError, match=r"^r\.jsonl:3: a row written before a schema change \(accumulator-name: "
                                          r".*\); migrate the file once with `python scripts/migrate_rows\.py`$"):
        check_any_row(row, "r.jsonl:3")

    out = tmp_path / "report"
    assert main(["report", "--results", str(old_files / "results.jsonl"), "--out", str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "results.jsonl:2: a row written before a schema change (accumulator-name" in err
    assert "python scripts/migrate_rows.py" in err
    assert not out.exists() or not any(out.iterdir())

    with pytest.raises(ValueError, match=r"^bench row 0: peer 'sdpa-cudnn' under its old name \(now "
                                         r"'sdpa-bf16:cudnn'\), written before a rename; migrate the file once"):
        checked_rows([{"impl": "sdpa-cudnn", "recipe": "bf16"}])
    with pytest.raises(ValueError, match=r"^bench row 1: recipe '.*accumulator=hopper_fp8.*' under the "
                                         r"accumulator's old name"):
        checked_rows([{"impl": "cudnn-fp8"}, {"impl": "triton-fp8", "recipe": OLD_SPEC}])
    assert checked_rows([{"impl": "triton-fp8", "recipe": NEW_SPEC}]) == [{"impl": "triton-fp8", "recipe": NEW_SPEC}]


def test_bench_render_refuses_an_unmigrated_file_before_writing(old_files, capsys):
    from zyfa.cli import main

    md = old_files / "bench.md"
    assert main(["bench", "--render", str(old_files / "bench.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"zyfa bench --render: {old_files / 'bench.json'}: bench row 0: peer 'sdpa-cudnn' under its old "
                   "name (now 'sdpa-bf16:cudnn'), written before a rename; migrate the file once with "
                   "`python scripts/migrate_rows.py`")
    assert not md.exists()
