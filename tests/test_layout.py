"""The dependency arrows of docs/DESIGN.md point one way; this parses imports and fails on a wrong one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from zyfa import SOURCE_TREE_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
OURS = {"zyfa", "reference", "capture", "accuracy"}
# package -> packages of ours it may import (command modules that wire packages together are exempt)
ALLOWED = {
    "reference": set(),
    "zyfa": set(),
    "capture": set(),
    "accuracy": {"zyfa", "reference", "capture"},
}
# the command module wires the packages together; zyfa/bench/ is not exempt: the peer kernels it times live in
# zyfa/peers/, below both it and accuracy/implementations/registry.py
EXEMPT = {ROOT / "zyfa" / "cli.py"}
# files that may import one more package of ours: the benchmark times on captured activations (capture's store)
ALSO_ALLOWED = {ROOT / "zyfa" / "bench" / "cli.py": {"capture"}, ROOT / "zyfa" / "bench" / "cases.py": {"capture"}}


def _folder_name(module: str) -> str:
    """A module's dotted name by folder: ``zyfa.accuracy.operator.runner`` (how it is imported) ->
    ``zyfa.accuracy.operator.runner``."""
    parts = module.split(".")
    if len(parts) > 1 and parts[0] == "zyfa" and parts[1] in SOURCE_TREE_PACKAGES:
        return ".".join(parts[1:])
    return module


def _parsed(path: Path) -> ast.Module:
    """The module's tree with every absolute import named by folder (:func:`_folder_name`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                a.name = _folder_name(a.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "zyfa":
                node.names = [ast.alias(name=a.name, asname=a.asname or a.name) if a.name in SOURCE_TREE_PACKAGES
                              else a for a in node.names]
            node.module = _folder_name(node.module)
    return tree


def _imports(path: Path) -> set[str]:
    tree = _parsed(path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
            if node.module == "zyfa":
                found |= {a.name for a in node.names if a.name in SOURCE_TREE_PACKAGES}
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_point_one_way(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if path in EXEMPT:
            continue
        wrong = (_imports(path) & OURS) - ALLOWED[package] - {package} - ALSO_ALLOWED.get(path, set())
        if wrong:
            bad.append(f"{path.relative_to(ROOT)} imports {sorted(wrong)}")
    assert not bad, "imports against docs/DESIGN.md's direction:\n" + "\n".join(bad)


def test_reference_imports_no_triton():
    for path in (ROOT / "reference").rglob("*.py"):
        assert "triton" not in _imports(path), f"{path} imports triton"


def test_cli_lists_subcommands(capsys):
    from zyfa.cli import main

    assert main([]) == 2
    out = capsys.readouterr().out
    assert "accuracy" in out


# ---------------------------------------------------------------------------------------------- accuracy roles

ROLES = ("report", "impact", "longctx", "study", "tasks")
# role -> what it may import inside accuracy ("core", a role, or "role.module")
ROLE_ALLOWED = {
    "core": {"core"},
    "report": {"core", "report"},
    "impact": {"core", "impact", "report.blocks", "report.document", "report.plots"},
    "longctx": {"core", "longctx", "impact.model", "report"},
    "study": {"core", "report", "impact", "longctx", "study"},
    "tasks": {"core", "tasks", "impact.model", "longctx"},
}


def _role_of_file(path: Path) -> str:
    rel = path.relative_to(ROOT / "accuracy").parts
    return rel[0] if len(rel) > 1 and rel[0] in ROLES else "core"


def _accuracy_targets(path: Path) -> set[str]:
    """Every accuracy module ``path`` imports, as "core", "<role>" or "<role>.<module>"."""
    tree = _parsed(path)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.count(".") >= 2:  # from accuracy.report.blocks import fmt
                names.append(node.module)
            else:  # from accuracy import report; from accuracy.report import blocks
                names += [f"{node.module}.{a.name}" for a in node.names]
    out = set()
    for n in names:
        parts = n.split(".")
        if parts[0] != "accuracy" or len(parts) == 1:
            continue
        if parts[1] in ROLES:
            out.add(parts[1] if len(parts) == 2 else f"{parts[1]}.{parts[2]}")
        elif (ROOT / "accuracy" / f"{parts[1]}.py").is_file():
            out.add("core")
    return out


def test_accuracy_roles_point_one_way():
    bad = []
    for path in sorted((ROOT / "accuracy").rglob("*.py")):
        role = _role_of_file(path)
        allowed = ROLE_ALLOWED[role]
        wrong = sorted(t for t in _accuracy_targets(path) if t not in allowed and t.split(".")[0] not in allowed)
        if wrong:
            bad.append(f"{path.relative_to(ROOT)} ({role}) imports {wrong}")
    assert not bad, "imports against the roles of accuracy/:\n" + "\n".join(bad)


def test_accuracy_roles_cover_the_package():
    """Each role is a package with modules (a flat accuracy/report.py would slip past the role check)."""
    for role in ROLES:
        assert (ROOT / "accuracy" / role / "__init__.py").is_file(), role
        assert not (ROOT / "accuracy" / f"{role}.py").exists(), f"accuracy/{role}.py next to accuracy/{role}/"


# ---------------------------------------------------------------------------------------------- private names

def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _is_ours(module: str) -> bool:
    return module.split(".")[0] in OURS


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _same_package(importer: str, target: str) -> bool:
    """``target`` (a module, or module.name) lies in the package of ``importer``."""
    package = importer.rsplit(".", 1)[0]
    return target == package or target.startswith(package + ".")


def _is_module(target: str) -> bool:
    """``target`` (dotted) is one of our modules or packages, not a name inside one."""
    p = ROOT.joinpath(*target.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _private_module_of_package(importer: str, target: str) -> bool:
    """``target`` is a private module of the importer's own package, imported whole (``from zyfa.kernels import
    _triton_fp8``): a package's internal modules; their private *names* stay private to them."""
    return _same_package(importer, target) and _is_module(target)


def _private_uses(path: Path, me: str | None = None) -> list[str]:
    """``from m import _x`` and ``m._x`` of our modules outside the importer's own package (``me``: the
    importer's module name, by default from its path)."""
    me = _folder_name(me or _module_of(path))
    tree = _parsed(path)
    bound: dict[str, str] = {}  # local name -> our module it names
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _is_ours(a.name):
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    if any(_private(p) for p in a.name.split(".")) and not _same_package(me, a.name):
                        found.append(f"line {node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _is_ours(node.module):
            for a in node.names:
                target = f"{node.module}.{a.name}"
                private_name = _private(a.name) and not _private_module_of_package(me, target)
                private_module = any(_private(p) for p in node.module.split(".")) and not _same_package(me, target)
                if private_name or private_module:
                    found.append(f"line {node.lineno}: from {node.module} import {a.name}")
                bound[a.asname or a.name] = target
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, cur = [node.attr], node.value
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id in bound:
                target = ".".join([bound[cur.id], *reversed(chain)])
                if not _private_module_of_package(me, target):
                    found.append(f"line {node.lineno}: {cur.id}.{'.'.join(reversed(chain))}")
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_private_names_across_modules(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        bad += [f"{path.relative_to(ROOT)} {u}" for u in _private_uses(path)]
    assert not bad, "private names used outside their module's package:\n" + "\n".join(bad)


def test_the_checks_find_what_they_look_for(tmp_path):
    """The checks themselves, on a module written here (as if it were accuracy/report/probe.py)."""
    probe = tmp_path / "probe.py"
    probe.write_text("from accuracy.impact.rows import _secret\nfrom accuracy.impact import rows\nrows._x\n"
                     "from accuracy.report import blocks\nblocks._private_here_too\nimport accuracy.study.run as sr\n"
                     "sr.log\nfrom accuracy import runner\n")
    assert _private_uses(probe, "zyfa.accuracy.report.probe") == [
        "line 1: from accuracy.impact.rows import _secret", "line 3: rows._x", "line 5: blocks._private_here_too"]
    assert _accuracy_targets(probe) == {"impact.rows", "report.blocks", "study.run", "core"}
    # a package's private modules are its own to import whole; their private names are not
    probe.write_text("from zyfa.kernels import _triton_fp8\nfrom zyfa.kernels.attention_fp8 import _plan_cache\n")
    assert _private_uses(probe, "zyfa.kernels.probe") == ["line 2: from zyfa.kernels.attention_fp8 import _plan_cache"]
    assert _private_uses(probe, "zyfa.accuracy.probe") == ["line 1: from zyfa.kernels import _triton_fp8",
                                                     "line 2: from zyfa.kernels.attention_fp8 import _plan_cache"]
