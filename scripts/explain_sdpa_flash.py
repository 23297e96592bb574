#!/usr/bin/env python3
"""Why PyTorch SDPA's flash backend (FA2) has less error than the ``bf16`` emulation: record on a GPU, fit on a CPU.

    python3 scripts/explain_sdpa_flash.py record --out fa2.pt      # on the GPU: FA2's outputs on probes and inputs
    python3 scripts/explain_sdpa_flash.py fit fa2.pt               # anywhere: which model of FA2 reproduces them

``record`` runs the flash backend (``torch.nn.attention.SDPBackend.FLASH_ATTENTION``, BF16) on

- *one-hot probes*: V is a block of the identity (key j writes column j - c·d, every other key a zero row), so
  each output element is one key's rounded probability times the factor the kernel applies to it afterwards
  (the rescale to the final row max, then 1/l), rounded to bf16. ceil(s_k / d) calls with the same Q and K show
  every key's value. Which running max each probability was rounded against, which tile size and order the
  kernel used and how it normalised can be read off bit for bit;
- the study's Gaussian inputs (``zyfa.accuracy.study.run.gaussian_specs("default")``), whose outputs the study's
  real-vs-emulated table compares with the ``bf16`` emulation.

``fit`` evaluates, with no GPU, candidate models of an FA2-style forward (``fa2_model``: KV tiles of ``block_n``
keys, visited first to last or last to first, an online row max, P = exp2(s·c − m·c) rounded to bf16 for P·V,
the row sum from the fp32 P, the output divided by l or multiplied by 1/l) and the project's ``bf16`` emulation:
the fraction of probe outputs each reproduces bit for bit, and on the study inputs each one's output distance to
FA2's and its error against the FP64 oracle over the emulation's (FA2's ratio beside it). docs/real_kernels.md
has the result.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zyfa.norms import rel_l2  # noqa: E402

PROBE_HEAD_DIMS = (64, 128, 256)
PROBE_SEQ = 512
PROBE_LOGIT_STD = 2.0


def _probe_inputs(d: int, causal: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    # logits q.k/sqrt(d) of std PROBE_LOGIT_STD: q, k entries of std sqrt(PROBE_LOGIT_STD)
    s = math.sqrt(PROBE_LOGIT_STD)
    q = (torch.randn(1, 1, PROBE_SEQ, d, generator=g) * s).to(torch.bfloat16)
    k = (torch.randn(1, 1, PROBE_SEQ, d, generator=g) * s).to(torch.bfloat16)
    return q, k


def one_hot_values(s_k: int, d: int, block: int) -> torch.Tensor:
    """V of the ``block``-th probe call: key j = block·d + c holds e_c, every other key zeros. (1, 1, s_k, d)."""
    v = torch.zeros(1, 1, s_k, d)
    lo, hi = block * d, min(s_k, (block + 1) * d)
    v[0, 0, lo:hi, : hi - lo] = torch.eye(hi - lo)
    return v.to(torch.bfloat16)


def record(out: Path) -> None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from zyfa.accuracy.inputs.attention_input import make_gaussian
    from zyfa.accuracy.study.run import gaussian_specs

    if not torch.cuda.is_available():
        sys.exit("explain_sdpa_flash.py record: needs a CUDA GPU")

    def fa2(q, k, v, causal, scale):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q.cuda(), k.cuda(), v.cuda(), is_causal=causal, scale=scale).cpu()

    data = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "probes": [], "inputs": []}
    for seed, (d, causal) in enumerate(itertools.product(PROBE_HEAD_DIMS, (False, True))):
        q, k = _probe_inputs(d, causal, seed)
        outs = [fa2(q, k, one_hot_values(PROBE_SEQ, d, c), causal, d ** -0.5)
                for c in range(math.ceil(PROBE_SEQ / d))]
        data["probes"].append({"d": d, "causal": causal, "seed": seed, "q": q, "k": k, "outs": outs})
        print(f"probe d{d} causal={causal}: {len(outs)} calls", flush=True)
    for spec in gaussian_specs("default"):
        x = make_gaussian(spec)
        if x.q.shape[-1] != x.v.shape[-1] or x.window is not None:
            continue  # FA2 has no kernel for MLA's 192/128
        sm = x.sm_scale if x.sm_scale is not None else x.q.shape[-1] ** -0.5
        o = fa2(x.q.to(torch.bfloat16), x.k.to(torch.bfloat16), x.v.to(torch.bfloat16), bool(x.causal), sm)
        data["inputs"].append({"name": x.name, "spec": spec, "out": o})
        print(f"input {x.name}", flush=True)
    torch.save(data, out)
    print(f"wrote {out}")


def fa2_split_block_n(head_dim: int) -> int:
    """Keys per KV tile of FA2's split-KV forward: 256 up to head dim 64, 128 up to 128, else 64."""
    return 256 if head_dim <= 64 else (128 if head_dim <= 128 else 64)


def fa2_num_splits(batch_heads: int, s_q: int, s_k: int, head_dim: int, num_sms: int = 132) -> int:
    """How many KV splits FA2's forward uses (its set_params_splitkv and num_splits_heuristic, flash_api.cpp):
    with slots = 2 CTAs per SM, none (1) when batch·heads·ceil(s_q / 64) query blocks fill at least 0.8 of the
    slots; otherwise, among the split counts up to min(128, slots, KV tiles) that change the tiles per split, the
    smallest whose wave efficiency (w / ceil(w), w = blocks·splits / slots) is at least 0.85 of the best one.
    The H200 has 132 SMs. Checked against the recording: it picks the count that reproduces FA2 on every input."""
    blocks = batch_heads * math.ceil(s_q / 64)
    slots = 2 * num_sms
    if blocks >= 0.8 * slots:
        return 1
    n_tiles = math.ceil(s_k / fa2_split_block_n(head_dim))
    top = min(128, slots, n_tiles)

    def eligible(n):
        return n == 1 or math.ceil(n_tiles / n) != math.ceil(n_tiles / (n - 1))

    eff = {n: (w := blocks * n / slots) / math.ceil(w) for n in range(1, top + 1) if eligible(n)}
    best = max(eff.values())
    return min(n for n, e in eff.items() if e >= 0.85 * best)


def _fa2_pass(S, v64, c, t_lo: int, t_hi: int, block_n: int, reverse: bool):
    """FA2's online softmax over the keys [t_lo, t_hi) of fp32 scores S (s_q, s_k): per tile of ``block_n`` keys
    m = max(m, rowmax S), P = exp2(fp32(S·c − fp32(m·c))) (one rounding, a fused multiply-add),
    alpha = exp2((m_old − m)·c), l = l·alpha + ΣP (fp32 P), acc = acc·alpha + bf16(P)·V (fp32).
    Returns (acc, l, m)."""
    s_q = S.shape[0]
    m = torch.full((s_q, 1), float("-inf"))
    l_sum = torch.zeros(s_q, 1)
    acc = torch.zeros(s_q, v64.shape[1])
    tiles = list(range(t_lo, t_hi, block_n))
    for t0 in reversed(tiles) if reverse else tiles:
        t1 = min(t0 + block_n, t_hi)
        st = S[:, t0:t1]
        m_new = torch.maximum(m, st.amax(dim=1, keepdim=True))
        ms = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), (m_new * c).float())
        p = torch.exp2((st.double() * c.double() - ms.double()).float())
        alpha = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp2(((m - m_new) * c).float()))
        alpha = torch.where(torch.isinf(m_new), torch.ones_like(m), alpha)
        l_sum = (l_sum * alpha + p.sum(dim=1, keepdim=True, dtype=torch.float64).float()).float()
        acc = ((acc * alpha).float() + (p.to(torch.bfloat16).double() @ v64[t0:t1]).float()).float()
        m = m_new
    return acc, l_sum, m


def fa2_model(q, k, v, *, sm_scale: float, causal: bool, block_n: int, reverse: bool, rcp: bool,
              splits: int = 1) -> torch.Tensor:
    """An FA2-style forward of one head in fp32 arithmetic on bf16 operands: q (s_q, d), k (s_k, d), v (s_k, d_v).

    Scores S = q·kᵀ in fp32 (float64 products and sum, rounded once); the online softmax of ``_fa2_pass``, KV
    tiles visited last to first when ``reverse``. One split: output bf16(acc / l), or bf16(acc · fp32(1/l)) when
    ``rcp``. With ``splits`` > 1 the keys are cut into that many runs of ceil(tiles / splits) tiles, each run's
    softmax is its own (its P rounded against its own running max), each writes O_s = acc_s · (1/l_s) and
    lse_s = m_s·sm_scale + ln l_s in fp32, and the runs are combined in fp32 with weights exp(lse_s − lse)
    (FA2's split-KV kernel and its combine), then rounded to bf16. Causal is top-left aligned (SDPA's is_causal)."""
    s_q, s_k = q.shape[0], k.shape[0]
    S = (q.double() @ k.double().T).float()
    if causal:
        S = S.masked_fill(torch.ones(s_q, s_k, dtype=torch.bool).triu(1), float("-inf"))
    c = torch.tensor(sm_scale * math.log2(math.e), dtype=torch.float32)
    v64 = v.double()
    if splits == 1:
        acc, l_sum, _ = _fa2_pass(S, v64, c, 0, s_k, block_n, reverse)
        out = acc * (1.0 / l_sum).float() if rcp else acc / l_sum
        return out.to(torch.bfloat16)
    per = math.ceil(math.ceil(s_k / block_n) / splits) * block_n
    parts = []
    for lo in range(0, s_k, per):
        acc, l_sum, m = _fa2_pass(S, v64, c, lo, min(lo + per, s_k), block_n, reverse)
        seen = l_sum > 0
        o = torch.where(seen, acc * (1.0 / torch.where(seen, l_sum, 1.0)).float(), torch.zeros_like(acc))
        lse = torch.where(seen, (m * sm_scale).float() + torch.log(torch.where(seen, l_sum, 1.0)), float("-inf"))
        parts.append((o.float(), lse.float()))
    lse_all = torch.stack([p[1] for p in parts])  # (splits, s_q, 1)
    top = lse_all.amax(dim=0)
    lse = torch.log(torch.exp(lse_all - top).sum(dim=0)) + top
    out = sum(torch.exp(ls - lse) * o for o, ls in parts)
    return out.float().to(torch.bfloat16)


def fa2_forward(q, k, v, *, sm_scale: float, causal: bool, num_sms: int = 132) -> torch.Tensor:
    """FA2's forward as the model says it runs on a GPU of ``num_sms`` SMs: q (b, h, s_q, d), k/v (b, h_kv, s_k, .)
    (h % h_kv == 0, query head i reads KV head i // (h / h_kv)), the split count FA2 picks for this launch,
    each head through :func:`fa2_model` on the CPU. Returns (bf16 output (b, h, s_q, d_v), splits)."""
    b, h, s_q, d = q.shape
    g = h // k.shape[1]
    splits = fa2_num_splits(b * h, s_q, k.shape[2], d, num_sms=num_sms)
    q, k, v = (t.detach().to("cpu", torch.bfloat16).float() for t in (q, k, v))
    out = torch.empty(b, h, s_q, v.shape[-1], dtype=torch.bfloat16)
    for bi in range(b):
        for hi in range(h):
            out[bi, hi] = fa2_model(q[bi, hi], k[bi, hi // g], v[bi, hi // g], sm_scale=sm_scale, causal=causal,
                                    block_n=fa2_split_block_n(d), reverse=True, rcp=True, splits=splits)
    return out, splits


def candidates(head_dim: int, s_q: int, s_k: int, batch_heads: int) -> dict[str, dict]:
    """The models ``fit`` compares, as fa2_model arguments for one input."""
    bn = fa2_split_block_n(head_dim)
    n = fa2_num_splits(batch_heads, s_q, s_k, head_dim)
    return {
        "128-key tiles, first to last (the bf16 recipe)": dict(block_n=128, reverse=False, rcp=False),
        "64-key tiles, last to first, x 1/l": dict(block_n=64, reverse=True, rcp=True),
        f"{bn}-key tiles, last to first, x 1/l, no split": dict(block_n=bn, reverse=True, rcp=True),
        f"FA2 split-KV: {n} splits of {bn}-key tiles": dict(block_n=bn, reverse=True, rcp=True, splits=n),
        f"{n} splits, tiles first to last": dict(block_n=bn, reverse=False, rcp=True, splits=n),
    }


def fit(path: Path) -> None:
    from zyfa.accuracy.inputs.attention_input import make_gaussian
    from zyfa.reference.attention import attention_fp64

    from zyfa.emulator import emulate

    data = torch.load(path, weights_only=False)
    print(f"# FA2 recorded on {data['device']} (torch {data['torch']})\n")
    print("## One-hot probes: share of output elements reproduced bit for bit\n")
    print("| probe | model: share reproduced |\n|---|---|")
    for p in data["probes"]:
        q, k, d, causal = p["q"][0, 0].float(), p["k"][0, 0].float(), p["d"], p["causal"]
        real = torch.cat([o[0, 0] for o in p["outs"]], dim=1)[:, :PROBE_SEQ]
        vs = [one_hot_values(PROBE_SEQ, d, c)[0, 0].float() for c in range(len(p["outs"]))]
        cells = []
        for label, cand in candidates(d, PROBE_SEQ, PROBE_SEQ, 1).items():
            got = torch.cat([fa2_model(q, k, v, sm_scale=d ** -0.5, causal=causal, **cand) for v in vs], dim=1)
            cells.append(f"{label}: {(got[:, :PROBE_SEQ] == real).double().mean():.4f}")
        emu = torch.cat([emulate(q[None, None], k[None, None], v[None, None], "bf16", causal=causal,
                                 sm_scale=d ** -0.5).out[0, 0].to(torch.bfloat16) for v in vs], dim=1)
        cells.append(f"bf16 emulation: {(emu[:, :PROBE_SEQ] == real).double().mean():.4f}")
        print(f"| d{d}{' causal' if causal else ''} | " + "; ".join(cells) + " |")

    print("\n## Study inputs: error against FP64 over the bf16 emulation's, and distance to FA2's output\n")
    print("| input | FA2 / emulation | model: its error / emulation's, rel-L2 of its output to FA2's |\n|---|---|---|")
    for rec in data["inputs"]:
        x = make_gaussian(rec["spec"])
        q, k, v = (t[0, 0].to(torch.bfloat16).float() for t in (x.q, x.k, x.v))
        sm = x.sm_scale if x.sm_scale is not None else q.shape[-1] ** -0.5
        ref = attention_fp64(q[None, None], k[None, None], v[None, None], causal=bool(x.causal), sm_scale=sm)
        ref = (ref[0] if isinstance(ref, tuple) else ref)[0, 0]
        emu = emulate(q[None, None], k[None, None], v[None, None], "bf16", causal=bool(x.causal), sm_scale=sm)
        e_emu = rel_l2(emu.out[0, 0], ref)
        real = rec["out"][0, 0]
        cells = []
        for label, cand in candidates(q.shape[-1], q.shape[0], k.shape[0], 1).items():
            got = fa2_model(q, k, v, sm_scale=sm, causal=bool(x.causal), **cand)
            cells.append(f"{label}: {rel_l2(got, ref) / e_emu:.4f}, {rel_l2(got, real):.1e}")
        print(f"| {rec['name']} | {rel_l2(real, ref) / e_emu:.4f} | " + "; ".join(cells) + " |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="on a CUDA GPU: FA2's outputs on the probes and the study's Gaussian inputs")
    r.add_argument("--out", type=Path, required=True)
    f = sub.add_parser("fit", help="anywhere: compare candidate models with a recording")
    f.add_argument("recording", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "record":
        record(a.out)
    else:
        if not a.recording.is_file():
            sys.exit(f"explain_sdpa_flash.py fit: no recording at {a.recording}")
        fit(a.recording)


if __name__ == "__main__":
    main()
