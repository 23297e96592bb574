"""Reading a ``--kernel`` spec and loading the user's function: shared by the in-process path
(:func:`zyfa.accuracy.implementations.plugins.load_plugin`) and the plug-in worker
(:mod:`zyfa.accuracy.implementations.plugin_worker`).

A spec is ``[NAME=]module:function`` or ``[NAME=]path/to/file.py:function``. ``NAME`` (letters, digits, ``_ . + -``,
starting with a letter) is what the rows call the kernel; without it the name is ``plugin:`` and the target with
a file's path made absolute, so a relative and an absolute path to one file name one kernel. Its identity in
provenance (:class:`PluginSource`) is the name, the resolved absolute path and the SHA-256 of the file.

Exposed:
    PluginError                       a spec or a function that breaks the contract (one line naming the kernel)
    PluginSource                      name, spec as typed, target, path, sha256, function; ``record()``
    parse_spec(text) -> PluginSource  (no code runs: the source is read to check it defines the function)
    load_callable(src) -> (fn, where) imports the module or executes the file; the file's folder goes on sys.path
    check_signature(spec, fn)         the contract's keywords and positionals
    CONTRACT                          the contract in one line
    add_wall_arguments(parser), wall_options(args) -> dict, wall_flags(args) -> list   --kernel-timeout,
        --kernel-in-process (this module imports no torch: the commands check arguments before heavy imports)
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CONTRACT", "DEFAULT_TIMEOUT_S", "PluginError", "PluginSource", "add_wall_arguments", "check_signature",
           "load_callable", "parse_spec", "wall_flags", "wall_options"]

DEFAULT_TIMEOUT_S = 600.0  # per call; a real kernel on a long capture takes seconds, a hang takes forever
CONTRACT = "fn(q, k, v, *, causal: bool, sm_scale: float, window: int | None) -> out | (out, lse)"
_NAME = re.compile(r"[A-Za-z][\w.+-]*")


class PluginError(RuntimeError):
    """A plug-in spec or function that cannot be used (the message names the kernel)."""


@dataclass(frozen=True)
class PluginSource:
    """Where a plug-in comes from.

    Attributes:
        name: the rows' ``implementation`` (``NAME`` of ``NAME=...``, else ``plugin:<target>``).
        spec: the spec as typed (for messages and the repro command).
        target: ``module`` or the absolute path of the file (the part before ``:function``).
        function: the function's name.
        path: the absolute path of the source file (a module's, where it has one), or None.
        sha256: SHA-256 of that file's bytes, or None.
        is_file: True for ``path/to/file.py:function``.
    """

    name: str
    spec: str
    target: str
    function: str
    path: str | None
    sha256: str | None
    is_file: bool

    @property
    def label(self) -> str:
        """How messages name the kernel: the spec as typed."""
        return self.spec

    def record(self) -> dict:
        """The provenance entry: name, spec, path, sha256, function."""
        return {"name": self.name, "spec": self.spec, "path": self.path, "sha256": self.sha256,
                "function": self.function}


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def parse_spec(text: str) -> PluginSource:
    """A ``--kernel`` spec resolved without running anything (the source is parsed to check the function).

    Raises:
        PluginError: a malformed spec, a missing file, a file that is not Python or defines no such function.
    """
    if not isinstance(text, str) or ":" not in text:
        raise PluginError(f"kernel {text!r}: expected module:function or path/to/file.py:function, "
                          "optionally NAME= before it")
    name = None
    head, eq, rest = text.partition("=")
    if eq and _NAME.fullmatch(head) and ":" in rest:
        name, body = head, rest
    else:
        body = text
    mod_part, _, fn_name = body.rpartition(":")
    if not mod_part or not fn_name.isidentifier():
        raise PluginError(f"kernel {text!r}: expected module:function or path/to/file.py:function, "
                          "optionally NAME= before it")
    if mod_part.endswith(".py") or os.sep in mod_part or "/" in mod_part:
        path = Path(mod_part)
        if not path.is_file():
            raise PluginError(f"kernel {text!r}: no such file {mod_part}")
        path = path.resolve()
        _check_defines(text, path, fn_name)
        target, is_file, src_path = str(path), True, path
    else:
        try:
            origin = getattr(importlib.util.find_spec(mod_part), "origin", None)
        except (ImportError, ValueError):
            origin = None
        src_path = Path(origin).resolve() if origin and origin.endswith(".py") and Path(origin).is_file() else None
        if src_path is not None:
            _check_defines(text, src_path, fn_name)
        target, is_file = mod_part, False
    return PluginSource(name=name or f"plugin:{target}:{fn_name}", spec=text, target=target, function=fn_name,
                        path=str(src_path) if src_path is not None else None,
                        sha256=_sha256(src_path) if src_path is not None else None, is_file=is_file)


def load_callable(src: PluginSource) -> tuple[Callable, str]:
    """Import the module or execute the file of ``src`` and return (its function, where it came from).

    A file's folder is put first on ``sys.path`` (once), so a kernel split over several files imports its
    own modules. Any failure at import (``SystemExit`` included) is a :class:`PluginError`.
    """
    spec = src.spec
    if src.is_file:
        path = Path(src.target)
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        mod_name = "zyfa_plugin_" + "".join(c if c.isalnum() else "_" for c in str(path))
        try:
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise ImportError(f"cannot load {path} as a Python module")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[mod_name] = module
            loader_spec.loader.exec_module(module)
        except KeyboardInterrupt:
            sys.modules.pop(mod_name, None)
            raise
        except BaseException as e:  # noqa: BLE001 - any import-time failure of the user's file, SystemExit too
            sys.modules.pop(mod_name, None)
            raise PluginError(f"kernel {spec!r}: importing {path} failed: {type(e).__name__}: {e}") from None
        where = str(path)
    else:
        try:
            module = importlib.import_module(src.target)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit at import too
            raise PluginError(f"kernel {spec!r}: cannot import module {src.target!r}: "
                              f"{type(e).__name__}: {e}") from None
        where = getattr(module, "__file__", None) or src.target
    fn = getattr(module, src.function, None)
    if fn is None:
        raise PluginError(f"kernel {spec!r}: module {src.target!r} has no attribute {src.function!r}")
    if not callable(fn):
        raise PluginError(f"kernel {spec!r}: {src.function!r} is not callable")
    return fn, where


def _check_defines(spec: str, path: Path, fn_name: str) -> None:
    """Refuse, before the file runs, a plug-in source that binds no top-level ``fn_name`` (def, class,
    assignment or import): its top-level code is not executed for a kernel it does not have."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError) as e:
        raise PluginError(f"kernel {spec!r}: {path} is not valid Python: {type(e).__name__}: {e}") from None
    names: set[str] = set()
    dynamic = False
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                names.add(node.id)
            dynamic = dynamic or node.id in ("globals", "setattr", "exec")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
            dynamic = dynamic or any(a.name == "*" for a in node.names)
    if fn_name not in names and not dynamic:
        raise PluginError(f"kernel {spec!r}: {path} defines no {fn_name!r} (the file was not run)")


def check_signature(spec: str, fn: Callable) -> None:
    """PluginError when ``fn``'s signature cannot take the contract's call (q, k, v and three keywords)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins / C functions: checked by the call itself
    params = list(sig.parameters.values())
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    problems = []
    if len(positional) < 3 and not var_pos:
        problems.append(f"takes {len(positional)} positional argument(s), needs q, k, v")
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [n for n in ("causal", "sm_scale", "window") if n not in names]
    if missing and not var_kw:
        problems.append(f"has no keyword argument(s) {', '.join(missing)}")
    required_extra = [p.name for p in params[3:] if p.default is p.empty
                      and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                      and p.name not in ("causal", "sm_scale", "window")]
    if required_extra:
        problems.append(f"requires argument(s) the contract does not pass: {', '.join(required_extra)}")
    if problems:
        raise PluginError(f"kernel {spec!r}: wrong signature {sig}: {'; '.join(problems)}. Contract: {CONTRACT}")


# ---------------------------------------------------------------------------------------------- options

def add_wall_arguments(parser) -> None:
    """``--kernel-timeout`` and ``--kernel-in-process`` on a parser (or an argument group) that has --kernel."""
    parser.add_argument("--kernel-timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"time limit of one call of a --kernel (default {DEFAULT_TIMEOUT_S:g}); a call past "
                             "it fails its row and its worker process is restarted")
    parser.add_argument("--kernel-in-process", action="store_true",
                        help="call --kernel plug-ins in this process instead of a worker process: faster, but "
                             "with no time limit, and a crash, os._exit or hang of the kernel is this process's")


def wall_options(args: argparse.Namespace) -> dict:
    """``load_plugins`` keywords from parsed arguments; ValueError for a time limit that is not > 0."""
    timeout = getattr(args, "kernel_timeout", DEFAULT_TIMEOUT_S)
    if timeout is None:
        timeout = DEFAULT_TIMEOUT_S
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"--kernel-timeout must be a number of seconds > 0, got {timeout!r}")
    return {"in_process": bool(getattr(args, "kernel_in_process", False)), "timeout": float(timeout)}


def wall_flags(args: argparse.Namespace) -> list[str]:
    """The ``--kernel-timeout`` / ``--kernel-in-process`` flags of ``args`` that differ from the defaults (for
    the command a run prints to reproduce it)."""
    if not getattr(args, "kernel", None):
        return []
    flags = ["--kernel-in-process"] if getattr(args, "kernel_in_process", False) else []
    timeout = getattr(args, "kernel_timeout", None)
    if timeout is not None and timeout != DEFAULT_TIMEOUT_S:
        flags += ["--kernel-timeout", f"{timeout:g}"]
    return flags
