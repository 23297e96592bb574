"""The cliff finder over the built-in real kernels on the H200 (``gpu``: skipped on CPU): each available kernel
sweeps lengths around a tile boundary, both masks, s_q = s_k and chunked, and every row is ok or a flag with
its reason (a kernel's refusal or NaN row is a finding, never a crash)."""

from __future__ import annotations

import math

import pytest
from zyfa.accuracy.cliffs.flags import find_flags
from zyfa.accuracy.cliffs.sweep import GaussianSource, run_cliffs, subjects
from zyfa.accuracy.implementations.registry import builtin_names, get_implementation
from zyfa.accuracy.inputs.attention_input import GaussianSpec

from zyfa.cli import main

PEERS = ("cudnn-fp8", "flashinfer-fa3", "sdpa-bf16:cudnn", "flash-attn-triton-amd")
LENGTHS = [1, 2, 3, 15, 16, 17, 63, 64, 65, 66, 127, 128, 129, 130]


def _available(name):
    impl = get_implementation(name)
    ok, why = impl.available()
    if not ok:
        pytest.skip(f"{name}: {why}")
    return impl


def _names():
    return [n for n in builtin_names() if n.startswith(("triton:", "cute:"))] + list(PEERS)  # ours, then the peers


@pytest.mark.gpu
@pytest.mark.parametrize("name", _names())
def test_builtin_sweeps_every_point(name):
    impl = _available(name)
    src = GaussianSource(GaussianSpec(heads_q=2, heads_kv=2, head_dim=128, seq=1))
    rows, prov = run_cliffs(src, subjects([], [impl]), LENGTHS, masks=["none", "causal"], shapes=["equal", "chunk"],
                            chunk=64, device="cuda", progress=False)
    n_chunk = sum(1 for L in LENGTHS if L > 64)
    assert len(rows) == 2 * (len(LENGTHS) + n_chunk)
    assert prov["implementations_platform"] == "h200"
    for r in rows:
        assert r["status"] in ("ok", "refused", "failed"), r
        if r["status"] != "ok":
            assert r["reason"] and r["orig_rel_l2"] is None, r
        elif r["nonfinite_rows"] == 0:  # a kernel's wrong answer is a finding for the flags, not a failure here
            assert r["orig_rel_l2"] is not None and r["orig_rel_l2"] >= 0 and r["seconds"] > 0, r
        else:
            assert r["orig_rel_l2"] is None, r
    flags = find_flags(rows)
    assert all(f["kind"] in ("nonfinite", "jump", "refused", "failed") for f in flags)
    flagged = {(f["length"], f["mask"], f["shape"]) for f in flags}
    for r in rows:  # whatever is not ok, or holds NaN/Inf rows, is flagged
        if r["status"] != "ok" or r["nonfinite_rows"]:
            assert (r["length"], r["mask"], r["shape"]) in flagged, r


@pytest.mark.gpu
def test_cli_on_cuda_writes_the_three_files(tmp_path):
    _available("triton:zyfa-hopper")
    out = tmp_path / "g"
    assert main(["cliffs", "--implementations", "triton:zyfa-hopper", "--recipes", "zyfa-hopper", "--lengths",
                 "100-140", "--mask", "both", "--shapes", "both", "--chunk", "32", "--head-dim", "128",
                 "--heads", "2", "--device", "cuda", "--no-progress", "--out", str(out)]) == 0
    for f in ("cliffs.jsonl", "cliffs.png", "cliffs.md"):
        assert (out / f).is_file()
    import json

    rows = [json.loads(x) for x in (out / "cliffs.jsonl").read_text().splitlines()[1:]]
    # our kernel and its recipe's emulation on the same inputs: errors within a few percent of each other
    by = {}
    for r in rows:
        by.setdefault((r["length"], r["mask"], r["shape"]), {})[r["impl_kind"]] = r
    for pair in by.values():
        real, emu = pair["builtin"]["orig_rel_l2"], pair["recipe"]["orig_rel_l2"]
        assert math.isclose(real, emu, rel_tol=0.1), pair
