"""The peers by name (:data:`zyfa.peers.names.PEER_NAMES`): the recipe each is paired with, what it needs, and how
to prepare it.

``zyfa bench`` times what :func:`prepare` returns, and the accuracy registry
(:mod:`zyfa.accuracy.implementations.registry`)
builds its built-in peers from :data:`PEERS`, so a peer has one name everywhere.

Exposed: ``Peer``, ``PEERS``, ``get_peer``, ``prepare``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from zyfa.peers import cudnn_fp8, flash_attn_amd, flashinfer_fa3, sdpa
from zyfa.peers.common import Prepared
from zyfa.peers.names import PEER_NAMES, canonical_name

__all__ = ["PEERS", "Peer", "get_peer", "prepare"]


@dataclass(frozen=True)
class Peer:
    """One peer kernel.

    Attributes:
        name: its one name (a key of :data:`zyfa.peers.names.PEER_NAMES`).
        recipe: the recipe whose numerics it has (the bench row's ``recipe``; the accuracy registry pairs it).
        device: what it runs on, in words.
        package: the distribution it needs, or None.
        check: ``() -> (ok, reason)``: whether the device and package are here.
        prepare: ``prepare(q, k, v, *, causal, sm_scale) -> Prepared``, or None where it needs more than the inputs
            (``cudnn-fp8:oracle-scale`` needs the FP64 oracle's output amax): not timed by the bench.
        hint: how to get it where ``check`` fails, or "".
        refuse: ``(q, k, v) -> reason | None``: inputs it cannot take, asked before ``check`` (a shape is refused
            the same on any machine).
    """

    name: str
    recipe: str
    device: str
    package: str | None
    check: Callable[[], tuple[bool, str]]
    prepare: Callable[..., Prepared] | None
    hint: str = ""
    refuse: Callable[..., str | None] | None = None


def _always() -> tuple[bool, str]:
    return True, ""


_HOPPER = "CUDA, Hopper (sm_90)"
PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer("sdpa-bf16:cudnn", "bf16", "CUDA (sm_80+)", None, sdpa.check_bf16,
         partial(sdpa.prepare, backend="cudnn")),
    Peer("sdpa-bf16:flash", "bf16", "CUDA (sm_80+)", None, sdpa.check_bf16,
         partial(sdpa.prepare, backend="flash")),
    Peer("cudnn-fp8", cudnn_fp8.CUDNN_FP8_RECIPE, _HOPPER, "nvidia-cudnn-frontend", cudnn_fp8.check,
         cudnn_fp8.prepare),
    Peer("cudnn-fp8:oracle-scale", cudnn_fp8.CUDNN_FP8_RECIPE, _HOPPER,
         "nvidia-cudnn-frontend", cudnn_fp8.check, None),
    Peer("sdpa-fp32", "fp32", "any", None, _always, partial(sdpa.prepare, dtype=torch.float32)),
    Peer("flash-attn-triton-amd", flash_attn_amd.FLASH_ATTN_AMD_RECIPE,
         "CUDA, sm_90 (portable Triton)", "flash-attn", flash_attn_amd.check, flash_attn_amd.prepare,
         refuse=flash_attn_amd.head_dims_refusal),
    Peer("flashinfer-fa3", flashinfer_fa3.FLASHINFER_FA3_RECIPE, _HOPPER, "flashinfer-python",
         flashinfer_fa3.check, flashinfer_fa3.prepare,
         hint="scripts/build_flashinfer_fa3.py builds FlashInfer's FA3 FP8 prefill for the GPU",
         refuse=flashinfer_fa3.head_dims_refusal),
)}
if list(PEERS) != list(PEER_NAMES):
    raise RuntimeError("zyfa.peers.names and zyfa.peers.registry must name the same peers, in one order")


def get_peer(name: str) -> Peer:
    """The peer of that name (an old name accepted); ValueError in one line listing the names for an unknown one."""
    peer = PEERS.get(canonical_name(name))
    if peer is None:
        raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
    return peer


def prepare(name: str, q, k, v, *, causal: bool, sm_scale: float) -> Prepared:
    """The peer ``name`` prepared once on q, k, v (b, h, s, d; bf16 or float): "prepare once, call many". RuntimeError
    with the reason (and how to get it) where it cannot run here, ValueError where it cannot take this input."""
    peer = get_peer(name)
    if peer.prepare is None:
        raise ValueError(f"peer {peer.name!r} needs more than its inputs to run (the accuracy runner's context)")
    why = peer.refuse(q, k, v) if peer.refuse else None
    if why:
        raise ValueError(why)
    ok, why = peer.check()
    if not ok:
        raise RuntimeError(f"{why} ({peer.hint})" if peer.hint else why)
    return peer.prepare(q, k, v, causal=causal, sm_scale=sm_scale)
