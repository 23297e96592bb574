"""Impact result files without a model: dropping rows (resume semantics kept), the migrated pre-fix p_flushed_mean
(on the committed results) and the refusal of an unmigrated row, merging several files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from zyfa.accuracy.impact import cli as impact_cli
from zyfa.accuracy.impact import rows as impact_rows
from zyfa.accuracy.io.results_io import ResultsFile
from zyfa.capture.fetch import sha256_file

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "reports" / "impact" / "results_7_recipes.jsonl"  # the first run: every row before the fix


def _row(model, recipe, window, layer=None, date="2026-11-30T01:00:00Z", **kw):
    return {"kind": "impact_window" if layer is None else "impact_layer", "model": model, "recipe": recipe,
            "window": window, "layer": layer, "n_tokens": 64, "text": "lee", "kl_mean": 1e-3, "ppl_ratio": 1.01,
            "delta_ppl": 0.2, "ppl_stock": 20.0, "kl_p99": 1e-2, "top1_agree": 0.95, "p_flushed_mean": 0.1,
            "p_flushed_checked": True,
            "provenance": {"date_utc": date, "argv": ["cli.py", "impact"], "num_q_heads": 9}, **kw}


@pytest.fixture
def results(tmp_path):
    rows = [_row(m, r, w) for m in ("smollm2", "gemma3") for r in ("zyfa", "fa3") for w in (0, 1)]
    rows += [_row("smollm2", "zyfa", 0, layer=i) for i in range(3)]
    path = tmp_path / "results.jsonl"
    lines = [json.dumps(r) + "\n" for r in rows]
    path.write_text("".join(lines))
    return path, rows, lines


def _main(argv):
    parser = argparse.ArgumentParser()
    impact_cli.add_arguments(parser)
    return impact_cli.main(parser.parse_args(argv))


def test_drop_rows_keeps_everything_else_and_resume_redoes_them(results, capsys):
    path, rows, lines = results
    assert _main(["--drop-rows", "*:fa3:0", "--out", str(path), "--reason", "earlier accumulator model"]) == 0
    assert "dropped 2 row(s)" in capsys.readouterr().out
    kept = [ln for ln, r in zip(lines, rows, strict=True) if not (r["recipe"] == "fa3" and r["window"] == 0)]
    assert path.read_text() == "".join(kept)  # every other line byte for byte
    side = [json.loads(x) for x in (path.parent / "results.jsonl.dropped").read_text().splitlines()]
    assert sorted((r["model"], r["recipe"], r["window"]) for r in side) == [("gemma3", "fa3", 0), ("smollm2", "fa3", 0)]
    assert all(r["dropped"]["spec"] == "*:fa3:0" and r["dropped"]["reason"] == "earlier accumulator model"
               for r in side)
    # --resume semantics: the sink skips exactly what is still in the file, so it measures the dropped rows again
    rf = ResultsFile.open(path, resume=True, reader=lambda p: (impact_rows.read_rows(p), {"rows_of": str(p)}),
                          key=impact_rows.row_key)
    done = rf.done
    rf.close()
    assert ("impact_window", "smollm2", "fa3", 0, None, 64, "lee") not in done
    assert ("impact_window", "smollm2", "fa3", 1, None, 64, "lee") in done
    assert len(done) == len(rows) - 2


def test_drop_rows_spec_layers(results):
    path, _, _ = results
    n, _ = impact_rows.drop_rows(path, "smollm2:zyfa:0:none")  # the all-layer row only
    assert n == 1
    n, _ = impact_rows.drop_rows(path, "smollm2:zyfa:0:1")  # one layer of the sweep
    assert n == 1
    left = impact_rows.read_rows(path)
    assert sorted(r["layer"] for r in left if r["model"] == "smollm2" and r["recipe"] == "zyfa"
                  and r["window"] == 0) == [0, 2]
    assert impact_rows.drop_rows(path, "qwen25coder:zyfa:0")[0] == 0  # nothing matches: file untouched
    n, side = impact_rows.drop_rows(path, "smollm2:*:*")
    assert n == 5 and len(side.read_text().splitlines()) == 7


@pytest.mark.parametrize("spec", ["smollm2:fa3", "smollm2:fa3:x", "smollm2:nope:0", "a:b:0:1:2", ":fa3:0"])
def test_bad_drop_spec(spec, results, capsys):
    path, _, lines = results
    assert _main(["--drop-rows", spec, "--out", str(path)]) == 2
    assert path.read_text() == "".join(lines)


def test_drop_refuses_a_file_that_changes_underneath(results, monkeypatch):
    path, _, lines = results
    real = Path.write_text

    def write_and_append(self, text, *a, **kw):  # a run appends a row while the drop writes its copy
        out = real(self, text, *a, **kw)
        with path.open("a") as f:
            f.write(json.dumps(_row("gemma3", "ck", 0)) + "\n")
        return out

    monkeypatch.setattr(Path, "write_text", write_and_append)
    with pytest.raises(RuntimeError, match="changed while dropping"):
        impact_rows.drop_rows(path, "*:fa3:0")
    monkeypatch.undo()
    assert path.read_text().startswith("".join(lines)) and not (path.parent / "results.jsonl.dropped").exists()


def test_render_only_merges_several_files(results, tmp_path):
    path, _, _ = results
    other = tmp_path / "results_s2_x.jsonl"
    other.write_text(json.dumps(_row("smollm2", "zyfa", 0, date="2026-11-30T02:00:00Z", kl_mean=0.25)) + "\n")
    md = tmp_path / "impact.md"
    assert _main(["--render-only", "--out", str(tmp_path / "results*.jsonl"), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "| zyfa | 2 |" in text and "| 1.26e-01 [" in text  # smollm2/zyfa: (0.25 + 0.001) / 2, the later w0
    assert "1 rows were measured again later" in text and "results_s2_x.jsonl" in text
    assert _main(["--out", f"{path},{other}", "--models", "smollm2"]) == 2  # a run writes one file


@pytest.mark.skipif(not COMMITTED.is_file(), reason="committed impact results absent")
def test_committed_pre_fix_rows_are_migrated():
    """Every row of the first run predates the fix: the migration divided each by its query heads, kept the value
    read and said why; the report's note says the migration did it."""
    rows, files = impact_rows.load_rows([COMMITTED])
    for r in rows:
        heads = r["provenance"]["num_q_heads"]
        assert 0.0 <= r["p_flushed_mean"] <= 1.0
        if "p_flushed_mean_raw" in r:
            assert r["p_flushed_mean"] == pytest.approx(r["p_flushed_mean_raw"] / heads)
            assert "2f53d66" in r["p_flushed_mean_note"] and "p_flushed_mean per head" in r["migrated"]
        else:
            assert r["p_flushed_checked"] is True and r["p_flushed_mean"] == 0.0
    assert sum("p_flushed_mean_raw" in r for r in rows) == 82  # the other 10 held 0, a fraction however counted
    _, notes = impact_rows.prepare_rows(rows)
    assert any("`scripts/migrate_rows.py`) divided it" in n and "smollm2 ÷9" in n for n in notes)
    assert files[0]["sha256"] == sha256_file(COMMITTED)


def test_an_unmigrated_row_is_refused_in_one_line_naming_the_migration(tmp_path):
    path = tmp_path / "results.jsonl"
    old = _row("m", "zyfa", 0)
    del old["p_flushed_checked"]
    path.write_text(json.dumps(_row("m", "ck", 0)) + "\n" + json.dumps(old) + "\n")
    with pytest.raises(ValueError) as e:
        impact_rows.read_rows(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:2: a row written before a schema change (p_flushed-per-head: ")
    assert msg.endswith("migrate the file once with `python scripts/migrate_rows.py`") and "\n" not in msg
    assert _main(["--render-only", "--out", str(path), "--markdown", str(tmp_path / "x.md")]) == 2
    assert not (tmp_path / "x.md").exists()


def test_a_real_implementation_has_no_p_flushed(tmp_path):
    """A real kernel's P is never seen: its rows show no P-flushed fraction (rows written before the rule hold 0.0,
    rows after it null), while an emulation's fraction is shown."""
    rows = [_row("qwen25coder-1.5b", "triton:fa3", w, implementation="triton:fa3", p_flushed_mean=v)
            for w, v in ((0, 0.0), (1, None))]
    rows += [_row("qwen25coder-1.5b", "fa3", w, p_flushed_mean=0.25) for w in (0, 1)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = tmp_path / "impact.md"
    assert _main(["--render-only", "--out", str(path), "--markdown", str(md)]) == 0
    lines = {ln.split(" | ")[0].lstrip("| "): ln for ln in md.read_text().splitlines() if ln.startswith("| ")}
    assert lines["triton:fa3"].split(" | ")[7] == "–"
    assert lines["fa3"].split(" | ")[7] == "0.250"
