"""Paired statistics of HumanEval rows: pass@1 per implementation, the per-problem comparison against the baseline
(exact McNemar test on the discordant problems, the pass-rate difference's interval over problems by the verdicts'
rule, ``verdict.paired_interval``: a plan's verdict table and this table show one interval),
and the drift of the logits along the generated sequences by position.

The scoring (:mod:`zyfa.accuracy.tasks.humaneval`) writes one row per (problem, implementation) with ``passed``; this
module only reads rows. The unit of inference is the problem (study_methods.md §1): the arrays are aligned by
task id, and only problems where both implementations produced a scored row are paired.

``mcnemar_exact`` is ``zyfa.accuracy.scoring.verdict.mcnemar_exact``, re-exported. The drift's KL mean has a 95%
interval from resampling whole problems (``verdict.cluster_bootstrap``).

Exposed: ``pass_arrays``, ``paired_summary``, ``drift_by_position``, ``drift_trend``, ``mcnemar_exact``,
``summary_markdown``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from zyfa.accuracy.scoring.verdict import cluster_bootstrap, mcnemar_exact, mean_interval, paired_interval

__all__ = ["drift_by_position", "drift_trend", "mcnemar_exact", "paired_summary", "pass_arrays", "summary_markdown"]

DRIFT_BINS = (0, 16, 32, 64, 128, 256, 512, 1024)


def _scored(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r.get("kind") == "humaneval" and r.get("status") == "ok"
            and isinstance(r.get("passed"), bool)]


def pass_arrays(rows: Sequence[dict]) -> dict[tuple[str, str], dict[str, bool]]:
    """(model, implementation) -> task id -> passed, over the scored rows."""
    out: dict[tuple[str, str], dict[str, bool]] = {}
    for r in _scored(rows):
        out.setdefault((r["model"], r["implementation"]), {})[r["task_id"]] = r["passed"]
    return out


def drift_by_position(rows: Sequence[dict], bins: Sequence[int] = DRIFT_BINS) -> list[dict]:
    """Mean per-token KL and top-1 agreement of the rows' ``drift_kl``/``drift_top1`` in position bins
    [bins[i], bins[i+1]), with the number of tokens and of problems (rows) in each, and the KL mean's 95% interval
    from resampling whole problems (a problem's tokens are not independent)."""
    out = []
    edges = list(bins) + [math.inf]
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        kl, top, unit = [], [], []
        for n, r in enumerate(rows):
            k, t = r.get("drift_kl") or [], r.get("drift_top1") or []
            k = k[lo:None if hi == math.inf else int(hi)]
            kl += k
            top += t[lo:None if hi == math.inf else int(hi)]
            unit += [n] * len(k)
        if kl:
            _, kl_lo, kl_hi = cluster_bootstrap(kl, unit, n_boot=2000)
            out.append({"positions": f"{lo}-{'' if hi == math.inf else int(hi) - 1}", "tokens": len(kl),
                        "problems": len(set(unit)), "kl_mean": float(np.mean(kl)), "kl_lo": kl_lo, "kl_hi": kl_hi,
                        "top1_agree": float(np.mean(top))})
    return out


def drift_trend(rows: Sequence[dict], *, min_tokens: int = 32) -> dict | None:
    """Does the drift grow along the generated sequence? Within each problem with at least ``min_tokens`` drift
    positions, the least-squares slope of the per-token KL on log2(position + 1), i.e. nats per doubling of the
    position (a problem's tokens share its prompt, so the slope is taken inside each problem and the problems are
    the units). Returns the number of problems, the mean slope with its 95% interval over problems
    (``verdict.mean_interval``), and for scale those problems' mean KL over positions 0-15; None below 2 problems.
    A positive slope: the KL grows with position."""
    slopes, early = [], []
    for r in rows:
        kl = np.asarray(r.get("drift_kl") or [], dtype=np.float64)
        if kl.size < min_tokens or not np.all(np.isfinite(kl)):
            continue
        x = np.log2(np.arange(kl.size) + 1.0)
        slopes.append(float(np.polyfit(x, kl, 1)[0]))
        early.append(float(kl[:16].mean()))
    if len(slopes) < 2:
        return None
    est, lo, hi = mean_interval(slopes)
    return {"problems": len(slopes), "min_tokens": min_tokens, "slope": est, "slope_lo": lo, "slope_hi": hi,
            "early_kl": float(np.mean(early))}


def paired_summary(rows: Sequence[dict], *, alpha: float = 0.05) -> list[dict]:
    """One entry per (model, implementation): pass@1 and its standard error, and against the rows' baseline the
    paired difference (implementation - baseline) with its interval over problems (``paired_interval``), the exact
    McNemar p-value with the discordant counts, and the drift by position with its trend (``drift_trend``)."""
    arrays = pass_arrays(rows)
    baselines = {r["model"]: r.get("baseline") for r in rows if r.get("kind") == "humaneval"}
    out = []
    for (model, name), passes in arrays.items():
        n = len(passes)
        rate = sum(passes.values()) / n
        entry = {"model": model, "implementation": name, "problems": n, "pass_at_1": rate,
                 "stderr": math.sqrt(rate * (1 - rate) / n) if n > 1 else math.nan,
                 "baseline": baselines.get(model)}
        base = arrays.get((model, baselines.get(model)))
        if base is not None and name != baselines.get(model):
            common = sorted(set(base) & set(passes))
            a = np.array([base[t] for t in common], dtype=bool)
            b = np.array([passes[t] for t in common], dtype=bool)
            p, n01, n10 = mcnemar_exact(a, b)
            ci = paired_interval(a.astype(float), b.astype(float), alpha=alpha) if common else None
            entry.update({"paired_problems": len(common), "baseline_pass_at_1": float(a.mean()) if common else None,
                          "diff": ci[0] if ci else None, "diff_low": ci[1] if ci else None,
                          "diff_high": ci[2] if ci else None, "mcnemar_p": p, "n01": n01, "n10": n10})
            mine = [r for r in _scored(rows) if r["model"] == model and r["implementation"] == name]
            entry["drift"] = drift_by_position(mine)
            entry["drift_trend"] = drift_trend(mine)
        out.append(entry)
    return out


def _pct(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def summary_markdown(rows: Sequence[dict]) -> str:
    """The summary as Markdown tables: pass@1 with the paired comparison, then the drift by position."""
    s = paired_summary(rows)
    lines = ["| model | implementation | problems | pass@1 % (± s.e.) | Δ vs baseline, points [95% CI] | "
             "McNemar p (n01/n10) |", "|---|---|---|---|---|---|"]
    for e in s:
        diff = (f"{_pct(e['diff'])} [{_pct(e['diff_low'])}, {_pct(e['diff_high'])}]" if e.get("diff") is not None
                else "baseline" if e["implementation"] == e["baseline"] else "—")
        mc = f"{e['mcnemar_p']:.3g} ({e['n01']}/{e['n10']})" if "mcnemar_p" in e else "—"
        lines.append(f"| {e['model']} | {e['implementation']} | {e['problems']} | {_pct(e['pass_at_1'])} "
                     f"(± {_pct(e['stderr'])}) | {diff} | {mc} |")
    drift = [e for e in s if e.get("drift")]
    if drift:
        lines += ["", "Drift along the baseline's generated tokens (teacher-forced): mean KL(baseline || "
                  "implementation) in nats with its 95% interval over problems, and top-1 agreement, by position.",
                  "", "| model | implementation | positions | problems | tokens | KL mean [95% CI] | top-1 agree % |",
                  "|---|---|---|---|---|---|---|"]
        for e in drift:
            for b in e["drift"]:
                lines.append(f"| {e['model']} | {e['implementation']} | {b['positions']} | {b['problems']} | "
                             f"{b['tokens']} | {b['kl_mean']:.3g} [{b['kl_lo']:.3g}, {b['kl_hi']:.3g}] | "
                             f"{_pct(b['top1_agree'])} |")
    trend = [e for e in drift if e.get("drift_trend")]
    if trend:
        lines += ["", "Does the drift grow with position? Within each problem with at least "
                  f"{trend[0]['drift_trend']['min_tokens']} drift positions, "
                  "the least-squares slope of the per-token KL on log2(position + 1), in nats per doubling of the "
                  "position; mean over problems with its 95% interval over problems (positive: the KL grows), beside "
                  "those problems' mean KL over positions 0-15.", "",
                  "| model | implementation | problems | KL slope per doubling [95% CI] | mean KL, positions 0-15 |",
                  "|---|---|---|---|---|"]
        for e in trend:
            t = e["drift_trend"]
            lines.append(f"| {e['model']} | {e['implementation']} | {t['problems']} | {t['slope']:+.3g} "
                         f"[{t['slope_lo']:+.3g}, {t['slope_hi']:+.3g}] | {t['early_kl']:.3g} |")
    return "\n".join(lines) + "\n"
