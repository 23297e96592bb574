"""zyfa report --impact: the model-impact section (accuracy.impact's tables) in the Markdown and the HTML, from
several impact result files (one per concurrent run), with every named recipe, 1-3 windows per model, a
per-layer sweep, a repeated measurement and pre-fix rows whose p_flushed_mean the migration divided
(scripts/migrate_rows.py, run on the file as on the committed ones)."""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict

import numpy as np
import pytest
from scipy import stats
from zyfa.capture.fetch import sha256_file

from tests.load_file import load_script
from tests.report.conftest import html_tables, md_tables, numbers
from zyfa.recipes import RECIPES

N_TOKENS = 64
POST_FIX = "2026-12-02T01:{:02d}:{:02d}Z"  # after 2f53d66 (p_flushed_mean a fraction) and every RECIPE_CHANGES
PRE_FIX = "2026-11-29T22:{:02d}:{:02d}Z"  # a process started before it: p_flushed_mean inflated by the heads


def _row(model, recipe, window, *, date, argv, heads=4, layer=None, rng, pf=None, kl=None):
    kl = float(kl if kl is not None else rng.uniform(1e-3, 3e-2))
    ppl_stock = 20.0 + window
    ratio = 1.0 + float(rng.uniform(0.0, 0.05))
    row = {
        "kind": "impact_window" if layer is None else "impact_layer", "model": model, "window": window,
        "split": "heldout", "text": "lee", "n_tokens": N_TOKENS, "token_offset": 128 * window, "recipe": recipe,
        "layer": layer, "nll_stock": math.log(ppl_stock), "nll_recipe": math.log(ppl_stock * ratio),
        "ppl_stock": ppl_stock, "ppl_recipe": ppl_stock * ratio, "delta_ppl": ppl_stock * (ratio - 1),
        "ppl_ratio": ratio, "kl_mean": kl, "kl_p99": kl * 8, "kl_max": kl * 20,
        "top1_agree": float(rng.uniform(0.85, 1.0)), "kl_blocks": [kl * 0.9, kl * 1.1], "n_scored": N_TOKENS - 1,
        "p_flushed_mean": float(pf if pf is not None else rng.uniform(0.0, 0.9)), "seconds": 1.0,
        **({"p_flushed_checked": True} if date >= "2026-11-30" else {}),  # a pre-fix row is left to the migration
        "provenance": {"date_utc": date, "git_commit": "0" * 40, "git_dirty": False, "argv": list(argv),
                       "num_q_heads": heads, "model_description": f"test model {model}", "model_sha256": "ab" * 32,
                       "torch": "2.x", "transformers": "5.x", "cpu": "test cpu"},
    }
    if layer is not None:
        row["op_rel_l2"] = float(rng.uniform(0.01, 0.1))
        row["op_rel_l2_deq"] = float(rng.uniform(0.005, 0.05))
        row["k_amax"] = 10.0 + layer
    return row


@pytest.fixture(scope="module")
def impact_files(tmp_path_factory):
    """Two files as two concurrent runs write them: every named recipe x 3 windows of m17, m2 (2 windows, split
    across the files, one measurement repeated later), m1 (1 window), a 6-layer sweep, and pre-fix rows."""
    rng = np.random.default_rng(0)
    d = tmp_path_factory.mktemp("impact")
    a, b = [], []
    argv_a = ["cli.py", "impact", "--models", "m17,m2,m1", "--out", "a.jsonl"]
    argv_b = ["cli.py", "impact", "--models", "m2", "--out", "b.jsonl", "--resume"]
    t = iter(range(10_000))

    def date(fmt=POST_FIX):
        i = next(t)
        return fmt.format(i // 60, i % 60)

    for w in range(3):
        for rc in RECIPES:
            a.append(_row("m17", rc, w, date=date(), argv=argv_a, rng=rng))
    for rc in ("zyfa", "ck", "aiter"):
        a.append(_row("m2", rc, 0, date=date(), argv=argv_a, rng=rng))
    for rc in ("zyfa", "fp32"):
        a.append(_row("m1", rc, 0, date=date(), argv=argv_a, rng=rng, pf=0.0 if rc == "fp32" else None))
    for rc in ("zyfa", "ck", "aiter"):
        b.append(_row("m2", rc, 1, date=date(), argv=argv_b, rng=rng))
    b.append(_row("m2", "zyfa", 0, date=date(), argv=argv_b, rng=rng, kl=0.5))  # measured again: supersedes
    for lay in range(6):
        b.append(_row("m2", "zyfa", 0, layer=lay, date=date(), argv=argv_b, rng=rng, kl=1e-4 * (lay + 1)))
    argv_old = ["cli.py", "impact", "--models", "old", "--out", "a.jsonl"]
    for rc, raw in (("zyfa", 4.5), ("aiter", 7.2), ("fa3", 2.7), ("bf16", 0.0)):
        a.append(_row("old", rc, 0, date=date(PRE_FIX), argv=argv_old, heads=9, rng=rng, pf=raw))
    pa, pb = d / "results.jsonl", d / "results_s2_b.jsonl"
    pa.write_text("".join(json.dumps(r) + "\n" for r in a))
    pb.write_text("".join(json.dumps(r) + "\n" for r in b))
    migrate = load_script("migrate_rows")
    assert migrate.main([str(d)]) == 0  # the old rows migrated once, as the committed files were
    return pa, pb, a, b


@pytest.fixture(scope="module")
def rendered(small_results, impact_files, tmp_path_factory):
    from zyfa.cli import main

    path, _ = small_results
    pa, pb, a, b = impact_files
    out = tmp_path_factory.mktemp("report")
    glob = str(pa.parent / "results*.jsonl")
    assert main(["report", "--results", str(path), "--impact", glob, "--out", str(out)]) == 0
    return out, (out / "report.md").read_text(encoding="utf-8"), (out / "report.html").read_text(encoding="utf-8")


def _expected(rows):
    """(model, recipe) -> window rows as the report must use them: the latest of repeated measurements."""
    best = {}
    for r in rows:
        if r["kind"] != "impact_window":
            continue
        k = (r["model"], r["recipe"], r["window"])
        if k not in best or r["provenance"]["date_utc"] >= best[k]["provenance"]["date_utc"]:
            best[k] = r
    out = defaultdict(list)
    for (m, rc, _), r in best.items():
        out[(m, rc)].append(r)
    return out


def _table_key(model):
    return f"t-impact-{model}-{N_TOKENS}-lee"


def test_tables_match_in_markdown_and_html(rendered):
    _, md, page = rendered
    t_md, t_html = md_tables(md), html_tables(page)
    keys = [k for k in t_md if k.startswith("t-impact")]
    for model in ("m17", "m2", "m1", "old"):
        assert _table_key(model) in keys
    assert "t-impact-files" in keys and "t-impact-layers-m2-w0-64-lee-summary" in keys
    for k in keys:
        assert t_md[k] == t_html[k], k
    assert "## Model impact" in md and "<h2>Model impact" in page
    assert "fig_impact_kl.png" in md and page.count("data:image/png;base64,") >= 1


def test_numbers_are_the_rows(rendered, impact_files):
    _, md, page = rendered
    _, _, a, b = impact_files
    exp = _expected(a + b)
    tables = md_tables(md)
    seen = set()
    for model in ("m17", "m2", "m1"):
        t = tables[_table_key(model)]
        head = t[0]
        col = {name: head.index(name) for name in head}
        kls = []
        for line in t[1:]:
            rs = exp[(model, line[0])]
            seen.add((model, line[0]))
            assert int(line[col["windows"]]) == len(rs)
            for name, key, tol in (("ppl ratio", "ppl_ratio", 6e-6), ("Δppl", "delta_ppl", 6e-5)):
                got = numbers(line[col[name]])
                vals = [r[key] for r in rs]
                assert got[0] == pytest.approx(np.mean(vals), abs=tol), (model, line[0], name)
                if len(rs) == 1:
                    assert len(got) == 1  # no interval from one window
                else:
                    assert len(got) == 3 and min(vals) - tol <= got[1] <= got[0] <= got[2] <= max(vals) + tol
            kl = numbers(line[col["KL (nats/token)"]])
            assert kl[0] == pytest.approx(np.mean([r["kl_mean"] for r in rs]), rel=6e-3)
            assert (len(kl) == 3) == (len(rs) > 1)
            kls.append(kl[0])
            pf = numbers(line[col["P flushed"]])[0]
            assert pf == pytest.approx(np.mean([r["p_flushed_mean"] for r in rs]), abs=6e-4)
            assert numbers(line[col["top-1 agree"]])[0] == pytest.approx(
                np.mean([r["top1_agree"] for r in rs]), abs=6e-5)
        assert kls == sorted(kls)  # recipes by mean KL
    assert {rc for m, rc in seen if m == "m17"} == set(RECIPES)  # every named recipe
    assert len(RECIPES) == 22  # 17, and the quantization schemes of issue 14
    # the repeated m2/zyfa/w0 measurement: the later one (KL 0.5) is used, and the report says so
    m2z = [line for line in tables[_table_key("m2")][1:] if line[0] == "zyfa"][0]
    assert numbers(m2z[4])[0] > 0.1
    assert "1 rows were measured again later" in md and "1 rows were measured again later" in page


def test_per_layer_summary_and_spearman(rendered, impact_files):
    _, md, _ = rendered
    _, _, _, b = impact_files
    lay = sorted((r for r in b if r["kind"] == "impact_layer"), key=lambda r: r["layer"])
    t = md_tables(md)["t-impact-layers-m2-w0-64-lee-summary"]
    line = t[1]
    assert line[0] == "zyfa" and int(line[1]) == 6
    rho = stats.spearmanr([r["op_rel_l2"] for r in lay], [r["kl_mean"] for r in lay]).statistic
    assert numbers(line[2])[0] == pytest.approx(rho, abs=0.006)
    assert line[4].startswith("5 (29%)")  # the top layer's share: 6/21 of the summed KL
    detail = md_tables(md)["t-impact-layers-m2-w0-64-lee"]
    assert [int(x[0]) for x in detail[1:]] == list(range(6))
    assert [float(x[1]) for x in detail[1:]] == pytest.approx([r["kl_mean"] for r in lay], rel=6e-3)


def test_pre_fix_p_flushed_is_migrated_with_a_note(rendered, impact_files):
    _, md, page = rendered
    t = md_tables(md)[_table_key("old")]
    col = t[0].index("P flushed")
    shown = {line[0]: numbers(line[col])[0] for line in t[1:]}
    assert shown == pytest.approx({"zyfa": 0.5, "aiter": 0.8, "fa3": 0.3, "bf16": 0.0}, abs=6e-4)
    for doc in (md, re.sub(r"<[^>]+>", "", page)):
        assert "scripts/migrate_rows.py" in doc and "divided it (old ÷9" in doc
        changed = doc.split("Measured before a recipe change: ")[1:]
        assert any(x.startswith("old/zyfa/w0 were written") and "fdfa291" in x for x in changed)
        assert any(x.startswith("old/fa3/w0 were written") and "435c315" in x for x in changed)
        assert not any("m17/" in x for x in changed)
    _, _, a, _ = impact_files
    assert [r["p_flushed_mean"] for r in a if r["model"] == "old"] == [4.5, 7.2, 2.7, 0.0]  # as written


def test_regenerate_command_names_the_impact_files(rendered, impact_files):
    _, md, _ = rendered
    pa, pb, _, _ = impact_files
    assert f"--impact {pa},{pb}" in md.split("```")[1]
    files = md_tables(md)["t-impact-files"]
    assert [line[0] for line in files[1:]] == ["results.jsonl", "results_s2_b.jsonl"]
    assert files[1][1] == sha256_file(pa)[:16]


def test_missing_impact_file_is_an_error(small_results, tmp_path, capsys):
    from zyfa.cli import main

    path, _ = small_results
    assert main(["report", "--results", str(path), "--impact", str(tmp_path / "none*.jsonl"),
                 "--out", str(tmp_path)]) == 2
    assert "--impact" in capsys.readouterr().err


def test_study_picks_the_committed_impact_files(tmp_path, monkeypatch):
    """Unset --impact: the repository's committed impact results, whatever the current directory (a study run
    from elsewhere keeps its impact section); impact files of the current directory are not picked up."""
    from zyfa.accuracy.study import cli as study
    from zyfa.accuracy.study.compose import REPO_ROOT

    committed = sorted(p.name for p in (REPO_ROOT / "reports" / "impact").glob("results*.jsonl"))
    assert committed, "the repository commits its impact results"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reports" / "impact").mkdir(parents=True)
    for name in ("results_s2_a.jsonl", "results.jsonl", "results.jsonl.dropped"):
        (tmp_path / "reports" / "impact" / name).write_text("")
    found = study.impact_files(None)
    assert sorted(p.name for p in found) == committed
    assert all(p.resolve().parent == (REPO_ROOT / "reports" / "impact").resolve() for p in found)
    assert study.impact_files("none") == []
    with pytest.raises(FileNotFoundError):
        study.impact_files("missing.jsonl")


def test_study_renders_the_impact_section_with_its_hash(impact_files, tmp_path):
    """A tiny zyfa study (3 Gaussian inputs, one recipe) with --impact: the command at the top names the files,
    the provenance records their sha256, the section is in both documents."""
    from zyfa.cli import main

    pa, pb, _, _ = impact_files
    out = tmp_path / "study"
    argv = ["study", "--captures", "none", "--gaussian-filter", "d64", "--recipes", "zyfa", "--max-seq", "128",
            "--impact", f"{pa},{pb}", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    md = (out / "report.md").read_text(encoding="utf-8")
    page = (out / "report.html").read_text(encoding="utf-8")
    top = md.split("```")[1]
    assert "zyfa study --captures none" in top and top.count(f"--impact {pa},{pb}") == 2  # study and report
    prov = {line[0]: line[1] for line in md_tables(md)["t-provenance"][1:]}
    assert sha256_file(pa) in prov["study_impact"] and sha256_file(pb) in prov["study_impact"]
    for doc in (md_tables(md), html_tables(page)):
        assert _table_key("m17") in doc and len(doc[_table_key("m17")]) == 1 + len(RECIPES)  # header + recipes
