"""Report blocks and the one number format, shared by the report and the impact section (torch-free).

A block is a tuple: ``("h", level, text)``, ``("p", text)``, ``("code", text)``,
``("table", key, header, rows, prose)`` or ``("img", path, caption)``.
"""

from __future__ import annotations

import math
import re

from zyfa.markdown import code_fence, md_escape


def md_cell(s: object) -> str:
    """A table cell: :func:`zyfa.markdown.md_escape` (line breaks flattened, backslashes and pipes escaped)."""
    return md_escape(s)


def blocks_markdown(blocks: list[tuple], *, anchors: bool = False) -> list[str]:
    """Markdown lines of ``blocks``; ``anchors`` puts ``<a id=key>`` before each table (the report's links)."""
    out: list[str] = []
    for b in blocks:
        if b[0] == "h":
            out += ["#" * b[1] + " " + md_escape(b[2]), ""]
        elif b[0] == "p":
            out += [md_escape(b[1], table=False), ""]
        elif b[0] == "code":
            fence = code_fence(b[1])
            out += [fence, b[1], fence, ""]
        elif b[0] == "table":
            _, key, header, rows, _prose = b
            if anchors:
                out += [f'<a id="{key}"></a>', ""]
            out.append("| " + " | ".join(md_cell(c) for c in header) + " |")
            out.append("|" + "|".join("---" for _ in header) + "|")
            out += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows]
            out.append("")
        elif b[0] == "img":
            cap = md_escape(b[2], table=False)
            out += [f"![{cap}]({b[1]})", "", f"*{cap}*", ""]
    return out


# the named number formats; any other ``kind`` is a Python format spec (e.g. ".2e", "+.4f", ".1%")
KINDS = {"err": ".3e", "db": ".2f", "ratio": ".3f", "corr": "+.2f", "cos": ".6f", "feat": ".3g", "num": ".4g"}


def fmt(v, kind: str = "err") -> str:
    """The one number format of the reports (the accuracy report and the model-impact section).

    ``kind``: ``err`` (errors, fractions) 3 significant digits in scientific notation; ``db`` 2 decimals;
    ``ratio`` 3 decimals; ``corr`` signed 2 decimals; ``cos`` 6 decimals; ``feat`` 3 significant digits;
    ``int``; ``num`` (benchmark values) 4 significant digits; anything else is a format spec (``".2e"``).
    None -> "-"; NaN -> "nan"; infinities "inf" / "-inf"; booleans "yes" / "no"; strings as they are.
    """
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, str):
        return v
    if isinstance(v, int) and kind in ("int", "num"):
        return str(v)
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if kind == "int":
        return str(int(v))
    return format(v, KINDS.get(kind, kind))


def kind_of(metric: str) -> str:
    """The format kind of a result column: ``db``, ``cos``, ``feat`` or ``err``."""
    if metric.endswith("_db"):
        return "db"
    if metric.endswith("cosine"):
        return "cos"
    if metric.startswith("feat_"):
        return "feat"
    return "err"


def fmt_ci(ci, kind: str = "err") -> str:
    """``estimate [low, high]`` of an (estimate, low, high) triple (e.g. ``zyfa.accuracy.scoring.metrics.CI``); the
    estimate
    alone when the interval is a point or undefined."""
    est, lo, hi = (float(x) for x in ci)
    if lo == hi or math.isnan(lo) or math.isnan(hi):  # one value, or no interval
        return fmt(est, kind)
    return f"{fmt(est, kind)} [{fmt(lo, kind)}, {fmt(hi, kind)}]"


def slug(s: object) -> str:
    """Lower-case letters and digits joined by ``-`` (table keys, figure names)."""
    return re.sub(r"[^a-z0-9]+", "-", str(s).lower()).strip("-")


def sharding_line(prov: dict) -> str | None:
    """One sentence on how a sharded run (``torchrun``, :mod:`zyfa.accuracy.io.shard`) ran, from its merged provenance:
    the
    number of ranks and the backend, each rank's rows (and devices, where recorded) and the wall time; None for a
    run of one process without torchrun."""
    world = prov.get("world_size")
    if not isinstance(world, int):
        return None
    parts = []
    for r in prov.get("ranks") or []:
        if isinstance(r, dict) and "rank" in r:
            devs = r.get("devices")
            parts.append(f"rank {r['rank']} {r.get('rows', '?')} rows" + (f" on {', '.join(devs)}" if devs else ""))
    wall = prov.get("wall_time_s")
    text = f"{world} rank{'s' if world != 1 else ''} ({prov.get('backend') or 'no process group'})"
    if parts:
        text += ": " + "; ".join(parts)
    if isinstance(wall, (int, float)):
        text += f"; wall time {wall:.1f} s"
    return text
