"""Per-input features that explain attention error, and per-head errors, for the study's result rows.

The runner's rows give one error per (input, recipe), over all heads of the input. The report also needs
what might *cause* the error, and the error of each head, so the study adds these columns to the rows
before writing them (the report then reads result files only):

- ``feat_q_outlier``, ``feat_k_outlier``, ``feat_v_outlier``: max|x| / rms(x) over the whole tensor. A
  per-tensor FP8 scale maps max|x| to 448, so a large ratio leaves typical values few significant codes.
- ``feat_entropy_nats``: the attention entropy H = -sum_j p_ij ln p_ij of the exact softmax (from the
  original inputs), averaged over the query rows that see at least one key and over heads. Low entropy means
  peaked attention (sinks): few large probabilities and many tiny ones that FP8 flushes to zero.
- ``feat_k_outlier_heads``, ``feat_entropy_heads``: the same per query head (K's ratio of the KV head the
  query head uses).
- ``deq_rel_l2_heads``, ``orig_rel_l2_heads``: relative L2 error per query head (same two references as the
  runner's ``deq_``/``orig_`` metrics); per-tensor scales stay those of the whole input, as in the runner.

Exposed:
    input_features(inp, *, device="cpu", chunk_size=1024) -> dict
    head_errors(inp, recipes, *, device="cpu", chunk_size=1024) -> {recipe name: {"deq_rel_l2_heads": [...],
        "orig_rel_l2_heads": [...]}}
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from zyfa.accuracy.inputs.attention_input import AttentionInput
from zyfa.reference.attention import attention_fp64

from zyfa.emulator import emulate
from zyfa.norms import rel_l2_per
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import Recipe

__all__ = ["FEATURES", "head_errors", "input_features"]

# feature column -> (label, unit) as the report shows it
FEATURES = {
    "feat_k_outlier": "max|K| / rms(K)",
    "feat_q_outlier": "max|Q| / rms(Q)",
    "feat_entropy_nats": "attention entropy (nats)",
}


def _outlier(x: torch.Tensor) -> float:
    x = x.double()
    rms = float(x.pow(2).mean().sqrt())
    return float(x.abs().max()) / rms if rms > 0 else math.nan


def _allowed(s_q: int, s_k: int, rows: torch.Tensor, causal: bool, window: int | None, dev) -> torch.Tensor | None:
    """Mask (len(rows), s_k) of keys each query row sees (bottom-right aligned), or None when all are seen."""
    if not causal and window is None:
        return None
    pos = rows.to(dev) + (s_k - s_q)
    j = torch.arange(s_k, device=dev)
    ok = j[None, :] <= pos[:, None]
    if window is not None:
        ok &= j[None, :] > (pos[:, None] - window)
    return ok


@torch.no_grad()
def input_features(inp: AttentionInput, *, device: str | torch.device = "cpu", chunk_size: int = 1024) -> dict:
    """Outlier ratios of Q/K/V and the exact attention entropy, overall and per query head (see module doc).

    The entropy is computed in float32 from the original inputs, chunked over query rows (O(s^2 d) work,
    about one FP64 oracle call's worth).
    """
    x = inp.to(device)
    q, k, v = x.q, x.k, x.v
    b, h_q, s_q, d = q.shape
    h_kv, s_k = k.shape[1], k.shape[2]
    group = h_q // h_kv
    scale = inp.sm_scale if inp.sm_scale is not None else 1.0 / math.sqrt(d)
    ent_sum = torch.zeros(h_q, dtype=torch.float64, device=q.device)
    ent_n = torch.zeros(h_q, dtype=torch.float64, device=q.device)
    causal = bool(inp.causal) or inp.window is not None
    for start in range(0, s_q, chunk_size):
        rows = torch.arange(start, min(start + chunk_size, s_q))
        ok = _allowed(s_q, s_k, rows, causal, inp.window, q.device)
        for hk in range(h_kv):
            qs = q[:, hk * group:(hk + 1) * group, start:start + len(rows)].float()
            s = torch.einsum("bgqd,bkd->bgqk", qs, k[:, hk].float()) * scale
            if ok is not None:
                s = s.masked_fill(~ok, -math.inf)
            lse = torch.logsumexp(s, dim=-1, keepdim=True)
            p = torch.exp(s - lse)
            # H = lse - sum p s  (masked entries have p = 0; avoid 0 * -inf)
            ps = torch.where(p > 0, p * s, torch.zeros((), device=s.device)).sum(-1)
            ent = lse.squeeze(-1) - ps
            valid = torch.isfinite(lse.squeeze(-1))
            ent = torch.where(valid, ent, torch.zeros((), device=s.device))
            ent_sum[hk * group:(hk + 1) * group] += ent.double().sum(dim=(0, 2))
            ent_n[hk * group:(hk + 1) * group] += valid.double().sum(dim=(0, 2))
    ent_heads = (ent_sum / ent_n.clamp_min(1)).tolist()
    k_heads = [_outlier(k[:, i // group]) for i in range(h_q)]
    return {
        "feat_q_outlier": _outlier(q),
        "feat_k_outlier": _outlier(k),
        "feat_v_outlier": _outlier(v),
        "feat_entropy_nats": float(ent_sum.sum() / ent_n.sum().clamp_min(1)),
        "feat_entropy_heads": ent_heads,
        "feat_k_outlier_heads": k_heads,
    }


@torch.no_grad()
def head_errors(inp: AttentionInput, recipes: Sequence[Recipe | str], *, device: str | torch.device = "cpu",
                chunk_size: int = 1024) -> dict[str, dict[str, list[float]]]:
    """Relative L2 error per query head of each recipe, against both FP64 references (see module doc).

    Runs the emulator and the oracle again (the runner keeps no outputs); the quantization of the inputs is
    that of the whole input, as in the runner.
    """
    x = inp.to(device)
    kw = {"causal": x.causal, "sm_scale": x.sm_scale, "window": x.window}
    ref_orig, _ = attention_fp64(x.q, x.k, x.v, chunk_size=chunk_size, **kw)
    seen: list[tuple] = []  # (q_deq, k_deq, v_deq, ref): recipes that quantize alike share a reference
    res = {}
    for r in recipes:
        recipe = get_recipe(r)
        em = emulate(x.q, x.k, x.v, recipe, **kw)
        deq = (em.q_deq, em.k_deq, em.v_deq)
        ref = next((c[3] for c in seen if all(torch.equal(a, b) for a, b in zip(deq, c[:3], strict=True))), None)
        if ref is None:
            ref = attention_fp64(*deq, chunk_size=chunk_size, **kw)[0]
            seen.append((*deq, ref))
        res[recipe.name] = {"deq_rel_l2_heads": rel_l2_per(em.out, ref, 1),
                            "orig_rel_l2_heads": rel_l2_per(em.out, ref_orig, 1)}
    return res
