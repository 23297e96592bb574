"""The ``zyfa`` command's own behaviour: help text, --version, the recipes table and a closed stdout."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

import zyfa
from zyfa import recipes as R
from zyfa.cli import main
from zyfa.recipes_cli import COLUMNS, numerics_fields, table_lines

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, close_stdout: bool = False) -> tuple[int, str, str]:
    p = subprocess.Popen([sys.executable, "-m", "zyfa.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if close_stdout:
        p.stdout.close()  # the reader goes away before the first write, as `| head -0` would
        return p.wait(timeout=120), "", p.stderr.read()
    out, err = p.communicate(timeout=120)
    return p.returncode, out, err


def test_help_has_no_restructuredtext_markup(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "`" not in out
    assert "--version" in out


def test_version_names_the_package_version_and_the_checkout_commit(capsys, monkeypatch):
    monkeypatch.delenv("ZYFA_GIT_COMMIT", raising=False)
    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert out.startswith(f"zyfa {zyfa.__version__}")
    if head.returncode == 0:  # a git checkout: the commit is shown in capture.version's one format
        assert re.fullmatch(rf"zyfa {re.escape(zyfa.__version__)} \(git {head.stdout.strip()}(\+dirty)?\)", out)


def test_version_takes_the_commit_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("ZYFA_GIT_COMMIT", "abc123")
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"zyfa {zyfa.__version__} (git abc123)"


def test_closed_stdout_ends_quietly():
    code, _, err = _run("recipes", close_stdout=True)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert code == 141


def _row(lines: list[str], name: str) -> str:
    (row,) = [ln for ln in lines if ln.startswith(f"| {name} |")]
    return row.split("|", 2)[2]  # the cells after the name


def _alternative(field: dataclasses.Field) -> list[R.Recipe]:
    """Pairs base/variant differing in ``field`` only, from whichever named recipe admits a change."""
    allowed = {"q_format": R.QK_FORMATS, "k_format": R.QK_FORMATS, "v_format": R.QKV_FORMATS,
               "q_scale": R.SCALE_GRANULARITIES, "k_scale": R.SCALE_GRANULARITIES,
               "v_scale": R.SCALE_GRANULARITIES, "exp_method": R.EXP_METHODS, "p_format": R.P_FORMATS,
               "p_scale": R.P_SCALES, "p_scale_granularity": R.P_SCALE_GRANULARITIES, "rowsum": R.ROWSUMS,
               "v_descale": R.V_DESCALES, "accumulator": R.ACCUMULATORS, "reciprocal": R.RECIPROCALS,
               "out_format": R.OUT_FORMATS, "mad_rounding": ("nearest", "trunc"), "platform": R.PLATFORM_NAMES,
               "head_dim_tiles": (((128, 64, 64),),), "qk_rotation": R.ROTATIONS, "kv_order": R.KV_ORDERS}
    for base in R.RECIPES.values():
        value = getattr(base, field.name)
        if field.name in allowed:
            candidates = [c for c in allowed[field.name] if c != value]
        elif isinstance(value, bool):
            candidates = [not value]
        else:
            candidates = [value + 1, value * 2]
        for c in candidates:
            try:
                return [base, base.replace(name="variant", **{field.name: c})]
            except ValueError:
                continue
    raise AssertionError(f"no valid change of {field.name}")


@pytest.mark.parametrize("field", [f for f in dataclasses.fields(R.Recipe) if f.name in numerics_fields()],
                         ids=lambda f: f.name)
def test_table_shows_every_field_that_differs(field):
    base, variant = _alternative(field)
    lines = table_lines([base, variant])
    assert _row(lines, base.name) != _row(lines, "variant"), f"{field.name} hidden by the table"


def test_every_numerics_field_has_one_column():
    placed = [f for _, main_, further in COLUMNS for f in (*main_, *further)]
    assert sorted(placed) == sorted(numerics_fields() + ["status"])


def test_zyfa_and_tilescale_rows_differ_and_table_shows_status():
    lines = table_lines(list(R.RECIPES.values()))
    assert "p_scale_granularity=tile" in _row(lines, "zyfa-tilescale")
    assert _row(lines, "zyfa") != _row(lines, "zyfa-tilescale")
    for r in R.RECIPES.values():
        assert _row(lines, r.name).rstrip(" |").endswith(r.status)


def test_status_of_every_recipe():
    for r in R.RECIPES.values():
        assert r.status in R.STATUSES
        if r.status != "from source":
            assert r.status_note, r.name
        for text in (r.source, r.status_note):  # citations stay inside the repository or public sources
            assert "shared/" not in text and "peers.md" not in text and "issue " not in text, r.name
    verified = {r.name for r in R.RECIPES.values() if r.status == "verified"}
    # Run against their real kernels on the H200 in the study; triton-amd's real kernel has other P scaling
    # (docs/real_kernels.md) and FA3's real kernel is not run, so fa3 stays modelled.
    assert verified == {"cudnn-fp8", "zyfa-hopper"}
    assert all("H200" in R.RECIPES[n].status_note for n in verified)
    assert R.RECIPES["fa3"].status == "modelled"


def test_status_is_checked():
    with pytest.raises(ValueError, match="status"):
        R.Recipe(name="x", source="y", status="guessed")
    with pytest.raises(ValueError, match="status_note"):
        R.Recipe(name="x", source="y", status="assumed")


def test_status_leaves_numerics_ids_alone():
    r = R.RECIPES["zyfa"]
    assert r.short_str() == r.replace(status="from source", status_note="").short_str()
    assert "status" not in r.short_str()


def test_recipes_command_shows_status_note():
    code, out, _ = _run("recipes", "cudnn-fp8")
    assert code == 0
    assert f"status: verified ({R.RECIPES['cudnn-fp8'].status_note})" in out
