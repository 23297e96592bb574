"""The mutation-testing set-up stays consistent: every configured module and test path exists, the script's
per-module pyproject narrows [tool.mutmut] to one module, and the tool's work folders are ignored by git and
ruff. (The mutation run itself is scripts/mutation_test.py, never part of the default CI run.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.load_file import load_script

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
ISSUE_MODULES = {
    "zyfa/formats.py",
    "zyfa/quant.py",
    "zyfa/emulator.py",
    "zyfa/emulator_tile.py",  # emulate's tile steps, moved out of zyfa/emulator.py
    "zyfa/recipes.py",
    "zyfa/recipe_spec.py",  # the recipe-spec grammar, moved out of zyfa/recipes.py
    "reference/attention.py",
    "accuracy/scoring/metrics.py",
    "accuracy/inputs/attention_input.py",
    "capture/store.py",
    "capture/writer.py",  # the store's writer, moved out of capture/store.py
}


@pytest.fixture(scope="module")
def script():
    return load_script("mutation_test", register=True)


def test_every_listed_module_and_test_path_exists(script):
    base, table = script.load_settings(ROOT / "pyproject.toml")
    assert set(table) == ISSUE_MODULES
    assert set(base["source_paths"]) == ISSUE_MODULES
    for module, tests in table.items():
        assert (ROOT / module).is_file(), module
        assert tests and all((ROOT / t).exists() for t in tests), (module, tests)
    assert base["process_isolation"] == "forkserver"
    assert "not gpu and not slow" in base["pytest_add_cli_args"]


def test_module_pyproject_narrows_the_mutmut_table(script):
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    base, table = script.load_settings(ROOT / "pyproject.toml")
    out = tomllib.loads(script.module_pyproject(text, base, "zyfa/quant.py", table["zyfa/quant.py"]))
    mm = out["tool"]["mutmut"]
    assert mm["source_paths"] == ["zyfa/quant.py"]
    assert mm["pytest_add_cli_args_test_selection"] == table["zyfa/quant.py"]
    assert mm["pytest_add_cli_args"] == base["pytest_add_cli_args"]
    # everything else in pyproject.toml is kept as it was
    original = tomllib.loads(text)
    assert out["project"] == original["project"]
    assert out["tool"]["pytest"] == original["tool"]["pytest"]
    assert out["tool"]["zyfa"] == original["tool"]["zyfa"]


def test_survivor_lines_are_found_in_the_mutated_function(script):
    source = ["def a(x):", "    return x + 1", "", "def b(x):", "    return x + 1"]
    diff = "-    return x + 1\n+    return x - 1"
    assert script._source_line(source, "pkg.mod.x_b__mutmut_3", diff) == 5
    assert script._source_line(source, "pkg.mod.x_a__mutmut_1", diff) == 2


@pytest.mark.parametrize("path", ["mutants/x.py", ".mutation/zyfa_quant/x.py", "mutation_results.md"])
def test_work_folders_are_git_ignored(path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False)
    assert r.returncode == 0, f"{path} is not git-ignored"


def test_work_folders_are_excluded_from_ruff():
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["ruff"]
    assert {"mutants", ".mutation"} <= set(ruff["extend-exclude"])


def test_stale_verdicts_follow_the_functions_that_changed(script):
    old = "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x\n\n\nclass C:\n    def m(self):\n        return 1\n"
    new = ("def f(x):\n    return x + 2\n\n\n# a comment and new blank lines change nothing\n\n"
           "def g(x):\n\n    return x\n\n\ndef h():\n    return 0\n")
    verdicts = {"pkg.mod.x_f__mutmut_1": 1, "pkg.mod.x_g__mutmut_1": 0, "pkg.mod.xǁCǁm__mutmut_2": None}
    assert [script.mutant_function(k) for k in verdicts] == ["f", "g", "C.m"]
    r = script.stale(old, new, verdicts)
    assert (r["changed"], r["added"], r["removed"]) == (["f"], ["h"], ["C.m"])
    assert (r["mutants"], r["stale_mutants"], r["stale_judged"], r["not_judged"]) == (3, 2, 1, 1)
    assert script.stale(old, old, verdicts)["stale_mutants"] == 0


def test_rerun_patterns_select_exactly_the_mutants_of_the_named_functions(script):
    import fnmatch

    names = ["zyfa.emulator.x_emulate__mutmut_3", "zyfa.emulator.x__mma__mutmut_12",
             "zyfa.emulator.x__mma_step__mutmut_1", "zyfa.recipes.xǁRecipeǁ__post_init____mutmut_7",
             "zyfa.recipes.xǁRecipeǁon__mutmut_2", "zyfa.recipes.xǁRecipeǁtiles__mutmut_1"]
    pats = script.mutant_patterns("zyfa/emulator.py", ["_mma"])
    assert pats == ["zyfa.emulator.x__mma__mutmut_*"]
    assert [n for n in names if any(fnmatch.fnmatch(n, p) for p in pats)] == ["zyfa.emulator.x__mma__mutmut_12"]
    pats = script.mutant_patterns("zyfa/recipes.py", ["Recipe.on", "Recipe.__post_init__"])
    assert [n for n in names if any(fnmatch.fnmatch(n, p) for p in pats)] == [
        "zyfa.recipes.xǁRecipeǁ__post_init____mutmut_7", "zyfa.recipes.xǁRecipeǁon__mutmut_2"]
    # the patterns invert mutant_function for every name
    for n in names:
        mod = n.split(".x")[0].replace(".", "/") + ".py"
        assert fnmatch.fnmatch(n, script.mutant_patterns(mod, [script.mutant_function(n)])[0])


def test_rerun_carries_only_unchanged_functions_verdicts_into_unjudged_slots(script):
    old = {"m.x_f__mutmut_1": 1, "m.x_f__mutmut_2": 0, "m.x_g__mutmut_1": 0, "m.x_h__mutmut_1": 1}
    new = {"m.x_f__mutmut_1": None, "m.x_f__mutmut_2": None, "m.x_g__mutmut_1": 1, "m.x_g__mutmut_2": None,
           "m.x_k__mutmut_1": None}
    assert script.carry_verdicts(new, old, keep={"f", "k"}) == 2
    # f's verdicts carried; g re-run (its new verdict kept, its new mutant left unjudged); k had none before
    assert new == {"m.x_f__mutmut_1": 1, "m.x_f__mutmut_2": 0, "m.x_g__mutmut_1": 1, "m.x_g__mutmut_2": None,
                   "m.x_k__mutmut_1": None}


def test_rerun_changed_refuses_without_an_earlier_run(script, tmp_path, capsys):
    with pytest.raises(SystemExit):
        script.main(["zyfa/quant.py", "--rerun-changed", "--work", str(tmp_path / "none"),
                     "--out", str(tmp_path / "r.md")])
    err = capsys.readouterr().err
    assert "--rerun-changed: no earlier run of zyfa/quant.py" in err and err.count("\n") == 1
    with pytest.raises(SystemExit):
        script.main(["--rerun-changed", "--rerun-undetected", "--out", str(tmp_path / "r.md")])
    assert "give one" in capsys.readouterr().err


def test_modules_imported_as_zyfa_subpackages_are_mutated_under_that_name(script):
    """accuracy/, capture/ and reference/ are imported as zyfa.accuracy, zyfa.capture, zyfa.reference: mutmut names
    a mutant by its file's path, so those modules are mutated at zyfa/<package>/..."""
    assert script.mutated_path("capture/store.py") == "zyfa/capture/store.py"
    assert script.mutated_path("accuracy/scoring/metrics.py") == "zyfa/accuracy/scoring/metrics.py"
    assert script.mutated_path("reference/attention.py") == "zyfa/reference/attention.py"
    assert script.mutated_path("zyfa/quant.py") == "zyfa/quant.py"
    assert script.mutant_patterns("capture/store.py", ["open_capture", "CaptureInfo.read_bytes"]) == [
        "zyfa.capture.store.x_open_capture__mutmut_*", "zyfa.capture.store.xǁCaptureInfoǁread_bytes__mutmut_*"]
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    base, table = script.load_settings(ROOT / "pyproject.toml")
    out = tomllib.loads(script.module_pyproject(text, base, "capture/store.py", table["capture/store.py"]))
    assert out["tool"]["mutmut"]["source_paths"] == ["zyfa/capture/store.py"]


def test_the_copy_imports_a_zyfa_subpackage_from_inside_zyfa(script, tmp_path):
    """prepare lays accuracy/, capture/ and reference/ out inside zyfa/ (the wheel's layout): the copy's
    zyfa.capture.store is the file at zyfa/capture/store.py, the one mutmut mutates."""
    base, table = script.load_settings(ROOT / "pyproject.toml")
    dest = script.prepare(tmp_path, "capture/store.py", base, table["capture/store.py"], from_head=False)
    assert (dest / "zyfa" / "capture" / "store.py").is_file() and (dest / "zyfa" / "reference").is_dir()
    code = "import zyfa.capture.store as s, zyfa.reference.attention as a; print(s.__file__); print(a.__file__)"
    r = subprocess.run([sys.executable, "-c", code], cwd=dest, capture_output=True, text=True, check=True,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(dest)})
    assert r.stdout.split() == [str(dest / "zyfa" / "capture" / "store.py"),
                                str(dest / "zyfa" / "reference" / "attention.py")]
