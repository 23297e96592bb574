#!/usr/bin/env python3
"""Screen which surviving mutants new test files kill, in one process (torch imported once), inside the mutmut
copy of an earlier ``scripts/mutation_test.py`` run.

    python3 scripts/mutation_screen.py <slug> <test file>... [--names NAME ...] [--undetected FILE.json] [-k EXPR]

<slug>: the module's folder under .mutation/ (zyfa_emulator, accuracy_metrics, ...). The test files (paths
relative to the repository) are copied into mutmut's copy (.mutation/<slug>/mutants/<same path>). pytest then runs
them once with no mutant (they must pass), then once per mutant with MUTANT_UNDER_TEST=<name>, mutmut's own
switch, which every trampoline reads at each call: exit 1 = killed, 0 = survived. --undetected FILE.json takes
the names from the "undetected" list of a JSON written by scripts/mutation_test.py. Results are printed and
merged into .mutation/<slug>/screen.json ({name: {"killed_by": [files]}}). A screen, not a verdict: mutmut's
own re-run (scripts/mutation_test.py --rerun-undetected) is the check of record.
"""
import argparse
import contextlib
import io
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ap = argparse.ArgumentParser()
ap.add_argument("slug")
ap.add_argument("tests", nargs="+")
ap.add_argument("--names", nargs="*", default=[])
ap.add_argument("--undetected", default=None, metavar="FILE.json")
ap.add_argument("-k", default=None)
a = ap.parse_args()
work = ROOT / ".mutation" / a.slug
mut = work / "mutants"
names = list(a.names)
if a.undetected:
    names += [u["name"] for u in json.loads(Path(a.undetected).read_text())["results"][0]["undetected"]]
if not (mut / "pyproject.toml").exists():
    sys.exit(f"no mutmut copy in {mut}: run scripts/mutation_test.py for the module first")
for t in a.tests:
    dst = mut / t
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / t, dst)
    for helper in ("__init__.py", "conftest.py"):  # the folder's package marker and shared fixtures
        src = ROOT / Path(t).parent / helper
        if src.exists():
            shutil.copy(src, dst.parent / helper)
os.chdir(mut)
sys.path.insert(0, str(mut))
os.environ.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONHASHSEED="0", GIT_CEILING_DIRECTORIES=str(work))
import pytest  # noqa: E402

args = [*a.tests, "-x", "-q", "-p", "no:cacheprovider", "-m", "not gpu and not slow", "--no-header"]
if a.k:
    args += ["-k", a.k]


def run(name):
    os.environ["MUTANT_UNDER_TEST"] = name
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = int(pytest.main(args))
    return rc, buf.getvalue()


rc, out = run("")
if rc != 0:
    print(out[-3000:])
    sys.exit(f"the tests fail with no mutant (exit {rc}): fix them first")
store = work / "screen.json"
res = json.loads(store.read_text()) if store.exists() else {}
killed = 0
for n in names:
    rc, out = run(n)
    verdict = {1: "killed", 0: "survived"}.get(rc, f"exit {rc}")
    killed += rc == 1
    print(f"{verdict:9s} {n}", flush=True)
    e = res.setdefault(n, {"killed_by": []})
    if rc == 1:
        for t in a.tests:
            if t not in e["killed_by"]:
                e["killed_by"].append(t)
store.write_text(json.dumps(res, indent=1))
print(f"{killed}/{len(names)} killed by {' '.join(a.tests)}")
