#!/usr/bin/env python3
"""Mutation testing of the numerics core and the capture store, one module at a time (mutmut 3).

For each module named in ``[tool.zyfa.mutation]`` of pyproject.toml, this script copies the source and test
folders into ``<work>/<module>/`` (never touching the working tree), writes there a pyproject.toml whose
``[tool.mutmut]`` table is the repository's one with ``source_paths`` and the test selection narrowed to that
module, runs ``python -m mutmut run``, and reads back every mutant's verdict. mutmut runs, for each mutant,
only the tests that executed the mutated function in its first (statistics) pass.

It writes a Markdown summary (kill rate per module, every survivor with its diff) and a JSON file with the same
data. Nothing runs in the default CI selection: this is a maintainer's tool, minutes to hours depending on cores.

    python3 scripts/mutation_test.py                          # every configured module, report in ./
    python3 scripts/mutation_test.py zyfa/quant.py            # one module
    python3 scripts/mutation_test.py --max-children 16 --out /tmp/mutation.md

Needs ``pip install -e '.[dev]'`` (mutmut is in the dev extra). The verdicts are mutmut's: "killed" means some
test failed with the mutant in place, "survived" that every selected test passed, "timeout" that the tests ran
longer than mutmut's limit (counted as detected, listed apart), "no tests" that no selected test executed it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from zyfa import SOURCE_TREE_PACKAGES  # noqa: E402  (the packages imported as zyfa.<name>)

# What the copy needs to import the packages and run their tests (pytest's pythonpath is ".").
COPIED = ["zyfa", "reference", "accuracy", "capture", "tests", "datasets", "examples", "pyproject.toml"]
SKIP_NAMES = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
DETECTED = ("killed", "timeout", "caught by type check", "segfault")
INTERNAL_ERROR = "pytest internal error"


def _fail(msg: str) -> None:
    print(f"mutation_test: {msg}", file=sys.stderr)
    raise SystemExit(2)


def load_settings(pyproject: Path) -> tuple[dict, dict[str, list[str]]]:
    """The repository's [tool.mutmut] table and the per-module test selection of [tool.zyfa.mutation]."""
    data = tomllib.loads(pyproject.read_text("utf-8"))
    tool = data.get("tool", {})
    base = tool.get("mutmut")
    modules = tool.get("zyfa", {}).get("mutation", {}).get("tests")
    if not base or not modules:
        _fail(f"{pyproject} has no [tool.mutmut] table or no [tool.zyfa.mutation] tests table")
    return dict(base), {str(k): list(v) for k, v in modules.items()}


def mutated_path(module: str) -> str:
    """The path mutmut mutates for a configured module. mutmut names a mutant by its file's path, so a module of a
    package the tests import as ``zyfa.<name>`` (``capture/store.py`` -> ``zyfa.capture.store``) is mutated at
    ``zyfa/<name>/...``, where :func:`prepare` lays those packages out as the wheel does; a module of zyfa/ as it
    is."""
    return f"zyfa/{module}" if module.split("/", 1)[0] in SOURCE_TREE_PACKAGES else module


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


def module_pyproject(text: str, base: dict, module: str, tests: list[str]) -> str:
    """pyproject.toml text with the [tool.mutmut] table replaced by one narrowed to ``module`` and ``tests``."""
    table = dict(base)
    table["source_paths"] = [mutated_path(module)]
    table["pytest_add_cli_args_test_selection"] = list(tests)
    table.pop("paths_to_mutate", None)
    table.pop("tests_dir", None)
    # Drop the existing [tool.mutmut] table: from its header to the next table header.
    stripped = re.sub(r"(?ms)^\[tool\.mutmut\]\s*$.*?(?=^\[|\Z)", "", text)
    lines = ["", "[tool.mutmut]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    return stripped.rstrip("\n") + "\n" + "\n".join(lines) + "\n"


def _slug(module: str) -> str:
    return module.replace("/", "_").removesuffix(".py")


def _copy(dest: Path, names: list[str], from_head: bool) -> None:
    """Copy ``names`` (files or folders of the repository) into ``dest``: as committed at HEAD when
    ``from_head`` and this is a git checkout (the report then names an exact commit), else as they stand."""
    if from_head and (ROOT / ".git").exists():
        archive = subprocess.run(["git", "archive", "HEAD", "--", *names], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
        return
    for name in names:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=SKIP_NAMES)
        elif src.is_file():
            shutil.copy2(src, dest / name)


def prepare(work: Path, module: str, base: dict, tests: list[str], from_head: bool) -> Path:
    """A fresh copy of the sources and tests under ``work`` with the module's own mutmut table."""
    dest = work / _slug(module)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    _copy(dest, COPIED, from_head)
    if mutated_path(module) != module:
        # the wheel's layout (zyfa/accuracy, zyfa/capture, zyfa/reference): zyfa/__init__.py then installs no
        # source-tree finder and zyfa.<name> is imported from inside zyfa/, under the name mutmut gives it
        for name in SOURCE_TREE_PACKAGES:
            if (dest / name).is_dir():
                shutil.copytree(dest / name, dest / "zyfa" / name)
    source_text = (dest / "pyproject.toml").read_text("utf-8")
    (dest / "pyproject.toml").write_text(module_pyproject(source_text, base, module, tests), "utf-8")
    return dest


def refresh_tests(work: Path, module: str, base: dict, tests: list[str], from_head: bool) -> Path:
    """The module's earlier work folder with its tests/ replaced by the current ones, inside mutmut's copy too,
    and its test selection by the current one (for --rerun-undetected)."""
    dest = work / _slug(module)
    if not (dest / "mutants").is_dir():
        _fail(f"--rerun-undetected: no earlier run of {module} in {dest}; run it once without the option")
    for where in (dest, dest / "mutants"):
        shutil.rmtree(where / "tests", ignore_errors=True)
        _copy(where, ["tests"], from_head)
    text = (dest / "pyproject.toml").read_text("utf-8")
    (dest / "pyproject.toml").write_text(module_pyproject(text, base, module, tests), "utf-8")
    return dest


def function_sources(text: str) -> dict[str, str]:
    """Every function and method of a module's source -> its AST dump without positions, keyed as mutmut names
    them after ``x_``: ``func`` and ``Class.method`` (nested functions belong to their enclosing function)."""
    import ast

    out: dict[str, str] = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = ast.dump(node, include_attributes=False)
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{sub.name}"] = ast.dump(sub, include_attributes=False)
    return out


def mutant_function(key: str) -> str:
    """``pkg.mod.x_func__mutmut_3`` -> ``func``; ``pkg.mod.xǁClassǁmethod__mutmut_3`` -> ``Class.method``."""
    name = key.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
    if name.startswith("xǁ"):
        return ".".join(part for part in name[2:].split("ǁ") if part)
    return name[2:] if name.startswith("x_") else name


def stale(old_text: str, new_text: str, verdicts: dict[str, int | None]) -> dict:
    """What an earlier run's verdicts (mutant -> exit code, None: not judged) are worth against the current source:
    the functions changed, added or removed since, and how many recorded mutants sit in changed or removed
    functions (their verdicts no longer describe the code)."""
    old, new = function_sources(old_text), function_sources(new_text)
    changed = sorted(f for f in new if f in old and old[f] != new[f])
    added = sorted(f for f in new if f not in old)
    removed = sorted(f for f in old if f not in new)
    gone = set(changed) | set(removed)
    in_gone = [k for k in verdicts if mutant_function(k) in gone]
    return {"functions": len(new), "changed": changed, "added": added, "removed": removed,
            "mutants": len(verdicts), "stale_mutants": len(in_gone),
            "stale_judged": sum(verdicts[k] is not None for k in in_gone),
            "not_judged": sum(v is None for v in verdicts.values())}


def mutant_patterns(module: str, functions: list[str]) -> list[str]:
    """mutmut name patterns (``fnmatch``, as ``mutmut run`` takes them) for every mutant of the named functions of
    ``module``: ``func`` -> ``pkg.mod.x_func__mutmut_*``, ``Class.method`` -> ``pkg.mod.xǁClassǁmethod__mutmut_*``."""
    prefix = mutated_path(module).removesuffix(".py").replace("/", ".")
    out = []
    for f in functions:
        if "." in f:
            cls, meth = f.split(".", 1)
            out.append(f"{prefix}.xǁ{cls}ǁ{meth}__mutmut_*")
        else:
            out.append(f"{prefix}.x_{f}__mutmut_*")
    return out


def carry_verdicts(new: dict[str, int | None], old: dict[str, int | None], keep: set[str]) -> int:
    """Copy into ``new`` (mutant -> exit code) the earlier verdicts of the mutants whose function is in ``keep``
    (unchanged functions: mutmut numbers mutants per function, so their names and changes are the same). Returns
    how many were carried."""
    n = 0
    for key in new:
        if mutant_function(key) in keep and old.get(key) is not None and new[key] is None:
            new[key] = old[key]
            n += 1
    return n


def stale_report(work: Path, modules: list[str]) -> int:
    """Print, per module, how much of the earlier run in ``work`` still describes the working tree's source."""
    print("| module | functions changed / added / removed | mutants recorded | in changed or removed functions "
          "| not judged |")
    print("|---|---|---|---|---|")
    for module in modules:
        dest = work / _slug(module)
        meta = dest / "mutants" / f"{mutated_path(module)}.meta"
        if not (dest / module).is_file() or not meta.is_file():
            print(f"| `{module}` | no earlier run in {dest} | | | |")
            continue
        verdicts = json.loads(meta.read_text("utf-8")).get("exit_code_by_key", {})
        r = stale((dest / module).read_text("utf-8"), (ROOT / module).read_text("utf-8"), verdicts)
        print(f"| `{module}` | {len(r['changed'])} / {len(r['added'])} / {len(r['removed'])} of {r['functions']} "
              f"| {r['mutants']} | {r['stale_mutants']} ({r['stale_judged']} judged) | {r['not_judged']} |")
    return 0


def _mutmut(dest: Path, env: dict, *args: str, capture: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mutmut", *args], cwd=dest, env=env, text=True, capture_output=capture, check=False
    )


def _source_line(module_text: list[str], name: str, diff: str) -> int | None:
    """1-based line of the module where the mutated line of ``diff`` stands, searched from the ``def`` of the
    mutated function (mutmut names mutants ``pkg.mod.x_func__mutmut_N`` or ``pkg.mod.xǁClassǁmethod__mutmut_N``)."""
    func = re.sub(r"__mutmut_\d+$", "", name.rsplit(".", 1)[-1]).split("ǁ")[-1].removeprefix("x_")
    start = next(
        (i for i, src in enumerate(module_text) if re.match(rf"\s*(async\s+)?def {re.escape(func)}\(", src)), 0
    )
    removed = [ln[1:] for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    for old in removed:
        for i in range(start, len(module_text)):
            if module_text[i].rstrip() == old.rstrip():
                return i + 1
    return None


def _exit_codes(dest: Path, module: str) -> dict[str, int | None]:
    """pytest's exit status for each mutant, as mutmut recorded it in ``mutants/<module>.meta``."""
    meta = dest / "mutants" / f"{mutated_path(module)}.meta"
    try:
        return dict(json.loads(meta.read_text("utf-8")).get("exit_code_by_key", {}))
    except (OSError, ValueError):
        return {}


def collect(dest: Path, env: dict, module: str) -> dict:
    """Every mutant's verdict, and the diff of each one not detected."""
    res = _mutmut(dest, env, "results", "--all", "true")
    if res.returncode != 0:
        _fail(f"mutmut results failed in {dest}:\n{res.stdout}\n{res.stderr}")
    verdicts: dict[str, str] = {}
    for line in res.stdout.splitlines():
        m = re.match(r"^\s+(\S+): (.+)$", line)
        if m:
            verdicts[m.group(1)] = m.group(2).strip()
    # mutmut counts pytest's exit status 3 (an internal error: a plugin or the harness broke, not a test) as
    # "killed". Such a mutant was never judged by a test: report it apart, as undetected.
    for name, code in _exit_codes(dest, module).items():
        if code == 3 and name in verdicts:
            verdicts[name] = INTERNAL_ERROR
    src = dest / mutated_path(module)
    source = src.read_text("utf-8").splitlines() if src.is_file() else []
    undetected = []
    for name, verdict in sorted(verdicts.items()):
        if verdict in DETECTED:
            continue
        if verdict == INTERNAL_ERROR:
            undetected.append({"name": name, "verdict": verdict, "line": None, "diff": "(not judged: pytest failed)"})
            continue
        diff = _mutmut(dest, env, "show", name).stdout
        body = "\n".join(ln for ln in diff.splitlines() if not ln.startswith("# "))
        undetected.append({"name": name, "verdict": verdict, "line": _source_line(source, name, body), "diff": body})
    counts: dict[str, int] = {}
    for verdict in verdicts.values():
        counts[verdict] = counts.get(verdict, 0) + 1
    return {"counts": counts, "total": len(verdicts), "undetected": undetected}


def run_module(
    work: Path,
    module: str,
    base: dict,
    tests: list[str],
    max_children: int | None,
    env: dict,
    from_head: bool,
    rerun: bool = False,
    rerun_changed: bool = False,
) -> dict:
    args = ["run"] + (["--max-children", str(max_children)] if max_children else [])
    if rerun_changed:
        return _rerun_changed(work, module, base, tests, max_children, env, from_head, args)
    if rerun:
        dest = refresh_tests(work, module, base, tests, from_head)
        names = [u["name"] for u in collect(dest, env, module)["undetected"]]
        if not names:
            print(f"== {module}: nothing undetected to re-run")
            result = collect(dest, env, module)
            result.update(module=module, tests=tests, seconds=0.0)
            return result
        args += names
    else:
        dest = prepare(work, module, base, tests, from_head)
    shown = " ".join(args) if len(args) < 8 else " ".join(args[:4]) + f" ... ({len(args) - 1} arguments)"
    print(f"== {module}: mutmut {shown} in {dest} (tests: {' '.join(tests)})", flush=True)
    t0 = time.monotonic()
    log = dest / "mutmut-run.log"
    with log.open("w") as fh:
        proc = subprocess.run(
            [sys.executable, "-m", "mutmut", *args], cwd=dest, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False
        )
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        _fail(f"mutmut run for {module} exited {proc.returncode} (log {log}):\n{tail}")
    result = collect(dest, env, module)
    result.update(module=module, tests=tests, seconds=round(seconds, 1))
    c = result["counts"]
    killed = c.get("killed", 0)
    print(
        f"   {module}: {killed}/{result['total']} killed, {c.get('timeout', 0)} timeouts, "
        f"{c.get('survived', 0)} survived, {len(result['undetected'])} undetected, {seconds:.0f} s",
        flush=True,
    )
    return result


def _rerun_changed(work: Path, module: str, base: dict, tests: list[str], max_children: int | None, env: dict,
                   from_head: bool, args: list[str]) -> dict:
    """A fresh copy of the module; mutmut judges only the mutants of the functions changed or added since the
    earlier run in ``work``; the earlier verdicts of the unchanged functions are carried over."""
    dest = work / _slug(module)
    earlier = work / (_slug(module) + ".earlier")
    meta = f"{mutated_path(module)}.meta"
    if not (dest / "mutants" / meta).is_file() and (earlier / "mutants" / meta).is_file():
        shutil.rmtree(dest, ignore_errors=True)  # an interrupted re-run: the earlier run is still whole
    elif (dest / module).is_file() and (dest / "mutants" / meta).is_file():
        shutil.rmtree(earlier, ignore_errors=True)
        dest.rename(earlier)  # kept until the merge is written: an interrupted re-run loses nothing
    else:
        _fail(f"--rerun-changed: no earlier run of {module} in {dest}; run it once without the option")
    old_text = (earlier / module).read_text("utf-8")
    old_verdicts = _exit_codes(earlier, module)
    t0 = time.monotonic()
    dest = prepare(work, module, base, tests, from_head)
    new_text = (dest / module).read_text("utf-8")
    r = stale(old_text, new_text, old_verdicts)
    functions = r["changed"] + r["added"]
    if not functions:
        print(f"== {module}: no function changed since the earlier run; its verdicts stand", flush=True)
        shutil.rmtree(dest)
        earlier.rename(dest)
        result = collect(dest, env, module)
        result.update(module=module, tests=tests, seconds=0.0, rerun_functions=[], carried=len(old_verdicts))
        return result
    print(f"== {module}: re-running the functions changed or added since the earlier run: {', '.join(functions)}",
          flush=True)
    log = dest / "mutmut-run.log"
    with log.open("w") as fh:
        proc = subprocess.run([sys.executable, "-m", "mutmut", *args, *mutant_patterns(module, functions)],
                              cwd=dest, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    new_meta = dest / "mutants" / meta
    if proc.returncode != 0 or not new_meta.is_file():
        tail = log.read_text(errors="replace")[-3000:]
        _fail(f"mutmut run for {module} exited {proc.returncode} (log {log}; the earlier run is in {earlier}):\n{tail}")
    data = json.loads(new_meta.read_text("utf-8"))
    keep = set(function_sources(new_text)) - set(functions)
    carried = carry_verdicts(data["exit_code_by_key"], old_verdicts, keep)
    tmp = new_meta.with_name(new_meta.name + ".partial")
    tmp.write_text(json.dumps(data), "utf-8")
    os.replace(tmp, new_meta)
    shutil.rmtree(earlier)
    seconds = time.monotonic() - t0
    print(f"   {module}: {carried} verdicts carried over from the unchanged functions", flush=True)
    result = collect(dest, env, module)
    result.update(module=module, tests=tests, seconds=round(seconds, 1), rerun_functions=functions,
                  carried=carried)
    return result


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git here)"


def render(results: list[dict], header: dict) -> str:
    out = [
        "# Mutation testing results (generated by scripts/mutation_test.py)",
        "",
        f"- tool: mutmut {header['mutmut']}, Python {header['python']}, torch {header['torch']}",
        f"- command: `{header['command']}`",
        f"- date: {header['date']}",
        f"- git commit: {header['commit']}{' (with uncommitted changes)' if header['dirty'] else ''}",
        f"- max children: {header['max_children']}, cores: {os.cpu_count()}",
        "",
        "| module | tests | mutants | killed | timeout | survived | other undetected | detected % | time (s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        c, total = r["counts"], r["total"]
        killed, timeouts, survived = c.get("killed", 0), c.get("timeout", 0), c.get("survived", 0)
        detected = sum(c.get(v, 0) for v in DETECTED)
        other = total - detected - survived
        pct = 100.0 * detected / total if total else 0.0
        out.append(
            f"| `{r['module']}` | {' '.join(r['tests'])} | {total} | {killed} | {timeouts} | {survived} | {other} "
            f"| {pct:.1f} | {r['seconds']:.0f} |"
        )
    for r in results:
        if not r["undetected"]:
            continue
        out += ["", f"## Undetected in `{r['module']}`", ""]
        for u in r["undetected"]:
            where = f"{r['module']}:{u['line']}" if u["line"] else r["module"]
            out += [f"### {where} — `{u['name']}` ({u['verdict']})", "", "```diff", u["diff"].strip(), "```", ""]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="modules to mutate (default: every one in [tool.zyfa.mutation])")
    ap.add_argument("--work", type=Path, default=ROOT / ".mutation", help="scratch folder (default .mutation/)")
    ap.add_argument("--out", type=Path, default=Path("mutation_results.md"), help="Markdown summary to write")
    ap.add_argument(
        "--working-tree",
        action="store_true",
        help="mutate the working tree as it stands (default in a git checkout: the files committed at HEAD)",
    )
    ap.add_argument(
        "--rerun-undetected",
        action="store_true",
        help="re-run only the mutants an earlier run in --work left undetected, against the current tests",
    )
    ap.add_argument(
        "--rerun-changed",
        action="store_true",
        help="a fresh copy in which mutmut judges only the mutants of the functions changed or added since the "
        "earlier run in --work (see --stale); the earlier verdicts of the unchanged functions are kept",
    )
    ap.add_argument("--max-children", type=int, default=None, help="parallel mutant workers (default: mutmut's)")
    ap.add_argument("--stale", action="store_true",
                    help="run nothing: say per module which functions changed since the run in --work, and how "
                    "many of its recorded verdicts they make stale")
    args = ap.parse_args(argv)
    if args.rerun_changed and args.rerun_undetected:
        _fail("--rerun-changed and --rerun-undetected are two different re-runs: give one")

    if args.stale:
        _, table = load_settings(ROOT / "pyproject.toml")
        return stale_report(args.work, args.modules or list(table))
    try:
        import mutmut
    except ImportError:
        _fail("mutmut is not installed: pip install -e '.[dev]' (or the wheel in .wheels/mutation/)")
    import torch

    base, table = load_settings(ROOT / "pyproject.toml")
    modules = args.modules or list(table)
    unknown = [m for m in modules if m not in table]
    if unknown:
        _fail(f"not configured in [tool.zyfa.mutation.tests]: {', '.join(unknown)} (known: {', '.join(table)})")
    out = args.out.resolve()
    if out.exists() and out.is_relative_to(ROOT) and _git("ls-files", str(out.relative_to(ROOT))):
        _fail(f"{args.out} is a committed file: write the results elsewhere and merge by hand")

    env = dict(os.environ)
    # One thread per mutant worker: mutmut forks its workers, and torch's thread pool does not survive a fork.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
    # The selections are CPU tests. On a GPU host, tests/conftest.py asks CUDA for the device in mutmut's fork
    # server; every forked worker then fails to re-initialise CUDA, pytest stops with an internal error, and
    # mutmut would count each mutant as killed. Hide the GPUs.
    env["CUDA_VISIBLE_DEVICES"] = ""
    # The copies are not a git checkout (tests that ask git about the checkout take their no-git branch).
    env["GIT_CEILING_DIRECTORIES"] = str(args.work.resolve())
    header = {
        "mutmut": getattr(mutmut, "__version__", None) or _pkg_version("mutmut"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "command": "python3 scripts/mutation_test.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": os.environ.get("ZYFA_GIT_COMMIT") or _git("rev-parse", "--short", "HEAD"),
        "dirty": args.working_tree and (ROOT / ".git").exists() and bool(_git("status", "--porcelain", "--", *COPIED)),
        "max_children": args.max_children or "mutmut default (cores)",
    }
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for module in modules:
        results.append(
            run_module(
                args.work,
                module,
                base,
                table[module],
                args.max_children,
                env,
                not args.working_tree,
                args.rerun_undetected,
                args.rerun_changed,
            )
        )
        # Rewrite after every module so an interrupted run keeps what finished.
        tmp = out.with_name(out.name + ".partial")
        tmp.write_text(render(results, header), "utf-8")
        os.replace(tmp, out)
        js = out.with_suffix(".json")
        tmp = js.with_name(js.name + ".partial")
        tmp.write_text(json.dumps({"header": header, "results": results}, indent=1), "utf-8")
        os.replace(tmp, js)
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


def _pkg_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(main())
