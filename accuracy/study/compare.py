"""``zyfa compare A.jsonl B.jsonl``: did my change help? Two result files of ``zyfa accuracy`` or ``zyfa study``,
compared per implementation and input.

For each implementation (a recipe's emulation or a real kernel) present in both files, and each error metric both
carry (``deq_rel_l2``, ``orig_rel_l2``), the ratio B / A is taken per input over the inputs both files have (an
input is its name and content hash: the same name with other data is not the same input). The summary is
:func:`zyfa.accuracy.scoring.verdict.paired_verdict` on those pairs (geometric-mean ratio, cluster-bootstrap interval,
the verdict against a threshold, by default 2%): the unit is the input; capture rows of one head each are clustered
by their capture file and layer, and rows holding per-head errors (``*_heads``) count each head as a unit
clustered by its input. Units where either side has no finite positive error (a failed row, NaN) are left out and
counted. ``deq_`` is not compared for a kernel that quantizes for itself (a plug-in): its reference is the
FP64 oracle on the paired recipe's dequantized inputs, which the kernel never received.

A user's kernel is identified across runs by its name, not by the path string as typed: ``plugin:<path>:<fn>``
is keyed by the file's base name and the function (a relative and an absolute path to one file are one kernel),
and the SHA-256 of its file, where the rows or the provenance carry it (``plugin_sha256``,
``implementations_plugins``), says whether the kernel changed between the runs; a plug-in found in one file only
whose file hash equals that of a plug-in in the other file only is the same kernel renamed, and is matched.

Each side's status (``ok``, ``suspect``, ``nonconforming``, ``failed``, ``unsupported``; a recipe row is ``ok``
unless its output holds NaN) is shown beside the ratio with the first reason. ``--bench A.json B.json`` adds the
speed: per implementation, the ratio of median kernel times B / A over the cases both ``zyfa bench`` files
timed. Last, what differs in the two runs' provenance (commit, versions, device, seed, inputs' hashes, kernels'
file hashes).

The command (arguments, files, exit status) is :mod:`zyfa.accuracy.study.compare_cli`.

Exposed: ``compare(a, b, *, threshold=0.02, ...) -> Comparison``, ``compare_speed(bench_a, bench_b)``,
``kernel_key(name) -> str``, ``render(comparison) -> str``, ``load_results(path) -> Side``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from zyfa.accuracy.io.results_io import read_jsonl, read_results, row_key, run_provenances
from zyfa.accuracy.report.speed import load_bench
from zyfa.accuracy.scoring.verdict import Verdict, paired_verdict

from zyfa.markdown import md_escape

__all__ = ["METRICS", "THRESHOLD", "Comparison", "Side", "compare", "compare_speed", "kernel_key", "load_results",
           "render"]

METRICS = ("deq_rel_l2", "orig_rel_l2")
THRESHOLD = 0.02
# provenance fields whose difference is worth a line (run ids and dates always differ)
PROVENANCE_FIELDS = ("git_commit", "git_dirty", "zyfa_version", "python", "torch", "torch_cuda", "numpy", "scipy",
                     "platform", "cpu", "cpu_count", "cuda_device", "device", "device_name", "seed",
                     "implementations_platform", "study_mode")
BENCH_CASE = ("input", "b", "h", "h_kv", "s", "d_qk", "d_v", "causal")


# ---------------------------------------------------------------------------------------------- reading

@dataclass
class Side:
    """One result file: its path, rows and provenance."""

    path: str
    rows: list[dict]
    provenance: dict

    def label(self) -> str:
        """Run id, date, commit and device; of each segment of a resumed file, oldest first, joined by " + "."""
        def one(p: dict) -> str:
            bits = [f"run {p['run_id']}" if p.get("run_id") else "", p.get("date_utc") or "",
                    f"git {str(p['git_commit'])[:12]}" if p.get("git_commit") else "", p.get("device_name") or ""]
            return ", ".join(b for b in bits if b)
        return " + ".join(one(p) for p in run_provenances(self.provenance))


def load_results(path: str | Path) -> Side:
    """A ``zyfa accuracy`` / ``zyfa study`` result file (.jsonl, or .csv with its sidecar) as a :class:`Side`.

    Raises:
        ValueError: one line naming the file: missing, not a result file, or without rows.
    """
    p = Path(path)
    if not p.exists():
        raise ValueError(f"no such file: {p}")
    if p.is_dir():
        raise ValueError(f"{p} is a directory; give a results file (.jsonl), e.g. {p / 'results.jsonl'}")
    if p.suffix.lower() == ".csv":
        res = read_results(p)
        rows, prov = list(res), res.provenance
    elif p.suffix.lower() == ".jsonl":
        rows, prov = read_jsonl(p)
    else:
        raise ValueError(f"{p}: not a result file (zyfa accuracy or zyfa study writes .jsonl or .csv)")
    if not rows:
        raise ValueError(f"{p}: no result rows")
    return Side(str(p), rows, prov)


# ---------------------------------------------------------------------------------------------- identity

def kernel_key(name: str) -> str:
    """How an implementation is matched across runs: a plug-in named by a file path (``plugin:<path>:<fn>``)
    by the file's base name and the function; any other name as it is."""
    if not name.startswith("plugin:"):
        return name
    target, _, fn = name[len("plugin:"):].rpartition(":")
    if target.endswith(".py") or "/" in target or "\\" in target:
        return f"plugin:{target.replace(chr(92), '/').rsplit('/', 1)[-1]}:{fn}"
    return name


def _impl_name(row: dict) -> str:
    return row.get("implementation") or row.get("recipe") or "?"


def _sha(row: dict, prov: dict) -> str | None:
    sha = row.get("plugin_sha256")
    if sha:
        return str(sha)
    entry = (prov.get("implementations_plugins") or {}).get(row.get("implementation") or "")
    return str(entry["sha256"]) if isinstance(entry, dict) and entry.get("sha256") else None


def _status(row: dict) -> tuple[str, str]:
    """(status, reason) of a row: a real row's own; a recipe row is ok unless its output holds NaN."""
    if row.get("real") or "status" in row:
        return str(row.get("status") or "ok"), str(row.get("reason") or row.get("error") or "")
    if row.get("has_nan"):
        return "nan", "NaN/Inf in the output"
    return "ok", ""


def _input_id(row: dict) -> tuple:
    return row_key(row)[:2]  # the input part of the one row identity: (input, content hash)


def _cluster(row: dict) -> tuple:
    """The independent group of a per-input unit: a capture's (file, layer) when the row is one of its layers'
    heads, else the input itself."""
    if row.get("input_source") == "capture" and row.get("input_layer") is not None:
        return ("layer", row.get("input_file_sha256") or row.get("input_file") or row.get("input_model"),
                row.get("input_layer"))
    return ("input", *_input_id(row))


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


# ---------------------------------------------------------------------------------------------- comparison

@dataclass
class ImplComparison:
    """One implementation in both files."""

    key: str
    names: tuple[str, str]
    status: tuple[Counter, Counter]
    reasons: tuple[str, str]
    sha: tuple[str | None, str | None]
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    per_input: list[dict] = field(default_factory=list)

    @property
    def kernel_changed(self) -> bool | None:
        """True/False when both sides carry the kernel's file hash, else None."""
        a, b = self.sha
        return None if a is None or b is None else a != b


@dataclass
class Comparison:
    """What :func:`compare` found."""

    a: Side
    b: Side
    threshold: float
    impls: list[ImplComparison]
    only_a: list[str]
    only_b: list[str]
    inputs_common: int
    inputs_only_a: list[str]
    inputs_only_b: list[str]
    inputs_rehashed: list[str]
    provenance_diff: list[tuple[str, str, str]]
    speed: list[dict] = field(default_factory=list)
    speed_meta_diff: list[tuple[str, str, str]] = field(default_factory=list)


def _index(side: Side) -> dict[str, dict[tuple, dict]]:
    out: dict[str, dict[tuple, dict]] = {}
    for r in side.rows:
        out.setdefault(kernel_key(_impl_name(r)), {})[_input_id(r)] = r
    return out


def _file_hashes(index: dict[str, dict[tuple, dict]], prov: dict) -> dict[str, str]:
    """kernel key -> its file's sha256, for the plug-ins whose rows or provenance carry one."""
    out = {}
    for key, rows in index.items():
        sha = next((h for r in rows.values() if (h := _sha(r, prov))), None)
        if sha:
            out[key] = sha
    return out


def _match_renamed(ia: dict, ib: dict, pa: dict, pb: dict) -> None:
    """A plug-in in one file only, whose file hash equals that of a plug-in in the other file only, is the same
    kernel under another file name: B's rows are keyed by A's name (in place)."""
    ha, hb = _file_hashes(ia, pa), _file_hashes(ib, pb)
    for kb in [k for k in ib if k not in ia and k in hb]:
        same = [ka for ka in ia if ka not in ib and ha.get(ka) == hb[kb]]
        if len(same) == 1:
            ib[same[0]] = ib.pop(kb)


def _units(ra: dict, rb: dict, metric: str) -> list[tuple[tuple, tuple, float, float]]:
    """(unit, cluster, a, b) of one input: each head where both rows hold the same number of per-head errors,
    else the input."""
    ha, hb = ra.get(f"{metric}_heads"), rb.get(f"{metric}_heads")
    if isinstance(ha, list) and isinstance(hb, list) and len(ha) == len(hb) > 1:
        pairs = enumerate(zip(ha, hb, strict=True))
        return [((*_input_id(ra), i), ("input", *_input_id(ra)), x, y) for i, (x, y) in pairs]
    return [(_input_id(ra), _cluster(ra), ra.get(metric), rb.get(metric))]


def compare(a: Side, b: Side, *, threshold: float = THRESHOLD, alpha: float = 0.05, seed: int = 0,
            n_boot: int = 2000) -> Comparison:
    """Compare two result files (module docstring).

    Raises:
        ValueError: no implementation run on an input both files have.
    """
    ia, ib = _index(a), _index(b)
    _match_renamed(ia, ib, a.provenance, b.provenance)
    inputs_a = {_input_id(r) for r in a.rows}
    inputs_b = {_input_id(r) for r in b.rows}
    common_inputs = inputs_a & inputs_b
    impls = []
    for key in [k for k in ia if k in ib]:
        rows_a, rows_b = ia[key], ib[key]
        shared = [u for u in rows_a if u in rows_b]
        if not shared:
            continue
        first_a, first_b = next(iter(rows_a.values())), next(iter(rows_b.values()))
        sa = Counter(_status(r)[0] for r in rows_a.values())
        sb = Counter(_status(r)[0] for r in rows_b.values())
        why_a = next((_status(r)[1] for r in rows_a.values() if _status(r)[1]), "")
        why_b = next((_status(r)[1] for r in rows_b.values() if _status(r)[1]), "")
        c = ImplComparison(key, (_impl_name(first_a), _impl_name(first_b)), (sa, sb), (why_a, why_b),
                           (_file_hashes({key: rows_a}, a.provenance).get(key),
                            _file_hashes({key: rows_b}, b.provenance).get(key)))
        for u in shared:
            ra, rb = rows_a[u], rows_b[u]
            c.per_input.append({"input": u[0], "status_a": _status(ra)[0], "status_b": _status(rb)[0],
                                **{f"{m}_{s}": r.get(m) for m in METRICS for s, r in (("a", ra), ("b", rb))}})
        for m in METRICS:
            if m.startswith("deq_") and "self" in (first_a.get("quantizes"), first_b.get("quantizes")):
                continue  # a kernel that quantizes for itself never received the inputs of deq_'s reference
            units = [x for u in shared for x in _units(rows_a[u], rows_b[u], m)]
            if not any(x[2] is not None or x[3] is not None for x in units):
                continue  # the metric is in neither file for this implementation
            good = [x for x in units if _positive(x[2]) and _positive(x[3])]
            c.dropped[m] = len(units) - len(good)
            if good:
                c.verdicts[m] = paired_verdict(
                    [x[2] for x in good], [x[3] for x in good], units=[x[0] for x in good],
                    clusters=[x[1] for x in good], threshold=threshold, alpha=alpha, ratio=True,
                    higher_is_better=False, metric=m, seed=seed, n_boot=n_boot, arms=("A", "B"))
        impls.append(c)
    if not impls:
        raise ValueError(f"{a.path} and {b.path} have no implementation run on an input both hold "
                         f"({len(common_inputs)} input(s) in common; implementations {', '.join(sorted(ia))[:200]} "
                         f"against {', '.join(sorted(ib))[:200]})")
    names_a = {n for n, _ in inputs_a}
    names_b = {n for n, _ in inputs_b}
    rehashed = sorted(n for n in names_a & names_b
                      if {h for m, h in inputs_a if m == n} != {h for m, h in inputs_b if m == n})
    return Comparison(
        a=a, b=b, threshold=threshold, impls=impls,
        only_a=sorted(set(ia) - set(ib)), only_b=sorted(set(ib) - set(ia)), inputs_common=len(common_inputs),
        inputs_only_a=sorted(str(n) for n, _ in inputs_a - inputs_b if n not in rehashed),
        inputs_only_b=sorted(str(n) for n, _ in inputs_b - inputs_a if n not in rehashed),
        inputs_rehashed=rehashed, provenance_diff=_dict_diff(a.provenance, b.provenance, PROVENANCE_FIELDS))


def _dict_diff(pa: dict, pb: dict, fields) -> list[tuple[str, str, str]]:
    return [(k, str(pa.get(k)), str(pb.get(k))) for k in fields
            if (k in pa or k in pb) and pa.get(k) != pb.get(k)]


def compare_speed(bench_a: str | Path, bench_b: str | Path, *, threshold: float = THRESHOLD,
                  seed: int = 0, n_boot: int = 2000) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """Per implementation (``impl`` and ``recipe`` of ``zyfa bench`` rows), the ratio of median kernel times B / A
    over the cases (input, shape, length, mask) both files timed: the median of the per-case ratios and the
    paired verdict (cases as units). Returns (rows, differences of the two files' metadata).

    Raises:
        ValueError: a file that is missing or not a bench file.
    """
    loaded = []
    for p in (bench_a, bench_b):
        if not Path(p).is_file():
            raise ValueError(f"no such bench file: {p}")
        (_name, meta, rows), = load_bench([p])
        if not rows:
            raise ValueError(f"{p}: not a zyfa bench file (no rows)")
        loaded.append((meta, {(*(r.get(k) for k in BENCH_CASE), kernel_key(str(r.get("impl"))), r.get("recipe")): r
                              for r in rows if _positive(r.get("ms")) and "error" not in r}))
    (ma, ra), (mb, rb) = loaded
    by_impl: dict[tuple, list[tuple]] = {}
    for k in ra:
        if k in rb:
            by_impl.setdefault(k[-2:], []).append((k, ra[k]["ms"], rb[k]["ms"]))
    out = []
    for (impl, recipe), cases in by_impl.items():
        ratios = sorted(y / x for _, x, y in cases)
        n = len(ratios)
        median = ratios[n // 2] if n % 2 else (ratios[n // 2 - 1] + ratios[n // 2]) / 2
        v = paired_verdict([x for _, x, _ in cases], [y for _, _, y in cases], units=[c[0] for c in cases],
                           threshold=threshold, ratio=True, higher_is_better=False, metric="kernel time",
                           seed=seed, n_boot=n_boot, arms=("A", "B"))
        out.append({"impl": impl, "recipe": recipe, "cases": n, "median_ratio": median, "verdict": v})
    diff = _dict_diff(ma, mb, ("git_commit", "device", "versions", "repeats", "kernels"))
    return out, diff


# ---------------------------------------------------------------------------------------------- Markdown

def _f(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return f"{x:.4g}"


def _status_cell(counts: Counter, reason: str) -> str:
    cell = ", ".join(f"{s} {n}" if len(counts) > 1 or n > 1 else s for s, n in sorted(counts.items()))
    return cell + (f": {reason[:160]}" if reason and set(counts) != {"ok"} else "")


def _kernel_cell(c: ImplComparison) -> str:
    if c.kernel_changed is None:
        return "-" if not any(c.sha) else f"hash on one side only ({(c.sha[0] or c.sha[1])[:12]})"
    if c.kernel_changed:
        return f"**changed** ({c.sha[0][:12]} → {c.sha[1][:12]})"
    return f"same ({c.sha[0][:12]})"


def render(cmp: Comparison) -> str:
    """The comparison as Markdown."""
    t = cmp.threshold
    lines = ["# zyfa compare", "",
             f"- A: `{md_escape(cmp.a.path)}` ({md_escape(cmp.a.label())})",
             f"- B: `{md_escape(cmp.b.path)}` ({md_escape(cmp.b.label())})", "",
             f"Error ratio B / A per implementation, paired over the {cmp.inputs_common} input(s) both files hold "
             "(an input: its name and content hash). B/A is the geometric mean of the per-unit ratios with its 95% "
             "cluster-bootstrap interval (unit: the input; capture heads clustered by file and layer; per-head "
             "errors count each head, clustered by input). Verdict: `no effect larger than "
             f"{t:g}` when the interval lies inside 1 ± {t:g}, `effect` when it excludes 1 and reaches beyond, "
             "else inconclusive with the smallest effect the design could detect (accuracy.scoring.verdict). "
             "Below 1: B has less error. A kernel of your own (it quantizes for itself) is compared on orig_rel_l2 "
             "only: deq_'s reference is built on the paired recipe's inputs, which it never received.", ""]
    changed = [c for c in cmp.impls if c.kernel_changed]
    for c in changed:
        lines.append(f"**The kernel `{md_escape(c.key)}` changed between the runs** (file sha256 "
                     f"{c.sha[0][:12]} → {c.sha[1][:12]}).")
    if changed:
        lines.append("")
    lines += ["## Error", "",
              "| implementation | metric | n (clusters) | B/A | 95% interval | verdict | A status | B status | "
              "kernel file |", "|---|---|--:|--:|---|---|---|---|---|"]
    for c in cmp.impls:
        sa, sb = (_status_cell(c.status[i], c.reasons[i]) for i in (0, 1))
        if not c.verdicts:
            lines.append(f"| {md_escape(c.key)} | - | 0 | - | - | not compared: no input with an error on both sides | "
                         f"{md_escape(sa)} | {md_escape(sb)} | {_kernel_cell(c)} |")
        for m, v in c.verdicts.items():
            n = f"{v.n_units}" + (f" ({v.n_clusters})" if v.n_clusters != v.n_units else "")
            if c.dropped.get(m):
                n += f", {c.dropped[m]} left out"
            ci = f"[{_f(v.lo)}, {_f(v.hi)}]" if math.isfinite(v.lo) else "none (one cluster)"
            verdict = v.label + (f" ({v.direction})" if v.direction else "")
            lines.append(f"| {md_escape(c.key)} | {m} | {n} | {_f(v.effect)} | {ci} | {md_escape(verdict)} | "
                         f"{md_escape(sa)} | {md_escape(sb)} | {_kernel_cell(c)} |")
    if cmp.speed:
        lines += ["", "## Speed", "",
                  "Median kernel time B / A per case both bench files timed (below 1: B is faster); the geometric "
                  "mean over the cases with its interval and verdict (cases as units).", "",
                  "| implementation | recipe | cases | median B/A | geometric mean [95% interval] | verdict |",
                  "|---|---|--:|--:|---|---|"]
        for s in cmp.speed:
            v = s["verdict"]
            ci = f"{_f(v.effect)} [{_f(v.lo)}, {_f(v.hi)}]" if math.isfinite(v.lo) else _f(v.effect)
            lines.append(f"| {md_escape(s['impl'])} | {md_escape(s['recipe'])} | {s['cases']} | "
                         f"{_f(s['median_ratio'])} | {ci} | {md_escape(v.label)} |")
    lines += ["", "## Per input", "", "| implementation | input | A status | B status | " +
              " | ".join(f"A {m} | B {m} | B/A" for m in METRICS) + " |",
              "|---|---|---|---|" + "--:|--:|--:|" * len(METRICS)]
    for c in cmp.impls:
        for p in c.per_input:
            cells = []
            for m in METRICS:
                x, y = p[f"{m}_a"], p[f"{m}_b"]
                cells += [_f(x), _f(y), _f(y / x) if _positive(x) and _positive(y) else "-"]
            lines.append(f"| {md_escape(c.key)} | {md_escape(p['input'])} | {p['status_a']} | {p['status_b']} | "
                         + " | ".join(cells) + " |")
    lines += ["", "## What differs", ""]
    diffs = [*(("run", k, x, y) for k, x, y in cmp.provenance_diff),
             *(("bench", k, x, y) for k, x, y in cmp.speed_meta_diff)]
    if diffs:
        lines += ["| file | field | A | B |", "|---|---|---|---|"]
        lines += [f"| {w} | {k} | {md_escape(x)[:120]} | {md_escape(y)[:120]} |" for w, k, x, y in diffs]
    else:
        lines.append("The two runs' provenance agrees on " + ", ".join(PROVENANCE_FIELDS[:8]) + ", ...")
    notes = []
    if cmp.inputs_rehashed:
        notes.append(f"same input name, other data (content hash differs; not compared): "
                     f"{', '.join(cmp.inputs_rehashed[:10])}")
    for label, names in (("inputs only in A", cmp.inputs_only_a), ("inputs only in B", cmp.inputs_only_b),
                         ("implementations only in A", cmp.only_a), ("implementations only in B", cmp.only_b)):
        if names:
            notes.append(f"{label} ({len(names)}): {', '.join(names[:10])}" + (", ..." if len(names) > 10 else ""))
    for c in cmp.impls:
        if c.names[0] != c.names[1]:
            how = "one file and function" if kernel_key(c.names[1]) == c.key else "the same file contents"
            notes.append(f"`{c.names[0]}` (A) and `{c.names[1]}` (B) are the same kernel `{c.key}` ({how})")
    lines += ["", *(f"- {md_escape(n, table=False)}" for n in notes)]
    return "\n".join(lines).rstrip() + "\n"
