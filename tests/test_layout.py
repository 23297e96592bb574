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

# The folders of accuracy/, bottom to top (docs/DESIGN.md, "Import order"): a module may import the modules of its
# own folder and of the folders before it, never of one after it. "top" is the package's own modules
# (accuracy/__init__.py and the Python API, accuracy/api.py).
ORDER = ("io", "scoring", "inputs", "implementations", "report", "operator", "cliffs", "impact", "longctx", "tasks",
         "study", "top")
# narrower than the order: role -> {lower role: the only modules of it the role may import}
NARROWER = {
    "impact": {"report": {"report.blocks", "report.document", "report.plots"}},
    "longctx": {"impact": {"impact.model"}, "cliffs": {"cliffs.section"}},
    "tasks": {"impact": {"impact.model"}},
}
ROLES = ORDER[:-1]
TOP_MODULES = {"__init__.py", "api.py"}


def _role_of_file(path: Path) -> str:
    rel = path.relative_to(ROOT / "accuracy").parts
    return rel[0] if len(rel) > 1 else "top"


def _accuracy_module(dotted: str) -> str | None:
    """``accuracy.io.results_io`` (or a name inside it) -> the accuracy module it lies in, by folder; None when it
    is not one of accuracy's modules."""
    parts = dotted.split(".")
    if parts[0] != "accuracy":
        return None
    while parts:
        p = ROOT.joinpath(*parts)
        if p.with_suffix(".py").is_file() or (p / "__init__.py").is_file():
            return ".".join(parts)
        parts = parts[:-1]
    return None


def _accuracy_imports(path: Path) -> dict[str, int]:
    """Every accuracy module ``path`` imports, at the top or inside a function, with the first line that does."""
    found: dict[str, int] = {}
    for node in ast.walk(_parsed(path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # from accuracy.io import results_io (a module) or from accuracy.io.results_io import row_key (a name)
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            target = _accuracy_module(n)
            if target is not None:
                found.setdefault(target, node.lineno)
    return found


def _role_target(module: str) -> str:
    """``accuracy.io.results_io`` -> "io.results_io"; ``accuracy.api`` or ``accuracy`` -> "top"."""
    parts = module.split(".")[1:]
    if not parts or (len(parts) == 1 and parts[0] not in ROLES):
        return "top"
    return ".".join(parts[:2])


def _accuracy_targets(path: Path) -> set[str]:
    """Every accuracy module ``path`` imports, as "top" or "<role>.<module>" ("<role>" for a role's package)."""
    return {_role_target(m) for m in _accuracy_imports(path)}


def _against_the_order(role: str, target: str) -> bool:
    to = target.split(".")[0]
    if to == role:
        return False
    if ORDER.index(to) > ORDER.index(role):
        return True
    allowed = NARROWER.get(role, {}).get(to)
    return allowed is not None and target not in allowed


def test_accuracy_roles_point_one_way():
    bad = []
    for path in sorted((ROOT / "accuracy").rglob("*.py")):
        role = _role_of_file(path)
        wrong = sorted(t for t in _accuracy_targets(path) if _against_the_order(role, t))
        if wrong:
            bad.append(f"{path.relative_to(ROOT)} ({role}) imports {wrong}")
    assert not bad, "imports against the order of accuracy/'s folders (" + " < ".join(ORDER) + "):\n" + "\n".join(bad)


def test_accuracy_roles_cover_the_package():
    """Every module of accuracy/ lies in a role's folder (besides the package's own ``__init__`` and ``api``), each
    role is a package, and a role's ``__init__`` holds only its docstring (so importing one module of a folder
    imports nothing else of it)."""
    assert {p.name for p in (ROOT / "accuracy").glob("*.py")} == TOP_MODULES
    folders = {p.name for p in (ROOT / "accuracy").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(ROLES), f"folders of accuracy/ not in ORDER: {sorted(folders ^ set(ROLES))}"
    for role in ROLES:
        init = ROOT / "accuracy" / role / "__init__.py"
        assert init.is_file(), role
        body = ast.parse(init.read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), \
            f"{init.relative_to(ROOT)} holds more than its docstring"
    for role, narrower in NARROWER.items():
        for to, modules in narrower.items():
            assert ORDER.index(to) < ORDER.index(role), (role, to)
            assert all(_accuracy_module(f"accuracy.{m}") for m in modules), modules


def _accuracy_graph() -> dict[str, dict[str, int]]:
    """accuracy module -> {accuracy module it imports: line}, imports inside functions included."""
    graph = {}
    for path in sorted((ROOT / "accuracy").rglob("*.py")):
        me = _module_of(path)
        graph[me] = {t: n for t, n in _accuracy_imports(path).items() if t != me}
    return graph


def _circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle (a -> b -> ... -> a, as a list of modules) per strongly connected component of ``graph`` that
    has more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph.get(w, ()))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    components.append(set(component))
    circles = []
    for component in components:
        start = min(component)
        # the shortest way back to start inside the component (breadth first)
        back = {start: None}
        queue = [start]
        found = None
        while queue and found is None:
            v = queue.pop(0)
            for w in sorted(graph.get(v, ())):
                if w == start:
                    found = v
                    break
                if w in component and w not in back:
                    back[w] = v
                    queue.append(w)
        path = [found]
        while back[path[-1]] is not None:
            path.append(back[path[-1]])
        circles.append(list(reversed(path)))
    return circles


def test_accuracy_imports_have_no_circle():
    """No module of accuracy/ imports itself back through others, counting imports inside functions too."""
    graph = _accuracy_graph()
    shown = []
    for circle in _circles(graph):
        hops = zip(circle, circle[1:] + circle[:1], strict=True)
        shown.append(" -> ".join(f"{a} (line {graph[a][b]})" for a, b in hops) + f" -> {circle[0]}")
    assert not shown, "circles among accuracy's imports:\n" + "\n".join(shown)


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
                     "sr.log\nfrom accuracy.operator import runner\nfrom accuracy import api\n"
                     "def f():\n    from zyfa.accuracy.io.results_io import read_results\n")
    assert _private_uses(probe, "zyfa.accuracy.report.probe") == [
        "line 1: from accuracy.impact.rows import _secret", "line 3: rows._x", "line 5: blocks._private_here_too"]
    assert _accuracy_targets(probe) == {"impact.rows", "report.blocks", "study.run", "operator.runner", "top",
                                        "io.results_io"}
    assert _accuracy_imports(probe)["accuracy.io.results_io"] == 11  # inside a function too
    assert _against_the_order("report", "operator.runner") and not _against_the_order("report", "io.results_io")
    assert _against_the_order("impact", "report.front") and not _against_the_order("impact", "report.blocks")
    # a circle is found and shown as one way round; a tree with a shared leaf is none
    assert _circles({"a": {"b": 1}, "b": {"c": 2, "d": 3}, "c": {"a": 4}, "d": {}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b": 1, "c": 2}, "b": {"d": 3}, "c": {"d": 4}, "d": {}}) == []
    # a package's private modules are its own to import whole; their private names are not
    probe.write_text("from zyfa.kernels import _triton_fp8\nfrom zyfa.kernels.attention_fp8 import _plan_cache\n")
    assert _private_uses(probe, "zyfa.kernels.probe") == ["line 2: from zyfa.kernels.attention_fp8 import _plan_cache"]
    assert _private_uses(probe, "zyfa.accuracy.probe") == ["line 1: from zyfa.kernels import _triton_fp8",
                                                     "line 2: from zyfa.kernels.attention_fp8 import _plan_cache"]
