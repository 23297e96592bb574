"""Conformance probes: does a real kernel compute the attention the contract describes, before it is scored?

A kernel that ignores ``causal``, returns its LSE in base 2, or maps query heads to the wrong KV heads still
returns finite tensors of the right shape, and its rows would look like measurements. Each real implementation
therefore runs a few small probes first (:func:`probe`, a few heads and at most 128 tokens, against the FP64
oracle), built so that a broken kernel misses by orders of magnitude more than FP8 error:

- ``output``: a plain input (4 heads, 128 tokens, head dim 64, no mask): the output must be a
  float tensor of shape (b, h, s_q, d_v) on the inputs' device (checked by
  :func:`zyfa.accuracy.implementations.base.call_implementation`), with rel-L2 to FP64 below
  :data:`OUTPUT_REL_L2_MAX` (FP8
  gives about 0.03; a kernel that masks when not asked gives about 0.5 or more).
- ``lse`` (when it returns one): the natural-log LSE within :data:`LSE_ABS_MAX` of FP64's. A miss is named:
  base 2 (ratio 1/ln 2 = 1.4427 to FP64's), unscaled (the LSE of Q·Kᵀ without ``sm_scale``), or off by so much.
- ``causal``: the keys after the first half of the queries carry values of :data:`BIG` (1e3); under the mask
  the first half never sees them (outputs of order 1), without it their outputs are of order BIG/2. A miss
  above :data:`MASK_MISS` (BIG/10) is a mask ignored.
- ``window``: causal with a window of 16 keys; the first 32 keys carry BIG, so queries from 48 on must not see
  them.
- ``gqa``: KV head j's values are offset by ``GQA_OFFSETS[j]`` (+100, -100): each query head's mean output says
  which KV head it read; the contract is query head i -> KV head i // (h // h_kv).

A probe the kernel cannot take (its ``limits``, e.g. no window) is skipped; one that raises is skipped too,
with the error in the result (a kernel that fails on every input has failed rows anyway). A failed probe makes
the kernel nonconforming: :func:`apply` turns its ``ok`` rows into ``status: nonconforming`` with one line
naming the probe and what was seen, never ``ok``. Built-ins are probed once per session and device
(:func:`probe_cached`); plug-ins every run.

The probes' fixed size misses a kernel that masks only at small lengths, so a plug-in's mask is also checked on
each scored input's own lengths (:func:`scored_mask_check`, called by :mod:`zyfa.accuracy.implementations.real_rows`):
one more call on one query group of the input with the hidden keys' values raised, those rows compared with the scored
output. A miss makes that row ``nonconforming``.

Also here: :func:`suspect_reason` (a paired row whose real/emulated error ratio is outside
:data:`zyfa.accuracy.scoring.tolerances.SUSPECT_BAND` gets ``status: suspect``), and :func:`pairing_warning` (a kernel
that reports its quantization granularity, an
optional attribute ``fn.quantization`` of a plug-in: ``"tensor"``, ``"head"``, ... or a dict per tensor
``{"q": ..., "k": ..., "v": ...}``, paired with a recipe that quantizes otherwise).

Exposed: ``Conformance``, ``probe(impl, device)``, ``probe_cached(impl, device)``, ``apply(row, conf)``,
``scored_mask_check(impl, x, out) -> (outcome, line)``,
``suspect_reason(row)``, ``pairing_warning(impl)``, and the thresholds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from zyfa.accuracy.implementations.base import (
    Implementation,
    ImplementationError,
    call_implementation,
    unsupported_reason,
)
from zyfa.accuracy.inputs.attention_input import AttentionInput
from zyfa.accuracy.scoring.tolerances import SUSPECT_BAND
from zyfa.reference.attention import attention_fp64

from zyfa.norms import rel_l2
from zyfa.recipe_spec import get_recipe

__all__ = ["BIG", "GQA_OFFSETS", "LSE_ABS_MAX", "MASK_MISS", "OUTPUT_REL_L2_MAX", "SCORED_BIG", "SCORED_MISS",
           "Conformance", "apply", "pairing_warning", "probe", "probe_cached", "scored_mask_check",
           "suspect_reason"]

BIG = 1e3  # the values of the keys a mask must hide
MASK_MISS = BIG / 10  # a masked probe missing FP64 by more than this saw the hidden keys
OUTPUT_REL_L2_MAX = 0.3  # rel-L2 to FP64 of the plain probe: FP8 kernels give about 0.03
LSE_ABS_MAX = 0.5  # |LSE - FP64's| on the plain probe (LSE about 5.4 there; FP8 error about 0.05)
GQA_OFFSETS = (100.0, -100.0)  # per-KV-head value offsets of the GQA probe
LN2 = math.log(2.0)
# head dim 64: every kernel here takes it (FlashInfer's FA3 pack is built for 64 and 256 only; a head dim it lacks
# would start a JIT build of minutes on the GPU machine)
_HEADS, _KV_HEADS, _TOKENS, _DIM, _WINDOW = 4, 2, 128, 64, 16


@dataclass
class Conformance:
    """What the probes of one kernel found: ``failures`` (probe -> what was seen), ``skipped`` (probe -> why)."""

    name: str
    failures: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    passed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        """One line naming the failed probes and what they saw ("" when it conforms)."""
        return "; ".join(f"conformance probe '{p}': {what}" for p, what in self.failures.items())

    def record(self) -> dict:
        return {"ok": self.ok, "passed": list(self.passed), "failures": dict(self.failures),
                "skipped": dict(self.skipped)}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _qkv(seed: int, h: int = _HEADS, h_kv: int = _KV_HEADS, s: int = _TOKENS, d: int = _DIM):
    g = _gen(seed)
    return (torch.randn(1, h, s, d, generator=g), torch.randn(1, h_kv, s, d, generator=g),
            torch.randn(1, h_kv, s, d, generator=g))


def _inputs() -> dict[str, AttentionInput]:
    """The probe inputs (bf16, the dtype of Gaussian inputs), on the CPU."""
    if not _INPUTS:
        _INPUTS.update(_make_inputs())
    return _INPUTS


_INPUTS: dict[str, AttentionInput] = {}


def _make_inputs() -> dict[str, AttentionInput]:
    plain = _qkv(1, h_kv=_HEADS)  # MHA: a kernel that takes no GQA still has its output and LSE checked
    q, k, v = _qkv(2, h=2, h_kv=2)
    v = v.clone()
    v[:, :, _TOKENS // 2:] += BIG  # keys the first half of the queries must not see under the causal mask
    causal = (q, k, v)
    q, k, v = _qkv(3, h=2, h_kv=2)
    v = v.clone()
    v[:, :, :2 * _WINDOW] += BIG  # keys no query from 3 * window on sees through a window of `window` keys
    window = (q, k, v)
    q, k, v = _qkv(4)
    v = v.clone()
    for j, off in enumerate(GQA_OFFSETS):
        v[:, j] += off
    gqa = (q, k, v)

    def mk(name, t, **kw):
        return AttentionInput(f"conformance-{name}", *(x.to(torch.bfloat16) for x in t), **kw,
                              meta={"source": "conformance probe"})

    return {"output": mk("output", plain), "causal": mk("causal", causal, causal=True),
            "window": mk("window", window, causal=True, window=_WINDOW), "gqa": mk("gqa", gqa)}


_REFS: dict[tuple, tuple] = {}


def _cached_ref(x: AttentionInput, sm_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FP64 (out, lse) of a probe input (the inputs are fixed, so once per session)."""
    key = (x.name, sm_scale)
    if key not in _REFS:
        _REFS[key] = attention_fp64(x.q, x.k, x.v, causal=x.causal, window=x.window,
                                    sm_scale=sm_scale if sm_scale is not None else x.sm_scale)
    return _REFS[key]


def _run(impl: Implementation, x: AttentionInput, dev: torch.device, ref) -> tuple:
    """(out float64 on the CPU, lse float64 or None) of ``impl`` on ``x``; ImplementationError as raised."""
    xd = x.to(dev)
    res = call_implementation(impl, xd, {"oracle_out_amax": float(ref[0].abs().max())})  # checks the device too
    lse = res.lse.detach().double().cpu() if res.lse is not None else None
    return res.out.detach().double().cpu(), lse


class _Nonconforming(Exception):
    """A probe's finding (what was seen), raised inside :func:`probe`."""


def _check_output(impl, x, dev, ref, conf: Conformance) -> None:
    try:
        out, lse = _run(impl, x, dev, ref)
    except ImplementationError as e:
        if e.__cause__ is not None:  # the kernel raised (an input it cannot take): skipped, as any probe
            raise
        raise _Nonconforming(f"on a plain input: {e}") from None  # what it returned breaks the contract
    err = rel_l2(out, ref[0])
    if not err < OUTPUT_REL_L2_MAX:
        raise _Nonconforming(f"rel-L2 {err:.3g} to FP64 on a plain input without a mask (FP8 error is about "
                             f"0.03; above {OUTPUT_REL_L2_MAX}: a mask applied when not asked, or wrong arithmetic)")
    if lse is None:
        conf.skipped["lse"] = "the kernel returns no LSE"
        return
    ref_lse = ref[1]
    miss = float((lse - ref_lse).abs().max())
    if miss <= LSE_ABS_MAX:
        conf.passed.append("lse")
        return
    ratio = float((lse / ref_lse).median())
    scale = x.sm_scale if x.sm_scale is not None else 1.0 / math.sqrt(x.q.shape[-1])
    to_unscaled = float((lse / _cached_ref(x, sm_scale=1.0)[1]).median())  # vs the LSE of Q·Kᵀ (about 30 here)
    if abs(ratio - 1 / LN2) < 0.02:
        what = f"LSE looks like log2: ratio {ratio:.4f} to FP64's natural-log LSE (1/ln 2 = {1 / LN2:.4f})"
    elif abs(to_unscaled - 1) < 0.05:
        what = (f"LSE looks unscaled: the LSE of Q·Kᵀ without sm_scale ({scale:.4g}), ratio {to_unscaled:.4f} to "
                f"it; {ratio:.4f} to FP64's")
    elif abs(to_unscaled - 1 / LN2) < 0.07:
        what = f"LSE looks unscaled and in log2: ratio {to_unscaled:.4f} to the unscaled LSE's; {ratio:.4f} to FP64's"
    else:
        what = f"LSE off by up to {miss:.3g} from FP64's natural-log LSE (ratio {ratio:.4f})"
    conf.failures["lse"] = what


def _check_masked(name: str, impl, x, dev, ref, rows: slice) -> None:
    out, _ = _run(impl, x, dev, ref)
    miss = float((out[:, :, rows] - ref[0][:, :, rows]).abs().max())
    if miss > MASK_MISS:
        hidden = ("future keys" if name == "causal" else f"keys outside the window of {x.window}")
        raise _Nonconforming(f"{name}={'True' if name == 'causal' else x.window} ignored: queries see {hidden} "
                             f"(values {BIG:g}); output off by {miss:.3g} where FP64's is at most "
                             f"{float(ref[0][:, :, rows].abs().max()):.3g}")


def _check_gqa(impl, x, dev, ref) -> None:
    out, _ = _run(impl, x, dev, ref)
    h, h_kv = x.q.shape[1], x.k.shape[1]
    group = h // h_kv
    for i in range(h):
        mean = float(out[:, i].mean())
        read = min(range(h_kv), key=lambda j: abs(mean - GQA_OFFSETS[j]))
        if abs(mean - GQA_OFFSETS[read]) > abs(GQA_OFFSETS[0]) / 2:
            raise _Nonconforming(f"query head {i}'s output (mean {mean:.3g}) matches no KV head's values")
        if read != i // group:
            raise _Nonconforming(f"query head {i} reads KV head {read}; the contract maps query head i to KV "
                                 f"head i // {group} = {i // group} (h {h}, h_kv {h_kv})")


def probe(impl: Implementation, device: str | torch.device = "cpu") -> Conformance:
    """Run every probe of ``impl`` on ``device``; never raises for the kernel's faults."""
    dev = torch.device(device)
    conf = Conformance(impl.name)
    tokens = _TOKENS // 2
    for name, x in _inputs().items():
        why = unsupported_reason(impl, x)
        if why is not None:
            conf.skipped[name] = f"the kernel cannot take the input: {why}"
            continue
        ref = _cached_ref(x)
        try:
            if name == "output":
                _check_output(impl, x, dev, ref, conf)
            elif name == "causal":
                _check_masked(name, impl, x, dev, ref, slice(0, tokens))
            elif name == "window":
                _check_masked(name, impl, x, dev, ref, slice(3 * _WINDOW, None))
            else:
                _check_gqa(impl, x, dev, ref)
        except _Nonconforming as e:
            conf.failures[name] = str(e)
            continue
        except ImplementationError as e:
            conf.skipped[name] = f"could not run: {e}"
            continue
        conf.passed.append(name)
    return conf


# ---------------------------------------------------------------------------------------------- the scored input

SCORED_BIG = 1e3  # hidden values on the scored input: this many times its own max |v|
SCORED_MISS = SCORED_BIG / 100  # a visible row moving by more than this many max |v| saw the hidden keys


def _scored_cases(x: AttentionInput) -> list[tuple[str, slice, slice]]:
    """(what, hidden keys, rows that must not see them) for the masks of ``x`` at its own lengths: the future
    keys of the first half of the queries (causal, bottom-right), the keys before the window of the last queries
    (window). A mask that hides nothing at this shape gives no case."""
    s_q, s_k = x.q.shape[2], x.k.shape[2]
    off = s_k - s_q
    cases = []
    if (x.causal or x.window is not None) and s_q >= 2:
        c = s_q // 2  # rows [0, c) see keys up to c - 1 + off
        cases.append(("causal", slice(c + off, s_k), slice(0, c)))
    if x.window is not None and s_k - x.window >= 2:
        w0 = (s_k - x.window + 1) // 2  # keys [0, w0) are outside the window of rows from w0 + window - 1 - off
        cases.append(("window", slice(0, w0), slice(max(0, w0 + x.window - 1 - off), s_q)))
    return cases


def scored_mask_check(impl: Implementation, x: AttentionInput, out: torch.Tensor) -> tuple[str, str]:
    """Check the mask of ``x`` (causal, window) on ``x``'s own lengths, beside the probes' fixed 128 tokens.

    On one query group of the first batch entry (the lengths unchanged), the values of keys some rows must not see
    are raised to :data:`SCORED_BIG` times the input's max |v| and the kernel is run again; those rows of its
    output must stay where they were in ``out`` (its output on ``x``) within :data:`SCORED_MISS` times max |v|
    (an FP8 kernel moves them by about 0.1 max |v| through its V scale). A kernel that ignores the mask at
    this length moves them by its weight on the hidden keys times the big values.

    Returns:
        ("passed" | "failed" | "skipped" | "none", one line): "none" where the mask hides nothing here.
    """
    cases = _scored_cases(x)
    if not cases:
        return "none", ""
    h, h_kv = x.q.shape[1], x.k.shape[1]
    g = h // h_kv
    vmax = float(x.v.detach().abs().max().float())
    vmax = vmax if math.isfinite(vmax) and vmax > 0 else 1.0
    big = min(SCORED_BIG * vmax, torch.finfo(x.v.dtype).max / 4 if x.v.dtype.is_floating_point else SCORED_BIG)
    ref = out[:1, :g].detach().double().cpu()
    for what, hidden, rows in cases:
        v = x.v[:1, :1].clone()
        v[:, :, hidden] = big
        xs = AttentionInput(x.name, x.q[:1, :g].contiguous(), x.k[:1, :1].contiguous(), v, causal=x.causal,
                            window=x.window, sm_scale=x.sm_scale, meta=dict(x.meta))
        try:
            res = call_implementation(impl, xs)
        except ImplementationError as e:
            return "skipped", f"could not run: {e}"
        miss = float((res.out.detach().double().cpu()[:, :, rows] - ref[:, :, rows]).abs().max())
        if not miss <= SCORED_MISS * vmax:
            flag = "causal=True" if what == "causal" else f"window={x.window}"
            hid = "future keys" if what == "causal" else f"keys outside the window of {x.window}"
            return "failed", (f"scored-input mask check: {flag} ignored at s_q {x.q.shape[2]}, s_k {x.k.shape[2]}: "
                              f"queries see {hid} (values raised to {big:.3g}); output rows moved by {miss:.3g} "
                              f"where max |v| is {vmax:.3g}")
    return "passed", ""


_SESSION: dict[tuple[str, str], Conformance] = {}


def probe_cached(impl: Implementation, device: str | torch.device = "cpu") -> Conformance:
    """:func:`probe`, once per session and device for a built-in; every call for a plug-in (its file may
    change between runs of one process)."""
    if impl.plugin:
        return probe(impl, device)
    key = (impl.name, str(torch.device(device)))
    if key not in _SESSION:
        _SESSION[key] = probe(impl, device)
    return _SESSION[key]


def suspect_reason(row: dict) -> str | None:
    """Why a paired real row is suspect (its ``real_emu_ratio`` outside
    :data:`zyfa.accuracy.scoring.tolerances.SUSPECT_BAND`), or None."""
    ratio = row.get("real_emu_ratio")
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool):
        return None
    if SUSPECT_BAND.contains(ratio):
        return None
    lo, hi = SUSPECT_BAND
    return (f"its error is {ratio:.3g}x its paired emulation's ({row.get('paired_spec')}), outside "
            f"[{lo}, {hi}]: the kernel does not compute what the recipe models")


def apply(row: dict, conf: Conformance | None) -> dict:
    """Mark a real row: ``nonconforming`` (the probes' line in ``reason``, before the scored-input check's line
    where that failed too) or ``suspect`` in place of ``ok``; failed and unsupported rows keep their status.
    Returns ``row``."""
    if row.get("status") == "nonconforming" and conf is not None and not conf.ok:  # the scored input's too
        row["reason"] = f"{conf.line()}; {row.get('reason')}"
        return row
    if row.get("status") != "ok":
        return row
    if conf is not None and not conf.ok:
        row.update(status="nonconforming", reason=conf.line())
        return row
    why = suspect_reason(row)
    if why is not None:
        row.update(status="suspect", reason=why)
    return row


_TENSORS = ("q", "k", "v")


def pairing_warning(impl: Implementation) -> str | None:
    """A warning when the kernel reports its quantization granularity (``fn.quantization``: one granularity or
    a dict per tensor) and its paired recipe quantizes a tensor otherwise; None when they agree or it does not
    say. Such a kernel's ratio to the recipe's emulation says how the two quantizations differ, not whether the
    kernel is faithful; the report names this as the cause of its flagged rows."""
    reported = getattr(impl.fn, "quantization", None)
    if reported is None or impl.recipe is None:
        return None
    if isinstance(reported, str):
        reported = dict.fromkeys(_TENSORS, reported)
    if not isinstance(reported, dict):
        return f"kernel {impl.name}: quantization attribute {reported!r} is neither a granularity nor a dict"
    r = get_recipe(impl.recipe)
    diff = [f"{t} per {reported[t]} (the recipe: per {getattr(r, f'{t}_scale')})" for t in _TENSORS
            if t in reported and str(reported[t]) != getattr(r, f"{t}_scale")]
    if not diff:
        return None
    return (f"{impl.name} paired with {r.name}, which quantizes otherwise: the kernel quantizes {', '.join(diff)}; "
            "its error ratio compares it with an emulation that quantizes otherwise, not with what it computes")
