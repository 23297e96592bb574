"""CPU check of the CuTe kernel's softmax formula (``softmax_tile`` in zyfa/kernels/_cute_softmax.py, ``flush_pv``
in _cute_fp8.py, ``epilogue``) against the h200 emulation of ``zyfa-hopper``: no DSL, no GPU.

The kernel's per-tile arithmetic is transcribed in plain torch exactly as the kernel (and its PTX) writes it: the
CTA's KV range (n_tiles, n_full), the mask, m_tile = fl(max(S)·c), e = min(floor(log2 448 - t_max), e_cap), the row
bias (bias + 8(e - m))/128, the fused ``fma.rn.sat`` (rounded once, here exactly), min 126/128, the magic add, the
code as the low byte, the row sum decoded from the codes in the kernel's lane order, l and acc by one FMA each (as the
PTX contracts them), O = acc / l · vd in bf16, LSE = ((m + log2 l) - e)·ln 2. What is not the kernel's: alpha's
``ex2.approx`` is torch's exp2 (the emulator's), lg2 torch's, and P·V is the emulator's matrix-unit model of the
tile's fresh product: this test checks the softmax / P path, not the matrix unit.

Compared per tile with ``emulate(..., trace=...)``: P's codes (equal except where the fused MAD's rounding of
8(t + e) + bias sits within its drift of a code boundary, never at a row max), e bit for bit, the row sum bit for bit
where the codes agree; then the outputs and LSE within the difference of exp2 and of the fused updates.
"""

from __future__ import annotations

import math

import pytest
import torch

from zyfa.emulator import emulate, quantize_inputs
from zyfa.emulator_tile import mma
from zyfa.kernels.kernel_plan import LOG2_448, LOG2E, kernel_plan
from zyfa.platforms import get_platform

RECIPE = "zyfa-hopper"
BLOCK_M, BLOCK_N = 128, 128  # rows per CTA (two 64-row warpgroups: per-row arithmetic, so one block here)
TWO_POW_120 = 2.0 ** 120
MAGIC_SAT = 98304.0  # 1.5·2^16
CLAMP = 126.0 / 128.0
F32 = torch.float32


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fma.rn.f32: a·b + c rounded once to fp32. The product is exact in float64; the sum's rounding error comes
    from TwoSum, and a float64 sum on an fp32 midpoint is resolved by its sign (no double rounding)."""
    p = a.double() * b.double()
    c = c.double().expand_as(p)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    r = s.float()
    finite = torch.isfinite(s)
    other = torch.nextafter(r, torch.where(s.double() > r.double(), torch.full_like(r, math.inf),
                                           torch.full_like(r, -math.inf)))
    mid = (r.double() + other.double()) / 2
    tie = finite & (s != r.double()) & (s == mid) & (err != 0)
    up = torch.where(other > r, other, r)
    down = torch.where(other > r, r, other)
    return torch.where(tie, torch.where(err > 0, up, down), r)


def mad_codes(s: torch.Tensor, c8n: torch.Tensor, rbn: torch.Tensor) -> torch.Tensor:
    """``mad_code``: fma.rn.sat (clamp to [0, 1], NaN -> 0), min 126/128, + 1.5·2^16 in fp32, the low byte."""
    y = fma_f32(s, c8n, rbn)
    y = torch.nan_to_num(y, nan=0.0).clamp(0.0, 1.0)
    y = torch.minimum(y, torch.tensor(CLAMP, dtype=F32))
    z = (y + torch.tensor(MAGIC_SAT, dtype=F32)).view(torch.int32)
    assert not ((z >> 8) & 0xFFF).any()  # bits 8-19 zero: the code_value decode below is exact
    return z & 0xFF


def code_values(codes: torch.Tensor) -> torch.Tensor:
    """``code_value``: (code << 20) read as fp32, value·2^-120 (subnormal codes as fp32 subnormals)."""
    return (codes.to(torch.int32) << 20).view(F32)


def lane_order_sum(v: torch.Tensor) -> torch.Tensor:
    """The kernel's row sum of one tile's 128 decoded codes (last dim): lane t of the quad holds keys
    8i + 2t + {0, 1}; per k-block s and 16-key half h it adds ((k0 + k0+1) + (k0+8 + k0+9)) with k0 = 32s + 16h + 2t,
    from 0; then the two butterflies (offsets 1 and 2)."""
    lanes = []
    for t in range(4):
        x = torch.zeros(v.shape[:-1], dtype=F32)
        for s in range(BLOCK_N // 32):
            for h in range(2):
                k0 = 32 * s + 16 * h + 2 * t
                x = x + ((v[..., k0] + v[..., k0 + 1]) + (v[..., k0 + 8] + v[..., k0 + 9]))
        lanes.append(x)
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])


def kernel_transcription(q8, k8, v8, qd, kd, vd, *, causal: bool, sm_scale: float, plat, trace_hook=None):
    """The CuTe kernel's forward on quantized values (q8: (b, h, s_q, d); k8, v8 expanded to q heads), CTA by CTA
    and tile by tile; ``trace_hook(mb, j, rows, codes, e, row_sum, s, c, m_use, l)`` sees every tile. Returns
    (out bf16-valued fp32, lse)."""
    plan = kernel_plan(RECIPE)
    b, h, s_q, _ = q8.shape
    s_k, d_v = k8.shape[2], v8.shape[3]
    c = (torch.tensor(sm_scale * LOG2E, dtype=F32) * qd) * kd  # (sm_scale·log2e·qd)·kd, fp32
    c8n = (c * 8.0) * 0.0078125
    bias = torch.tensor(plan.mad_bias, dtype=F32)
    e_cap = torch.tensor(plan.e_cap, dtype=F32)
    s_all = mma(q8, k8.transpose(-1, -2), None, plat.accum_bits, k_step=plat.k_step)  # the emulator's Q·K model
    out = torch.zeros((b, h, s_q, d_v), dtype=F32)
    lse = torch.zeros((b, h, s_q), dtype=F32)
    off = s_k - s_q
    for mb in range(-(-s_q // BLOCK_M)):
        p0 = mb * BLOCK_M + off
        n_tiles, n_full = -(-s_k // BLOCK_N), s_k // BLOCK_N
        if causal:
            hi = max(min(s_k, p0 + BLOCK_M), 0)
            n_tiles = (hi + BLOCK_N - 1) // BLOCK_N
            n_full = min(n_full, max(p0 + 1, 0) // BLOCK_N)
        rows = torch.arange(mb * BLOCK_M, (mb + 1) * BLOCK_M)
        live = rows < s_q
        m = torch.full((b, h, BLOCK_M), -math.inf, dtype=F32)
        l = torch.zeros((b, h, BLOCK_M), dtype=F32)
        e = torch.zeros((b, h, BLOCK_M), dtype=F32)
        acc = torch.zeros((b, h, BLOCK_M, d_v), dtype=F32)
        for j in range(n_tiles):
            keys = torch.arange(j * BLOCK_N, (j + 1) * BLOCK_N)
            s = torch.zeros((b, h, BLOCK_M, BLOCK_N), dtype=F32)  # TMA zero-fills Q rows and K keys out of bounds
            kin = keys[keys < s_k]
            rin = rows[live]
            s[:, :, :len(rin), :len(kin)] = s_all[:, :, rin][..., kin]
            if j >= n_full:
                ok = (keys[None, :] < s_k) & torch.ones((BLOCK_M, 1), dtype=torch.bool)
                if causal:
                    ok = ok & (keys[None, :] <= rows[:, None] + off)
                s = s.masked_fill(~ok, -math.inf)
            m_tile = s.amax(-1) * c
            m_new = torch.maximum(m, m_tile)
            m_use = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
            a = torch.exp2(m - m_use)  # ex2.approx.f32 in the kernel (ex2(-inf) = 0)
            t_max = m_tile - m_use
            e_row = torch.minimum(torch.floor(torch.tensor(LOG2_448, dtype=F32) - t_max), e_cap)
            e_new = torch.where(t_max == -math.inf, e, e_row)
            alpha = a * torch.exp2(e_new - e)  # pow2i: exact
            rbn = (bias + 8.0 * (e_new - m_use)) * 0.0078125
            codes = mad_codes(s, c8n, rbn[..., None])
            row_sum = lane_order_sum(code_values(codes)) * torch.tensor(TWO_POW_120, dtype=F32)
            l = fma_f32(l, alpha, row_sum)
            p = codes.to(torch.uint8).view(torch.float8_e4m3fn).float()
            vt = torch.zeros((b, h, BLOCK_N, d_v), dtype=F32)
            vt[:, :, :len(kin)] = v8[:, :, kin]  # Vᵀ zero-padded to 32 keys, zero-filled past it by TMA
            pv = mma(p, vt, None, plat.accum_bits, k_step=plat.k_step)  # fresh product per tile (emulator model)
            acc = fma_f32(acc, alpha[..., None], pv)
            m, e = m_new, e_new
            if trace_hook is not None:
                trace_hook(mb, j, rows, codes, e.clone(), row_sum, s, c, m_use, l.clone())
        has = l > 0
        l_safe = torch.where(has, l, torch.ones_like(l))
        o = (acc / l_safe[..., None]) * vd
        o = torch.where(has[..., None], o, torch.zeros_like(o)).to(torch.bfloat16).float()
        m_fin = torch.where(m == -math.inf, torch.zeros_like(m), m)
        ls = ((m_fin + torch.log2(l_safe)) - e) * torch.tensor(math.log(2.0), dtype=F32)
        ls = torch.where(has, ls, torch.full_like(ls, -math.inf))
        n = int(live.sum())
        out[:, :, mb * BLOCK_M:mb * BLOCK_M + n] = o[:, :, :n]
        lse[:, :, mb * BLOCK_M:mb * BLOCK_M + n] = ls[:, :, :n]
    return out, lse


def _inputs(b, h, h_kv, s_q, s_k, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((b, h, s_q, d), generator=g) * 1.5
    k = torch.randn((b, h_kv, s_k, d), generator=g)
    v = torch.randn((b, h_kv, s_k, d), generator=g)
    # a few large keys: running maxima that move from tile to tile, P exponents above 8 on later tiles
    k[:, :, ::37] *= 4.0
    q[:, :, ::5] *= 3.0
    return q, k, v


CASES = [  # b, h, h_kv, s_q, s_k, d
    (1, 2, 1, 1, 1, 64),
    (1, 2, 2, 17, 17, 64),
    (1, 4, 2, 130, 130, 64),
    (2, 2, 1, 300, 300, 64),
    (1, 2, 1, 17, 300, 64),
    (1, 2, 1, 300, 17, 64),
    (1, 4, 2, 130, 333, 128),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}h{c[1]}kv{c[2]}q{c[3]}k{c[4]}d{c[5]}" for c in CASES])
def test_kernel_formula_matches_h200_emulation(case, causal):
    b, h, h_kv, s_q, s_k, d = case
    q, k, v = _inputs(b, h, h_kv, s_q, s_k, d, seed=s_q * 1000 + s_k + d)
    plat = get_platform("h200")
    sm_scale = 1.0 / math.sqrt(d)
    trace: list = []
    em = emulate(q, k, v, RECIPE, causal=causal, platform="h200", trace=trace)
    qi = quantize_inputs(q, k, v, RECIPE)
    group = h // h_kv
    k8 = qi.k_values.repeat_interleave(group, dim=1)
    v8 = qi.v_values.repeat_interleave(group, dim=1)
    kd = qi.k_descale.reshape(-1)[0]
    vd = qi.v_descale.reshape(-1)[0]
    qd = qi.q_descale.reshape(-1)[0]

    em_tiles = {}
    for tr in trace:
        r0, r1 = tr["rows"]
        for mb in range(r0 // BLOCK_M, -(-r1 // BLOCK_M)):
            em_tiles[(mb, tr["cols"][0] // BLOCK_N)] = tr
    seen = {"tiles": 0, "codes": 0, "off": 0}

    def check(mb, j, rows, codes, e, row_sum, s, c, m_use, l):
        live = rows < s_q
        n = int(live.sum())
        tr = em_tiles.get((mb, j))
        if tr is None:  # the emulator skipped a tile no row of the block sees: the kernel's codes are all 0
            assert not codes[:, :, :n].any()
            return
        seen["tiles"] += 1
        r0 = tr["rows"][0]
        sl = slice(mb * BLOCK_M - r0, mb * BLOCK_M - r0 + n)
        c1 = tr["cols"][1] - tr["cols"][0]
        em_codes = tr["p8"][:, :, sl, :c1].to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32)
        mine = codes[:, :, :n, :c1]
        assert not codes[:, :, :n, c1:].any()  # keys past s_k
        assert torch.equal(e[:, :, :n], tr["e"][:, :, sl, 0]), "P exponent e differs"
        diff = mine != em_codes
        seen["codes"] += mine.numel()
        seen["off"] += int(diff.sum())
        if diff.any():
            # only where the fused MAD's rounding sits within its drift of a code boundary, by one code
            assert int((mine - em_codes)[diff].abs().max()) == 1
            x = 8.0 * (s[:, :, :n, :c1].double() * c.double() - m_use[:, :, :n, None].double()
                       + e[:, :, :n, None].double()) + (56.0 + 0.0625)
            dist = (x - torch.round(x)).abs()[diff]
            assert float(dist.max()) < 1e-3, f"a code differs {float(dist.max())} away from a boundary"
            # never at a row max (t = 0 there: fused_mad_is_exact's margin)
            at_max = s[:, :, :n, :c1] == s[:, :, :n].amax(-1, keepdim=True)
            assert not (diff & at_max).any(), "a row max's code differs"
        rows_same = ~diff.any(-1)
        em_sum = tr["row_sum"][:, :, sl, 0]
        assert torch.equal(row_sum[:, :, :n][rows_same], em_sum[rows_same]), "row sum differs"
        exact = code_values(codes[:, :, :n]).double().sum(-1) * TWO_POW_120
        assert torch.equal(row_sum[:, :, :n].double(), exact), "the lane-order row sum is not exact"

    out, lse = kernel_transcription(qi.q_values, k8, v8, qd, kd, vd, causal=causal, sm_scale=sm_scale, plat=plat,
                                    trace_hook=check)
    assert seen["tiles"] > 0
    assert seen["off"] <= max(2, seen["codes"] // 2000), seen  # boundary cases are rare
    # outputs: the emulator's acc·alpha + pv and l·alpha + sum round twice where the kernel fuses, and its exp2 is
    # torch's in both here: within an ulp or two of fp32 before bf16, so bf16 agrees up to one step
    assert torch.equal(torch.isinf(lse), torch.isinf(em.lse))
    fin = torch.isfinite(em.lse)
    torch.testing.assert_close(lse[fin], em.lse[fin], rtol=0, atol=2e-5)
    rel = (out - em.out).abs() / em.out.abs().clamp(min=1e-30)
    assert float(torch.cat([rel[out != em.out], rel.new_zeros(1)]).max()) <= 2 ** -7, "more than one bf16 step"
    assert (out != em.out).float().mean() < 0.02
