"""One verdict per implementation from its result rows, with the reason, for every command that scores kernels.

The rows of ``zyfa accuracy`` / ``zyfa study`` (:mod:`zyfa.accuracy.implementations.real_rows`,
:mod:`zyfa.accuracy.implementations.conformance`),
``zyfa longctx`` and ``zyfa cliffs`` carry a ``status`` per row and the why in ``reason`` or ``error``. A kernel
that crashed on one input or ignored the mask on one input is not ``ok`` on the others: the verdict of an
implementation is the worst status among its rows, in the order of :data:`VERDICTS`:

- ``nonconforming``: a row is ``nonconforming`` (a conformance probe failed, or the mask at a scored input's own
  lengths): its outputs are not the attention the contract describes, so its numbers mean nothing;
- ``failed``: a row ``failed`` (the kernel raised, returned a malformed output, or did not load);
- ``suspect``: a row is ``suspect`` (its error ratio to its paired emulation is outside the band);
- ``ok``: every row that ran is ``ok``;
- ``not run``: no row ran (each is ``unsupported`` / ``refused``: inputs outside the kernel's declared limits).

Rows a kernel declined (``unsupported``, ``refused``) do not change the verdict; they are named in its reason.
The reason says on how many of the implementation's rows the deciding status was seen and the most frequent
reason (with the count of other reasons).

:func:`verdict_lines` is the one place the terminal summary of a scoring command is built (``zyfa accuracy``,
``zyfa study``, ``zyfa longctx``, ``zyfa cliffs`` all print it); the study's front page tables the same
:func:`implementation_verdicts`.

Exposed: ``VERDICTS``, ``Verdict``, ``implementation_verdicts(rows, name_of=...)``, ``verdict_lines(rows, ...)``,
``short_reason(text)``, ``row_reason(row)``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# worst first: the verdict of an implementation is the first of these that one of its rows has
VERDICTS = ("nonconforming", "failed", "suspect", "ok")
DECLINED = ("unsupported", "refused")  # the kernel said it cannot take the input: not a failure
NOT_RUN = "not run"
SHORT = 80  # the most characters of a reason in a table cell


@dataclass(frozen=True)
class Verdict:
    """An implementation's verdict: ``name``, ``verdict`` (one of :data:`VERDICTS` or ``not run``), ``reason``
    (empty for a clean ``ok``), ``n`` (its rows), ``n_bad`` (rows with the deciding status) and ``n_declined``
    (rows it declined: ``unsupported`` or ``refused``)."""

    name: str
    verdict: str
    reason: str
    n: int
    n_bad: int
    n_declined: int = 0

    @property
    def scored(self) -> bool:
        """Whether its numbers may be shown: ``ok`` or ``suspect`` (a suspect number is shown with its verdict)."""
        return self.verdict in ("ok", "suspect")

    def short(self, limit: int = SHORT) -> str:
        """The verdict in a table cell: ``<verdict>: <reason cut to limit>``; an ``ok`` with declined rows
        ``ok (declined k of n)``; a clean ``ok`` alone."""
        if self.verdict == "ok":
            return f"ok (declined {self.n_declined} of {self.n})" if self.n_declined else "ok"
        return f"{self.verdict}: {short_reason(self.reason, limit)}" if self.reason else self.verdict


def default_name(row: dict) -> str:
    """A row's implementation: ``implementation`` where it has one, else its recipe (an emulation)."""
    return str(row.get("implementation") or row.get("recipe") or "?")


def row_reason(row: dict) -> str:
    """The why of a row's status (``reason``, else ``error``), without a leading ``<status>: `` it may repeat."""
    text = str(row.get("reason") or row.get("error") or "").strip()
    status = str(row.get("status") or "")
    if status and text.startswith(f"{status}: "):
        text = text[len(status) + 2:]
    return text or "no reason recorded in the rows"


def short_reason(text: str, limit: int = SHORT) -> str:
    """``text`` without the words a table row already says (``kernel '<name>' `` before what it did,
    ``conformance probe ``), cut to ``limit`` characters at a word boundary (an ellipsis where it was cut)."""
    text = " ".join(str(text).split())
    text = re.sub(r"^kernel '[^']*' ", "", text).replace("conformance probe ", "probe ")
    if len(text) <= limit:
        return text
    cut = text[:limit - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "…"


def _because(rows: Sequence[dict], status: str, n: int) -> str:
    mine = [r for r in rows if r.get("status") == status]
    counts = Counter(row_reason(r) for r in mine)
    top, _ = counts.most_common(1)[0]
    others = len(counts) - 1
    where = f"on {len(mine)} of {n} rows" if len(mine) < n else "on its only row" if n == 1 else f"on all {n} rows"
    return f"{top} ({where}" + (f"; {others} other reason{'s' if others > 1 else ''})" if others else ")")


def implementation_verdicts(rows: Sequence[dict], name_of: Callable[[dict], str] = default_name) -> list[Verdict]:
    """One :class:`Verdict` per implementation of ``rows`` (named by ``name_of``), in the order they first
    appear. A row without ``status`` (an emulated recipe's) is ``ok``."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(name_of(r), []).append(r)
    out = []
    for name, mine in by.items():
        statuses = [str(r.get("status") or "ok") for r in mine]
        n = len(mine)
        declined = [r for r, s in zip(mine, statuses, strict=True) if s in DECLINED]
        worst = next((v for v in VERDICTS if v in statuses), None)
        if worst is None:
            out.append(Verdict(name, NOT_RUN, _because(mine, statuses[0], n) if declined else "no rows ran",
                               n, n, len(declined)))
            continue
        reason = "" if worst == "ok" else _because(mine, worst, n)
        if declined:
            kinds = sorted({str(r.get("status")) for r in declined})
            note = f"declined {len(declined)} of {n} rows ({'/'.join(kinds)}): {row_reason(declined[0])}"
            reason = f"{reason}; {note}" if reason else note
        out.append(Verdict(name, worst, reason, n, statuses.count(worst), len(declined)))
    return out


def verdict_lines(rows: Sequence[dict], name_of: Callable[[dict], str] = default_name,
                  only: Callable[[dict], bool] | None = None) -> list[str]:
    """The terminal summary of a scoring command: one line per implementation that is not a clean ``ok``
    (``<verdict>: <name>: <reason>``), then one line naming the clean ones (``ok: a, b, c``). ``only``: the rows
    to judge (default all). [] without rows."""
    picked = [r for r in rows if only is None or only(r)]
    verdicts = implementation_verdicts(picked, name_of)
    lines = [f"{v.verdict}: {v.name}: {v.reason}" for v in verdicts if v.verdict != "ok" or v.reason]
    clean = [v.name for v in verdicts if v.verdict == "ok" and not v.reason]
    if clean:
        lines.append("ok: " + ", ".join(clean))
    return lines
