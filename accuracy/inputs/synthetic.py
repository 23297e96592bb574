"""Controlled synthetic attention inputs: Q/K/V whose attention has a chosen entropy, sink and K outlier channels.

Gaussian inputs (:mod:`zyfa.accuracy.inputs.attention_input`) have diffuse attention (5.4-9.9 nats on the study's
shapes), where an unscaled e4m3 cast of P flushes almost nothing; real layers are peaked and flush a large part of P. A
:class:`SyntheticSpec` sets the attention structure instead, so that regime can be swept at any head dim:

- ``entropy``: the mean attention entropy in nats (per query row of softmax(sm_scale·QKᵀ), mask applied,
  averaged over rows and heads, as :func:`zyfa.accuracy.inputs.features.input_features` computes it). Reached by
  scaling Q by a temperature found by root-finding (Brent) on the realised entropy of a fixed subset of query rows.
- ``sink``: the mean probability on key 0 (an attention sink). One RoPE channel pair (the lowest frequency) is
  reserved: it is zero in every Q and K row except a constant in Q and a single entry in key 0, so it adds a
  boost to key 0's score and to no other score; the boost is solved jointly with the temperature.
- ``k_outliers``, ``k_bias``: that many K channels carry a constant bias of ±``k_bias`` (in units of K's bulk
  standard deviation, random sign per KV head and channel), like the QKV bias of Qwen2 models: without RoPE it
  shifts each score row by a constant (softmax-invariant) but sets K's per-tensor FP8 scale. The channels are the
  next-lowest-frequency RoPE pairs, where real models' bias channels sit.
- ``rope``: rotate Q and K by their positions (rotate-half convention, base ``rope_theta``) after the structure is
  built, as a model does; the calibration sees the rotated tensors.

Everything else is N(0, 1): Q's bulk, K's bulk, V. The draws come first, in a fixed order, from one
``torch.Generator`` seeded with ``seed``; the calibrated temperature and boost are rounded to a grid
(1/1024 in log2) so that the tensors are bit-identical from run to run, and the input is hashed like a
Gaussian one (:func:`zyfa.accuracy.inputs.attention_input.content_hash`). The realised entropy, sink mass and max|K|
are in the input's ``meta``.

Exposed:
    SYNTHETIC_KEYS                       key -> (default, description)
    SyntheticSpec                        frozen, validated
    parse_synthetic(text) -> SyntheticSpec   "synthetic:entropy=2.0,sink=0.3,..." (or without the prefix)
    split_inputs(text) -> list[str]      --inputs items, each synthetic spec kept whole; is_synthetic(item)
    make_synthetic(spec) -> AttentionInput
    attention_profile(q, k, *, sm_scale, causal, rows=None) -> {"entropy_nats", "sink_mass"}
    rope(x, theta) -> x rotated by position
"""

from __future__ import annotations

import dataclasses
import math

import torch
from scipy.optimize import brentq
from zyfa.accuracy.inputs.attention_input import AttentionInput, content_hash
from zyfa.accuracy.inputs.synthetic_spec import (
    SYNTHETIC_KEYS,
    SyntheticSpec,
    is_synthetic,
    parse_synthetic,
    split_inputs,
)

__all__ = ["SYNTHETIC_KEYS", "SyntheticSpec", "attention_profile", "is_synthetic", "make_synthetic", "parse_synthetic",
           "rope", "split_inputs"]

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
CALIBRATION_ROWS = 384
LOG_TAU_RANGE = (-12.0, 10.0)  # natural log of Q's scale
BOOST_RANGE = (-60.0, 60.0)  # logits added to key 0
GRID = 1024  # log2 tau and the boost are rounded to multiples of 1/GRID


def rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x (…, seq, d) rotated by position (HF's rotate-half convention: channel i pairs with i + d/2, angle
    position · theta^(-2i/d)), in float32."""
    d = x.shape[-1]
    half = d // 2
    inv = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / d)
    ang = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().float(), ang.sin().float()
    x = x.float()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def _channels(d: int, sink: bool, n: int) -> tuple[tuple[int, int] | None, list[int]]:
    """The sink's RoPE pair (lowest frequency) and the ``n`` outlier channels (next-lowest pairs, both members)."""
    half = d // 2
    pairs = list(range(half - 1, -1, -1))  # lowest frequency first
    sink_pair = (pairs[0], pairs[0] + half) if sink else None
    free = pairs[1:] if sink else pairs
    chans = [c for p in free for c in (p, p + half)]
    return sink_pair, chans[:n]


def _row_stats(logits: torch.Tensor, ok: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row entropy (nats) and probability of key 0 of softmax(logits) over the last dim, masked by ``ok``."""
    if ok is not None:
        logits = logits.masked_fill(~ok.to(logits.device), -math.inf)
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    p = torch.exp(logits - lse)
    ps = torch.where(p > 0, p * logits, logits.new_zeros(())).sum(-1)
    return lse.squeeze(-1) - ps, p[..., 0]


def _mask(rows: torch.Tensor, s_k: int, causal: bool) -> torch.Tensor | None:
    return (torch.arange(s_k)[None, :] <= rows[:, None]) if causal else None


@torch.no_grad()
def attention_profile(q: torch.Tensor, k: torch.Tensor, *, sm_scale: float | None = None, causal: bool = True,
                      rows: torch.Tensor | None = None, chunk: int = 256) -> dict[str, float]:
    """Mean attention entropy (nats) and mean probability on key 0 (sink mass) of softmax(sm_scale·QKᵀ),
    over the query ``rows`` (default all; s_q == s_k, causal or not) and every head, in float32.

    The entropy is :func:`zyfa.accuracy.inputs.features.input_features`' ``feat_entropy_nats`` (tests hold them equal);
    this form takes a subset of rows, which the calibration needs."""
    b, h_q, s, d = q.shape
    h_kv = k.shape[1]
    g = h_q // h_kv
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)
    rows = torch.arange(s) if rows is None else rows
    ent, sink, n = 0.0, 0.0, 0
    for start in range(0, len(rows), chunk):
        r = rows[start:start + chunk]
        ok = _mask(r, k.shape[2], causal)
        qs = q[:, :, r].float().reshape(b, h_kv, g, len(r), d)
        logits = torch.einsum("bhgrd,bhkd->bhgrk", qs, k.float()) * scale
        e, p0 = _row_stats(logits, ok)
        ent += float(e.double().sum())
        sink += float(p0.double().sum())
        n += e.numel()
    return {"entropy_nats": ent / n, "sink_mass": sink / n}


def _solve(f, lo: float, hi: float, target: float, what: str) -> float:
    """x in [lo, hi] with f(x) = target for a monotone f (Brent's method); ValueError naming ``what`` when the
    target is outside f's range there."""
    flo, fhi = f(lo) - target, f(hi) - target
    if flo == 0:
        return lo
    if fhi == 0:
        return hi
    if (flo > 0) == (fhi > 0):
        a, b = sorted((flo + target, fhi + target))
        raise ValueError(f"synthetic: {what}={target:g} is not reachable on this shape (between {a:.3g} and "
                         f"{b:.3g} here)")
    return float(brentq(lambda x: f(x) - target, lo, hi, xtol=1e-5, rtol=1e-9))


def _grid(x: float) -> float:
    return round(x * GRID) / GRID


@torch.no_grad()
def make_synthetic(spec: SyntheticSpec, *, device: str | torch.device = "cpu") -> AttentionInput:
    """Draw and calibrate the input ``spec`` describes (module doc); bit-identical for the same spec on CPU.

    The draws are made on the CPU; ``device`` is where the calibration's score matrices are computed (a GPU
    speeds up long sequences; its sums may round differently, so an input calibrated there can differ in the last
    grid step of the temperature from the CPU's, and its content hash says so). The tensors are returned on CPU.

    Raises ValueError (one line) when the requested entropy or sink cannot be reached on the shape (e.g. more
    entropy than uniform causal attention has)."""
    gen = torch.Generator(device="cpu").manual_seed(spec.seed)
    b, h, h_kv, s, d = spec.batch, spec.heads, spec.n_kv, spec.seq, spec.head_dim
    q0 = torch.randn((b, h, s, d), generator=gen)
    k0 = torch.randn((b, h_kv, s, d), generator=gen)
    v = torch.randn((b, h_kv, s, d), generator=gen)
    signs = torch.where(torch.rand((b, h_kv, d), generator=gen) < 0.5, -1.0, 1.0)
    sink_pair, out_ch = _channels(d, spec.sink is not None, spec.k_outliers)
    if sink_pair is not None:
        q0[..., list(sink_pair)] = 0.0
        k0[..., list(sink_pair)] = 0.0
    if out_ch and spec.k_bias:
        k0[..., out_ch] += spec.k_bias * signs[:, :, None, out_ch]
    rot = (lambda x: rope(x, spec.rope_theta)) if spec.rope else (lambda x: x)
    qr, kr = rot(q0), rot(k0)
    sm = 1.0 / math.sqrt(d)

    # calibration on a fixed subset of query rows: logits = sm*tau*A + boost*cos(angle of key 0's pair) at key 0.
    # Under a causal mask row 0 sees key 0 alone (entropy 0, sink 1): it enters with its weight 1/s, the
    # evenly spaced rows 1..s-1 with the rest.
    causal = bool(spec.causal)
    first = 1 if causal and s > 1 else 0
    rows = torch.linspace(first, s - 1, min(s - first, CALIBRATION_ROWS)).round().long().unique()
    w0 = first / s  # row 0's weight
    dev = torch.device(device)
    ok = _mask(rows, s, causal)
    ok = ok.to(dev) if ok is not None else None
    g = h // h_kv
    a = torch.einsum("bhgrd,bhkd->bhgrk", qr[:, :, rows].reshape(b, h_kv, g, len(rows), d).to(dev),
                     kr.to(dev)) * sm
    if sink_pair is not None and spec.rope:
        omega = spec.rope_theta ** (-2 * sink_pair[0] / d)
        col = torch.cos(rows.double() * omega).float().to(dev)  # R_i e_c . R_0 e_c
    else:
        col = torch.ones(len(rows), device=dev)

    def split(log_tau: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row: key 0's logit, and the log-sum-exp and softmax mean of the other keys' logits (one pass;
        the boost on key 0 then changes only per-row scalars)."""
        logits = a * math.exp(log_tau)
        rest = logits[..., 1:] if ok is None else logits[..., 1:].masked_fill(~ok[:, 1:], -math.inf)
        lse = torch.logsumexp(rest, dim=-1)
        p = torch.exp(rest - lse[..., None])
        mean = torch.where(p > 0, p * rest, rest.new_zeros(())).sum(-1)
        return logits[..., 0], lse, mean

    def stats(parts, boost: float) -> tuple[float, float]:
        l0, lse_rest, mean_rest = parts
        l0 = l0 + boost * col
        lse = torch.logaddexp(lse_rest, l0)
        p0 = torch.exp(l0 - lse)
        ent = lse - p0 * l0 - torch.where(p0 < 1, (1 - p0) * mean_rest, lse.new_zeros(()))
        return (1 - w0) * float(ent.double().mean()), w0 + (1 - w0) * float(p0.double().mean())

    def solve(want_entropy: float | None, want_sink: float | None) -> tuple[float, float]:
        def boost_for(parts, *, clamp: bool = True) -> float:
            """The boost giving the sink at this temperature (the bracket's end where it cannot)."""
            if want_sink is None:
                return 0.0
            lo, hi = BOOST_RANGE
            if clamp and stats(parts, lo)[1] >= want_sink:
                return lo
            if clamp and stats(parts, hi)[1] <= want_sink:
                return hi
            return _solve(lambda x: stats(parts, x)[1], lo, hi, want_sink, "sink")

        log_tau = 0.0
        if want_entropy is not None:
            log_tau = _solve(lambda lt: stats(split(lt), boost_for(split(lt)))[0], *LOG_TAU_RANGE, want_entropy,
                             "entropy")
            log_tau = _grid(log_tau / math.log(2)) * math.log(2)
        return log_tau, _grid(boost_for(split(log_tau), clamp=False))

    def build(log_tau: float, boost: float):
        tau = math.exp(log_tau)
        q, k = q0 * tau, k0.clone()
        if sink_pair is not None and boost:
            kappa = math.sqrt(abs(boost) / (sm * tau))  # key 0's entry, in K's bulk units
            q[..., sink_pair[0]] = math.copysign(tau * kappa, boost)  # Q's constant: tau times kappa
            k[:, :, 0, sink_pair[0]] = kappa
        dtype = _DTYPES[spec.dtype]
        q, k = rot(q).to(dtype), rot(k).to(dtype)
        return q, k, attention_profile(q.to(dev), k.to(dev), sm_scale=sm, causal=causal)

    log_tau, boost = solve(spec.entropy, spec.sink)
    q, k, realised = build(log_tau, boost)
    # the subset's estimate is off the full rows' by a near-constant offset: one corrected solve removes it
    off_e = realised["entropy_nats"] - spec.entropy if spec.entropy is not None else 0.0
    off_s = realised["sink_mass"] - spec.sink if spec.sink is not None else 0.0
    if abs(off_e) > 0.01 or abs(off_s) > 0.005:
        try:
            again = solve(spec.entropy - off_e if spec.entropy is not None else None,
                          min(max(spec.sink - off_s, 1e-6), 1 - 1e-6) if spec.sink is not None else None)
        except ValueError:
            again = None
        if again is not None and again != (log_tau, boost):
            q2, k2, r2 = build(*again)
            err2 = abs(r2["entropy_nats"] - (spec.entropy or r2["entropy_nats"])) + abs(
                r2["sink_mass"] - (spec.sink if spec.sink is not None else r2["sink_mass"]))
            if err2 < abs(off_e) + abs(off_s):
                (log_tau, boost), q, k, realised = again, q2, k2, r2
    tau = math.exp(log_tau)
    v = v.to(_DTYPES[spec.dtype])
    meta = {
        "source": "synthetic",
        "spec": dataclasses.asdict(spec),
        "spec_string": spec.spec_string(),
        "content_hash": content_hash(q, k, v, causal=causal),
        "temperature": tau,
        "sink_boost_logits": boost,
        "sink_channel": sink_pair[0] if sink_pair is not None else None,
        "k_outlier_channels": out_ch,
        "realised_entropy_nats": realised["entropy_nats"],
        "realised_sink_mass": realised["sink_mass"],
        "realised_max_abs_k": float(k.float().abs().max()),
    }
    return AttentionInput(name=spec.name, q=q, k=k, v=v, causal=causal, window=None, sm_scale=None, meta=meta)
