"""Attention inputs for the accuracy runner: seeded Gaussian specs and captured model activations.

Exposed:
    AttentionInput           one (q, k, v) problem with its mask, scale and metadata (incl. content hash)
    GaussianSpec             frozen, validated description of a Gaussian input (accuracy/inputs/gaussian_spec.py)
    make_gaussian(spec)      -> AttentionInput, deterministic in ``spec.seed``
    capture_inputs(path, layers=None, heads=None, max_tokens=None) -> list[AttentionInput]
    content_hash(*tensors, causal=False, window=None)   sha256 of dtypes, shapes, bytes and the mask, 16 hex digits

Tensors are (batch, heads, seq, head_dim); K/V keep their own ``heads_kv`` (GQA/MQA not expanded).
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from zyfa.accuracy.inputs.gaussian_spec import SUPPORTED_HEAD_DIMS, GaussianSpec
from zyfa.accuracy.io.device import available_bytes, check_memory
from zyfa.capture.fetch import sha256_file
from zyfa.capture.store import open_capture, read_capture

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "AttentionInput",
    "GaussianSpec",
    "capture_inputs",
    "check_capture_memory",
    "content_hash",
    "make_gaussian",
]

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class AttentionInput:
    """One attention problem.

    Attributes:
        name: readable id, used in tables and result rows.
        q: (b, h_q, s_q, d_qk); k: (b, h_kv, s_k, d_qk); v: (b, h_kv, s_k, d_v); h_q % h_kv == 0.
        causal, window, sm_scale: as in ``reference.attention_fp64`` (sm_scale None = 1/sqrt(d_qk)).
        meta: provenance of the data: ``source`` ("gaussian" or "capture"), ``content_hash`` of q/k/v, and
            the spec or the capture file's sha256, model, layer and heads.
    """

    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool = False
    window: int | None = None
    sm_scale: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for t, x in (("q", self.q), ("k", self.k), ("v", self.v)):
            if not isinstance(x, torch.Tensor) or x.dim() != 4:
                raise ValueError(f"input {self.name!r}: {t} must be a 4-D tensor (batch, heads, seq, head_dim)")
        b, h_q, s_q, d_qk = self.q.shape
        if self.k.shape[:2] != self.v.shape[:2] or self.k.shape[2] != self.v.shape[2]:
            raise ValueError(f"input {self.name!r}: k {tuple(self.k.shape)} and v {tuple(self.v.shape)} differ")
        if self.k.shape[0] != b or self.k.shape[3] != d_qk:
            raise ValueError(f"input {self.name!r}: q {tuple(self.q.shape)} and k {tuple(self.k.shape)} differ")
        if self.k.shape[1] < 1 or h_q % self.k.shape[1]:
            raise ValueError(f"input {self.name!r}: {h_q} query heads not a multiple of {self.k.shape[1]} kv heads")
        if self.window is not None and not (_is_int(self.window) and self.window >= 1):
            raise ValueError(f"input {self.name!r}: window must be an int >= 1 or None, got {self.window!r}")

    @property
    def shape(self) -> dict[str, int]:
        """batch, heads_q, heads_kv, seq_q, seq_k, head_dim, head_dim_v."""
        b, h_q, s_q, d_qk = self.q.shape
        return {"batch": b, "heads_q": h_q, "heads_kv": self.k.shape[1], "seq_q": s_q, "seq_k": self.k.shape[2],
                "head_dim": d_qk, "head_dim_v": self.v.shape[3]}

    def to(self, device: torch.device | str) -> AttentionInput:
        """A copy with q, k, v on ``device`` (same object if already there)."""
        if self.q.device == torch.device(device):
            return self
        return dataclasses.replace(self, q=self.q.to(device), k=self.k.to(device), v=self.v.to(device))


def make_gaussian(spec: GaussianSpec) -> AttentionInput:
    """Draw the input described by ``spec`` (bit-identical for the same spec, on CPU)."""
    gen = torch.Generator(device="cpu").manual_seed(spec.seed)
    shapes = {
        "q": (spec.batch, spec.heads_q, spec.s_q, spec.head_dim),
        "k": (spec.batch, spec.heads_kv, spec.seq, spec.head_dim),
        "v": (spec.batch, spec.heads_kv, spec.seq, spec.d_v),
    }
    x = {t: torch.randn(s, generator=gen, dtype=torch.float32).mul_(spec.std) for t, s in shapes.items()}
    n_outliers = {}
    if spec.outlier_frac > 0:
        for t in "qkv":  # fixed order, so which tensors get outliers does not change the others' draws
            hit = torch.rand(shapes[t], generator=gen, dtype=torch.float32) < spec.outlier_frac
            big = torch.randn(shapes[t], generator=gen, dtype=torch.float32).mul_(spec.std * spec.outlier_scale)
            if t in spec.outlier_tensors:
                x[t].add_(torch.where(hit, big, 0.0))
                n_outliers[t] = int(hit.sum())
    dtype = _DTYPES[spec.dtype]
    q, k, v = (x[t].to(dtype) for t in "qkv")
    meta = {
        "source": "gaussian",
        "spec": dataclasses.asdict(spec),
        "content_hash": content_hash(q, k, v, causal=spec.causal, window=spec.window),
    }
    if n_outliers:
        meta["outlier_counts"] = n_outliers
    return AttentionInput(name=spec.name, q=q, k=k, v=v, causal=spec.causal, window=spec.window,
                          sm_scale=None, meta=meta)


def content_hash(*tensors: torch.Tensor, causal: bool = False, window: int | None = None) -> str:
    """sha256 over each tensor's dtype, shape and raw bytes, and the mask; the first 16 hex digits.

    The mask is part of the input's identity (result files are joined on it): a causal or windowed problem on
    the same tensors hashes differently. Unmasked inputs hash their tensors alone, as before the mask was added.
    """
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    if causal or window is not None:
        h.update(f"mask:causal={bool(causal)},window={window}".encode())
    return h.hexdigest()[:16]


def capture_inputs(
    path: str | Path,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    max_tokens: int | None = None,
    *,
    device: str | None = None,
) -> list[AttentionInput]:
    """One input per captured layer of an HDF5 capture (:func:`zyfa.capture.store.read_capture`).

    Before any data is read, each layer's declared size is checked (:func:`check_capture_memory`): a layer that
    would not fit in memory is refused in one line naming the file and the layer.

    Args:
        path: capture file written by ``zyfa capture``.
        layers: layer indices to keep (None: every complete layer); an absent layer is an error.
        heads: the model's query-head indices to keep (None: all captured). The KV heads they use come along,
            so GQA structure is kept; a selection that does not form equal groups gets one KV head per query
            head (``zyfa.capture.store``'s rule).
        max_tokens: keep the first N tokens of the sequence (a prefix, so causal masks stay valid).

    Per-tensor FP8 scales are then computed over the selected heads and tokens only.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"capture file not found: {path}")
    if max_tokens is not None and not (_is_int(max_tokens) and max_tokens >= 1):
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")

    check_capture_memory(open_capture(path), layers=layers, heads=heads, max_tokens=max_tokens, device=device)
    file_hash = sha256_file(path)
    inputs = [_from_record(rec, path, file_hash, max_tokens)
              for rec in read_capture(path, layers=layers, heads=heads)]
    if not inputs:
        raise ValueError(f"{path}: the capture holds no complete layers")
    return inputs


# Host bytes reading a layer takes per stored byte: the array h5py reads, its torch view's checks (isfinite
# masks) and the contiguous copies made from it.
READ_COPIES = 3


def check_capture_memory(info, *, layers=None, heads=None, max_tokens=None, device=None) -> None:
    """ValueError naming the file and the layer when reading a capture's layer, or running it, would not fit.

    ``info``: :func:`zyfa.capture.store.open_capture`'s metadata (shapes from the file's structure, no data read).
    Two needs per layer: reading (the stored q, k, v whole, :data:`READ_COPIES` times, against the host's
    free memory) and the run (:func:`zyfa.accuracy.io.device.check_memory`, the rule Gaussian inputs are checked by,
    on the selected heads and tokens, against ``device``'s)."""
    want = info.complete_layers if layers is None else [i for i in sorted(set(int(x) for x in layers))
                                                        if i in info.datasets]
    host = available_bytes(torch.device("cpu"))
    for i in want:
        where = f"{info.path}: layer {i}"
        need = READ_COPIES * info.read_bytes(i)
        if host is not None and need > host:
            shapes = ", ".join(f"{n} {tuple(s)}" for n, (s, _) in info.datasets[i].items())
            raise ValueError(f"{where} declares {shapes}: reading it needs about {need / 2**30:.1f} GiB, but the "
                             f"host has {host / 2**30:.1f} GiB free (use another capture, or fewer --layers)")
        (b, hq, s, d), (_, hkv, _, _), (_, _, _, dv) = (info.datasets[i][n][0] for n in ("q", "k", "v"))
        if heads is not None:
            hq = min(hq, len(set(heads)))
            hkv = min(hkv, hq)
        s = min(s, max_tokens) if max_tokens is not None else s
        check_memory({"batch": b, "heads_q": hq, "heads_kv": hkv, "seq_q": s, "seq_k": s, "head_dim": d,
                      "head_dim_v": dv}, device or "cpu", what=where)


# root attributes of a capture copied into each input's meta (capture.store.REQUIRED_ROOT and friends)
_CAPTURE_META = ("model", "model_source", "model_package", "model_sha256", "text_source", "text_sha256",
                 "seq_len", "dtype", "transformers_version", "git_commit", "created")


def _from_record(rec, path: Path, file_hash: str, max_tokens: int | None) -> AttentionInput:
    q, k, v = rec.q, rec.k, rec.v
    if max_tokens is not None:
        q, k, v = q[:, :, :max_tokens], k[:, :, :max_tokens], v[:, :, :max_tokens]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    model_tag = str(rec.model).rstrip("/").split("/")[-1] or path.stem
    name = f"{model_tag}-L{rec.layer}"
    if rec.layer_type:
        name += f"-{rec.layer_type}"
    root = rec.meta or {}
    all_heads = root.get("num_q_heads")
    if all_heads is None or list(rec.q_heads) != list(range(int(all_heads))):
        name += "-h" + ".".join(map(str, rec.q_heads))
    name += f"-s{q.shape[2]}"
    meta = {
        "source": "capture",
        "file": path.name,
        "file_sha256": file_hash,
        **{key: root[key] for key in _CAPTURE_META if key in root},
        "layer": int(rec.layer),
        "layer_type": str(rec.layer_type),
        "q_heads": list(rec.q_heads),
        "kv_heads": list(rec.kv_heads),
        "max_tokens": max_tokens,
        "content_hash": content_hash(q, k, v, causal=bool(rec.causal), window=rec.window),
    }
    return AttentionInput(name=name, q=q, k=k, v=v, causal=bool(rec.causal), window=rec.window,
                          sm_scale=float(rec.sm_scale), meta=meta)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)
