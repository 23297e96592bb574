"""The paper's accuracy claims as a table generated from result rows, each with a verdict by a stated rule.

The ZYFA paper claims, at head dimension 128, that ZYFA's error is "within a few percent of that of Composable
Kernel and Triton and 62–78% lower than that of AITER's". Each claim is a range for the ratio of ZYFA's error to a
peer's (:data:`CLAIMS`): ``zyfa/ck`` and ``zyfa/triton-amd`` in [0.95, 1.05] ("a few percent" read as ±5% of 1.0),
``zyfa/aiter`` in [0.22, 0.38].

Our figure at the paper's condition: recipe rows (the emulations; real-kernel rows are left out) at head dim 128,
paired per unit with the peer on the same input. The unit is each layer × head where rows carry per-head errors
(``deq_rel_l2_heads``), else each input (a layer, a Gaussian draw). The figure is the geometric mean of the per-unit
ratios (:func:`zyfa.accuracy.scoring.verdict.paired_verdict` with ``ratio=True``) with two 95% intervals: over the
independent units, the capture layers (a cluster bootstrap: a layer's heads share its input and are resampled together;
the verdict's interval, as ``studies/hd128-claims-clustered.toml`` declares), and over every layer × head as if
independent (shown beside it; narrower), under the kernel-only error (``deq``: against FP64 on the recipe's own
FP8 inputs) and the error the model sees (``orig``: against FP64 on the original inputs). Captures (real
activations, the paper's condition), synthetic attention and Gaussian inputs are separate rows.

The rule (:func:`claim_verdict`), decided before any hd128 capture exists:

* *reproduced*: the whole interval lies inside the paper's range;
* *contradicted*: the whole interval lies outside it;
* *inconclusive*: the interval straddles an edge of the range (or fewer than two units);
* *untested at the condition*: no head-dim-128 rows of that input kind.

Beside it, the sensitivity to our own assumption: technique 1's details are not public, so the verdict is
recomputed with each plausible variant of the ``zyfa`` recipe in its place (:data:`VARIANTS`: the MAD's offset,
truncating or nearest conversion, the exponent's granularity), from rows of those recipes where they exist; where
they do not, the table says so and gives the command. No recipe is tuned toward the paper's numbers.

Exposed: ``CLAIMS``, ``VARIANTS``, ``Claim``, ``claim_verdict(lo, hi, low, high, n)``, ``claim_figures(rows)``,
``pair_figure(rows, a, b, kind, err, *, threshold, head_dim)`` (any two recipe arms, any
head dim: the contrast plans of :mod:`zyfa.accuracy.report.contrast`), ``sensitivity(rows)``,
``commands(missing)``, ``input_kind(row)``, ``claims_section(rows) -> add(doc, plots)``,
``claims_headline(rows)``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from zyfa.accuracy.report.blocks import fmt
from zyfa.accuracy.report.document import Doc
from zyfa.accuracy.scoring.verdict import paired_verdict

from zyfa.recipe_spec import get_recipe

__all__ = ["CLAIMS", "CONDITION_HEAD_DIM", "ERRORS", "INPUT_KINDS", "VARIANTS", "Claim", "claim_figures",
           "claim_verdict", "claims_headline", "claims_section", "commands", "input_kind", "pair_figure",
           "sensitivity"]

CONDITION_HEAD_DIM = 128
FEW_PERCENT = 0.05


@dataclass(frozen=True)
class Claim:
    key: str
    peer: str  # the peer recipe (its emulation)
    low: float  # the paper's range for ZYFA's error / the peer's
    high: float
    text: str  # the paper's words


CLAIMS = (
    Claim("zyfa-ck", "ck", 1 - FEW_PERCENT, 1 + FEW_PERCENT,
          "ZYFA's error within a few percent of Composable Kernel's"),
    Claim("zyfa-triton", "triton-amd", 1 - FEW_PERCENT, 1 + FEW_PERCENT,
          "ZYFA's error within a few percent of Triton's (AMD's Triton forward)"),
    Claim("zyfa-aiter", "aiter", 0.22, 0.38, "ZYFA's error 62–78% lower than AITER's"),
)
# input kinds: row input_source -> label; captures are the paper's condition (real activations)
INPUT_KINDS = {"capture": "real activations (captures)", "synthetic": "synthetic attention",
               "gaussian": "Gaussian"}
ERRORS = {"deq_rel_l2": "deq", "orig_rel_l2": "orig"}
# technique 1's plausible variants: label -> recipe names whose rows stand for it (a spec and its named alias);
# the list studies/hd128-sensitivity-all.toml declares (tests/report/test_hd128.py keeps them equal)
VARIANTS = (
    ("as assumed (zyfa: trunc, offset +1/16, exponent per row)", ("zyfa",)),
    ("trunc, offset 0", ("zyfa:mad_offset=0",)),
    ("trunc, offset +1/4", ("zyfa:mad_offset=0.25",)),
    ("nearest, offset 0 (the plain chord)", ("zyfa:mad_rounding=nearest,mad_offset=0",)),
    ("exponent per 128×128 tile", ("zyfa:p_scale_granularity=tile", "zyfa-tilescale")),
    ("fixed 2^8 exponent", ("zyfa:p_scale=pow2,p_scale_log2=8", "zyfa-pow2fixed")),
    ("bound: exact exp2 and RNE cast, no MAD", ("zyfa-exp2",)),
)


def claim_verdict(lo: float, hi: float, low: float, high: float, n: int) -> str:
    """The rule: reproduced (the interval [lo, hi] inside [low, high]), contradicted (wholly outside),
    inconclusive (straddles an edge, or fewer than two units), untested at the condition (no units)."""
    if n == 0:
        return "untested at the condition"
    if n < 2 or not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive (fewer than two units)"
    if low <= lo and hi <= high:
        return "reproduced"
    if hi < low or lo > high:
        return "contradicted"
    return "inconclusive (the interval straddles the range's edge)"


def _ok(row: dict, head_dim: int | None = CONDITION_HEAD_DIM) -> bool:
    """An emulation row that finished without NaN, at ``head_dim`` (QK and V; None: any)."""
    return (not row.get("real") and row.get("status") in (None, "ok") and not row.get("has_nan")
            and (head_dim is None or (row.get("head_dim") == head_dim
                                      and row.get("head_dim_v", head_dim) == head_dim)))


def _cluster(row: dict):
    """The row's independent unit for intervals: its capture layer (a layer's heads share the layer's input;
    the same layer at another length or text is not independent of it either), else the input itself."""
    if row.get("input_source") == "capture" and row.get("input_layer") is not None:
        return ("layer", row.get("input_model"), row.get("input_layer"))
    return ("input", row["input"], row.get("input_content_hash"))


def _units(row: dict, err: str) -> dict:
    """unit -> (error, cluster): one unit per head where the row has per-head errors for every query head, else one
    per input."""
    key = (row["input"], row.get("input_content_hash"))
    cl = _cluster(row)
    heads = row.get(f"{err}_heads")
    if isinstance(heads, list) and len(heads) > 1 and len(heads) == row.get("heads_q", len(heads)):
        return {(*key, h): (float(v), cl) for h, v in enumerate(heads) if v is not None}
    v = row.get(err)
    return {} if v is None else {(*key, None): (float(v), cl)}


def input_kind(row: dict) -> str | None:
    """The row's input kind (a key of :data:`INPUT_KINDS`: ``synthetic:...`` sources count as synthetic), or None."""
    src = str(row.get("input_source") or "")
    kind = src.split(":", 1)[0]
    return kind if kind in INPUT_KINDS else None


def _canonical(names: Sequence[str]) -> set[str]:
    """The names rows carry for these recipe names or specs (``zyfa:mad_offset=0`` is written ``...=0.0``)."""
    out = set(names)
    for n in names:
        with contextlib.suppress(ValueError):  # not a recipe: rows may still carry the name
            out.add(get_recipe(n).name)
    return out


def _arm(rows: Sequence[dict], names: Sequence[str], kind: str, err: str,
         head_dim: int | None = CONDITION_HEAD_DIM) -> dict:
    want = _canonical(names)
    out: dict = {}
    for r in rows:
        if r.get("recipe") in want and input_kind(r) == kind and _ok(r, head_dim):
            out.update(_units(r, err))
    return {k: v for k, v in out.items() if v[0] > 0 and math.isfinite(v[0])}


def pair_figure(rows: Sequence[dict], a: Sequence[str], b: Sequence[str], kind: str, err: str, *,
                threshold: float = FEW_PERCENT, head_dim: int | None = CONDITION_HEAD_DIM) -> dict:
    """The figure of one contrast of two recipe arms (``a``, ``b``: recipe names or specs whose rows stand for each;
    the first names the arm) on one input kind and error: the geometric mean of the per-unit ratio b / a with two
    intervals, one over the units (``lo_unit``, ``hi_unit``: each layer x head counted as independent) and one over
    the clusters (``lo``, ``hi``: whole layers resampled, their heads kept together). ``label``, ``label_unit``:
    :func:`zyfa.accuracy.scoring.verdict.paired_verdict`'s verdict against ``threshold`` (a fraction of 1) with the
    clustered and the per-unit interval. ``detectable``: the clustered design's minimum detectable change of the
    ratio at alpha 0.05 and 80% power, as a fraction of 1. ``units``: each paired unit as (input, query head or
    None, cluster, ratio b / a), in the rows' order (empty without pairs). Rows at ``head_dim`` only (None: any)."""
    pa_all = _arm(rows, a, kind, err, head_dim)
    pb_all = _arm(rows, b, kind, err, head_dim)
    both = [k for k in pa_all if k in pb_all]
    rec = {"a": a[0], "b": b[0], "kind": kind, "error": ERRORS[err], "n": len(both), "per_head": False,
           "ratio": math.nan, "lo": math.nan, "hi": math.nan, "lo_unit": math.nan, "hi_unit": math.nan,
           "detectable": math.inf, "label": "untested (no paired rows)", "label_unit": "untested (no paired rows)",
           "n_clusters": len({pa_all[k][1] for k in both}), "inputs": len({k[:2] for k in both}), "units": []}
    if both:
        rec["per_head"] = any(k[2] is not None for k in both)
        common = {"threshold": threshold, "ratio": True, "higher_is_better": False,
                  "metric": f"error ratio ({ERRORS[err]})", "arms": (a[0], b[0])}
        pa, pb = {k: pa_all[k][0] for k in both}, {k: pb_all[k][0] for k in both}
        unit = paired_verdict(pa, pb, **common)
        clustered = paired_verdict(pa, pb, clusters={k: pa_all[k][1] for k in both}, **common)
        rec.update(ratio=clustered.effect, lo=clustered.lo, hi=clustered.hi, lo_unit=unit.lo, hi_unit=unit.hi,
                   detectable=clustered.detectable, label=clustered.label, label_unit=unit.label)
        rec["units"] = [(k[0], k[2], pa_all[k][1], pb[k] / pa[k]) for k in both]
    return rec


def _figure(rows, claim: Claim, ours: Sequence[str], kind: str, err: str) -> dict:
    """:func:`pair_figure` of zyfa (``ours``) against the claim's peer, with the claim's verdicts (the verdict by the
    clustered interval, studies/hd128-claims-clustered.toml; ``verdict_unit`` by the per-unit one)."""
    rec = pair_figure(rows, (claim.peer,), ours, kind, err)
    rec["claim"] = claim
    rec["verdict"] = claim_verdict(rec["lo"], rec["hi"], claim.low, claim.high, rec["n_clusters"])
    rec["verdict_unit"] = claim_verdict(rec["lo_unit"], rec["hi_unit"], claim.low, claim.high, rec["n"])
    return rec


def claim_figures(rows: Sequence[dict]) -> list[dict]:
    """One dict per (claim, input kind, error): ``ratio`` (geometric mean of zyfa / peer per unit), ``lo``, ``hi``
    (its 95% interval), ``n`` (paired units), ``inputs`` (inputs behind them), ``per_head``, ``verdict``."""
    return [_figure(rows, c, ("zyfa",), kind, err) for c in CLAIMS for kind in INPUT_KINDS for err in ERRORS]


def sensitivity(rows: Sequence[dict], variants=VARIANTS) -> list[dict]:
    """The verdicts with each technique-1 variant as ZYFA: one dict per (claim, variant, input kind, error) as in
    :func:`claim_figures`, plus ``variant`` (its label) and ``spec`` (the recipe spec that makes its rows).
    ``variants``: (label, recipe names or specs whose rows stand for it) pairs (default :data:`VARIANTS`; a plan's
    list: :mod:`zyfa.accuracy.report.hd128`)."""
    out = []
    for label, names in variants:
        for c in CLAIMS:
            for kind in INPUT_KINDS:
                for err in ERRORS:
                    rec = _figure(rows, c, names, kind, err)
                    rec.update(variant=label, spec=names[0])
                    out.append(rec)
    return out


def _ci(rec: dict, lo: str, hi: str) -> str:
    if rec["n"] == 0:
        return "–"
    if not math.isfinite(rec[lo]):
        return "no interval (one unit)"
    return f"[{fmt(rec[lo], 'ratio')}, {fmt(rec[hi], 'ratio')}]"


def _interval(rec: dict) -> str:
    """The ratio with the verdict's (clustered) interval."""
    if rec["n"] == 0:
        return "–"
    return f"{fmt(rec['ratio'], 'ratio')} {_ci(rec, 'lo', 'hi')}"


def _n(rec: dict) -> str:
    if rec["n"] == 0:
        return "0"
    if rec["per_head"]:
        return f"{rec['n']} layer × head units in {rec['n_clusters']} layers"
    return f"{rec['n']} input" + ("s" if rec["n"] > 1 else "")


def commands(missing: Sequence[str]) -> list[str]:
    """The commands that make hd128 capture rows for the recipe specs ``missing``: the named recipes in one run
    beside the peers, each field spec in a run of its own (a spec's fields are comma-separated, as ``--recipes``'
    list is). A spec with a named alias in :data:`VARIANTS` runs under that name."""
    named = ["zyfa", *(c.peer for c in CLAIMS)]
    specs = []
    aliases = {names[0]: next((n for n in names if ":" not in n), None) for _, names in VARIANTS}
    for spec in missing:
        alias = spec if ":" not in spec else aliases.get(spec)
        if alias is not None:
            named.append(alias)
        else:
            specs.append(spec)
    run = "zyfa accuracy --inputs CAPTURES_HD128.h5 --out claims/{}.jsonl --recipes {}"
    return [run.format("named", ",".join(dict.fromkeys(named)))] + [
        run.format(f"variant{i}", f"'{spec}'") for i, spec in enumerate(specs, 1)]


def claims_headline(rows: Sequence[dict]) -> str:
    """One sentence: the verdict of each claim at the paper's condition (captures at hd128), deq and orig."""
    figs = [f for f in claim_figures(rows) if f["kind"] == "capture"]
    parts = []
    for c in CLAIMS:
        mine = {f["error"]: f for f in figs if f["claim"] is c}
        same = mine["deq"]["verdict"] == mine["orig"]["verdict"]
        parts.append(f"{c.text} ({c.low:g}–{c.high:g}): " + (mine["deq"]["verdict"] if same else
                     f"{mine['deq']['verdict']} (deq), {mine['orig']['verdict']} (orig)"))
    return "; ".join(parts) + "."


def claims_section(rows: Sequence[dict], variants=VARIANTS, *, sensitivity_rows: Sequence[dict] | None = None,
                   sensitivity_note: str = ""):
    """A report section (``add(doc, plots)``): the claims table and the sensitivity table (over ``variants``, as in
    :func:`sensitivity`, on ``sensitivity_rows``, default ``rows``; ``sensitivity_note`` says which)."""
    figs = claim_figures(rows)
    sens = sensitivity(rows if sensitivity_rows is None else sensitivity_rows, variants)

    def add(doc: Doc, plots: bool) -> None:
        doc.h(2, "The paper's accuracy claims")
        doc.p("The ZYFA paper's claims are at head dimension 128: ZYFA's error \"within a few percent of that of "
              "Composable Kernel and Triton and 62–78% lower than that of AITER's\". Each claim is a range for "
              "ZYFA's error over the peer's: [0.95, 1.05] for \"within a few percent\" (±5% of 1.0, our reading), "
              "[0.22, 0.38] for 62–78% lower. Our figure: the geometric mean of the paired per-unit ratio "
              "zyfa / peer (the emulations of the recipes) at head dim 128, under the kernel-only error (deq) and "
              "the error against the original inputs (orig). The unit is each layer × head where the rows carry "
              "per-head errors, else each input; the heads of a layer share its input, so the independent unit is "
              "the layer: the verdict's 95% interval is a cluster bootstrap over layers (each drawn layer keeps its "
              "heads; widened to the t interval on layers − 1 degrees of freedom where that is wider), and the "
              "interval that counts every layer × head as independent is shown beside it (narrower, optimistic). "
              "Rule, stated before the data: **reproduced** when the whole interval lies inside the paper's range, "
              "**contradicted** when it lies wholly outside, **inconclusive** when it straddles an edge, "
              "**untested at the condition** when no head-dim-128 rows of that kind exist. Only real activations "
              "(captures) are the paper's condition; synthetic and Gaussian rows are shown beside them, not in "
              "their place.")
        doc.table("t-claims", ["claim (paper's range of zyfa / peer)", "inputs at hd128", "error",
                               "zyfa / peer [95% interval over layers]", "95% interval over layer × head units",
                               "n", "verdict (over layers)", "verdict if heads were independent"],
                  [[f"{f['claim'].text} ({f['claim'].low:g}–{f['claim'].high:g})", INPUT_KINDS[f["kind"]],
                    f["error"], _interval(f), _ci(f, "lo_unit", "hi_unit"), _n(f), f["verdict"],
                    f["verdict_unit"]] for f in figs], text=True)
        doc.h(3, "Sensitivity to our reading of technique 1")
        doc.p("The paper's code is not public: the MAD's offset, the integer conversion's rounding (truncate or "
              "nearest) and the exponent's granularity of the `zyfa` recipe are our choices (docs/numerics.md). "
              "Each plausible variant takes ZYFA's place and the rule is applied again (interval over layers), on "
              "the same inputs, where rows of that variant exist. A verdict that stays the same across the rows "
              "of one claim does not rest on our choice." + (f" {sensitivity_note}" if sensitivity_note else ""))
        have = [s for s in sens if s["n"] > 0 and s["kind"] == "capture"]
        doc.table("t-claims-sensitivity", ["technique-1 variant (recipe)", "claim", "error",
                                           "zyfa / peer [95% interval over layers]", "n", "verdict"],
                  [[f"{s['variant']} (`{s['spec']}`)", s["claim"].key, s["error"], _interval(s), _n(s),
                    s["verdict"]] for s in have], text=True)
        missing = [names[0] for _, names in variants
                   if not any(s["n"] > 0 for s in sens if s["spec"] == names[0] and s["kind"] == "capture")]
        if missing:
            doc.p("No rows at head dim 128 on real activations (captures) for: "
                  + ", ".join(f"`{m}`" for m in missing) + ". To make them, run the commands below on a head-dim-128 "
                  "capture (`zyfa capture`) and add their rows to the study's results.")
            doc.code("\n".join(commands(missing)))

    return add
