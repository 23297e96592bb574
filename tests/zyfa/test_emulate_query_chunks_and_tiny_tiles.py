"""emulate()'s row and tile bookkeeping: query chunks, per-row descales, 1x1 tiles, windows without ``causal``.

The expected values come from the FP64 oracle (reference/attention.py) on inputs built so that the recipe's only
rounding left is fp32 arithmetic: per-token (or per-block) FP8 descales that are exact powers of two, different
from block to block, values exactly representable in e4m3fn, and P kept in fp32. A row that picks up another
row's descale, a KV tile that is skipped or visited twice, or a chunk that loses keys then shows as an error of
order one, far above the fp32 tolerance (1e-5 of each output channel's scale).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reference.attention import attention_fp64
from zyfa.emulator import emulate
from zyfa.norms import rel_l2
from zyfa.recipes import get_recipe

pytestmark = pytest.mark.filterwarnings("ignore:head dims")  # tiny head dims on purpose

D = 16


pytestmark = pytest.mark.usefixtures("one_thread")


def _operand(g, s: int, block: int, amax_channel: int, zero_channel: int | None) -> np.ndarray:
    """(1, 1, s, D): block i of ``block`` tokens is 2^e_i times e4m3fn-exact values (halves up to 1), with its
    amax 448·2^e_i in ``amax_channel``; so its descale amax/448 = 2^e_i is exact and so is every value.
    ``zero_channel`` is zero throughout (the other operand's amax channel then adds nothing to any score)."""
    x = g.integers(-2, 3, (s, D)).astype(np.float64) / 2
    x[:, amax_channel] = 0.0
    if zero_channel is not None:
        x[:, zero_channel] = 0.0
    for i, b0 in enumerate(range(0, s, block)):
        x[b0, amax_channel] = 448.0
        x[b0 : b0 + block] *= 2.0 ** ((-1, 1, 0, -2, 2)[(i + int(g.integers(5))) % 5])
    return x[None, None]


def _exact_inputs(s_q: int, s_k: int, block_q: int, block_kv: int, seed: int = 0):
    g = np.random.default_rng(seed)
    q = _operand(g, s_q, block_q, amax_channel=0, zero_channel=1)
    k = _operand(g, s_k, block_kv, amax_channel=1, zero_channel=0)
    v = _operand(g, s_k, block_kv, amax_channel=0, zero_channel=None)
    return [torch.from_numpy(x).float() for x in (q, k, v)]


def _fp32_p_blockscale(block_m: int, block_n: int, block_q: int, block_kv: int):
    """ck-blockscale (per-block Q, K, V descales, V's applied per tile, P x 2^8) with P and the output in fp32."""
    return get_recipe("ck-blockscale").replace(
        name=f"blockscale-fp32p-{block_m}x{block_n}",
        p_format="fp32",
        out_format="fp32",
        head_dim_tiles=(),  # the small tiles under test, not CK's per-head-dim ones
        block_m=block_m,
        block_n=block_n,
        scale_block_q=block_q,
        scale_block_kv=block_kv,
    )


def _assert_matches_oracle(q, k, v, recipe, **kw):
    emu = emulate(q, k, v, recipe, **kw)
    # the premise: the per-block quantization is exact, so the oracle sees what the kernel saw
    for deq, x in zip((emu.q_deq, emu.k_deq, emu.v_deq), (q, k, v), strict=True):
        assert torch.equal(deq.expand_as(x), x)
    mask = {key: kw[key] for key in ("causal", "window") if key in kw}
    ref, ref_lse = attention_fp64(q, k, v, **mask)
    scale = v.double().abs().amax(dim=2, keepdim=True).clamp(min=1.0)  # each output channel's scale
    err = ((emu.out.double() - ref).abs() / scale).max().item()
    assert err < 1e-5, f"{recipe.name} {kw}: output off by {err:.3e} of its channel's scale"
    assert torch.equal(torch.isneginf(emu.lse), torch.isneginf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert ((emu.lse.double() - ref_lse)[fin].abs() < 1e-5).all()
    return emu


MASKS = ("none", "causal", "window", "causal+window")


def _mask(name: str, window: int) -> dict:
    return {
        "none": {},
        "causal": {"causal": True},
        "window": {"window": window},
        "causal+window": {"causal": True, "window": window},
    }[name]


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("s_q,s_k", [(24, 40), (40, 24), (24, 10)])
@pytest.mark.parametrize("q_chunk", [None, 4, 8])
def test_query_chunks_keep_every_row_its_own_descale_and_keys(mask, s_q, s_k, q_chunk):
    """Rows emulated in chunks of 4 or 8 (block_m 4) against the oracle: each chunk must use its own rows' Q
    descales (per 4-row block, all different) and see every key its rows see, also without a mask; with more
    queries than keys, whole chunks see no key at all under a causal mask (zeros, lse -inf)."""
    q, k, v = _exact_inputs(s_q, s_k, block_q=4, block_kv=8)
    _assert_matches_oracle(q, k, v, _fp32_p_blockscale(4, 8, 4, 8), q_chunk=q_chunk, **_mask(mask, 6))


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("s_q,s_k", [(2, 2), (2, 3), (3, 2)])
@pytest.mark.parametrize("block_m", [1, 4])
@pytest.mark.parametrize("q_chunk", [None, 1])
def test_one_key_tiles_and_per_token_descales(mask, s_q, s_k, block_m, q_chunk):
    """block_n = 1 (a tile per key) and a descale per token for Q, K and V, on two or three queries and keys:
    no key is skipped (key 0 included), each tile uses its own key's K and V descale and each row its own Q
    descale, whether the rows are padded to a 4-row block or are blocks of one."""
    q, k, v = _exact_inputs(s_q, s_k, block_q=1, block_kv=1, seed=s_q * 10 + s_k)
    _assert_matches_oracle(q, k, v, _fp32_p_blockscale(block_m, 1, 1, 1), q_chunk=q_chunk, **_mask(mask, 2))


@pytest.mark.parametrize("name", ["ck-blockscale", "sage2", "aiter-triton", "zyfa", "fa3"])
@pytest.mark.parametrize("mask", MASKS)
def test_results_do_not_depend_on_q_chunk(name, mask):
    """The named recipe as it is (FP8 P, its output rounding) on 16-row blocks: 150 queries emulated one block at
    a time give bit-identical outputs, LSEs and stats to one pass, for every mask (a kernel program owns block_m
    rows; how many the emulator takes at once must not matter)."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 150, 32, generator=g)
    k, v = (torch.randn(1, 1, 130, 32, generator=g) for _ in range(2))
    mask = _mask(mask, 50)
    r = get_recipe(name).replace(name=f"{name}-16", block_m=16, scale_block_q=16)
    whole = emulate(q, k, v, r, **mask)
    part = emulate(q, k, v, r, q_chunk=16, **mask)
    assert torch.equal(part.out, whole.out)
    assert torch.equal(part.lse, whole.lse)
    assert part.stats == whole.stats


@pytest.mark.parametrize("name", ["fa3", "zyfa-hopper", "sage2", "zyfa", "aiter-triton"])
def test_a_window_alone_is_the_window_with_the_causal_bound(name):
    """``window`` implies the causal bound (emulate's docstring: query at p sees p - window < j <= p), so
    ``causal=False`` with a window is bit for bit ``causal=True`` with it, in fp32 output too. On the Hopper
    accumulator recipes this needs the row blocks that see none of a tile to skip it, as the kernels do."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, 300, 64, generator=g) for _ in range(3))
    v = v.abs() * 4  # positive V: an extra truncation of the Hopper accumulator is visible
    r = get_recipe(name).replace(name=f"{name}-fp32out", out_format="fp32")
    alone = emulate(q, k, v, r, window=100)
    both = emulate(q, k, v, r, causal=True, window=100)
    assert torch.equal(alone.out, both.out) and torch.equal(alone.lse, both.lse)
    ref, _ = attention_fp64(alone.q_deq, alone.k_deq, alone.v_deq, causal=True, window=100)
    assert rel_l2(alone.out, ref) < 0.05
