"""The description of a seeded Gaussian attention input, and its checks: no torch, so that ``zyfa accuracy``
refuses a bad shape in one line before any heavy import (the tensors are drawn by
:func:`zyfa.accuracy.inputs.attention_input.make_gaussian`).

Exposed:
    GaussianSpec          frozen, validated description of a Gaussian input (FA3-style outliers optional)
    SUPPORTED_HEAD_DIMS   the (d_qk, d_v) pairs the peers' kernels ship (the emulator takes any d >= 1)
    DTYPE_NAMES           the dtypes the original inputs may have
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

# (d_qk, d_v) pairs the real kernels ship: the standard head dims, MLA (192/128) and absorbed MLA (576/512).
# The emulator and the FP64 oracle compute any head dim >= 1 (80, 96, 112 included), so a Gaussian input may
# have any; a real kernel refuses the dims it lacks in its own row.
SUPPORTED_HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (192, 128), (576, 512))
DTYPE_NAMES = ("bf16", "fp32")


@dataclass(frozen=True)
class GaussianSpec:
    """A seeded Gaussian attention input.

    Entries are std·N(0, 1); with ``outlier_frac`` > 0, each entry of the tensors named in
    ``outlier_tensors`` (Q and K by default) gets an extra std·outlier_scale·N(0, 1) with probability
    ``outlier_frac``: at std 1 this is the FA3 paper's N(0,1) + N(0, outlier_scale²)·Bernoulli(outlier_frac)
    (outlier_scale 10, outlier_frac 0.001 there). The bulk draws come first from one ``torch.Generator``,
    so specs that differ only in their outliers share the same bulk values.

    Attributes:
        seq: keys (and queries unless ``seq_q``); seq_q: queries when fewer or more than the keys (decode:
            1; chunked prefill: a chunk shorter than the keys), aligned bottom-right as in the oracle.
        head_dim, head_dim_v: any dims >= 1; head_dim_v None means head_dim.
        dtype: "bf16" or "fp32": values are drawn in fp32 and rounded to this dtype.
    """

    batch: int = 1
    heads_q: int = 4
    heads_kv: int = 4
    seq: int = 4096
    head_dim: int = 128
    head_dim_v: int | None = None
    causal: bool = False
    window: int | None = None
    std: float = 1.0
    outlier_frac: float = 0.0
    outlier_scale: float = 10.0
    outlier_tensors: str = "qk"
    seed: int = 0
    dtype: str = "bf16"
    seq_q: int | None = None

    def __post_init__(self) -> None:
        for name in ("batch", "heads_q", "heads_kv", "seq", "seed"):
            value = getattr(self, name)
            if not _is_int(value):
                raise ValueError(f"{name} must be an int, got {value!r}")
        for name in ("batch", "heads_q", "heads_kv", "seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_q is not None and not (_is_int(self.seq_q) and self.seq_q >= 1):
            raise ValueError(f"seq_q must be an int >= 1 or None, got {self.seq_q!r}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")
        for name, d in (("head_dim", self.head_dim), ("head_dim_v", self.d_v)):
            if not (_is_int(d) and d >= 1):
                raise ValueError(f"{name} must be an int >= 1, got {d!r}")
        if self.window is not None and not (_is_int(self.window) and self.window >= 1):
            raise ValueError(f"window must be an int >= 1 or None, got {self.window!r}")
        if not (math.isfinite(self.std) and self.std > 0):
            raise ValueError(f"std must be finite and > 0, got {self.std}")
        if not 0.0 <= self.outlier_frac <= 1.0:
            raise ValueError(f"outlier_frac must be in [0, 1], got {self.outlier_frac}")
        if not (math.isfinite(self.outlier_scale) and self.outlier_scale >= 0):
            raise ValueError(f"outlier_scale must be finite and >= 0, got {self.outlier_scale}")
        if not self.outlier_tensors or set(self.outlier_tensors) - set("qkv"):
            raise ValueError(f"outlier_tensors must be letters of 'qkv', got {self.outlier_tensors!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {sorted(DTYPE_NAMES)}, got {self.dtype!r}")

    @property
    def d_v(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def s_q(self) -> int:
        """Queries: ``seq_q``, or ``seq`` when not given."""
        return self.seq if self.seq_q is None else self.seq_q

    @property
    def name(self) -> str:
        hd = f"{self.head_dim}" if self.d_v == self.head_dim else f"{self.head_dim}-{self.d_v}"
        s = f"s{self.seq}" if self.s_q == self.seq else f"sq{self.s_q}-sk{self.seq}"
        parts = [f"gaussian-b{self.batch}-h{self.heads_q}x{self.heads_kv}-{s}-d{hd}"]
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"w{self.window}")
        if self.std != 1.0:
            parts.append(f"std{self.std:g}")
        if self.outlier_frac > 0:
            parts.append(f"out{self.outlier_frac:g}x{self.outlier_scale:g}{self.outlier_tensors}")
        if self.dtype != "bf16":
            parts.append(self.dtype)
        parts.append(f"seed{self.seed}")
        return "-".join(parts)


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)
