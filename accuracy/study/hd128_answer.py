"""The study's first answer, at the paper's condition: which kernel adds how much error on real head-dim-128
activations, and does it matter to the model.

One table, a row per implementation measured on hd128 captures (real kernels by their implementation name, emulated
recipes by their recipe): the kernel-only error (deq) and the error against the original inputs (orig), each the
geometric mean over layers of a layer's rel-L2 against FP64 (all its query heads in one row), with a 95% bootstrap
interval over layers (the layer is the independent unit: its heads share its input); the orig error over BF16's,
paired per layer; and what the model does with it, where a plan measured it: the retrieval verdicts of the plans
that ran the implementation in every layer (``studies/fp8-retrieval-hd128.toml``: exact match against cuDNN's
BF16 kernel, paired per prompt, clustered by fact) and the next-token KL of impact rows of an hd128 model.
Where no rows answer, the cell says "untested" and the line under the table says what would.

Sources: this run's hd128 capture rows when they cover at least as many layers as the committed files
(``reports/hd128/real_kernels.jsonl``, H200, and ``reports/hd128/results.jsonl``); otherwise the committed files,
named with their commit and device. The prose under the table is computed from the table.

Exposed: ``COMMITTED``, ``RETRIEVAL_PLANS``, ``hd128_rows``, ``layer_entries``, ``retrieval_effects``,
``impact_kl``, ``kl_sentence``, ``lead_section``.
"""

from __future__ import annotations

import glob
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from zyfa.accuracy.impact.rows import load_rows as load_impact_rows
from zyfa.accuracy.impact.rows import prepare_rows as prepare_impact_rows
from zyfa.accuracy.longctx.verdicts import plan_verdicts
from zyfa.accuracy.report.document import Doc
from zyfa.accuracy.report.front import ABLATION_PREFIX, implementation_of, is_real, number, source_label
from zyfa.accuracy.report.front import ratio as ratio_text
from zyfa.accuracy.report.results import load_results
from zyfa.accuracy.scoring.plan import load_plan
from zyfa.accuracy.scoring.verdict import cluster_bootstrap
from zyfa.capture.models import MODELS

__all__ = ["COMMITTED", "RETRIEVAL_PLANS", "hd128_rows", "impact_kl", "kl_sentence", "layer_entries", "lead_section",
           "retrieval_effects"]

ROOT = Path(__file__).resolve().parents[2]
#: the committed hd128 capture rows, real kernels first (a layer measured in both keeps the first file's row)
COMMITTED = (ROOT / "reports" / "hd128" / "real_kernels.jsonl", ROOT / "reports" / "hd128" / "results.jsonl")
#: the retrieval plans that ran FP8 implementations in every layer of an hd128 model against a BF16 one (their rows:
#: wherever under reports/ they were written under the plan's hash, as the README's findings find them)
RETRIEVAL_PLANS = (ROOT / "studies" / "fp8-retrieval-hd128.toml",)
IMPACT_ROWS = ROOT / "reports" / "impact"
BF16 = ("sdpa-bf16:cudnn", "bf16")  # the BF16 row the orig ratio is taken over: the real kernel's, else the recipe's
ANCHOR = "t-hd128-answer"


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def hd128_rows(rows: Sequence[dict]) -> list[dict]:
    """The rows of head-dim-128 captures that scored (status ok or suspect, finite deq and orig rel-L2), ablations
    of zyfa's technique 1 left out (the claims section's sensitivity table has them)."""
    out = []
    for r in rows:
        if r.get("input_source") != "capture" or r.get("head_dim") != 128:
            continue
        if r.get("status", "ok") not in ("ok", "suspect") or str(r.get("recipe", "")).startswith(ABLATION_PREFIX):
            continue
        if all(isinstance(r.get(m), (int, float)) and math.isfinite(r[m]) for m in ("deq_rel_l2", "orig_rel_l2")):
            out.append(r)
    return out


def _layer(r: dict) -> tuple:
    return (r.get("input_file"), r.get("input_layer"))


def _by_name(rows: Sequence[dict]) -> dict[str, dict[tuple, dict]]:
    by: dict[str, dict[tuple, dict]] = {}
    for r in rows:
        by.setdefault(implementation_of(r), {}).setdefault(_layer(r), r)
    return by


def _geo(values: Sequence[float]) -> tuple[float, float, float]:
    """(geometric mean, lo, hi): the bootstrap over the values' logs, each value its own unit (a layer)."""
    return tuple(math.exp(x) for x in cluster_bootstrap(np.log(np.asarray(values, dtype=float))))


def layer_entries(rows: Sequence[dict]) -> list[dict]:
    """One dict per implementation of ``rows`` (already :func:`hd128_rows`): ``name``, ``implementation`` (the
    real kernel's name, None for an emulation), ``real``, ``device``, ``n`` (layers), ``deq`` and ``orig``
    ((geometric mean, lo, hi) over layers), ``x_bf16`` (the orig error over the BF16 row's, paired per layer; None
    without a BF16 row or for the BF16 row itself), ``recipe``, ``file`` (the rows' ``_file`` labels). Ordered:
    real kernels first, then by deq error."""
    by = _by_name(rows)
    base_name = next((n for n in BF16 if n in by), None)
    base = by.get(base_name)
    out = []
    for name, layers in by.items():
        keys = sorted(layers, key=str)
        first = layers[keys[0]]
        e = {"name": name, "recipe": first.get("recipe"),
             "implementation": first.get("implementation") if is_real(first) else None, "real": is_real(first),
             "device": first.get("device_name") or first.get("device") or "",
             "n": len(keys), "deq": _geo([layers[k]["deq_rel_l2"] for k in keys]),
             "orig": _geo([layers[k]["orig_rel_l2"] for k in keys]), "x_bf16": None,
             "file": sorted({str(layers[k].get("_file", "")) for k in keys} - {""})}
        if base is not None and name != base_name:
            shared = [k for k in keys if k in base and base[k]["orig_rel_l2"] > 0]
            if shared:
                e["x_bf16"] = _geo([layers[k]["orig_rel_l2"] / base[k]["orig_rel_l2"] for k in shared])
        out.append(e)
    out.sort(key=lambda e: (not e["real"], e["deq"][0]))
    return out


def _points(x: float) -> str:
    return f"{x * 100:+.0f}".replace("-", "−")


def retrieval_effects(plans: Sequence[Path] = RETRIEVAL_PLANS, root: Path = ROOT) -> tuple[dict[str, str], list[str]]:
    """({implementation: its retrieval verdict, short}, [each plan with its condition and rule]) from each plan's rows
    written under its current hash: for the first contrast (primary, then exploratory, in the plan's order) whose
    ``b`` is the implementation, the exact-match change of ``b`` over ``a`` across the plan's informative cells
    (points, the range over cells), how many cells are effects, no effect or inconclusive (after the plan's
    correction for the primary contrast; ceiling and floor cells left out), and whether the contrast is primary or
    exploratory."""
    out: dict[str, str] = {}
    sources = []
    for plan_file in plans:
        if not plan_file.is_file():
            continue
        # lazy: imports torch (through scoring.metrics); zyfa report reads results without torch
        from zyfa.accuracy.study.plan_findings import plan_rows

        plan = load_plan(plan_file)
        by_file = plan_rows(root, plan.hash)
        rows = [r for f in sorted(by_file) for r in by_file[f]]
        if not rows:
            continue
        conds: set[str] = set()
        verdicts = [v for v in plan_verdicts(plan, rows) if v["metric"] == "exact" and v["verdict"] is not None]
        for c in dict.fromkeys(v["contrast"] for v in verdicts):
            mine = [v for v in verdicts if v["contrast"] == c and v["verdict"].informative]
            if not mine or c.b in out:  # the first contrast that names b answers for it
                continue
            eff = [v["verdict"].effect for v in mine]
            kinds = [v["kind"] for v in mine]
            lengths = sorted({v["length"] for v in mine})
            span = _points(min(eff)) if min(eff) == max(eff) else f"{_points(max(eff))} to {_points(min(eff))}"
            counts = ", ".join(f"{kinds.count(k)} {label}" for k, label in (
                ("effect", "effects"), ("equivalent", "no effect"), ("inconclusive", "inconclusive"))
                if kinds.count(k))
            what = "exploratory" if c.exploratory else "primary"
            out[c.b] = f"{span} pts vs {c.a}; {counts} of {len(mine)} cells ({what})"
            conds.add(f"{', '.join(plan.tasks)} at {lengths[0] // 1024}K–{lengths[-1] // 1024}K, "
                      f"{mine[0]['verdict'].n_clusters} facts per cell")
        sources.append(f"`{plan_file.name}` ({plan.short_hash}; {'; '.join(sorted(conds))}; no effect: none "
                       f"larger than {plan.metrics['exact'] * 100:g} points; primary cells after "
                       f"{plan.correction.capitalize()}), rows in "
                       + ", ".join(f"`{d}/`" for d in sorted({_rel(f.parent) for f in by_file})))
    return out, sources


def impact_kl(folder: Path = IMPACT_ROWS) -> tuple[dict[str, tuple[float, float, float, int]], str]:
    """({recipe or implementation: (mean next-token KL, lo, hi, windows)}, a phrase of the rows' condition and
    sources) over the whole-model impact rows (every layer's attention swapped) of hd128 registry models under
    ``folder``; ({}, "") where none exist. The figures are the model-impact section's
    (:func:`zyfa.accuracy.impact.section.summarize`: a 95% bootstrap over windows)."""
    # lazy: the impact section's bootstrap imports torch; zyfa report's composer imports this module without it
    from zyfa.accuracy.impact.section import summarize

    hd128 = {name for name, spec in MODELS.items() if spec.head_dim == 128}
    rows, sources = [], {}
    for f in sorted(glob.glob(str(folder / "**" / "*.jsonl"), recursive=True)):
        try:
            mine = [r for r in load_impact_rows([f])[0] if r.get("kind") == "impact_window"
                    and r.get("model") in hd128 and r.get("layer") is None
                    and isinstance(r.get("kl_mean"), (int, float))]
        except (ValueError, OSError):
            continue
        for r in mine:  # the provenance of a zyfa impact row lacks the device its row records
            sources.setdefault(source_label(Path(f).name, {**(r.get("provenance") or {}), "device": r.get("device")}),
                               None)
        rows += mine
    if not rows:
        return {}, ""
    groups = summarize(prepare_impact_rows(rows)[0])
    out = {}
    for _, entries in sorted(groups.items(), key=lambda kv: -sum(len(e["windows"]) for e in kv[1])):
        for e in entries:  # a recipe measured in several conditions: the best-covered condition's figure
            out.setdefault(str(e["recipe"]), (e["kl"].estimate, e["kl"].low, e["kl"].high, len(e["windows"])))
    keys = list(groups)
    condition = (f"{', '.join(sorted({k[0] for k in keys}))}, held-out windows of "
                 f"{'/'.join(str(n) for n in sorted({k[1] for k in keys}))} tokens of the "
                 f"{', '.join(sorted({str(k[2]) for k in keys}))} text, from {'; '.join(sources)}")
    return out, condition


def _cell(t: tuple[float, float, float] | None, ratio: bool = False) -> str:
    if t is None:
        return "–"
    est, lo, hi = t
    f = ratio_text if ratio else number
    return f(est) + (f" [{f(lo)}, {f(hi)}]" if math.isfinite(lo) else "")


def _groups(rows: Sequence[dict], provenances: Sequence[tuple[str, dict]], this_run: Sequence[str],
            committed: Sequence[Path]) -> tuple[list[list[dict]], dict[str, str]]:
    """[(hd128 rows, where they come from)]: this run's alone when they cover as many layers as the committed files;
    else the committed files' first, then this run's rows of the implementations the committed files lack (a
    user's kernel, say), each group with its own BF16 row for the ratio. Also {file label: its source label}."""
    here = hd128_rows(rows)
    files = [p for p in committed if p.is_file()]
    there, labels = [], {n: source_label(n, p, this_run) for n, p in provenances}
    if files:
        res = load_results(files)
        there = [{**r, "_file": f"committed:{r.get('_file')}"} for r in hd128_rows(res.rows)]
        labels.update({f"committed:{n}": source_label(n, p) for n, p in res.provenances})
    if here and len({_layer(r) for r in here}) >= len({_layer(r) for r in there}):
        return [here], labels
    groups = [there] if there else []
    names = {implementation_of(r) for r in there}
    extra = [r for r in here if implementation_of(r) not in names or implementation_of(r) in BF16]
    if any(implementation_of(r) not in names for r in extra):
        groups.append(extra)
    return groups, labels


def lead_section(rows: Sequence[dict], provenances: Sequence[tuple[str, dict]] = (), this_run: Sequence[str] = (), *,
                 committed: Sequence[Path] = COMMITTED, plans: Sequence[Path] = RETRIEVAL_PLANS,
                 impact_folder: Path = IMPACT_ROWS) -> Callable[[Doc, bool], None]:
    """The section the study's front page opens with (``add(doc, plots)``); see the module's docstring."""
    groups, labels = _groups(rows, provenances, this_run, committed)
    entries, seen = [], set()
    for k, group in enumerate(groups):  # the groups in order (committed first), each in layer_entries' order
        for e in layer_entries(group):
            if e["name"] not in seen:
                seen.add(e["name"])
                entries.append({**e, "group": k, "source": "; ".join(labels.get(f, f.removeprefix("committed:"))
                                                                     for f in e["file"]) or "this run"})
    chosen = [r for group in groups for r in group]
    retrieval, retrieval_src = retrieval_effects(plans)
    kl, kl_condition = impact_kl(impact_folder)

    def add(doc: Doc, plots: bool) -> None:
        doc.h(2, "At head dim 128 on real activations: how much error, and does it matter to the model")
        if not entries:
            doc.p("Untested here: these results hold no head-dim-128 capture rows and the committed ones "
                  f"({', '.join(f'`{_rel(p)}`' for p in committed)}) were not found. "
                  "`zyfa capture --model qwen25coder-1.5b` makes the capture, `zyfa accuracy --inputs FILE` its rows.")
            doc.table(ANCHOR, ["answer"], [["untested"]])
            return
        models = sorted({str(r.get("input_model")) for r in chosen})
        tokens = sorted({int(r.get("seq_k") or 0) for r in chosen})
        masks = sorted({"causal" if r.get("causal") else "no mask" for r in chosen})
        doc.p(f"**Condition**: {', '.join(models)} captures, head dim 128, {', '.join(map(str, tokens))} tokens, "
              f"{', '.join(masks)}; rel-L2 against FP64 of a layer's output (all its query heads), geometric mean "
              "over layers [95% bootstrap interval over layers; unit: the layer, n in the third column]. "
              "**From**: the last column.")
        body = []
        for e in entries:
            kind = "real" if e["real"] else "emulation"
            model = retrieval.get(e["implementation"] or "", "untested") if e["real"] else \
                "untested (real kernels only)"
            k = kl.get(e["implementation"] or e["name"])
            body.append([e["name"], kind, str(e["n"]), _cell(e["deq"]), _cell(e["orig"]),
                         _cell(e["x_bf16"], ratio=True),
                         f"{_cell(k[:3])} ({k[3]} windows)" if k else "untested", model, e["source"]])
        doc.table(ANCHOR, ["implementation", "kind", "layers", "kernel-only error (deq)",
                           "error against the original inputs (orig)", "orig × BF16's (paired per layer)",
                           "next-token KL, every layer's attention", "retrieval exact match, every layer's attention",
                           "from"],
                  body)
        main = [e for e in entries if e["group"] == 0]
        doc.p(_prose(main) + kl_sentence(main, kl) + _model_prose(main, retrieval))
        more = [e for e in entries if e["group"] > 0]
        if more:
            layers = sorted({e["n"] for e in more})
            names = ", ".join("`" + e["name"] + "`" for e in more)
            doc.p(f"The last {len(more)} rows ({names}) are this run's "
                  f"implementations that the committed rows lack, on this run's {'/'.join(map(str, layers))} "
                  "layers of the shipped sample capture (fewer layers, fewer tokens and heads: wide intervals, and "
                  "not in the sentence above, which is about the first rows).")
        if retrieval_src:
            doc.p("Retrieval: exact match of the implementation in every layer minus that of the one it is compared "
                  "with, paired per prompt, clustered by fact, range over the plan's informative cells, from the "
                  "plans " + "; ".join(retrieval_src) + ". The long-context section has every cell.")
        if kl:
            doc.p("Next-token KL: KL(stock ‖ implementation) of the next-token distributions in nats/token, mean "
                  "over the positions of a window, with the implementation as the attention of every layer; mean "
                  "over windows [95% bootstrap interval over windows; unit: the window, n in the cell]: "
                  f"{kl_condition} (`zyfa impact`; the model-impact section has perplexity and top-1 agreement).")
        else:
            doc.p("Next-token KL: untested at head dim 128 (no whole-model impact rows of an hd128 model under "
                  "`reports/impact/`; `zyfa impact --models qwen25coder-1.5b --device cuda` makes them).")

    return add


def kl_sentence(entries: Sequence[dict], kl: dict[str, tuple[float, float, float, int]]) -> str:
    """A sentence computed from the table's KL column: its spread over the FP8 implementations beside the spread of
    their orig error, so a reader sees whether the layer's error ranks their effect on the model."""
    fp8 = [(e, kl[e["implementation"] or e["name"]]) for e in entries
           if e["x_bf16"] is not None and e["recipe"] != "bf16" and e["name"] not in BF16
           and (e["implementation"] or e["name"]) in kl]
    if len(fp8) < 2:
        return ""
    lo, hi = min(fp8, key=lambda t: t[1][0]), max(fp8, key=lambda t: t[1][0])
    orig = [e["orig"][0] for e, _ in fp8]
    kl_ratio, orig_ratio = hi[1][0] / lo[1][0], max(orig) / min(orig)
    # said only where the data carry it: the KL extremes' intervals apart and a spread far beyond the orig spread
    apart = math.isfinite(lo[1][2]) and math.isfinite(hi[1][1]) and lo[1][2] < hi[1][1]
    verdict = (": equal layer error, unequal effect on the model" if apart and kl_ratio > 2 * orig_ratio else "")
    return (f" Next-token KL of the {len(fp8)} FP8 implementations with KL rows runs from {number(lo[1][0])} "
            f"(`{lo[0]['name']}`) to {number(hi[1][0])} (`{hi[0]['name']}`) nats/token, "
            f"{ratio_text(kl_ratio)} apart{' (intervals disjoint)' if apart else ''}, while their orig errors lie "
            f"within {ratio_text(orig_ratio)} of each other{verdict}.")


def _model_prose(entries: Sequence[dict], retrieval: dict[str, str]) -> str:
    """A sentence on what the model does with it, from the retrieval cells of the table's real kernels."""
    said = [f"`{e['name']}` {retrieval[e['implementation']]}" for e in entries
            if e["real"] and e["implementation"] in retrieval]
    if not said:
        return " What the model does with this error is untested here."
    return (" With the implementation in every layer of the model, retrieval exact match changes by: "
            + "; ".join(said) + ".")


def _prose(entries: Sequence[dict]) -> str:
    """Two sentences computed from the table: the spread of kernel-only error and of the orig ratio over BF16."""
    fp8 = [e for e in entries if e["x_bf16"] is not None and e["recipe"] != "bf16" and e["name"] not in BF16]
    if not fp8:
        return "No BF16 row to compare the FP8 implementations with."
    lo_deq, hi_deq = min(fp8, key=lambda e: e["deq"][0]), max(fp8, key=lambda e: e["deq"][0])
    lo_x, hi_x = min(e["x_bf16"][0] for e in fp8), max(e["x_bf16"][0] for e in fp8)
    share = max(e["deq"][0] / e["orig"][0] for e in fp8)
    return (f"Against the original inputs every FP8 implementation here has {lo_x:.3g}–{hi_x:.3g}× BF16's error "
            f"({len(fp8)} implementations, geometric means over layers). Their kernel-only error ranges from "
            f"{number(lo_deq['deq'][0])} (`{lo_deq['name']}`) to {number(hi_deq['deq'][0])} (`{hi_deq['name']}`), "
            "at most "
            f"{share:.0%} of the same implementation's orig error: on these activations the rounding of Q, K and V "
            "to FP8, which every implementation shares, weighs more than how each kernel computes.")
