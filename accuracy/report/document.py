"""The report document: blocks rendered alike to Markdown and to one self-contained HTML file, written to a
folder, and checked in headless Chromium.

Exposed: ``Doc``, ``render_markdown(doc)``, ``render_html(doc)``, ``write_report(doc, out_dir)``,
``screenshot(page, png)``, ``save_screenshot(page, prog)``.
"""

from __future__ import annotations

import base64
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from zyfa.accuracy.report.blocks import blocks_markdown

from zyfa.markdown import md_escape


@dataclass
class Doc:
    """Blocks rendered alike to Markdown and HTML: ("h", level, text), ("p", text), ("code", text),
    ("table", key, header, rows, text), ("img", path, caption[, "side"])."""

    title: str
    blocks: list = field(default_factory=list)
    images: dict = field(default_factory=dict)  # file name -> PNG bytes

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def table(self, key: str, header: Sequence[str], rows: Sequence[Sequence[str]], *, text: bool = False) -> None:
        """text: cells hold prose (left-aligned, wrapped in HTML); else numbers (right-aligned, one line)."""
        self.blocks.append(("table", key, list(header), [list(r) for r in rows], text))

    def img(self, name: str, png: bytes, caption: str, *, side: bool = False) -> None:
        """side: in HTML, the figure floats right of the blocks that follow (until the next heading)."""
        self.images[name] = png
        self.blocks.append(("img", name, caption, "side") if side else ("img", name, caption))


def render_markdown(doc: Doc) -> str:
    return "\n".join([f"# {md_escape(doc.title)}", "", *blocks_markdown(doc.blocks, anchors=True)]).rstrip() + "\n"


def _inline_html(text: str) -> str:
    s = html.escape(text, quote=False)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)
    return re.sub(r"\[([^\]]+)\]\((#[A-Za-z0-9_-]+)\)", r'<a href="\2">\1</a>', s)  # links inside the page


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#1a1a1a;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}h3{margin-top:1.5em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0 1em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right;white-space:nowrap}
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}
.tw{overflow-x:auto}pre{background:#f6f6f6;padding:.7em;overflow-x:auto;white-space:pre-wrap;
overflow-wrap:anywhere}
code{background:#f2f2f2;padding:0 .2em;overflow-wrap:anywhere}figure{margin:1em 0}img{max-width:100%}
figcaption{font-size:.85em;color:#555}
figure.side{float:right;width:36%;margin:0 0 .5em 1em}h2{clear:both}
table.text td{text-align:left;white-space:normal;max-width:48em;overflow-wrap:anywhere}
"""


def render_html(doc: Doc) -> str:
    """One self-contained HTML document: inline CSS, images as data URIs, no script."""
    body = [f"<h1>{_inline_html(doc.title)}</h1>"]
    for b in doc.blocks:
        if b[0] == "h":
            body.append(f"<h{b[1]}>{_inline_html(b[2])}</h{b[1]}>")
        elif b[0] == "p":
            body.append(f"<p>{_inline_html(b[1])}</p>")
        elif b[0] == "code":
            body.append(f"<pre><code>{html.escape(b[1], quote=False)}</code></pre>")
        elif b[0] == "table":
            _, key, header, rows, text = b
            cls = ' class="text"' if text else ""
            th = "".join(f"<th>{_inline_html(c)}</th>" for c in header)
            trs = "".join("<tr>" + "".join(f"<td>{_inline_html(c)}</td>" for c in r) + "</tr>" for r in rows)
            body.append(f'<div class="tw"><table id="{html.escape(key)}"{cls}><thead><tr>{th}</tr></thead>'
                        f"<tbody>{trs}</tbody></table></div>")
        elif b[0] == "img":
            data = base64.b64encode(doc.images[b[1]]).decode("ascii")
            cap = _inline_html(b[2])
            cls = ' class="side"' if len(b) > 3 and b[3] == "side" else ""
            body.append(f'<figure{cls}><img alt="{html.escape(b[2])}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{cap}</figcaption></figure>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(doc.title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write_report(doc: Doc, out_dir: str | Path) -> dict[str, Path]:
    """Write report.md, the PNGs and report.html into ``out_dir``; old fig_*.png there are removed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("fig_*.png"):
        if old.name not in doc.images:
            old.unlink()
    for name, png in doc.images.items():
        (out / name).write_bytes(png)
    md = out / "report.md"
    md.write_text(render_markdown(doc), encoding="utf-8")
    page = out / "report.html"
    page.write_text(render_html(doc), encoding="utf-8")
    return {"markdown": md, "html": page}


CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0")


def screenshot(page: str | Path, png: str | Path, *, width: int = 1280, height: int = 3000,
               timeout: float = 120) -> list[str]:
    """Open ``page`` in headless Chromium (fresh profile, no network) and save a screenshot of its top.

    Returns the console lines Chromium logged (errors, uncaught exceptions): empty for a clean page.
    Raises FileNotFoundError without chromium, RuntimeError if no screenshot was written.
    """
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        raise FileNotFoundError("chromium not found (Debian: apt-get install chromium)")
    png = Path(png).resolve()
    with tempfile.TemporaryDirectory() as prof:
        res = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={prof}", f"--window-size={width},{height}",
                              f"--screenshot={png}", Path(page).resolve().as_uri()],
                             capture_output=True, text=True, timeout=timeout, env={**os.environ, "HOME": prof})
    if not png.is_file():
        raise RuntimeError(f"chromium wrote no screenshot (exit {res.returncode}): {res.stderr[-500:]}")
    return [line for line in res.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


# the first screen of a report: what a reader sees on opening report.html
FIRST_SCREEN = (1280, 1000)


def save_screenshot(page: Path, prog: str = "zyfa report") -> int:
    """Save ``report_screenshot.png`` next to ``page``: its first screen (:data:`FIRST_SCREEN`); 0, or 1 with one
    line on stderr (no Chromium, no screenshot, console errors)."""
    png = page.with_name("report_screenshot.png")
    try:
        console = screenshot(page, png, width=FIRST_SCREEN[0], height=FIRST_SCREEN[1])
    except (FileNotFoundError, RuntimeError, OSError) as e:
        print(f"{prog}: no screenshot: {e}", file=sys.stderr)
        return 1
    if console:
        print(f"{prog}: console errors in report.html:\n" + "\n".join(console), file=sys.stderr)
        return 1
    print(f"wrote {png} (headless Chromium, no console errors)")
    return 0
