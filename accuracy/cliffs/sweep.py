"""The length-cliff finder behind ``zyfa cliffs``: operator error against FP64 at every sequence length, and the
flag rule that picks out NaN/Inf rows, error jumps and refused lengths (docs/CLIFFS.md).

A sweep visits *points*: (length, mask, shape). The length L is the number of keys; the shape is ``equal``
(s_q = s_k = L) or ``chunk`` (chunked prefill: the last ``chunk`` query rows of the L-token input against all L
keys, bottom-right causal as docs/CONTRACTS.md aligns it; only at L > chunk, where it differs from ``equal``).
At each point the FP64 oracle runs once on the original inputs, and once per distinct dequantization of them
(shared by every recipe and implementation that quantizes alike); then every *subject* runs: a recipe through
the emulator, a built-in real kernel or a user's plug-in (:mod:`zyfa.accuracy.implementations.registry`).

Inputs (:class:`GaussianSource`, :class:`CaptureSource`): at each length the Gaussian input is
``make_gaussian`` of the spec with ``seq = L`` (the very input ``zyfa accuracy --seq L`` draws, so a flag has a
one-line reproducer there too); a capture gives the first L tokens of one layer.

One row per (subject, length, mask, shape): see :data:`ROW_KEYS`. The flags (:mod:`zyfa.accuracy.cliffs.flags`)
are computed from the rows alone, so a finished file can be re-rendered anywhere.

Exposed:
    DEFAULT_BASES, DEFAULT_MAX_LENGTH, WINDOW, ROW_KEYS
    default_lengths(max_length=32768, coarse_step=1) -> list[int];  default_centres(max_length) -> list[int]
    parse_lengths(spec) -> list[int]          "1-1024,2000-2100:4,4096"
    Subject, subjects(recipes, implementations) -> list[Subject]
    GaussianSource, CaptureSource             .name_at(L, mask, shape, chunk), .input_at(L), .max_length
    plan_keys(source, subjects, lengths, masks, shapes, chunk) -> list[row key]
    run_cliffs(source, subjects, lengths, *, masks, shapes, chunk, device, ...) -> (rows, provenance)
    format_lengths(lengths) -> str            the inverse of parse_lengths (ranges with their step)
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from zyfa.accuracy.cliffs.flags import finite_or_none
from zyfa.accuracy.implementations.base import (
    ImplementationError,
    call_implementation,
    device_platform,
    pairing,
    unsupported_reason,
)
from zyfa.accuracy.inputs.attention_input import AttentionInput, content_hash, make_gaussian
from zyfa.accuracy.io.device import ORACLE_CHUNK, check_memory, progress_bar, resolve_device, sync_device
from zyfa.accuracy.io.provenance import device_name, provenance
from zyfa.accuracy.io.results_io import row_key
from zyfa.capture.ranges import expand_ranges

from zyfa.emulator import emulate, quantization_key, quantize_inputs
from zyfa.norms import rel_l2_from_terms, rel_l2_terms
from zyfa.recipe_spec import get_recipe

__all__ = [
    "DEFAULT_BASES", "DEFAULT_MAX_LENGTH", "LONGEST_LENGTH", "MASKS", "ROW_KEYS", "SHAPES", "WINDOW",
    "CaptureSource", "GaussianSource", "Subject", "check_lengths_fit", "default_centres", "default_lengths",
    "format_lengths", "operator_errors", "parse_lengths", "plan_keys", "run_cliffs", "subjects",
]

# Default ranges: every length in 1..1024, plus +-WINDOW around the centres m * 2^k > 1024 (m in DEFAULT_BASES),
# up to DEFAULT_MAX_LENGTH.
DEFAULT_BASES = (64, 128, 176, 224)
DEFAULT_MAX_LENGTH = 32768
# The longest length --lengths accepts (2^20 tokens), checked before a range is expanded.
LONGEST_LENGTH = 1 << 20
DENSE_UP_TO = 1024
WINDOW = 64
MASKS = ("none", "causal")
SHAPES = ("equal", "chunk")

# Every key of a sweep row (None where it does not apply).
ROW_KEYS = (
    "run_id", "input", "input_hash", "source", "implementation", "impl_kind", "recipe", "platform", "length",
    "seq_q", "seq_k", "shape", "chunk", "mask", "causal", "window", "batch", "heads_q", "heads_kv", "head_dim",
    "head_dim_v", "dtype", "sm_scale", "status", "reason", "orig_rel_l2", "deq_rel_l2", "orig_lse_max_abs_err",
    "deq_lse_max_abs_err", "nonfinite_rows", "n_rows", "seconds", "oracle_seconds", "device",
)


# ---------------------------------------------------------------------------------------------- lengths

def default_centres(max_length: int = DEFAULT_MAX_LENGTH, bases: Sequence[int] = DEFAULT_BASES) -> list[int]:
    """The centres of the default windows: m * 2^k for m in ``bases``, above 1024 and at most ``max_length``."""
    out = set()
    for m in bases:
        c = m
        while c <= max_length:
            if c > DENSE_UP_TO:
                out.add(c)
            c *= 2
    return sorted(out)


def default_lengths(max_length: int = DEFAULT_MAX_LENGTH, *, coarse_step: int = 1) -> list[int]:
    """1..min(1024, max_length) step 1, then the lengths c-64..c+64 around every :func:`default_centres` c,
    with ``coarse_step`` (every centre itself kept), capped at ``max_length``."""
    if coarse_step < 1:
        raise ValueError(f"the step above 1024 must be >= 1, got {coarse_step}")
    out = set(range(1, min(DENSE_UP_TO, max_length) + 1))
    for c in default_centres(max_length):
        out.update(L for L in range(c - WINDOW, c + WINDOW + 1, coarse_step) if DENSE_UP_TO < L <= max_length)
        out.add(c)
    return sorted(out)


def parse_lengths(spec: str) -> list[int]:
    """``"1-1024,2000-2100:4,4096"`` -> sorted distinct lengths: items ``N``, ``A-B`` (inclusive) or ``A-B:STEP``;
    ``default`` stands for :func:`default_lengths`. ValueError (one line) on a malformed item."""
    if spec is None or not str(spec).strip():
        raise ValueError("--lengths is empty")
    items = [s.strip() for s in str(spec).split(",")]
    out = set(default_lengths()) if "default" in items else set()
    rest = ",".join(s for s in items if s != "default")
    if rest or not out:
        out.update(expand_ranges(rest, "--lengths", lowest=1, highest=LONGEST_LENGTH))
    return sorted(out)


def format_lengths(lengths: Sequence[int]) -> str:
    """Lengths as :func:`parse_lengths` reads them: runs of one step as ``A-B`` or ``A-B:STEP``."""
    ls = sorted(set(lengths))
    parts, i = [], 0
    while i < len(ls):
        j = i
        if i + 1 < len(ls):
            step = ls[i + 1] - ls[i]
            while j + 1 < len(ls) and ls[j + 1] - ls[j] == step:
                j += 1
        if j - i >= 2:
            parts.append(f"{ls[i]}-{ls[j]}" + (f":{step}" if step != 1 else ""))
            i = j + 1
        else:
            parts.append(str(ls[i]))
            i += 1
    return ",".join(parts)


# ---------------------------------------------------------------------------------------------- subjects

@dataclass(frozen=True)
class Subject:
    """One thing swept: a recipe through the emulator (``kind="recipe"``, ``recipe`` a Recipe) or a real
    implementation (``kind`` ``builtin``/``plugin``, ``impl`` an
    :class:`~accuracy.implementations.base.Implementation`)."""

    name: str
    kind: str
    recipe: Any = None
    impl: Any = None

    @property
    def recipe_name(self) -> str | None:
        if self.kind == "recipe":
            return self.recipe.name
        return None if self.impl.recipe is None else str(self.impl.recipe)


def subjects(recipes: Sequence = (), implementations: Sequence = ()) -> list[Subject]:
    """Recipes (names or Recipe objects) first, then implementations, as :class:`Subject`; a name twice is an error."""
    out = [Subject(r.name, "recipe", recipe=r) for r in (get_recipe(x) for x in recipes)]
    out += [Subject(i.name, "plugin" if i.plugin else "builtin", impl=i) for i in implementations]
    names = [s.name for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{', '.join(dup)} named twice")
    return out


# ---------------------------------------------------------------------------------------------- inputs

def _chunk_suffix(shape: str, chunk: int) -> str:
    return f"-sq{chunk}" if shape == "chunk" else ""


@dataclass(frozen=True)
class GaussianSource:
    """Gaussian inputs: at length L, ``make_gaussian(spec with seq=L, not causal)``; the mask is the point's."""

    spec: Any  # accuracy.inputs.attention_input.GaussianSpec (its seq and causal are replaced per point)
    max_length: int | None = None  # no limit

    @property
    def kind(self) -> str:
        return "gaussian"

    def name_at(self, length: int, mask: str, shape: str, chunk: int) -> str:
        return dataclasses.replace(self.spec, seq=length, causal=mask == "causal").name + _chunk_suffix(shape, chunk)

    def input_at(self, length: int):
        return make_gaussian(dataclasses.replace(self.spec, seq=length, causal=False, window=None))

    def window(self, mask: str) -> int | None:
        return None

    def describe(self) -> dict:
        return {"source": "gaussian", "spec": {k: v for k, v in dataclasses.asdict(self.spec).items()
                                               if k not in ("seq", "causal")}}


@dataclass(frozen=True)
class CaptureSource:
    """Prefixes of one captured layer: at length L, its first L tokens (``base`` is the layer at full length,
    from :func:`zyfa.accuracy.inputs.attention_input.capture_inputs`). Causal points keep the layer's sliding window."""

    base: Any  # accuracy.inputs.attention_input.AttentionInput

    @property
    def kind(self) -> str:
        return "capture"

    @property
    def max_length(self) -> int:
        return int(self.base.q.shape[2])

    def _stem(self) -> str:
        stem, sep, tail = self.base.name.rpartition("-s")
        return stem if sep and tail.isdigit() else self.base.name

    def name_at(self, length: int, mask: str, shape: str, chunk: int) -> str:
        tag = "" if mask == ("causal" if self.base.causal else "none") else f"-mask{mask}"
        return f"{self._stem()}-s{length}{tag}{_chunk_suffix(shape, chunk)}"

    def input_at(self, length: int):
        b = self.base
        q, k, v = (t[:, :, :length].contiguous() for t in (b.q, b.k, b.v))
        meta = {**b.meta, "max_tokens": length, "content_hash": content_hash(q, k, v)}
        return AttentionInput(name=f"{self._stem()}-s{length}", q=q, k=k, v=v, causal=False, window=None,
                              sm_scale=b.sm_scale, meta=meta)

    def window(self, mask: str) -> int | None:
        return self.base.window if mask == "causal" else None

    def describe(self) -> dict:
        m = self.base.meta
        return {"source": "capture", "file": m.get("file"), "file_sha256": m.get("file_sha256"),
                "model": m.get("model"), "layer": m.get("layer"), "layer_type": m.get("layer_type"),
                "q_heads": m.get("q_heads"), "kv_heads": m.get("kv_heads"), "tokens": self.max_length,
                "causal": bool(self.base.causal), "window": self.base.window}


def _key(name: str, subject: Subject) -> tuple:
    """The :func:`zyfa.accuracy.io.results_io.row_key` of the row of ``subject`` at input ``name`` (no content hash)."""
    return row_key({"input": name, "recipe": subject.recipe_name, "implementation": subject.name})


def _points(lengths, masks, shapes, chunk):
    for L in lengths:
        for mask in masks:
            for shape in shapes:
                if shape == "chunk" and chunk >= L:
                    continue  # the same problem as "equal"
                yield L, mask, shape


def plan_keys(source, subs: Sequence[Subject], lengths: Sequence[int], masks: Sequence[str],
              shapes: Sequence[str], chunk: int) -> list[tuple]:
    """Row keys in the order :func:`run_cliffs` makes the rows (what a resumed run skips, and the file's order)."""
    return [_key(source.name_at(L, mask, shape, chunk), s)
            for L, mask, shape in _points(lengths, masks, shapes, chunk) for s in subs]


# ---------------------------------------------------------------------------------------------- the sweep

def _point_shape(source, L: int, shape: str, chunk: int) -> dict:
    spec = getattr(source, "spec", None)
    if spec is not None:
        b, h, h_kv, d, d_v = spec.batch, spec.heads_q, spec.heads_kv, spec.head_dim, spec.d_v
    else:
        x = source.base
        b, h, _, d = x.q.shape
        h_kv, d_v = x.k.shape[1], x.v.shape[3]
    return {"batch": b, "heads_q": h, "heads_kv": h_kv, "seq_q": min(chunk, L) if shape == "chunk" else L,
            "seq_k": L, "head_dim": d, "head_dim_v": d_v}


def check_lengths_fit(source, lengths: Sequence[int], device) -> None:
    """ValueError (one line) when the longest length needs more memory than ``device`` has free
    (:func:`zyfa.accuracy.io.device.check_memory`), naming the longest length that fits."""
    if source.max_length is not None and max(lengths) > source.max_length:
        raise ValueError(f"length {max(lengths)} is above the input's {source.max_length} tokens: use --max-length "
                         f"{source.max_length} or shorter --lengths")
    try:
        check_memory(_point_shape(source, max(lengths), "equal", 1), device, what=f"length {max(lengths)}")
    except ValueError as e:
        fit = _longest_fitting(source, sorted(set(lengths)), device)
        hint = f"; lengths up to {fit} fit (--max-length {fit})" if fit is not None else ""
        raise ValueError(f"{e}{hint}") from None


def _longest_fitting(source, lengths: Sequence[int], device) -> int | None:
    """The longest of the sorted ``lengths`` that fits ``device`` (memory grows with the length: a bisection, so a
    long list is answered in a few checks), or None."""
    lo, hi = 0, len(lengths)
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits(source, lengths[mid], device):
            lo = mid + 1
        else:
            hi = mid
    return lengths[lo - 1] if lo > 0 else None


def _fits(source, L, device) -> bool:
    try:
        check_memory(_point_shape(source, L, "equal", 1), device)
        return True
    except ValueError:
        return False


def run_cliffs(source, subs: Sequence[Subject], lengths: Sequence[int], *, masks: Sequence[str] = ("none",),
               shapes: Sequence[str] = ("equal",), chunk: int = 128, device="cpu", progress: bool = True,
               seed: int = 0, skip: Collection[tuple] = (), on_start: Callable[[dict], None] | None = None,
               on_row: Callable[[dict], None] | None = None, run_id: str | None = None,
               extra_provenance: dict | None = None) -> tuple[list[dict], dict]:
    """Sweep ``subs`` over every (length, mask, shape); one row per subject at each point, in :func:`plan_keys`
    order, handed to ``on_row`` as it is made. Rows whose key is in ``skip`` are not made (a resumed run); a
    point whose rows are all done is not computed at all.

    Implementations whose device or package is missing are not run (the provenance's
    ``implementations_unavailable`` says why). A kernel's refusal or failure at a length is its row's status,
    never an exception.

    Returns:
        (the rows made, the run's provenance).

    Raises:
        ValueError: no lengths or subjects, an unknown mask or shape, or a longest length that would not fit.
    """
    lengths = sorted(set(int(L) for L in lengths))
    if not lengths:
        raise ValueError("no lengths to sweep")
    if not subs:
        raise ValueError("nothing to sweep: name --recipes, --implementations or --kernel")
    bad = [m for m in masks if m not in MASKS] + [s for s in shapes if s not in SHAPES]
    if bad:
        raise ValueError(f"unknown mask or shape {bad[0]!r} (masks: {', '.join(MASKS)}; shapes: {', '.join(SHAPES)})")
    if chunk < 1:
        raise ValueError(f"--chunk must be >= 1, got {chunk}")
    dev = resolve_device(device)
    check_lengths_fit(source, lengths, dev)
    usable, unavailable = [], {}
    for s in subs:
        ok, why = (True, "") if s.impl is None else s.impl.available()
        if ok:
            usable.append(s)
        else:
            unavailable[s.name] = why
    plat, plat_note = device_platform(dev)
    torch.manual_seed(seed)
    prov = provenance({
        "record_kind": "cliffs",
        "run_id": run_id or uuid.uuid4().hex[:12],
        "device": str(dev),
        "device_name": device_name(dev),
        "seed": seed,
        "subjects": [{"name": s.name, "kind": s.kind, "recipe": s.recipe_name} for s in usable],
        "implementations_unavailable": unavailable,
        "implementations_platform": plat,
        "implementations_platform_note": plat_note,
        "lengths": format_lengths(lengths),
        "masks": list(masks),
        "shapes": list(shapes),
        "chunk": chunk,
        "input_source": source.describe(),
        **(extra_provenance or {}),
    })
    if on_start is not None:
        on_start(prov)
    skip = set(skip)
    todo: dict[int, list] = {}
    for L, mask, shape in _points(lengths, masks, shapes, chunk):
        name = source.name_at(L, mask, shape, chunk)
        left = [s for s in usable if _key(name, s) not in skip]
        if left:
            todo.setdefault(L, []).append((mask, shape, name, left))

    bar = progress_bar(sum(len(p[3]) for pts in todo.values() for p in pts), enabled=progress, unit="row",
                       desc="cliffs")
    rows: list[dict] = []
    hashes: dict[int, str] = {}
    try:
        for L, pts in todo.items():
            inp = source.input_at(L)
            hashes[L] = inp.meta.get("content_hash")
            x_full = inp.to(dev)
            for mask, shape, name, left in pts:
                x = _point_input(x_full, source, mask, shape, chunk, name)
                base = {"run_id": prov["run_id"], "input": name, "input_hash": inp.meta.get("content_hash"),
                        "source": source.kind, "length": L, "shape": shape,
                        "chunk": chunk if shape == "chunk" else None, "mask": mask}
                for row in _run_point(x, left, base, dev, plat, bar):
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
    finally:
        bar.close()
    prov["input_hashes"] = {str(k): v for k, v in hashes.items()}
    return rows, prov


def _point_input(x, source, mask: str, shape: str, chunk: int, name: str):
    q = x.q[:, :, x.q.shape[2] - chunk:] if shape == "chunk" else x.q
    return dataclasses.replace(x, name=name, q=q, causal=mask == "causal", window=source.window(mask))


def operator_errors(out, lse, ref) -> dict[str, float | None]:
    """``rel_l2`` (:func:`zyfa.norms.rel_l2`, the study's definition) of ``out`` against
    ``ref = (out, lse)`` of the FP64 oracle, and ``lse_max_abs_err`` over the rows whose reference LSE is finite
    (None without an LSE, or where the two disagree on which rows are fully masked); None for a value that is
    not finite (an output holding NaN/Inf). Computed on the device, read back once."""
    vals = list(rel_l2_terms(out, ref[0]))  # squared norms, read back with the rest
    lse_ok = lse is not None
    if lse_ok:
        lr = ref[1]
        lo = lse.double().reshape(lr.shape)
        keep = torch.isfinite(lr)
        vals.append(torch.where(keep, (lo - lr).abs(), torch.zeros_like(lr)).amax() if lr.numel() else lr.sum())
        vals.append(((lo == -math.inf) != ~keep).any().double())  # masked rows that disagree
    got = torch.stack(vals).tolist()
    rel = rel_l2_from_terms(got[0], got[1])
    lse_err = None if not lse_ok or got[3] else got[2]
    return {"rel_l2": finite_or_none(rel), "lse_max_abs_err": finite_or_none(lse_err)}


def _errors(out, lse, ref, prefix: str) -> dict:
    return {prefix + k: v for k, v in operator_errors(out, lse, ref).items()}


def _run_point(x, subs: Sequence[Subject], base: dict, dev, plat, bar) -> list[dict]:
    # lazy: looked up when called, so a test can stand a stub in for it
    from zyfa.reference.attention import attention_fp64

    kw = {"causal": x.causal, "sm_scale": x.sm_scale, "window": x.window}
    t0 = time.perf_counter()
    ref_orig = attention_fp64(x.q, x.k, x.v, chunk_size=ORACLE_CHUNK, **kw)
    sync_device(dev)
    oracle_s = time.perf_counter() - t0
    orig32 = tuple(t.float() for t in (x.q, x.k, x.v))
    refs: dict[tuple, tuple] = {}  # quantization key -> FP64 reference on those dequantized inputs (shared)

    def deq_ref(recipe, deq=None) -> tuple:
        key = quantization_key(recipe)
        if key not in refs:
            deq = deq if deq is not None else quantize_inputs(x.q, x.k, x.v, recipe).dequantized()
            same = all(torch.equal(a, b) for a, b in zip(deq, orig32, strict=True))
            refs[key] = ref_orig if same else attention_fp64(*deq, chunk_size=ORACLE_CHUNK, **kw)
        return refs[key]

    b, h, s_q, _ = x.q.shape
    shape = {"seq_q": s_q, "seq_k": x.k.shape[2], "causal": bool(x.causal), "window": x.window, "batch": b,
             "heads_q": h, "heads_kv": x.k.shape[1], "head_dim": x.q.shape[3], "head_dim_v": x.v.shape[3],
             "dtype": str(x.q.dtype).replace("torch.", ""),
             "sm_scale": x.sm_scale if x.sm_scale is not None else 1.0 / math.sqrt(x.q.shape[3])}
    amax = float(ref_orig[0].abs().max())
    rows = []
    for s in subs:
        bar.set_postfix_str(f"L={base['length']} {base['mask']} {base['shape']} {s.name}")
        row: dict[str, Any] = {**base, "implementation": s.name, "impl_kind": s.kind, "recipe": s.recipe_name,
                               "platform": None, **shape, "status": "ok", "reason": None, "orig_rel_l2": None,
                               "deq_rel_l2": None, "orig_lse_max_abs_err": None, "deq_lse_max_abs_err": None,
                               "nonfinite_rows": None, "n_rows": b * h * s_q, "seconds": None,
                               "oracle_seconds": oracle_s, "device": str(dev)}
        out = lse = deq = quant = None
        t0 = time.perf_counter()
        if s.kind == "recipe":
            em = emulate(x.q, x.k, x.v, s.recipe, **kw)
            sync_device(dev)
            out, lse, deq, quant = em.out, em.lse, (em.q_deq, em.k_deq, em.v_deq), s.recipe
            row["platform"] = em.platform
        else:
            row["platform"] = plat
            reason = unsupported_reason(s.impl, x)
            if reason is not None:
                row.update(status="refused", reason=reason)
            else:
                try:
                    res = call_implementation(s.impl, x, {"oracle_out_amax": amax}, allow_nonfinite=True)
                    sync_device(dev)
                    out, lse = res.out.to(dev), (None if res.lse is None else res.lse.to(dev))
                except ImplementationError as e:
                    # raised inside the kernel (chained): it refuses this length; else a broken kernel or output
                    row.update(status="refused" if e.__cause__ is not None else "failed", reason=str(e))
                if out is not None and s.impl.recipe is not None:
                    quant = _paired_recipe(s.impl, plat)
        if out is not None:
            row["seconds"] = time.perf_counter() - t0
            row["nonfinite_rows"] = int((~torch.isfinite(out)).any(dim=-1).sum())
            row.update(_errors(out, lse, ref_orig, "orig_"))
            if quant is not None:
                row.update(_errors(out, lse, deq_ref(quant, deq), "deq_"))
        rows.append({k: row[k] for k in ROW_KEYS})
        bar.update(1)
    return rows


_PAIRED: dict = {}


def _paired_recipe(impl, plat):
    """The recipe whose quantization ``impl`` uses (:func:`zyfa.accuracy.implementations.base.pairing`), once per
    run."""
    key = (id(impl), plat)
    if key not in _PAIRED:
        _PAIRED[key] = (impl, pairing(impl, plat).recipe)  # the impl kept alive so its id stays unique
    return _PAIRED[key][1]
