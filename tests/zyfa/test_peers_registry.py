"""The peers' one table of names and their "prepare once, call many" entry (zyfa.peers.registry), on the CPU: the
fp32 SDPA peer runs here for real; the others are refused with their reason before any work."""

from __future__ import annotations

import math

import pytest
import torch
from zyfa.accuracy.implementations.names import kernel_namespace
from zyfa.accuracy.implementations.registry import builtin_names, get_implementation

from zyfa.peers.names import BENCH_PEERS, OLD_NAMES, PEER_NAMES, canonical_name
from zyfa.peers.registry import PEERS, get_peer, prepare
from zyfa.peers.sdpa import sdpa_forward


def _qkv(d_qk=64, d_v=64, h=4, h_kv=2, s=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, h, s, d_qk, generator=g), torch.randn(1, h_kv, s, d_qk, generator=g),
            torch.randn(1, h_kv, s, d_v, generator=g))


def test_prepared_peer_calls_many_times_and_keeps_its_last_output():
    """sdpa-fp32 prepared once: each call is SDPA on the same inputs (GQA repeated), output() the last one."""
    q, k, v = _qkv()
    p = prepare("sdpa-fp32", q, k, v, causal=True, sm_scale=1 / math.sqrt(64))
    with pytest.raises(RuntimeError, match="before the first call"):
        p.output()
    first = p.call().clone()
    second = p.call()
    assert p.output() is second and torch.equal(first, second)
    assert torch.equal(first, sdpa_forward(q, k, v, causal=True, sm_scale=1 / math.sqrt(64), dtype=torch.float32))
    assert p.details == {"sdpa_backend": "any", "sdpa_dtype": "float32"}


def test_one_name_per_peer_in_the_bench_and_the_accuracy_registry():
    """Every peer of the table is a built-in of the accuracy registry under the same name and recipe, and every
    non-Triton built-in is a peer of the table: one set of names."""
    names = builtin_names()
    assert set(PEERS) == {n for n in names if kernel_namespace(n) is None}  # not ours: triton:SPEC, cute:SPEC
    for name, peer in PEERS.items():
        impl = get_implementation(name)
        assert (impl.recipe, impl.package, impl.device) == (peer.recipe, peer.package, peer.device), name
    assert set(BENCH_PEERS) <= {n for n, p in PEERS.items() if p.prepare is not None}
    assert list(PEERS) == list(PEER_NAMES)


def test_old_bench_names_read_as_todays():
    assert canonical_name("sdpa-cudnn") == "sdpa-bf16:cudnn" and canonical_name("cudnn-fp8") == "cudnn-fp8"
    assert all(new in PEERS for new in OLD_NAMES.values())
    assert get_peer("sdpa-flash").name == "sdpa-bf16:flash"
    with pytest.raises(ValueError, match=r"^unknown peer 'sdpa-bf17'; known: sdpa-bf16:cudnn, "):
        get_peer("sdpa-bf17")


def test_shape_refused_before_the_machine_is_asked():
    """An input the kernel cannot take is refused with the same line on any machine (here, without a GPU)."""
    q, k, v = _qkv(d_qk=192, d_v=128)
    with pytest.raises(ValueError, match="one head size for Q, K and V, not 192/192/128"):
        prepare("flash-attn-triton-amd", q, k, v, causal=False, sm_scale=0.1)
    with pytest.raises(ValueError, match="d_qk = d_v in 64, 128, 256, not 192/128"):
        prepare("flashinfer-fa3", q, k, v, causal=False, sm_scale=0.1)


def test_unavailable_peer_says_why_and_how():
    if torch.cuda.is_available():
        pytest.skip("checks the reasons given on a machine without a GPU")
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match=r"^no CUDA device$"):
        prepare("cudnn-fp8", q, k, v, causal=False, sm_scale=0.1)
    with pytest.raises(RuntimeError, match=r"^no CUDA device \(scripts/build_flashinfer_fa3.py builds"):
        prepare("flashinfer-fa3", q, k, v, causal=False, sm_scale=0.1)
    with pytest.raises(ValueError, match="needs more than its inputs"):
        prepare("cudnn-fp8:oracle-scale", q, k, v, causal=False, sm_scale=0.1)
