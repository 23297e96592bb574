"""`zyfa impact` end to end on SmolLM2 (32-token windows, two recipes, a two-layer sweep): rows, resume, report."""

from __future__ import annotations

import argparse
import json

import pytest


@pytest.fixture(scope="module")
def run(smollm2, tmp_path_factory, monkeypatch_module):
    import zyfa.capture.models
    from zyfa.accuracy.impact import cli as impact_cli

    monkeypatch_module.setattr(zyfa.capture.models, "load_model", lambda name, **kw: smollm2)
    out = tmp_path_factory.mktemp("impact") / "results.jsonl"
    argv = ["--models", "smollm2", "--recipes", "fp32,aiter", "--tokens", "32", "--windows", "2",
            "--per-layer", "smollm2", "--layer-recipes", "aiter", "--layers", "28,29", "--out", str(out),
            "--no-progress"]
    parser = argparse.ArgumentParser()
    impact_cli.add_arguments(parser)
    assert impact_cli.main(parser.parse_args(argv)) == 0
    return out, parser, argv


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_rows_and_provenance(run):
    out, _, _ = run
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    win = [r for r in rows if r["kind"] == "impact_window"]
    lay = [r for r in rows if r["kind"] == "impact_layer"]
    assert sorted((r["recipe"], r["window"]) for r in win) == [("aiter", 0), ("aiter", 1), ("fp32", 0), ("fp32", 1)]
    assert sorted(r["layer"] for r in lay) == [28, 29]
    for r in win:
        assert r["split"] == "heldout" and r["n_tokens"] == 32 and r["n_scored"] == 31
        p = r["provenance"]
        for key in ("git_commit", "date_utc", "torch", "model_sha256", "model_package", "text_sha256",
                    "token_ids_sha256"):
            assert key in p, key
        assert r["ppl_ratio"] == pytest.approx(r["ppl_recipe"] / r["ppl_stock"])
    fp32 = [r for r in win if r["recipe"] == "fp32"]
    aiter = [r for r in win if r["recipe"] == "aiter"]
    assert max(r["kl_mean"] for r in fp32) < 1e-6 < min(r["kl_mean"] for r in aiter)
    assert fp32[0]["provenance"]["token_ids_sha256"] != fp32[1]["provenance"]["token_ids_sha256"]
    for r in lay:
        assert 0 < r["op_rel_l2"] < 1 and 0 < r["op_rel_l2_deq"] <= r["op_rel_l2"] * 10
        assert r["kl_mean"] > 0


def test_resume_adds_nothing(run):
    from zyfa.accuracy.impact import cli as impact_cli

    out, parser, argv = run
    before = out.read_text()
    assert impact_cli.main(parser.parse_args([*argv, "--resume"])) == 0
    assert out.read_text() == before


def test_markdown_section(run):
    out, _, _ = run
    md = (out.parent / "impact.md").read_text()
    assert md.startswith("## Model impact")
    assert "### smollm2" in md and "| aiter | 2 |" in md and "| fp32 | 2 |" in md
    assert "Per-layer sensitivity" in md and "| 28 |" in md and "| 29 |" in md


def test_a_second_run_into_the_folder_keeps_the_first_runs_rows_in_impact_md(run):
    """The default impact.md renders every impact results file beside --out (not only this run's): a second run
    into the same folder adds its rows to the section instead of writing over the first run's. A JSON-lines file
    that holds no impact rows is left out; --markdown renders this run's file alone."""
    from zyfa.accuracy.impact import cli as impact_cli

    out, parser, _ = run
    (out.parent / "other.jsonl").write_text('{"record": "provenance", "command": "accuracy"}\n')
    second = out.parent / "second.jsonl"
    argv = ["--models", "smollm2", "--recipes", "zyfa", "--tokens", "32", "--windows", "1", "--no-progress"]
    assert impact_cli.main(parser.parse_args([*argv, "--out", str(second)])) == 0
    md = (out.parent / "impact.md").read_text()
    assert "| results.jsonl |" in md and "| second.jsonl |" in md and "other.jsonl" not in md
    assert "| aiter | 2 |" in md and "| zyfa | 1 |" in md  # the first run's rows and the second's
    alone = out.parent / "alone.md"
    third = out.parent / "third.jsonl"
    assert impact_cli.main(parser.parse_args([*argv, "--out", str(third), "--markdown", str(alone)])) == 0
    text = alone.read_text()
    assert "| third.jsonl |" in text and "results.jsonl" not in text and "second.jsonl" not in text
    for p in (second, third, alone, out.parent / "other.jsonl"):
        p.unlink()
    assert impact_cli.main(parser.parse_args([*argv[:-1], "--render-only", "--out", str(out)])) == 0


def test_rows_are_checked_and_timed(run):
    out, _, _ = run
    for r in (json.loads(x) for x in out.read_text().splitlines()):
        assert r["p_flushed_checked"] is True and 0.0 <= r["p_flushed_mean"] <= 1.0
        assert r["provenance"]["run_started_utc"] <= r["provenance"]["date_utc"]


def test_drop_then_resume_measures_the_row_again(run, tmp_path):
    """Drop one window row from a copy of the results; --resume adds back exactly that row (same numbers)."""
    from zyfa.accuracy.impact import cli as impact_cli
    from zyfa.accuracy.impact import rows as impact_rows

    out, parser, argv = run
    copy = tmp_path / "results.jsonl"
    copy.write_text(out.read_text())
    before = {impact_rows.row_key(r): r for r in impact_rows.read_rows(copy)}
    n, _ = impact_rows.drop_rows(copy, "smollm2:aiter:1:none")
    assert n == 1
    args = [*argv, "--resume"]
    args[args.index("--out") + 1] = str(copy)
    assert impact_cli.main(parser.parse_args(args)) == 0
    after = impact_rows.read_rows(copy)
    assert len(after) == len(before)
    new = after[-1]
    key = impact_rows.row_key(new)
    assert key == ("impact_window", "smollm2", "aiter", 1, None, 32, "lee")
    assert new["kl_mean"] == before[key]["kl_mean"] and new["ppl_recipe"] == before[key]["ppl_recipe"]


def test_render_markdown_spearman():
    from zyfa.accuracy.impact.section import render_markdown

    rows = []
    for i in range(6):
        rows.append({"kind": "impact_layer", "model": "m", "window": 0, "recipe": "zyfa", "layer": i,
                     "text": "lee", "n_tokens": 64, "kl_mean": 0.001 * (i + 1), "op_rel_l2": 0.01 * (i + 1),
                     "op_rel_l2_deq": 0.02 * (6 - i), "k_amax": 3.0})
    md = render_markdown(rows)
    assert "+1.00" in md and "-1.00" in md  # rho against op error and against the (reversed) kernel-only error
    assert "+1.00 (p=0, n=6)" in md and "-1.00 (p=0, n=6)" in md  # each with its p and n
    assert "5 (29%)" in md  # the top layer's share of the summed KL: 6/21


def test_unknown_recipe_is_a_usage_error(capsys):
    from zyfa.accuracy.impact import cli as impact_cli

    parser = argparse.ArgumentParser()
    impact_cli.add_arguments(parser)
    assert impact_cli.main(parser.parse_args(["--recipes", "nope", "--models", "smollm2"])) == 2
    assert "unknown recipe" in capsys.readouterr().err
