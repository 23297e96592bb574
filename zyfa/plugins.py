"""A user's kernel named on the command line (``--kernel module:function`` or ``path/to/file.py:function``): found,
imported and its signature checked against the plug-in contract (docs/CONTRACTS.md), for every command that takes
one (``zyfa accuracy``/``study``/``longctx`` through accuracy.implementations, ``zyfa bench`` directly).

Exposed: ``CONTRACT``, ``PluginError``, ``load_callable(spec)``, ``check_defines(spec, path, name)``,
``check_signature(spec, fn)``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["CONTRACT", "PluginError", "check_defines", "check_signature", "load_callable"]


class PluginError(ValueError):
    """A kernel that cannot be loaded or breaks the contract's signature; the message names it."""


CONTRACT = "fn(q, k, v, *, causal: bool, sm_scale: float, window: int | None) -> out | (out, lse)"


def load_callable(spec: str) -> tuple[Callable, str]:
    """``module:function`` or ``path/to/file.py:function`` -> (callable, where it came from)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise PluginError(f"kernel {spec!r}: expected module:function or path/to/file.py:function")
    mod_part, _, fn_name = spec.rpartition(":")
    if not mod_part or not fn_name.isidentifier():
        raise PluginError(f"kernel {spec!r}: expected module:function or path/to/file.py:function")
    if mod_part.endswith(".py") or os.sep in mod_part or "/" in mod_part:
        path = Path(mod_part)
        if not path.is_file():
            raise PluginError(f"kernel {spec!r}: no such file {mod_part}")
        check_defines(spec, path, fn_name)
        mod_name = "zyfa_plugin_" + "".join(c if c.isalnum() else "_" for c in str(path.resolve()))
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
            raise PluginError(f"kernel {spec!r}: importing {mod_part} failed: {type(e).__name__}: {e}") \
                from None
        where = str(path)
    else:
        try:
            origin = getattr(importlib.util.find_spec(mod_part), "origin", None)
        except (ImportError, ValueError):
            origin = None
        if origin and origin.endswith(".py") and Path(origin).is_file():
            check_defines(spec, Path(origin), fn_name)
        try:
            module = importlib.import_module(mod_part)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit at import too
            raise PluginError(f"kernel {spec!r}: cannot import module {mod_part!r}: "
                                      f"{type(e).__name__}: {e}") from None
        where = getattr(module, "__file__", None) or mod_part
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise PluginError(f"kernel {spec!r}: module {mod_part!r} has no attribute {fn_name!r}")
    if not callable(fn):
        raise PluginError(f"kernel {spec!r}: {fn_name!r} is not callable")
    return fn, where


def check_defines(spec: str, path: Path, fn_name: str) -> None:
    """Refuse, before the file runs, a plug-in source that binds no top-level ``fn_name`` (def, class,
    assignment or import): its top-level code is not executed for a kernel it does not have."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError) as e:
        raise PluginError(f"kernel {spec!r}: {path} is not valid Python: {type(e).__name__}: {e}") \
            from None
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
        raise PluginError(f"kernel {spec!r}: wrong signature {sig}: {'; '.join(problems)}. "
                                  f"Contract: {CONTRACT}")
