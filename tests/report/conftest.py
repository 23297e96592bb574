"""A small result file made by the real runner on tiny Gaussian inputs, and parsers for the rendered report."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from zyfa.accuracy.inputs.attention_input import GaussianSpec, make_gaussian
from zyfa.accuracy.inputs.features import input_features
from zyfa.accuracy.io.results_io import write_results
from zyfa.accuracy.operator.runner import run_accuracy

RECIPES = ["zyfa", "zyfa-exp2", "ck"]
FLOAT = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]\d+)?|nan|-?inf")


@pytest.fixture(scope="session")
def small_results(tmp_path_factory):
    """results.jsonl: 2 lengths x 2 masks x 2 seeds of a 2:1 GQA head dim 64 input, 3 recipes, with features."""
    specs = [GaussianSpec(heads_q=2, heads_kv=1, seq=s, head_dim=64, causal=c, seed=seed)
             for s in (128, 256) for c in (False, True) for seed in (0, 1)]
    inputs = [make_gaussian(s) for s in specs]
    rows = run_accuracy(inputs, RECIPES, progress=False)
    feats = {inp.name: input_features(inp) for inp in inputs}
    for r in rows:
        r.update(feats[r["input"]])
    path = tmp_path_factory.mktemp("results") / "results.jsonl"
    write_results(rows, path)
    return path, list(rows)


def md_tables(text: str) -> dict[str, list[list[str]]]:
    """Tables of a rendered report.md by their anchor id: header row first."""
    lines = text.splitlines()
    out = {}
    for i, line in enumerate(lines):
        m = re.fullmatch(r'<a id="([^"]+)"></a>', line.strip())
        if not m:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("|"):
            j += 1
        rows = []
        while j < len(lines) and lines[j].startswith("|"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", lines[j])[1:-1]]
            if not all(set(c) <= {"-", ":"} for c in cells):
                rows.append(cells)
            j += 1
        out[m.group(1)] = rows
    return out


class _Tables(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._id = None
        self._row = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._id = a.get("id")
            self.tables[self._id] = []
        elif tag == "tr" and self._id is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._id].append(self._row)
            self._row = None
        elif tag == "table":
            self._id = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def html_tables(text: str) -> dict[str, list[list[str]]]:
    p = _Tables()
    p.feed(text)
    return p.tables


def numbers(cell: str) -> list[float]:
    return [float(x) for x in FLOAT.findall(cell)]
