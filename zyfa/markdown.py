"""The one escape of user-supplied text for Markdown (standard library only, so any package may use it).

Recipe, input, implementation and device names, titles, commands and error messages come from users' files and
command lines. Put raw into ``report.md`` or ``bench.md``, a ``|`` adds a table column and a line break ends a
table row or starts a heading (an ATX heading interrupts a paragraph). :func:`md_escape` makes such text one
inert line: every line break (``\\n``, ``\\r``, ``\\v``, ``\\f``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028,
U+2029) becomes a space, and (``table=True``, the default: cells, headings, titles) backslashes and pipes are
escaped, so it stays inside one table cell even inside a code span. Outside code spans, the text is also made as
inert as the HTML report makes it (``html.escape``, only in-page ``[text](#anchor)`` links kept): a ``<`` that
would open an HTML tag or an autolink (``<script>``, ``<img onerror=...>``, ``<http://...>``) becomes ``&lt;``, in
text with a link or image target other than an anchor of the page every ``[`` is escaped, and the ``:`` of
``http://`` and the ``.`` of ``www.`` are escaped so no bare URL becomes a link. :func:`code_fence` gives a fence
a code block's text cannot close.

Exposed: ``md_escape(text, *, table=True) -> str``, ``code_fence(text) -> str``.
"""

from __future__ import annotations

import re

__all__ = ["code_fence", "md_escape"]

_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+")
# Code spans (left as they are: Markdown shows their text literally) and the text between them.
_CODE_SPAN = re.compile(r"(`+)(?:.*?[^`])?\1(?!`)")
# What would make a link, an image or raw HTML outside a code span (in-page links ``[text](#anchor)`` excepted).
_TAG = re.compile(r"<(?=[A-Za-z/!?])")
_LINK_OPEN = re.compile(r"(?<!\\)((?:\\\\)*)\[(?![^\[\]]*\]\(#[A-Za-z0-9_-]+\))")
# A link target that is not an anchor of the page (``](http://...``), or a link reference definition (``[x]: url``)
_EXTERNAL = re.compile(r"\]\((?!#[A-Za-z0-9_-]+\))|^\s*\[[^\]]*\]:")
_URL = re.compile(r"(?i)\b(https?|ftp|mailto|javascript|data|file)(:)|\b(www)(\.)")


def _inert(text: str) -> str:
    """Text outside code spans with no raw HTML, autolink, bare URL or link/image but in-page links."""
    s = _TAG.sub("&lt;", text)
    if _EXTERNAL.search(s):  # brackets that are not a link ("[2.1e-2, 2.5e-2]") are left as they are
        s = _LINK_OPEN.sub(r"\1\\[", s)
    return _URL.sub(lambda m: (m.group(1) or m.group(3)) + "\\" + (m.group(2) or m.group(4)), s)


def md_escape(text: object, *, table: bool = True) -> str:
    """``text`` as one line of Markdown that adds no row, column or heading (see the module docstring)."""
    s = _BREAKS.sub(" ", str(text))
    if table:
        s = s.replace("\\", "\\\\").replace("|", "\\|")
    out, at = [], 0
    for m in _CODE_SPAN.finditer(s):
        out += [_inert(s[at:m.start()]), m.group()]
        at = m.end()
    return "".join(out + [_inert(s[at:])])


def code_fence(text: str) -> str:
    """A backtick fence longer than any run of backticks in ``text`` (at least three)."""
    runs = [len(m) for m in re.findall(r"`+", text)]
    return "`" * max(3, max(runs, default=0) + 1)
