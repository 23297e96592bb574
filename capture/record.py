"""``LayerRecord``: what one attention layer saw, the one type the hook produces and the store writes and reads.

The hook (``zyfa.capture.hook.QKVRecorder``) hands a ``LayerRecord`` to its callback as each layer runs; the
writer (``zyfa.capture.writer.CaptureWriter.write_layer``) stores one; the reader (``zyfa.capture.store.read_capture``)
yields them, with ``model``, ``path`` and ``meta`` (the file's root attributes) filled in.

Exposed: ``LayerRecord``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LayerRecord:
    """One attention layer's inputs for the selected query heads (see docs/CONTRACTS.md).

    q: (b, len(q_heads), s_q, d); k, v: (b, len(kv_heads), s_k, d), in the exact dtype the model ran in
    (float32, float16 or bfloat16). ``q_heads``/``kv_heads`` are the model's head indices of the rows, and
    ``kv_head_of_q[i]`` is the position in k/v of the KV head that query row ``i`` attends with. Records read
    back by ``read_capture`` always have equal consecutive groups (query row i uses KV row
    i // (len(q_heads) // len(kv_heads))), the GQA convention of the accuracy runner.

    ``window`` is the sliding-window length in keys (key j is seen from position p when p - window < j <= p),
    None without a window. ``model``, ``path`` and ``meta`` are empty for a record straight from the hook.
    """

    layer: int
    layer_type: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    sm_scale: float
    causal: bool
    window: int | None
    q_heads: tuple[int, ...]
    kv_heads: tuple[int, ...]
    kv_head_of_q: tuple[int, ...]
    num_q_heads: int
    num_kv_heads: int
    model: str = ""
    path: str = ""
    meta: dict = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        heads = ",".join(map(str, self.q_heads))
        return f"{self.meta.get('model', self.model)}:L{self.layer}:h{heads}"
