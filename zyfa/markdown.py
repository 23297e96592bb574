"""The one escape of user-supplied text for Markdown (standard library only, so any package may use it).

Recipe, input, implementation and device names, titles, commands and error messages come from users' files and
command lines. Put raw into ``report.md`` or ``bench.md``, a ``|`` adds a table column and a line break ends a
table row or starts a heading (an ATX heading interrupts a paragraph). :func:`md_escape` makes such text one
inert line: every line break (``\\n``, ``\\r``, ``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028,
U+2029) becomes a space, and (``table=True``, the default: cells, headings, titles) backslashes and pipes are
escaped, so it stays inside one table cell even inside a code span. :func:`code_fence` gives a fence a code
block's text cannot close. HTML output escapes separately (``html.escape``).

Exposed: ``md_escape(text, *, table=True) -> str``, ``code_fence(text) -> str``.
"""

from __future__ import annotations

import re

__all__ = ["code_fence", "md_escape"]

_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+")


def md_escape(text: object, *, table: bool = True) -> str:
    """``text`` as one line of Markdown that adds no row, column or heading (see the module docstring)."""
    s = _BREAKS.sub(" ", str(text))
    if table:
        s = s.replace("\\", "\\\\").replace("|", "\\|")
    return s


def code_fence(text: str) -> str:
    """A backtick fence longer than any run of backticks in ``text`` (at least three)."""
    runs = [len(m) for m in re.findall(r"`+", text)]
    return "`" * max(3, max(runs, default=0) + 1)
