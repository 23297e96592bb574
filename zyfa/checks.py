"""Checks whose answer can wait.

A NaN/Inf screen or a descale check asks the device a yes/no question, and reading the answer back is a host sync:
in every layer of every decode step, several per layer, each one a wait that hands the GPU to whatever else shares it.
:func:`check` asks such a question. Outside any :func:`deferred` scope it is answered at once, as a plain
``if not bool(flag): raise``. Inside one, the questions are collected and answered together when the outermost
scope ends (one sync per device), and the first check that failed raises the error it would have raised at once. The
work done after it ran on bad values and is dropped with the exception.

    with deferred():                      # a layer's attention call, or a whole decode step
        check(flag, on_fail)              # flag: a 0-d bool tensor, True = fine
        ...                               # on_fail() -> the exception to raise, or None: a closer look found
                                          #   nothing wrong (a screen's false alarm)

An exception raised inside a scope while a check made before it has failed is replaced by that check's error (what
would have been raised first), chained to it. :func:`wrapped` applies a caller's wrapping (e.g. "kernel X raised
ValueError: ...") to the errors of checks made inside it, as it applies to exceptions raised there.

Exposed: ``active()``, ``check(flag, on_fail)``, ``deferred()``, ``wrapped(wrap)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch

__all__ = ["active", "check", "deferred", "wrapped"]

OnFail = Callable[[], BaseException | None]

_pending: ContextVar[list | None] = ContextVar("zyfa_pending_checks", default=None)
_wraps: ContextVar[tuple] = ContextVar("zyfa_check_wraps", default=())


def active() -> bool:
    """Whether checks are being deferred (a :func:`deferred` scope is open)."""
    return _pending.get() is not None


def check(flag: torch.Tensor, on_fail: OnFail) -> None:
    """Ask ``flag`` (a 0-d bool tensor, True = fine): at once outside a :func:`deferred` scope, else when the
    outermost scope ends. A False answer raises ``on_fail()`` (through the :func:`wrapped` wraps open here), unless it
    returns None."""
    wraps = _wraps.get()

    def error() -> BaseException | None:
        e = on_fail()
        for wrap in reversed(wraps):  # the innermost wrap first, as nested try/except blocks would
            if e is not None:
                e = wrap(e)
        return e

    pending = _pending.get()
    if pending is None:
        if not bool(flag):
            e = error()
            if e is not None:
                raise e
        return
    pending.append((flag, error))


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Collect the :func:`check` questions asked inside and answer them together at the end of the outermost scope
    (an inner scope leaves them to it)."""
    if _pending.get() is not None:
        yield
        return
    pending: list = []
    token = _pending.set(pending)
    try:
        yield
    except Exception as raised:
        _pending.reset(token)
        token = None
        first = _first_failure(pending)
        if first is not None:
            raise first from raised
        raise
    finally:
        if token is not None:  # a normal end, or a KeyboardInterrupt: the scope closes either way
            _pending.reset(token)
    first = _first_failure(pending)
    if first is not None:
        raise first


@contextlib.contextmanager
def wrapped(wrap: Callable[[BaseException], BaseException]) -> Iterator[None]:
    """Errors of the checks made inside go through ``wrap`` when they are raised."""
    token = _wraps.set((*_wraps.get(), wrap))
    try:
        yield
    finally:
        _wraps.reset(token)


def _first_failure(pending: list) -> BaseException | None:
    """The error of the first failed check of ``pending`` (in the order they were asked), or None. One read back per
    device holding flags."""
    if not pending:
        return None
    by_device: dict[torch.device, list[int]] = {}
    for i, (flag, _) in enumerate(pending):
        by_device.setdefault(flag.device, []).append(i)
    fine = [True] * len(pending)
    for idx in by_device.values():
        for i, ok in zip(idx, torch.stack([pending[i][0].reshape(()) for i in idx]).tolist(), strict=True):
            fine[i] = bool(ok)
    for ok, (_, error) in zip(fine, pending, strict=True):
        if not ok:
            e = error()
            if e is not None:
                return e
    return None
