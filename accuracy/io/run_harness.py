"""What every measuring command shares around its rows, besides the results file (:mod:`zyfa.accuracy.io.results_io`,
:mod:`zyfa.accuracy.io.shard`): a time budget that counts work, and the refusal of implementations that cannot run here.

The run discipline itself (docs/RELIABILITY.md): every refusal before any file is written; rows appended to
``<out>.partial`` with fsync under the run lock (``ResultsFile`` / ``ShardedResults``); ``--resume`` continuing
exactly where a killed run stopped; a damaged partial refused as ``file:line: what``.

Exposed:
    WorkBudget(seconds)                 ``--max-seconds``: time spent inside ``working()`` blocks only, so loading
                                        a model never eats the budget; ``spent_out()`` between units of work
    refuse_unavailable(impls, flag)     ValueError (one line) naming the first implementation that cannot run on
                                        this machine, and how many more
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator

__all__ = ["WorkBudget", "refuse_unavailable"]


class WorkBudget:
    """A ``--max-seconds`` budget counting the time spent in :meth:`working` blocks (scoring), not loading.

    ``spent_out()`` is asked before each unit of work: a budget of 0 stops before the first, any budget above 0
    lets at least one unit run, so every ``--resume`` makes progress however slow the model is to load."""

    def __init__(self, seconds: float | None):
        if seconds is not None and not seconds >= 0:
            raise ValueError(f"--max-seconds must be 0 or more, got {seconds}")
        self.seconds = seconds
        self.spent = 0.0

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spent += time.perf_counter() - t0

    def spent_out(self) -> bool:
        """Whether no further unit of work may start (the work so far has used the budget)."""
        return self.seconds is not None and self.spent >= self.seconds


def refuse_unavailable(impls: Iterable[tuple[str, object]], flag: str = "--implementations") -> None:
    """``impls``: (name, implementation or None); ValueError ``<flag>: implementation X cannot run here: why``
    for the first whose ``available()`` says no (a recipe's emulation, None, always runs)."""
    unavailable = {}
    for name, impl in impls:
        if impl is None:
            continue
        ok, why = impl.available()
        if not ok:
            unavailable[name] = why
    if unavailable:
        first = next(iter(unavailable))
        more = f" (and {len(unavailable) - 1} more)" if len(unavailable) > 1 else ""
        raise ValueError(f"{flag}: implementation {first} cannot run here: {unavailable[first]}{more}")
