"""Vendor dispatch tables (zyfa/dispatch.py): each recipe that names a vendor kernel is applied only where the
vendor's dispatcher runs that kernel; elsewhere its row is refused in one line with the source.

Sources, read at ROCm/aiter @ e4048607 (2026-08-22):
- aiter/ops/mha.py:1796-1813  is_fmha_v3_fp8: FP8 assembly kernels only at (d_qk, d_v) = (128, 128), or (256, 256)
  on gfx950.
- aiter/ops/mha.py:1815-1838  can_impl_fmha_v3_fwd: no sliding window (:1828, swa from :1790-1794), power-of-two GQA
  ratio for FP8 (:1833-1835).
- aiter/ops/mha.py:2075       the assembly path only when seqlen_q > 128 ("Prefer CK for decode cases"); else
  mha_fwd (:2096-2097), which runs CK (csrc/cpp_itfs/mha_fwd.cu:372-379).
- csrc/cpp_itfs/mha_fwd.cu:12-23  mask none, or causal (bottom-right; top-left only when s_q = s_k), no window.
- hsa/gfx950/fmha_v3_fwd/fmha_fwd.csv:10-11 fwd_hd128_fp8(.co, _causal.co) ts_qo 256 ts_kv 128; :14-15
  fwd_hd256_fp8 ts_kv 64.
Composable Kernel (ROCm/rocm-libraries @ 014d097d, projects/composablekernel/example/ck_tile/01_fmha/codegen/ops/
fmha_fwd.py, KernelComponentFactoryGfx9.get_hdim_tile_size_dict, fp8/fp8bf16 branch): keys (64, 64) with a 128x64
tile, (128, 128), (192, 128), (256, 256) with 128x128; nothing above 256.
"""

from __future__ import annotations

import pytest
from zyfa.accuracy.inputs.attention_input import GaussianSpec, make_gaussian
from zyfa.accuracy.operator.runner import run_accuracy
from zyfa.accuracy.study.run import refusals

from zyfa.dispatch import TABLES, base_name, route, table_rows
from zyfa.recipe_spec import get_recipe


def _aiter(**kw):
    shape = {"head_dim": 128, "seq_q": 2048, "heads_q": 8, "heads_kv": 2, "causal": True, **kw}
    return route("aiter", **shape)


def test_aiter_hd128_causal_runs_the_asm_kernel_the_recipe_models():
    # mha.py:1796-1813, :1815-1838, :2075; fmha_fwd.csv:11 (fwd_hd128_fp8_causal.co)
    d = _aiter()
    assert d.refused is None and "fwd_hd128_fp8.co" in d.kernel and "fmha_fwd.csv:10-11" in d.source
    assert _aiter(causal=False).refused is None


def test_aiter_hd64_is_refused_ck_runs_there():
    # mha.py:1796-1800: no FP8 assembly kernel at d 64; mha_fwd -> CK (mha_fwd.cu:372-379)
    d = _aiter(head_dim=64)
    assert d.refused is not None and d.kernel.startswith("CK tile fmha")
    assert "no FP8 assembly kernel at this head dim" in d.refused and "recipe ck" in d.refused
    assert "aiter/ops/mha.py:1796-1800" in d.refused
    assert "\n" not in d.refused


def test_aiter_hd256_runs_another_asm_kernel_which_the_recipe_does_not_model():
    # mha.py:1799-1800 (256 on gfx950); fmha_fwd.csv:14-15 (fwd_hd256_fp8, ts_kv 64)
    d = _aiter(head_dim=256)
    assert d.refused is not None and "fwd_hd256_fp8.co" in d.kernel and "ts_kv 64" in d.kernel
    assert "fmha_fwd.csv:14-15" in d.source


@pytest.mark.parametrize("kw,why", [
    ({"seq_q": 128}, "s_q <= 128"),  # mha.py:2075: seqlen_q > 128 for the assembly path
    ({"window": 512}, "sliding window"),  # mha.py:1828 (not swa)
    ({"heads_q": 12, "heads_kv": 4}, "power of two"),  # mha.py:1833-1835: GQA ratio 3
    ({"heads_q": 12, "heads_kv": 2}, "power of two"),  # GQA 6: Qwen2.5-Coder-1.5B's 12 query / 2 KV heads
    ({"head_dim": 192, "head_dim_v": 128}, "no FP8 assembly kernel"),  # mha.py:1796-1800
])
def test_aiter_falls_back_to_ck_outside_the_asm_kernels_conditions(kw, why):
    d = _aiter(**kw)
    assert d.refused is not None and why in d.refused and d.kernel.startswith("CK tile fmha")


def test_a_window_covering_every_key_is_no_window():
    # mha.py:1790: window_size_left >= seqlen_k is taken as -1 (no window)
    assert _aiter(window=4096, seq_k=2048).refused is None


def test_no_fp8_kernel_above_256():
    assert _aiter(head_dim=576, head_dim_v=512).kernel is None
    d = route("ck", head_dim=576, head_dim_v=512, seq_q=1024)
    assert d.kernel is None and "no FP8 fmha forward kernel" in d.refused


def test_ck_maps_hd64_to_its_128x64_kernel_and_the_recipe_carries_those_tiles():
    # fmha_fwd.py KernelComponentFactoryGfx9.get_hdim_tile_size_dict, fp8bf16 key (64, 64): bm0 128, bn0 64
    d = route("ck", head_dim=64, seq_q=2048, causal=True)
    assert d.refused is None and "128 x bn0 64" in d.kernel
    assert get_recipe("ck").tiles(64) == (128, 64) and get_recipe("ck").tiles(128) == (128, 128)
    assert get_recipe("ck-blockscale").tiles(64) == (128, 64)
    for hd, hv in ((128, 128), (192, 128), (256, 256)):
        assert route("ck", head_dim=hd, head_dim_v=hv, seq_q=64, window=16).refused is None


def test_recipes_without_a_vendor_table_are_not_routed():
    for name in ("zyfa", "zyfa-exp2", "bf16", "fp32", "triton-amd"):
        assert route(name, head_dim=64, seq_q=64) is None
    assert base_name("aiter@h200") == "aiter" and base_name("aiter:p_scale=fmax") == "aiter"
    assert route("aiter@h200", head_dim=64, seq_q=2048).refused is not None


def test_every_table_ends_with_a_catch_all_and_rows_cite_a_source():
    for name, rows in TABLES.items():
        assert rows[-1].dims is None and rows[-1].when is None, name
    for row in table_rows():
        assert row["source"] and (row["recipe_applies"] or row["reason"] != "-")


def test_the_runner_writes_a_refused_row_and_computes_nothing():
    inp = make_gaussian(GaussianSpec(seq=160, head_dim=64, heads_q=2, heads_kv=1))
    rows = {r["recipe"]: r for r in run_accuracy(inp, ["ck", "aiter"], progress=False)}
    assert rows["aiter"]["status"] == "refused" and "AITER has no FP8 assembly kernel" in rows["aiter"]["reason"]
    assert "deq_rel_l2" not in rows["aiter"] and "p_flushed_frac" not in rows["aiter"]
    assert rows["ck"].get("status") is None and rows["ck"]["deq_rel_l2"] > 0
    assert "128 x bn0 64" in rows["ck"]["vendor_kernel"]


def test_the_study_leaves_refused_pairs_out_with_the_reason():
    hd64 = make_gaussian(GaussianSpec(seq=160, head_dim=64, heads_q=1, heads_kv=1))
    hd128 = make_gaussian(GaussianSpec(seq=160, head_dim=128, heads_q=1, heads_kv=1))
    out = refusals([hd64, hd128], ["aiter", "ck", "zyfa"])
    assert list(out) == [(hd64.name, "aiter")]
    assert "AITER has no FP8 assembly kernel" in out[(hd64.name, "aiter")]
