"""The peers' names: one table, with no import of torch or of a peer's package (the bench's Markdown renderer and
the report read it).

:data:`PEER_NAMES` maps each peer's one name (bench rows' ``impl``, the accuracy registry's key) to how tables
name it; :mod:`zyfa.peers.registry` gives each of these names its recipe, checks and ``prepare``. Bench files
written before the names were unified call SDPA's backends ``sdpa-cudnn``/``sdpa-flash`` (:data:`OLD_NAMES`);
:func:`canonical_name` reads them as today's names.

Exposed: ``PEER_NAMES``, ``BENCH_PEERS``, ``OLD_NAMES``, ``canonical_name``.
"""

from __future__ import annotations

__all__ = ["BENCH_PEERS", "OLD_NAMES", "PEER_NAMES", "canonical_name"]

PEER_NAMES: dict[str, str] = {
    "sdpa-bf16:cudnn": "cuDNN BF16",
    "sdpa-bf16:flash": "flash BF16 (SDPA)",
    "cudnn-fp8": "cuDNN FP8",
    "cudnn-fp8:oracle-scale": "cuDNN FP8 (oracle output scale)",
    "sdpa-fp32": "SDPA FP32",
    "flash-attn-triton-amd": "AMD Triton FP8",
    "flashinfer-fa3": "FA3 FP8 (FlashInfer)",
}
# the peers `zyfa bench` times by default, in its order
BENCH_PEERS = ("sdpa-bf16:cudnn", "sdpa-bf16:flash", "cudnn-fp8", "flash-attn-triton-amd", "flashinfer-fa3")
# names older bench files used -> today's (read, never written)
OLD_NAMES = {"sdpa-cudnn": "sdpa-bf16:cudnn", "sdpa-flash": "sdpa-bf16:flash"}


def canonical_name(name):
    """Today's name of a peer (an old bench file's name mapped on; any other name, or None, as given)."""
    return OLD_NAMES.get(name, name)
