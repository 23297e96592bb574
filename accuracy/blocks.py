"""Markdown of report blocks, shared by ``accuracy.report`` and ``accuracy.impact`` (torch-free).

A block is a tuple: ``("h", level, text)``, ``("p", text)``, ``("code", text)``,
``("table", key, header, rows, prose)`` or ``("img", path, caption)``.
"""

from __future__ import annotations


def md_cell(s: object) -> str:
    """A table cell: pipes escaped, newlines flattened."""
    return str(s).replace("|", "\\|").replace("\n", " ")


def blocks_markdown(blocks: list[tuple], *, anchors: bool = False) -> list[str]:
    """Markdown lines of ``blocks``; ``anchors`` puts ``<a id=key>`` before each table (the report's links)."""
    out: list[str] = []
    for b in blocks:
        if b[0] == "h":
            out += ["#" * b[1] + " " + b[2], ""]
        elif b[0] == "p":
            out += [b[1], ""]
        elif b[0] == "code":
            out += ["```", b[1], "```", ""]
        elif b[0] == "table":
            _, key, header, rows, _prose = b
            if anchors:
                out += [f'<a id="{key}"></a>', ""]
            out.append("| " + " | ".join(md_cell(c) for c in header) + " |")
            out.append("|" + "|".join("---" for _ in header) + "|")
            out += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows]
            out.append("")
        elif b[0] == "img":
            out += [f"![{b[2]}]({b[1]})", "", f"*{b[2]}*", ""]
    return out
