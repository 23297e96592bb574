"""Every arithmetic field of every recipe, against an independent float64 mini-emulation written in this file.

``_reference`` below is a second, deliberately plain implementation of a recipe, written from the field
descriptions in :mod:`zyfa.recipes` (not from the emulator's code): float64 numpy for everything that is not a
documented rounding, and explicit roundings where a recipe rounds. Its only shared pieces are the format
roundings ``round_to_fp8`` / ``round_to_bf16`` (checked on every code against torch's casts in
tests/zyfa/test_formats_exact.py); the MAD integer, the Schraudolph bits, the Hopper accumulator model, the P
scales, the online softmax and the quantizers are written out here.

The emulator computes in fp32 and this reference in float64, so a rounding decision could legitimately go the
other way where a value sits within fp32 error of a rounding boundary. ``_Guard`` notes any rounding decision
of the reference (input quantization, P exponent, P rounding or MAD integer) that would change within an fp32
error bound of its input; each case uses the first seed with none. The outputs must then be bit-equal to the
reference's rounded output wherever the unrounded value is clear of the output's rounding boundary, and within
one unit of the output format elsewhere (fp32 outputs: 2^-16 of the row's largest value); the LSE within 2e-5.

Each field variant also checks that the base recipe's answer would fail it (the field's effect is visible), so
a case cannot pass with the emulator ignoring the field. Fields whose effect is below any output format's
precision (``reciprocal``, ``log2e_folded``, ``v_descale`` with per-tensor scales) are pinned bit for bit in
fp32 by the targeted tests further down, on inputs built so that every other quantity is exact. The P exponent
of ``pow2_block`` and the MAD integer are also pinned directly, from the emulator's trace.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from tests.zyfa.hopper_rule import hopper_mma
from zyfa.emulator import emulate
from zyfa.formats import e4m3fn_bits_from_log2, round_to_bf16, round_to_fp8
from zyfa.norms import rel_l2
from zyfa.platforms import H200, Platform, get_platform
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import RECIPES, Recipe
from zyfa.rotation import rotation_matrix

pytestmark = pytest.mark.filterwarnings("ignore:head dims")  # tiny head dims on purpose

FMAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0, "e5m2": 57344.0}
LOG2E = 1.0 / math.log(2.0)
SCHRAUDOLPH = 127 * 2**23 - 486411  # the documented constant of exp_method="exp2_bittrick"


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------- roundings

class _Guard:
    """``margin`` drops to 0 when a rounding decision is within fp32 error of its boundary; ``where`` says which."""

    def __init__(self):
        self.margin, self.where = math.inf, ""

    def note(self, margin: float, where: str) -> None:
        if margin < self.margin:
            self.margin, self.where = margin, where


def _fp8(x: np.ndarray, fmt: str, guard: _Guard | None = None, what: str = "", rel=3e-7) -> np.ndarray:
    """Saturating RNE cast to ``fmt`` (float64 in and out); the guard checks x·(1 ± rel) rounds the same."""
    x = np.asarray(x, dtype=np.float64)

    def rnd(y):
        return round_to_fp8(torch.from_numpy(np.ascontiguousarray(y)), fmt).double().numpy()

    r = rnd(x)
    if guard is not None and not all(np.array_equal(rnd(x * (1 + s * rel)), r) for s in (1, -1)):
        guard.note(0.0, what)
    return r


def _bf16(x: np.ndarray) -> np.ndarray:
    return round_to_bf16(torch.from_numpy(np.asarray(x, dtype=np.float32))).double().numpy()


def _integer(y: np.ndarray, rounding: str, guard: _Guard, what: str, slack) -> np.ndarray:
    """R(y), R nearest-even or truncation toward zero; the guard checks y ± slack rounds the same."""
    def r(z):
        return np.rint(z) if rounding == "nearest" else np.trunc(z)

    out = r(y)
    if not (np.array_equal(r(y + slack), out) and np.array_equal(r(y - slack), out)):
        guard.note(0.0, what)
    return out


def _mad_value(t_s: np.ndarray, offset: float, rounding: str) -> np.ndarray:
    """Technique 1 by hand: n = clamp(R(8t + 56 + offset), 0, 0x7E), read as an e4m3fn code (E = n // 8,
    M = n % 8: 2^(E-7)·(1 + M/8), subnormal M·2^-9)."""
    y = np.clip(np.where(np.isneginf(t_s), -1.0, 8.0 * t_s + 56.0 + offset), -1.0, 200.0)
    n = np.clip(np.rint(y) if rounding == "nearest" else np.trunc(y), 0, 126)
    big_e, mant = n // 8, n % 8
    return np.where(big_e >= 1, 2.0 ** (big_e - 7) * (1 + mant / 8), mant * 2.0**-9)


def _bittrick(t: np.ndarray) -> np.ndarray:
    """fp32 Schraudolph exp2: the fp32 word u32(2^23·t + 127·2^23 − 486411), computed in fp32 as documented."""
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.float32(t.astype(np.float32) * np.float32(2**23)) + np.float32(SCHRAUDOLPH)
    y = np.where(np.isfinite(y), y, 0).astype(np.float64)
    bits = np.clip(np.trunc(y), 0, None).astype(np.int64).astype(np.uint32)
    return bits.view(np.float32).astype(np.float64)


def _stepwise_mma(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """a @ b as a kernel keeping a true fp32 sum computes it on the h200 platform (zyfa.platforms): every k = 32
    step from a fresh accumulator (:func:`tests.zyfa.hopper_rule.hopper_mma`), the step results added in k order."""
    out = np.zeros((a.shape[0], b.shape[1]))
    for k0 in range(0, a.shape[1], 32):
        out = out + hopper_mma(a[:, k0:k0 + 32], b[k0:k0 + 32], None, bits)
    return out


# ---------------------------------------------------------------------------------------------- quantization

def _quant(x: np.ndarray, fmt: str, gran: str, block: int, heads_kv: int, guard: _Guard, what: str):
    """(values, descale broadcastable to x) for one operand (b, h, s, d), as zyfa.recipes describes it."""
    if fmt == "fp32":
        return x.astype(np.float32).astype(np.float64), np.ones((1, 1, 1, 1))
    if fmt == "bf16":
        return _bf16(x), np.ones((1, 1, 1, 1))
    b, h, s, d = x.shape
    fmax = 127.0 if fmt == "int8" else FMAX[fmt]
    if gran == "none":
        return _fp8(x, fmt, guard, what), np.ones((1, 1, 1, 1))
    a = np.abs(x).astype(np.float32)
    if gran == "tensor":
        amax = a.max().reshape(1, 1, 1, 1)
    elif gran == "head":
        amax = a.max(axis=(2, 3), keepdims=True)
    elif gran == "head_kv":  # Q per (batch, kv head): the kv head's query-head group shares one
        g = h // heads_kv
        amax = np.repeat(a.reshape(b, heads_kv, g * s * d).max(-1).reshape(b, heads_kv, 1, 1), g, axis=1)
    elif gran == "channel":
        amax = a.max(axis=2, keepdims=True)
    elif gran == "block":
        nb = -(-s // block)
        amax = np.zeros((b, h, s, 1), dtype=np.float32)
        for i in range(nb):
            amax[:, :, i * block:(i + 1) * block] = a[:, :, i * block:(i + 1) * block].max(axis=(2, 3), keepdims=True)
    else:
        raise AssertionError(gran)
    # descale = amax / max in fp32 (1 where amax is 0), the kernels' argument convention
    descale = np.where(amax > 0, (amax / np.float32(fmax)).astype(np.float32), np.float32(1.0)).astype(np.float64)
    if fmt == "int8":
        y = x / descale
        return np.clip(_integer(y, "nearest", guard, what, slack=3e-7 * np.abs(y) + 1e-9), -127, 127), descale
    return _fp8(x / descale, fmt, guard, what), descale


# ---------------------------------------------------------------------------------------------- the reference

def _block_exponent(t: np.ndarray, r: Recipe, e_prev: np.ndarray, fmax: float) -> np.ndarray:
    """pow2_block: the largest power of two that keeps the block max at or below the format max,
    e = floor(log2(max) - t_max) (so the block max lands in (max/2, max]), capped; per row or per tile."""
    t_max = t.max(-1, keepdims=True)
    if r.p_scale_granularity == "tile":
        t_max = np.full_like(t_max, t_max.max())
    return np.where(np.isneginf(t_max), e_prev, np.minimum(np.floor(math.log2(fmax) - t_max), r.p_block_max_log2))


def _probabilities(t: np.ndarray, r: Recipe, e: np.ndarray | None, fmax: float):
    """(P as it feeds P·V, the fp32 row-sum source, the tile's unscale) from log2 probabilities t; ``e`` is the
    power-of-two exponent of pow2 scales (None otherwise)."""
    if r.exp_method == "mad_fp8":
        t_s = t + (e if e is not None else 0.0)
        return _mad_value(t_s, r.mad_offset, r.mad_rounding), np.exp2(t_s), None
    p = np.exp2(t) if r.exp_method == "exp2" else _bittrick(t)
    unscale = None
    if e is not None:
        ps = p * 2.0**e
    elif r.p_scale == "fmax":
        ps = p * fmax
    elif r.p_scale == "tile_amax":
        amax = max(p.max(), 1e-9)  # over the block_m x block_n tile
        ps, unscale = p * (fmax / amax), amax / fmax
    else:
        ps = p
    if r.p_format == "fp32":
        p8 = ps.astype(np.float32).astype(np.float64)
    elif r.p_format == "bf16":
        p8 = _bf16(ps)
    else:
        p8 = _fp8(ps, r.p_format)
    return p8, (ps if e is not None else p), unscale


def _reference(q, k, v, r: Recipe, *, causal=False, window=None, sm_scale=None, parts=None,
               platform: Platform | None = None):
    """One recipe in float64 with explicit roundings. q (b, h, s_q, d), k/v (b, h_kv, s_k, d): numpy float64.

    Returns (out, lse, guard): out (b, h, s_q, d_v) before the output rounding (:func:`_disagree` rounds it),
    lse natural log. ``parts`` (a dict), if given, receives batch 0 head 0's final ``acc`` and ``l`` and per tile
    ``tiles``: (row slice, alpha, P·V of the tile before any descale, row sum).
    """
    guard = _Guard()
    b, h, s_q, d = q.shape
    h_kv, s_k, d_v = k.shape[1], k.shape[2], v.shape[3]
    grp = h // h_kv
    sm = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    if r.qk_rotation != "none":  # the same orthogonal M for Q and K (zyfa.rotation, tested on its own), float32
        m = rotation_matrix(d, r.qk_rotation, seed=r.rotation_seed, dtype=torch.float64).numpy()
        q = (q.astype(np.float32) @ m.astype(np.float32)).astype(np.float64)
        k = (k.astype(np.float32) @ m.astype(np.float32)).astype(np.float64)
    k_mean = np.zeros((b, h_kv, 1, d))
    if r.k_smoothing:  # subtract K's per-channel mean over the sequence (softmax-invariant)
        k_mean = k.astype(np.float32).mean(axis=2, keepdims=True, dtype=np.float32).astype(np.float64)
        k = (k.astype(np.float32) - k_mean.astype(np.float32)).astype(np.float64)
    q8, qd = _quant(q, r.q_format, r.q_scale, r.scale_block_q, h_kv, guard, "q")
    k8, kd = _quant(k, r.k_format, r.k_scale, r.scale_block_kv, h_kv, guard, "k")
    v8, vd = _quant(v, r.v_format, r.v_scale, r.scale_block_kv, h_kv, guard, "v")
    p_fp8 = r.p_format in FMAX
    fmax = FMAX[r.p_format] if p_fp8 else 1.0
    # The platform (docs/PLATFORMS.md): h200 truncates FP8 sums in both Q·K and P·V (kept in the unit with
    # accumulator="matrix_unit", every k step flushed into fp32 with "fp32"); mi355x and BF16 sum in fp32.
    plat = get_platform(r.platform if platform is None else platform)  # the platform's kept bits, not the recipe's
    truncating = plat.name == "h200"
    in_unit = r.accumulator == "matrix_unit"
    qk_fp8 = r.q_format in FMAX and r.k_format in FMAX
    hopper = in_unit and p_fp8 and truncating
    pv_steps = not in_unit and p_fp8 and truncating
    bits = plat.accum_bits

    def fresh_pv(p8, vt):  # P·V of one tile from a fresh accumulator
        return hopper_mma(p8, vt, None, bits) if hopper else _stepwise_mma(p8, vt, bits) if pv_steps else p8 @ vt

    def scores(qv, kt):  # raw Q·K products summed as the platform does
        if not (truncating and qk_fp8):
            return qv @ kt
        return hopper_mma(qv, kt, None, bits) if in_unit else _stepwise_mma(qv, kt, bits)

    bm, bn = r.tiles(d)
    rows = -(-s_q // bm) * bm  # rows padded to whole blocks of block_m (a kernel program each)
    out = np.zeros((b, h, s_q, d_v))
    lse = np.full((b, h, s_q), -math.inf)

    def pick(x, bi, hi):  # descale of (batch, head), broadcast over (s, 1)
        return x[min(bi, x.shape[0] - 1), min(hi, x.shape[1] - 1)]

    for bi in range(b):
        for hi in range(h):
            kv = hi // grp
            qv = np.zeros((rows, d))
            qv[:s_q] = q8[bi, hi]
            qdv = np.ones((rows, 1))
            qdv[:s_q] = np.broadcast_to(pick(qd, bi, hi), (s_q, 1))
            kdv = np.broadcast_to(pick(kd, bi, kv), (s_k, 1))[:, 0]
            vdv = np.broadcast_to(pick(vd, bi, kv), (s_k, d_v) if vd.shape[3] > 1 else (s_k, 1))
            # log2-unit scores: c = sm_scale · qd · kd · log2(e) (natural-log scores then ×1/ln 2: the same)
            x_all = scores(qv, k8[bi, kv].T) * (sm * LOG2E) * qdv * kdv[None, :]
            pos = np.arange(rows)[:, None] + (s_k - s_q)
            keys = np.arange(s_k)[None, :]
            allowed = np.broadcast_to(np.arange(rows)[:, None] < s_q, (rows, s_k)).copy()
            if causal or window is not None:
                allowed &= keys <= pos
            if window is not None:
                allowed &= keys > pos - window
            x_all = np.where(allowed, x_all, -math.inf)
            m = np.full((rows, 1), -math.inf)
            l = np.zeros((rows, 1))
            e = np.zeros((rows, 1))
            acc = np.zeros((rows, d_v))
            acc_tc = np.zeros((rows, d_v))
            n_tiles = -(-s_k // bn)
            # a row block skips a KV tile none of its rows sees (the kernels' loop bounds); the flush every N
            # tiles counts tiles from key 0 (the kernel's start_n // BLOCK_N), whatever the mask; kv_order
            # "reverse" visits the tiles from the last to the first (FA3's mainloop)
            for tile in (range(n_tiles)[::-1] if r.kv_order == "reverse" else range(n_tiles)):
                c0, c1 = tile * bn, min((tile + 1) * bn, s_k)
                for r0 in range(0, rows, bm):
                    rs = slice(r0, r0 + bm)
                    al = allowed[rs, c0:c1]
                    if not al.any():
                        continue
                    x = x_all[rs, c0:c1]
                    m_new = np.maximum(m[rs], x.max(-1, keepdims=True))
                    m_use = np.where(np.isneginf(m_new), 0.0, m_new)
                    alpha = np.exp2(m[rs] - m_use)
                    t = x - m_use
                    # fp32 error bound of t as the emulator computes it (a few roundings of x and m; none at the
                    # row max itself, where t = x - x = 0 exactly): every rounding decision below must come out
                    # the same at t ± dt (the guard)
                    dt = np.where(np.isfinite(t) & (t != 0), 2.0**-22 * (np.abs(x) + np.abs(m_use)) + 2.0**-21, 0.0)
                    m[rs] = m_new
                    e_scale = None
                    if r.p_scale == "pow2":
                        e_scale = np.full((bm, 1), float(r.p_scale_log2))
                    elif r.p_scale == "pow2_block":
                        e_scale = _block_exponent(t, r, e[rs], fmax)
                        if not all(np.array_equal(_block_exponent(t + s * dt, r, e[rs], fmax), e_scale)
                                   for s in (1, -1)):
                            guard.note(0.0, "pow2_block exponent")
                    if e_scale is not None:
                        alpha = alpha * 2.0 ** (e_scale - e[rs])
                        e[rs] = e_scale
                    e_p = e[rs] if e_scale is not None else None
                    p8, p_sum, unscale = _probabilities(t, r, e_p, fmax)
                    for tt in (t + dt, t - dt) if p_fp8 else ():  # a bf16/fp32 P flip moves an output < 1 ulp
                        if not np.array_equal(_probabilities(tt, r, e_p, fmax)[0], p8):
                            guard.note(0.0, "P")
                    if r.rowsum == "fp32":
                        row_sum = p_sum.sum(-1, keepdims=True)
                    else:
                        if r.rowsum == "rounded_mma":  # P8 · ones, a fresh accumulator per tile
                            row_sum = fresh_pv(p8, np.ones((p8.shape[1], 1)))
                        else:
                            row_sum = p8.sum(-1, keepdims=True)
                        if r.p_scale == "fmax":
                            row_sum = row_sum / fmax
                    l[rs] = alpha * l[rs] + row_sum
                    vt = v8[bi, kv, c0:c1]
                    if parts is not None and bi == hi == 0:
                        parts.setdefault("tiles", []).append((rs, alpha, p8 @ vt, row_sum))
                    acc[rs] *= alpha
                    if r.p_scale == "tile_amax" or r.v_descale == "tile":
                        pv = fresh_pv(p8, vt)
                        if unscale is not None:
                            pv = pv * unscale
                        if r.v_descale == "tile":
                            pv = pv * vdv[c0]  # one V descale block per tile
                        acc[rs] += pv
                    elif hopper:
                        acc_tc[rs] = hopper_mma(p8, vt, acc_tc[rs] * alpha, bits)
                        if r.accum_flush_tiles and (tile + 1) % r.accum_flush_tiles == 0:
                            acc[rs] += acc_tc[rs]
                            acc_tc[rs] = 0.0
                    else:
                        acc[rs] += fresh_pv(p8, vt)
            acc = acc + acc_tc
            if parts is not None and bi == hi == 0:
                parts.update(acc=acc[:s_q].copy(), l=l[:s_q].copy(), vd=vdv[0])
            safe = np.where(l > 0, l, 1.0)
            o = np.where(l > 0, acc / safe, 0.0)
            if r.v_descale == "end":
                o = o * vdv[0] / (fmax if r.p_scale == "fmax" else 1.0)
            elif r.p_scale == "fmax":
                o = o / fmax
            out[bi, hi] = o[:s_q]
            with np.errstate(divide="ignore"):
                lg = (np.where(np.isneginf(m), 0.0, m) + np.log2(l) - e) * math.log(2.0)
            lse[bi, hi] = np.where(l > 0, lg, -math.inf)[:s_q, 0]
    if r.k_smoothing:  # the scores lack q·mean(k); the LSE is corrected by that term
        q_deq = q8 * qd
        lse = lse + sm * np.einsum("bhsd,bhd->bhs", q_deq, np.repeat(k_mean[:, :, 0], grp, axis=1))
    return out, lse, guard


def _round_out(o: np.ndarray, fmt: str, add=0.0) -> np.ndarray:
    """The output rounding of ``o + add`` (e4m3fn: scaled by the amax of ``o`` itself)."""
    x = o + add
    if fmt == "fp32":
        return x
    if fmt in ("bf16_rne", "bf16_trunc"):
        mode = "rne" if fmt == "bf16_rne" else "trunc"
        return round_to_bf16(torch.from_numpy(x.astype(np.float32)), mode).double().numpy()
    amax = np.abs(o).max()  # e4m3fn scaled by the output amax, rounded, descaled
    scale = 448.0 / amax if amax > 0 else 1.0
    return _fp8(x * scale, "e4m3fn") / scale


def _disagree(out: np.ndarray, unrounded: np.ndarray, fmt: str) -> np.ndarray:
    """Where ``out`` is not the output rounding of the reference's ``unrounded`` output.

    fp32 outputs: more than 2^-16 of the row's largest value apart. Rounded outputs: not equal where the
    unrounded value is clear of its rounding boundary by more than fp32 error (1e-6 of the row's largest value
    plus 1e-5 of its own), more than one unit of the format apart where it is not. (Equal: bit-equal for bf16;
    for e4m3fn up to 1e-6 relative, the output being an FP8 value divided by an fp32 scale.)
    """
    ref = _round_out(unrounded, fmt)
    row = np.abs(unrounded).max(-1, keepdims=True)
    if fmt == "fp32":
        return np.abs(out - ref) > 2.0**-16 * row
    a = np.abs(ref)
    if fmt == "e4m3fn":
        scale = 448.0 / np.abs(unrounded).max()
        ulp = np.maximum(2.0 ** (np.floor(np.log2(np.maximum(a * scale, 2.0**-6))) - 3), 2.0**-9) / scale
        same = np.abs(out - ref) <= 1e-6 * a
    else:
        ulp = 2.0 ** (np.floor(np.log2(np.maximum(a, 2.0**-126))) - 7)
        same = out == ref
    delta = 1e-6 * row + 1e-5 * np.abs(unrounded)
    clear = (_round_out(unrounded, fmt, delta) == ref) & (_round_out(unrounded, fmt, -delta) == ref)
    return np.where(clear, ~same, np.abs(out - ref) > ulp * (1 + 1e-6))


# ---------------------------------------------------------------------------------------------- inputs

def _inputs(seed, b=1, h=4, h_kv=2, s_q=12, s_k=80, d=16, std=1.5):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s_q, d, generator=g) * std
    k = torch.randn(b, h_kv, s_k, d, generator=g) * std
    v = torch.randn(b, h_kv, s_k, d, generator=g)
    return q, k, v


def _clear_case(recipe: Recipe, shape: dict, mask: dict, sm_scale=None, seeds=range(40), platform=None):
    """The first seed whose reference rounding decisions are all clear of their boundaries: (inputs, reference)."""
    for seed in seeds:
        q, k, v = _inputs(seed, **shape)
        out, lse, guard = _reference(q.double().numpy(), k.double().numpy(), v.double().numpy(), recipe,
                                     sm_scale=sm_scale, platform=platform, **mask)
        if guard.margin > 0:
            return (q, k, v), out, lse
    raise AssertionError(f"{recipe.name}: no seed in {seeds} keeps every rounding decision clear ({guard.where})")


def _assert_agrees(recipe, shape, mask, sm_scale=None, platform=None):
    """emulate(recipe) against the reference (on ``platform``, default the recipe's): outputs by
    :func:`_disagree`, the LSE to 2e-5."""
    (q, k, v), ref, ref_lse = _clear_case(recipe, shape, mask, sm_scale, platform=platform)
    emu = emulate(q, k, v, recipe, sm_scale=sm_scale, platform=platform, **mask)
    out = emu.out.double().numpy()
    bad = _disagree(out, ref, recipe.out_format)
    assert not bad.any(), (f"{recipe.name}: {int(bad.sum())} of {bad.size} outputs disagree with the reference's "
                           f"{recipe.out_format}; largest difference {np.abs(out - ref).max():.3e}")
    lse = emu.lse.double().numpy()
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    assert np.abs(lse[fin] - ref_lse[fin]).max(initial=0.0) < 2e-5, recipe.name
    return (q, k, v), ref, ref_lse


MASKS = {"full": {}, "causal": {"causal": True}, "window": {"causal": True, "window": 20}}
NAMED_SHAPE = dict(h=2, h_kv=1, s_q=16, s_k=300, d=16, std=1.0)  # 300 keys: 3 tiles of 128, 5 of 64


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("name", list(RECIPES))
def test_named_recipe_matches_the_independent_reference(name, mask):
    """Every named recipe, as named, on 16 queries x 300 keys (several KV tiles; GQA 2:1), each mask."""
    _assert_agrees(get_recipe(name), NAMED_SHAPE, MASKS[mask])


# Field variants on small tiles (block_m 4 over 12 queries, block_n 16/32 over 80 keys): each changes one field
# (or a field and what it needs) from a base recipe; ids say which.
SMALL = dict(block_m=4, block_n=16)
SMALL32 = dict(block_m=4, block_n=32)
_Z = get_recipe("zyfa").replace(**SMALL)
_E = get_recipe("zyfa-exp2").replace(**SMALL)
_C = get_recipe("ck").replace(head_dim_tiles=(), **SMALL)  # the small tiles at every head dim
_H = get_recipe("zyfa-hopper").replace(**SMALL32)
# A coarser accumulator (the platform's kept bits edited), so that flushing matters at bf16 precision.
H200_8, H200_6 = dataclasses.replace(H200, accum_bits=8), dataclasses.replace(H200, accum_bits=6)
VARIANTS: dict[str, tuple[Recipe, dict]] = {
    # formats of Q, K, V
    "q_e5m2": (_C, dict(q_format="e5m2")),
    "k_e4m3fnuz": (_C, dict(k_format="e4m3fnuz")),
    "v_e5m2": (_C, dict(v_format="e5m2")),
    "qk_bf16": (_C, dict(q_format="bf16", k_format="bf16")),
    "v_fp32": (_C, dict(v_format="fp32")),
    "qk_int8": (_C, dict(q_format="int8", k_format="int8")),
    # descale granularities and blocks
    "q_head": (_C, dict(q_scale="head")),
    "q_head_kv": (_C, dict(q_scale="head_kv")),
    "k_head": (_C, dict(k_scale="head")),
    "q_block4": (_C, dict(q_scale="block", scale_block_q=4)),
    "k_block16": (_C, dict(k_scale="block", scale_block_kv=16)),
    "v_block16": (_C, dict(v_scale="block", scale_block_kv=16, v_descale="tile")),
    "v_channel": (_C, dict(v_scale="channel")),
    "v_none": (_C, dict(v_scale="none")),
    "int8_block": (_C, dict(q_format="int8", k_format="int8", q_scale="block", k_scale="block",
                            scale_block_q=4, scale_block_kv=32)),
    "k_smoothing": (_C, dict(k_smoothing=True)),
    "qk_hadamard": (_C, dict(qk_rotation="hadamard")),
    "qk_random_hadamard": (_C, dict(qk_rotation="random_hadamard", rotation_seed=5)),
    "qk_random_hadamard_smoothing": (_C, dict(qk_rotation="random_hadamard", k_smoothing=True)),
    # tiles
    "block_n32": (_E, dict(block_n=32)),
    "kv_reverse": (_E, dict(kv_order="reverse")),
    "kv_reverse_hopper": (_H, dict(kv_order="reverse")),
    "block_m8_tile_exponent": (_Z, dict(block_m=8, p_scale_granularity="tile")),
    # exponentials and the MAD
    "exp2_bittrick": (_E, dict(exp_method="exp2_bittrick")),
    "mad_nearest": (_Z, dict(mad_rounding="nearest")),
    "mad_offset0": (_Z, dict(mad_offset=0.0)),
    "mad_offset_half": (_Z, dict(mad_offset=-0.5, mad_rounding="nearest")),
    # P format and scale
    "p_e5m2": (_C, dict(p_format="e5m2")),
    "p_e4m3fnuz": (_C, dict(p_format="e4m3fnuz")),
    "p_bf16": (_C, dict(p_format="bf16", p_scale="none")),
    "p_fp32": (_C, dict(p_format="fp32", p_scale="none")),
    "p_none": (_C, dict(p_scale="none")),
    "p_pow2_log2_4": (_C, dict(p_scale="pow2", p_scale_log2=4)),
    "p_pow2_block": (_C, dict(p_scale="pow2_block")),
    "p_tile_amax": (_C, dict(p_scale="tile_amax")),
    "p_block_cap3": (_Z, dict(p_block_max_log2=3)),
    "zyfa_tile_exponent": (_Z, dict(p_scale_granularity="tile")),
    # row sum
    "rowsum_rounded": (_C, dict(rowsum="rounded")),
    "rowsum_fp32": (_Z, dict(rowsum="fp32")),
    "rowsum_mma_hopper": (_H, dict(rowsum="rounded_mma")),
    # where V's descale goes, accumulation, normalisation, output
    "v_descale_tile_ck": (_C, dict(v_descale="tile")),
    "hopper_never_flushed": (_H, dict(accum_flush_tiles=0)),
    "hopper_flush2": (_H, dict(accum_flush_tiles=2)),
    "hopper_bits6": (_H, dict()),  # the same recipe on the 6-bit platform (VARIANT_PLATFORMS)
    # on h200 "fp32" flushes every k step: visible against a never-flushed coarse accumulator
    "fp32_accumulator": (_H.replace(accum_flush_tiles=0), dict(accumulator="fp32")),
    "rcp": (_C, dict(reciprocal="rcp")),
    "out_bf16_trunc": (_C, dict(out_format="bf16_trunc")),  # ck rounds to nearest even (issue 13)
    "platform_h200": (_C, dict(platform="h200")),  # fp32 sums on the H200: every k step flushed into fp32
    "platform_mi355x": (_H, dict(platform="mi355x")),  # the tensor-core accumulator on MFMA: fp32
    "out_fp32": (_C, dict(out_format="fp32")),
    "out_e4m3fn": (_C, dict(out_format="e4m3fn")),
    "natural_log_scores": (_C, dict(log2e_folded=False)),
}
# (base platform, variant platform) where not the recipe's own: the accumulator's kept bits are the platform's
VARIANT_PLATFORMS: dict[str, tuple[Platform | None, Platform | None]] = {
    **{v: (H200_8, H200_8) for v in ("kv_reverse_hopper", "hopper_never_flushed", "hopper_flush2",
                                     "fp32_accumulator")},
    "hopper_bits6": (None, H200_6)}
# fields whose effect is below the output format's precision on these inputs: pinned by the exact tests below
BELOW_OUTPUT_PRECISION = {"rcp", "natural_log_scores", "v_descale_tile_ck"}
SMALL_SHAPE = dict(h=4, h_kv=2, s_q=12, s_k=80, d=16, std=2.0)



@pytest.mark.parametrize("mask", ["full", "window"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_field_variant_matches_the_independent_reference(variant, mask):
    base, change = VARIANTS[variant]
    base_plat, plat = VARIANT_PLATFORMS.get(variant, (None, None))
    recipe = base.replace(**{"name": f"{base.name}-{variant}", **change})
    (q, k, v), ref, ref_lse = _assert_agrees(recipe, SMALL_SHAPE, MASKS[mask], platform=plat)
    if variant in BELOW_OUTPUT_PRECISION or mask != "full":
        return
    # the case must discriminate: the base recipe's result (its reference, rounded as it rounds) is not a
    # passing answer for the variant, in the output or in the LSE
    base_ref, base_lse, _ = _reference(*(x.double().numpy() for x in (q, k, v)), base, platform=base_plat,
                                       **MASKS[mask])
    fin = np.isfinite(ref_lse)
    assert (_disagree(_round_out(base_ref, base.out_format), ref, recipe.out_format).any()
            or np.abs(base_lse[fin] - ref_lse[fin]).max() > 2e-5), f"{variant}: the field's effect is not visible here"


# ---------------------------------------------------------------------------------------------- exact fp32 steps

def _exact_inputs(v_scale: float = 1.0, seed: int = 0):
    """Inputs on which everything before the normalisation is exact in fp32 (1 head, 8 queries, 64 keys, d 16).

    Q and K are small integers with one 448 each (so the per-tensor descales are exactly 1) in channels whose
    products vanish; key 0 holds every row's largest score (so the running max never changes after tile 0 and
    every rescale is a power of two); the last key's score is so low that its P is 0, and V's 448 sits there.
    V is integers times ``v_scale``. With sm_scale = ln(2)/8, c = fp32(sm_scale·log2 e) = 1/8 exactly.
    """
    g = np.random.default_rng(seed)
    q = g.integers(-1, 2, (8, 16)).astype(np.float64)
    k = g.integers(-1, 2, (64, 16)).astype(np.float64)
    q[:, 0], q[:, 1:3] = 4.0, 0.0
    q[0, 1] = 448.0
    k[:, 0], k[:, 1:3] = g.integers(-1, 2, 64), 0.0
    k[0, 0], k[63, 0], k[63, 2] = 8.0, -48.0, 448.0
    v = g.integers(-8, 9, (64, 16)).astype(np.float64)
    v[63, 0] = 448.0
    s = q @ k.T
    assert (s[:, 0:1] > s[:, 1:]).all() and (s[:, 0] - s[:, 63] > 8 * 20).all()
    to = [torch.from_numpy(x[None, None]).float() for x in (q, k, v * v_scale)]
    return to, math.log(2.0) / 8


def _f32(x):
    return np.asarray(x, dtype=np.float32)


def test_reciprocal_div_and_rcp_bit_for_bit():
    """reciprocal='div': O = fp32(acc / l); 'rcp': O = fp32(acc · fp32(1 / l)), on exact acc and l."""
    (q, k, v), sm = _exact_inputs()
    outs = {}
    for rec in ("div", "rcp"):
        r = get_recipe("zyfa").replace(name=f"zyfa-{rec}", block_m=8, block_n=16, reciprocal=rec, out_format="fp32")
        parts: dict = {}
        _reference(*(x.double().numpy() for x in (q, k, v)), r, sm_scale=sm, parts=parts)
        acc, l = parts["acc"], parts["l"]
        assert np.array_equal(_f32(acc), acc) and np.array_equal(_f32(l), l), "acc and l must be exact in fp32"
        want = _f32(acc) / _f32(l) if rec == "div" else _f32(acc) * (np.float32(1) / _f32(l))
        outs[rec] = emulate(q, k, v, r, sm_scale=sm).out[0, 0].numpy()
        assert np.array_equal(outs[rec].view(np.int32), want.view(np.int32)), rec
    assert not np.array_equal(outs["div"], outs["rcp"])  # the two differ on these inputs


def test_v_descale_at_the_end_or_per_tile_bit_for_bit():
    """v_descale='end': O = fp32(fp32(acc / l) · vd); 'tile': acc += fp32(P·V_tile · vd) tile by tile (the
    rescales are powers of two here, so exact), O = fp32(acc / l)."""
    (q, k, v), sm = _exact_inputs(v_scale=0.37)
    outs = {}
    for where in ("end", "tile"):
        r = get_recipe("zyfa").replace(name=f"zyfa-vd-{where}", block_m=8, block_n=16, v_descale=where,
                                       out_format="fp32")
        parts: dict = {}
        _reference(*(x.double().numpy() for x in (q, k, v)), r.replace(v_descale="end"), sm_scale=sm, parts=parts)
        vd = np.float32(parts["vd"][0])
        assert vd != 1 and vd == np.float32(np.float32(np.abs(v.numpy()).max()) / np.float32(448))
        l = _f32(parts["l"])
        if where == "end":
            want = (_f32(parts["acc"]) / l) * vd
        else:
            acc = np.zeros((8, 16), dtype=np.float32)
            for rs, alpha, pv, _ in parts["tiles"]:
                assert np.array_equal(_f32(alpha), alpha) and np.array_equal(_f32(pv), pv)
                acc[rs] = acc[rs] * _f32(alpha) + _f32(pv) * vd
            want = acc / l
        outs[where] = emulate(q, k, v, r, sm_scale=sm).out[0, 0].numpy()
        assert np.array_equal(outs[where].view(np.int32), want.view(np.int32)), where
    assert not np.array_equal(outs["end"], outs["tile"])


def test_log2e_folded_or_natural_log_scores_bit_for_bit():
    """log2e_folded: t = fp32(fp32(S · fp32(sm·log2 e)) − m); natural-log scores (Triton on AMD):
    t = fp32(fp32(fp32(S · fp32(sm)) − m) · fp32(log2 e)). Per-tensor descales are exactly 1 here."""
    (q, k, v), _ = _exact_inputs()
    sm = 0.3
    s = _f32(q[0, 0].numpy() @ k[0, 0].numpy().T)  # small integers: exact
    ts = {}
    for folded in (True, False):
        r = get_recipe("ck").replace(name=f"ck-folded-{folded}", block_m=8, block_n=64, head_dim_tiles=(),
                                     log2e_folded=folded)
        trace: list = []
        emulate(q, k, v, r, sm_scale=sm, trace=trace)
        if folded:
            x = s * np.float32(sm * LOG2E)
            want = x - x.max(-1, keepdims=True)
        else:
            x = s * np.float32(sm)
            want = (x - x.max(-1, keepdims=True)) * np.float32(LOG2E)
        ts[folded] = trace[0]["t"][0, 0].numpy()
        assert np.array_equal(ts[folded].view(np.int32), want.view(np.int32)), folded
    assert not np.array_equal(ts[True], ts[False])


# ---------------------------------------------------------------------------------------------- P exponent, MAD

@pytest.mark.parametrize("spec", [dict(), dict(p_scale_granularity="tile"), dict(p_block_max_log2=3),
                                  dict(exp_method="exp2")])
def test_block_exponent_puts_the_unrounded_block_max_in_the_top_binade(spec):
    """pow2_block: e = min(floor(log2(448) − t_max), cap) per row (or per block_m rows: 'tile'), computed here
    from the tile's own t. The block max 2^(t_max + e) must land in (224, 448]: rounding e the other way puts it
    in (448, 896], which the saturating cast hides in P's range but not here."""
    r = get_recipe("zyfa").replace(name="zyfa-e", block_m=4, block_n=16, **spec)
    q, k, v = _inputs(3, s_q=12, s_k=80, std=2.0)
    trace: list = []
    emulate(q, k, v, r, causal=True, window=40, trace=trace)
    checked = 0
    for tr in trace:
        t = tr["t"].double().numpy()
        e = tr["e"].double().numpy()
        t_max = t.max(-1, keepdims=True)
        if r.p_scale_granularity == "tile":
            b_, h_, n, _ = t_max.shape
            t_max = np.repeat(t_max.reshape(b_, h_, n // 4, 4).max(-1, keepdims=True), 4, axis=-2).reshape(t_max.shape)
        seen = np.isfinite(t_max)
        want = np.minimum(np.floor(math.log2(448.0) - t_max[seen]), r.p_block_max_log2)
        assert np.array_equal(e[seen], want)
        top = 2.0 ** (t_max[seen] + e[seen])
        uncapped = want < r.p_block_max_log2
        assert ((top[uncapped] > 224) & (top[uncapped] <= 448)).all()
        checked += int(seen.sum())
    assert checked > 50


def _mad_codes_by_hand(t: np.ndarray, offset: float, rounding: str) -> np.ndarray:
    """bits = clamp(R(8t + 56 + offset), 0, 0x7E) in fp32, R nearest-even or toward zero."""
    with np.errstate(invalid="ignore"):
        y = _f32(t) * np.float32(8) + np.float32(56.0 + offset)
    y = np.clip(np.where(np.isnan(y), 0, y), 0, 126)
    return (np.rint(y) if rounding == "nearest" else np.trunc(y)).astype(np.int64)


def _e4m3fn_value_by_hand(n: np.ndarray) -> np.ndarray:
    big_e, mant = n // 8, n % 8
    return np.where(big_e >= 1, 2.0 ** (big_e - 7) * (1 + mant / 8), mant * 2.0**-9)


def test_mad_codes_hand_worked():
    cases = [  # (t, offset, rounding, code): worked on paper from 8t + 56 + offset
        (0.0, 0.0, "nearest", 56),  # 1.0
        (-1.0, 0.0, "nearest", 48),  # 0.5
        (8.0, 0.0, "nearest", 120),  # 256
        (8.75, 0.0, "trunc", 126),  # 448, the clamp
        (20.0, 0.0, "nearest", 126),
        (-7.0, 0.0, "nearest", 0),
        (-6.5, 0.0, "nearest", 4),  # subnormal 4·2^-9 = 2^-7
        (0.5, 0.0, "nearest", 60),  # 1.5 (2^0.5 = 1.41)
        (0.0625, 0.0, "nearest", 56),  # 56.5: tie to even
        (0.1875, 0.0, "nearest", 58),  # 57.5: tie to even
        (-0.0078125, 0.0625, "trunc", 56),  # 56.0 exactly
        (-0.01, 0.0625, "trunc", 55),  # 55.9825 -> 55 = 0.9375
        (-0.3, -0.5, "nearest", 53),  # 53.1 -> 53 = 0.8125
        (-math.inf, 0.0625, "trunc", 0),  # masked
    ]
    t = torch.tensor([c[0] for c in cases], dtype=torch.float32)
    for i, (_, offset, rounding, code) in enumerate(cases):
        got = int(e4m3fn_bits_from_log2(t[i:i + 1], offset=offset, rounding=rounding)[0])
        assert got == code == int(_mad_codes_by_hand(t[i:i + 1].numpy(), offset, rounding)[0]), cases[i]
    assert _e4m3fn_value_by_hand(np.array([56, 48, 120, 126, 4, 60, 55, 53])).tolist() == [
        1.0, 0.5, 256.0, 448.0, 2.0**-7, 1.5, 0.9375, 0.8125]


@pytest.mark.parametrize("rounding,offset", [("trunc", 0.0625), ("trunc", 0.0), ("nearest", 0.0), ("nearest", -0.5)])
def test_emulated_mad_p_is_the_hand_formula(rounding, offset):
    """The emulator's P for mad_fp8 is exactly clamp(R(8(t + e) + 56 + offset), 0, 126) read as e4m3fn."""
    r = get_recipe("zyfa").replace(name="mad", block_m=4, block_n=16, mad_rounding=rounding, mad_offset=offset)
    q, k, v = _inputs(5, s_q=12, s_k=80, std=2.0)
    trace: list = []
    emulate(q, k, v, r, causal=True, trace=trace)
    for tr in trace:
        t_s = (tr["t"] + tr["e"]).numpy()
        want = _e4m3fn_value_by_hand(_mad_codes_by_hand(t_s, offset, rounding))
        assert np.array_equal(tr["p8"].double().numpy(), want)


# ---------------------------------------------------------------------------------------------- sm_scale

@pytest.mark.parametrize("sm_scale", [0.05, 0.6])  # 1/sqrt(16) = 0.25 is the default
@pytest.mark.parametrize("name", ["zyfa", "ck", "triton-amd", "fp32"])
def test_softmax_scale_other_than_the_default(name, sm_scale):
    """sm_scale reaches the scores: the emulator agrees with the independent reference at that scale, and the
    fp32 control with the FP64 oracle at that scale, which the default scale's oracle is far from."""
    from zyfa.reference.attention import attention_fp64

    _assert_agrees(get_recipe(name), dict(h=2, h_kv=1, s_q=16, s_k=300, d=16, std=1.0), MASKS["causal"], sm_scale)
    if name == "fp32":
        q, k, v = _inputs(0, h=2, h_kv=1, s_q=16, s_k=300, d=16)
        out = emulate(q, k, v, "fp32", causal=True, sm_scale=sm_scale).out.double()
        ref, _ = attention_fp64(q, k, v, causal=True, sm_scale=sm_scale)
        default, _ = attention_fp64(q, k, v, causal=True)
        assert rel_l2(out, ref) < 2e-6
        assert rel_l2(out, default) > 0.05
