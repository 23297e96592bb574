#!/usr/bin/env python3
"""Judge on a CUDA GPU the mutants of ``zyfa/emulator.py``'s ``emulate`` that a CPU cannot tell apart.

mutmut runs on the CPU (scripts/mutation_test.py), where a tensor put on the CPU instead of the input's device, or
a change to the GPU's default query chunk, changes nothing: those mutants survive there and are judged on a GPU by
``tests/zyfa/test_emulator_cuda.py`` (reports/tests/mutation.md, "Killed on CUDA only"). mutmut's numbers shift
whenever ``emulate`` changes, so the mutants are chosen by what they change, not by number:

- ``make`` (a machine with mutmut, e.g. this CPU one): mutmut's own mutation of the file (``mutate_file_contents``,
  the call ``mutmut run`` makes), from which it keeps the mutants of ``emulate`` whose change touches device
  placement (``device=dev``, ``dev=dev``) or the GPU's default chunk (``1 << 24``), less those that replace a whole
  statement by ``None`` (they fail on any device), plus one sanity mutant (``Tiling(recipe=None)``, which fails every
  call). Writes ``DIR/mutants/emulator_mutmut_<n>.py`` (the whole file with that one mutation, as ``mutmut apply``
  would write it), ``DIR/mutants.json`` (base file sha256 and commit, each mutant's number, old and new line, diff
  and sha256) and ``DIR/mutprobe.py`` (the pytest plugin below). Carry DIR to the GPU machine (about 2 MiB).
- ``run`` (the GPU machine; python3, torch, pytest, no mutmut): for each mutant, a temporary copy of the code
  (``zyfa/`` with the mutated ``emulator.py``, ``accuracy/``, ``capture/``, ``reference/``, ``pyproject.toml``,
  ``tests/conftest.py``, ``tests/zyfa/``) runs ``pytest -x -m gpu tests/zyfa/test_emulator_cuda.py``; the plugin
  records which ``zyfa/emulator.py`` the tests imported (its sha256 must be the mutant's) and the outcomes. First the
  unmutated file (must pass, nothing skipped) and the sanity mutant (must fail): else nothing runs (exit 2). Verdicts:
  killed (a test failed), survived (all ran and passed), timeout, error, not run (past ``--deadline``). It refuses
  in one line when ``zyfa/emulator.py`` is not the file the mutants were made from. ``--cpu-check`` runs a CPU test
  file instead (``-m "not gpu and not slow"``), to check the mechanism where there is no GPU.

    python3 scripts/mutation_cuda.py make --out .mutation-cuda
    python3 scripts/mutation_cuda.py run --mutants .mutation-cuda --jobs 8 --out $OUT/mutants_cuda.json
    python3 scripts/mutation_cuda.py run --mutants .mutation-cuda --cpu-check --jobs 2 --out /tmp/cpu.json
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zyfa.capture.version import git_label  # noqa: E402

BASE = "zyfa/emulator.py"
FUNC = "emulate"
GPU_TEST = "tests/zyfa/test_emulator_cuda.py"
CPU_TEST = "tests/zyfa/test_emulator.py"
CODE = ("zyfa", "accuracy", "capture", "reference")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
PROBE = '''"""pytest plugin of scripts/mutation_cuda.py (-p mutprobe): writes to $MUTPROBE_OUT which
zyfa/emulator.py the tests imported (path, sha256), how many tests passed, failed and skipped, the first failure."""
import hashlib
import json
import os
import sys

_counts = {"passed": 0, "failed": 0, "skipped": 0}
_first = []


def pytest_runtest_logreport(report):
    if report.skipped:
        _counts["skipped"] += 1
    elif report.failed:
        _counts["failed"] += 1
        if not _first:
            crash = getattr(report.longrepr, "reprcrash", None)
            msg = crash.message if crash is not None else str(report.longrepr)
            _first.append(f"{report.nodeid} ({report.when}): {msg}"[:600])
    elif report.when == "call":
        _counts["passed"] += 1


def pytest_sessionfinish(session, exitstatus):
    path = getattr(sys.modules.get("zyfa.emulator"), "__file__", None)
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest() if path else None
    if os.environ.get("MUTPROBE_OUT"):
        with open(os.environ["MUTPROBE_OUT"], "w") as f:
            json.dump({"emulator_file": path, "emulator_sha256": sha, "counts": _counts,
                       "first_failure": _first[0] if _first else None, "exitstatus": int(exitstatus)}, f)
'''


def _fail(msg: str) -> int:
    print(f"mutation_cuda: {msg}", file=sys.stderr)
    return 2


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def changed_lines(old: str, new: str) -> tuple[str, str]:
    """The lines of ``old`` a mutant removed and the lines it put instead, each joined by newlines."""
    d = [x for x in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
         if x[:1] in "+-" and not x.startswith(("+++", "---"))]
    return "\n".join(x[1:] for x in d if x[0] == "-"), "\n".join(x[1:] for x in d if x[0] == "+")


def is_candidate(old: str, new: str) -> bool:
    """A change the CPU cannot see: device placement or the GPU's default chunk, not a statement set to None."""
    code = new.split("#")[0].strip()
    if code.endswith("= None") and "(" not in code:
        return False
    return (("device=dev" in old and "device=dev" not in new) or ("dev=dev" in old and "dev=dev" not in new)
            or "1 << 24" in old)


def is_sanity(old: str, new: str) -> bool:
    return "Tiling(" in old and "recipe=recipe" in old and "recipe=None" in new


def make(out: Path) -> int:
    try:
        import libcst as cst
        from mutmut.mutation.file_mutation import mutate_file_contents
    except ImportError as e:
        return _fail(f"make needs mutmut 3 (pip install -e '.[dev]'): {e}")
    code = (ROOT / BASE).read_text()
    mutated = cst.parse_module(mutate_file_contents(BASE, code).code)
    orig = cst.parse_module(code)
    orig_fn = next(c for c in orig.body if isinstance(c, cst.FunctionDef) and c.name.value == FUNC)
    orig_text = orig.code_for_node(orig_fn)
    prefix = f"x_{FUNC}__mutmut_"
    fns = [c for c in mutated.body if isinstance(c, cst.FunctionDef) and c.name.value.startswith(prefix)
           and c.name.value[len(prefix):].isdigit()]
    if out.exists():
        shutil.rmtree(out)
    (out / "mutants").mkdir(parents=True)
    entries = []
    for fn in fns:
        n = int(fn.name.value[len(prefix):])
        fn = fn.with_changes(name=cst.Name(FUNC))
        old, new = changed_lines(orig_text, orig.code_for_node(fn))
        sanity = is_sanity(old, new)
        if not (sanity or is_candidate(old, new)):
            continue
        text = orig.deep_replace(orig_fn, fn).code
        name = f"emulator_mutmut_{n}.py"
        (out / "mutants" / name).write_text(text)
        diff = "".join(difflib.unified_diff(code.splitlines(True), text.splitlines(True), f"a/{BASE}", f"b/{BASE}",
                                            n=1))
        entries.append({"n": n, "sanity": sanity, "old": old.strip(), "new": new.strip(), "file": f"mutants/{name}",
                        "sha256": sha256_text(text), "diff": diff})
    sanities = [e for e in entries if e["sanity"]]
    if len(sanities) != 1:
        return _fail(f"expected one sanity mutant (Tiling(recipe=None)), found {len(sanities)}")
    meta = {"function": FUNC, "base_file": BASE, "base_sha256": sha256_text(code),
            "base_commit": git_label(), "mutants_of_function": len(fns),
            "numbering": f"mutmut's x_{FUNC}__mutmut_<n> for this base file", "mutants": entries}
    (out / "mutants.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "mutprobe.py").write_text(PROBE)
    print(f"mutation_cuda: {len(entries) - 1} candidates and the sanity mutant {sanities[0]['n']} of "
          f"{len(fns)} mutants of {FUNC} ({BASE} sha256 {meta['base_sha256'][:12]}) in {out}")
    return 0


def _tree(repo: Path, emulator: Path, test: str, root: Path) -> None:
    for d in CODE:
        shutil.copytree(repo / d, root / d, ignore=IGNORE, symlinks=True)
    shutil.copy2(repo / "pyproject.toml", root / "pyproject.toml")
    (root / "tests").mkdir()
    shutil.copy2(repo / "tests" / "conftest.py", root / "tests" / "conftest.py")
    shutil.copytree(repo / "tests" / "zyfa", root / "tests" / "zyfa", ignore=IGNORE)
    if not (root / test).exists():  # a test file of another folder (--test)
        (root / test).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / test, root / test)
    (root / BASE).unlink()
    shutil.copyfile(emulator, root / BASE)  # a fresh mtime: no stale bytecode can match


def run_one(label: str, emulator: Path, a: argparse.Namespace) -> dict:
    """One pytest run of the test file against ``emulator`` in its own copy of the code."""
    res: dict = {"label": label}
    left = a.deadline_at - time.monotonic()
    if left < 20:
        return dict(res, verdict="not run", why=f"--deadline {a.deadline:.0f} s reached", seconds=0.0)
    tmp = Path(tempfile.mkdtemp(prefix=f"mutcuda-{label}-"))
    t0 = time.monotonic()
    try:
        root = tmp / "repo"
        root.mkdir()
        _tree(a.repo, emulator, a.test, root)
        probe = tmp / "probe.json"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(a.mutants)]), MUTPROBE_OUT=str(probe),
                   PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
        if a.cpu_check:
            env["CUDA_VISIBLE_DEVICES"] = ""
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-m", a.marker, "-p", "no:cacheprovider", "-p", "mutprobe",
               a.test, *(["-k", a.k] if a.k else [])]
        try:
            p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=min(a.timeout, left))
            rc, tail = p.returncode, (p.stdout + p.stderr)[-3000:]
        except subprocess.TimeoutExpired:
            rc, tail = None, ""
        pr = json.loads(probe.read_text()) if probe.exists() else {}
        counts = pr.get("counts", {})
        res.update(rc=rc, counts=counts, first_failure=pr.get("first_failure"))
        if rc is None:
            res["verdict"] = "timeout"
        elif pr.get("emulator_sha256") != sha256(emulator):
            res.update(verdict="error", why=f"the tests imported {pr.get('emulator_file')}, not the mutant's file")
        elif rc == 1 and counts.get("failed", 0) > 0:
            res["verdict"] = "killed"
        elif rc == 0 and counts.get("passed", 0) > 0 and (a.cpu_check or counts.get("skipped", 0) == 0):
            res["verdict"] = "survived"
        else:
            res.update(verdict="error", why=f"pytest exit {rc}, outcomes {counts}")
        if res["verdict"] in ("error", "timeout"):
            res["output_tail"] = tail
    except Exception as e:  # noqa: BLE001  (a copy or probe failure is reported, not raised in a worker)
        res.update(verdict="error", why=f"{type(e).__name__}: {e}")
    finally:
        res["seconds"] = round(time.monotonic() - t0, 1)
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def _line(r: dict, e: dict | None) -> str:
    c = r.get("counts", {})
    head = f"{r['label']:>9}" if e is None else f"{e['n']:>5}"
    s = (f"{head}  {r['verdict']:<8} {r['seconds']:>6.1f} s  passed {c.get('passed', 0)} failed {c.get('failed', 0)}"
         f" skipped {c.get('skipped', 0)}")
    if e is not None:
        s += f"  {e['old'][:60]!r} -> {e['new'][:60]!r}"
    if r.get("why"):
        s += f"\n        why: {r['why']}"
    return s


def run(a: argparse.Namespace) -> int:
    a.repo, a.mutants = a.repo.resolve(), a.mutants.resolve()
    meta_path = a.mutants / "mutants.json"
    if not meta_path.is_file():
        return _fail(f"no {meta_path}: run `python3 scripts/mutation_cuda.py make --out {a.mutants}` first")
    meta = json.loads(meta_path.read_text())
    base = a.repo / meta["base_file"]
    if not base.is_file() or sha256(base) != meta["base_sha256"]:
        return _fail(f"refused: {base} is not the file the mutants were made from (sha256 "
                     f"{meta['base_sha256'][:12]}, commit {meta['base_commit']}): make them again")
    a.test = a.test or (CPU_TEST if a.cpu_check else GPU_TEST)
    if not (a.repo / a.test).is_file():
        return _fail(f"refused: no test file {a.repo / a.test}")
    a.marker = "not gpu and not slow" if a.cpu_check else "gpu"
    a.threads = max(1, (os.cpu_count() or 1) // max(1, a.jobs))
    a.deadline_at = time.monotonic() + a.deadline
    entries = [e for e in meta["mutants"] if not e["sanity"] and (a.only is None or e["n"] in a.only)]
    sanity = next(e for e in meta["mutants"] if e["sanity"])
    for e in [sanity, *entries]:
        if sha256(a.mutants / e["file"]) != e["sha256"]:
            return _fail(f"refused: {e['file']} is not the stored mutant (sha256 differs)")
    import torch

    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    if not a.cpu_check and cuda is None:
        return _fail("refused: torch sees no CUDA device here (the gpu tests would skip); --cpu-check runs a CPU test")
    print(f"mutation_cuda: {len(entries)} mutants of {meta['function']} (base sha256 {meta['base_sha256'][:12]}), "
          f"{a.test} -m '{a.marker}', {a.jobs} jobs x {a.threads} threads, torch {torch.__version__}, "
          f"CUDA device {cuda}", flush=True)
    t0 = time.monotonic()
    summary = {"function": meta["function"], "base_sha256": meta["base_sha256"], "base_commit": meta["base_commit"],
               "numbering": meta["numbering"], "test": a.test, "marker": a.marker, "k": a.k, "jobs": a.jobs,
               "host": platform.node(), "python": sys.version.split()[0], "torch": torch.__version__,
               "cuda_device": cuda}
    with ThreadPoolExecutor(max_workers=2) as ex:
        base_r, san_r = ex.map(lambda x: run_one(*x, a), [("baseline", base), ("sanity", a.mutants / sanity["file"])])
    print(_line(base_r, None), flush=True)
    print(_line(san_r, None) + f"  (mutant {sanity['n']})", flush=True)
    summary.update(baseline=base_r, sanity=dict(san_r, n=sanity["n"]))
    problems = []
    if base_r["verdict"] != "survived":
        problems.append(f"the unmutated file did not pass cleanly ({base_r['verdict']})")
    if san_r["verdict"] != "killed":
        problems.append(f"the sanity mutant {sanity['n']} was not killed ({san_r['verdict']})")
    results = []
    if not problems:
        with ThreadPoolExecutor(max_workers=a.jobs) as ex:
            futs = [(e, ex.submit(run_one, f"m{e['n']}", a.mutants / e["file"], a)) for e in entries]
            for e, f in futs:
                r = f.result()
                results.append(dict(r, n=e["n"], old=e["old"], new=e["new"]))
                print(_line(r, e), flush=True)
    counts: dict[str, int] = {}
    for r in results:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    summary.update(ok=not problems, problems=problems, counts=counts, seconds=round(time.monotonic() - t0, 1),
                   results=results)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(summary, indent=1) + "\n")
    if problems:
        for p in problems:
            print(f"mutation_cuda: refused: {p}", file=sys.stderr)
        return 2
    print(f"mutation_cuda: {counts} in {summary['seconds']} s; summary in {a.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="write the mutants (needs mutmut)")
    m.add_argument("--out", type=Path, required=True, help="the folder to write (replaced)")
    r = sub.add_parser("run", help="judge the mutants against the test file")
    r.add_argument("--mutants", type=Path, required=True, help="the folder `make` wrote")
    r.add_argument("--out", type=Path, required=True, help="the JSON summary")
    r.add_argument("--repo", type=Path, default=ROOT, help="the repository checkout (default this one)")
    r.add_argument("--jobs", type=int, default=8)
    r.add_argument("--cpu-check", action="store_true", help=f"a CPU test file (--test, default {CPU_TEST})")
    r.add_argument("--test", default=None, help="the test file, relative to the repository")
    r.add_argument("-k", default=None, help="pytest's -k expression for the test file")
    r.add_argument("--only", type=int, nargs="*", default=None, help="these mutant numbers only")
    r.add_argument("--timeout", type=float, default=300.0, help="seconds per pytest run (default 300)")
    r.add_argument("--deadline", type=float, default=540.0, help="seconds for the whole run (default 540)")
    a = ap.parse_args(argv)
    return make(a.out) if a.cmd == "make" else run(a)


if __name__ == "__main__":
    sys.exit(main())
