"""The description of a controlled synthetic input (``synthetic:KEY=VALUE,...``), parsed and checked without
torch, so that a bad one is refused before any heavy import; :func:`zyfa.accuracy.inputs.synthetic.make_synthetic`
draws it (the regime and the calibration are described there).

Exposed:
    SYNTHETIC_KEYS                       key -> (default, description)
    SyntheticSpec                        frozen, validated
    parse_synthetic(text) -> SyntheticSpec   "synthetic:entropy=2.0,sink=0.3,..." (or without the prefix)
    split_inputs(text) -> list[str]      --inputs items, each synthetic spec kept whole; is_synthetic(item)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zyfa.accuracy.inputs.gaussian_spec import DTYPE_NAMES

__all__ = ["PREFIX", "SYNTHETIC_KEYS", "SyntheticSpec", "is_synthetic", "parse_synthetic", "split_inputs"]

PREFIX = "synthetic"
# key -> (default, what it sets); the order is the order of the name and of the error message
SYNTHETIC_KEYS: dict[str, tuple] = {
    "entropy": (None, "mean attention entropy in nats (default: not calibrated, temperature 1)"),
    "sink": (None, "mean probability on key 0 (default: key 0 is an ordinary key)"),
    "k_outliers": (0, "number of K channels with a bias"),
    "k_bias": (0.0, "the bias, in units of K's bulk standard deviation"),
    "rope": (0, "1: rotate Q and K by position (RoPE)"),
    "rope_theta": (10000.0, "RoPE base"),
    "head_dim": (128, "head dim, even, >= 8 (the real kernels take 64, 128, 256)"),
    "seq": (2048, "tokens (queries = keys)"),
    "heads": (4, "query heads"),
    "kv_heads": (None, "KV heads (default: heads)"),
    "batch": (1, "batch"),
    "causal": (1, "1: causal mask"),
    "seed": (0, "seed of the draws"),
    "dtype": ("bf16", "bf16 or fp32"),
}
_INT_KEYS = ("k_outliers", "rope", "head_dim", "seq", "heads", "kv_heads", "batch", "causal", "seed")
_FLOAT_KEYS = ("entropy", "sink", "k_bias", "rope_theta")

@dataclass(frozen=True)
class SyntheticSpec:
    """A controlled synthetic attention input (module doc); every field one of :data:`SYNTHETIC_KEYS`."""

    entropy: float | None = None
    sink: float | None = None
    k_outliers: int = 0
    k_bias: float = 0.0
    rope: int = 0
    rope_theta: float = 10000.0
    head_dim: int = 128
    seq: int = 2048
    heads: int = 4
    kv_heads: int | None = None
    batch: int = 1
    causal: int = 1
    seed: int = 0
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        for name in _INT_KEYS:
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"synthetic: {name} must be an integer, got {v!r}")
        for name in _FLOAT_KEYS:
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise ValueError(f"synthetic: {name} must be a finite number, got {v!r}")
        for name in ("seq", "heads", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"synthetic: {name} must be >= 1, got {getattr(self, name)}")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise ValueError(f"synthetic: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        # any even head dim the emulator computes (RoPE rotates channel pairs); the real kernels' own dims
        # (SUPPORTED_HEAD_DIMS) are refused or warned about by the recipes that run them, not here
        if self.head_dim < 8 or self.head_dim % 2:
            raise ValueError(f"synthetic: head_dim must be an even number >= 8 (RoPE rotates channel pairs), "
                             f"got {self.head_dim}")
        for name in ("rope", "causal"):
            if getattr(self, name) not in (0, 1):
                raise ValueError(f"synthetic: {name} must be 0 or 1, got {getattr(self, name)}")
        if self.entropy is not None and self.entropy <= 0:
            raise ValueError(f"synthetic: entropy must be > 0 nats, got {self.entropy}")
        if self.sink is not None and not 0 < self.sink < 1:
            raise ValueError(f"synthetic: sink must be in (0, 1), got {self.sink}")
        if self.sink is not None and self.seq < 2:
            raise ValueError("synthetic: a sink needs seq >= 2")
        free_pairs = self.head_dim // 2 - (1 if self.sink is not None else 0)
        if not 0 <= self.k_outliers <= 2 * free_pairs:
            raise ValueError(f"synthetic: k_outliers must be in [0, {2 * free_pairs}] at head_dim {self.head_dim}, "
                             f"got {self.k_outliers}")
        if self.k_bias < 0:
            raise ValueError(f"synthetic: k_bias must be >= 0 (signs are drawn), got {self.k_bias}")
        if self.rope_theta <= 1:
            raise ValueError(f"synthetic: rope_theta must be > 1, got {self.rope_theta}")
        if self.seed < 0:
            raise ValueError(f"synthetic: seed must be >= 0, got {self.seed}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"synthetic: dtype must be one of {sorted(DTYPE_NAMES)}, got {self.dtype!r}")

    @property
    def n_kv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def name(self) -> str:
        parts = [f"synthetic-b{self.batch}-h{self.heads}x{self.n_kv}-s{self.seq}-d{self.head_dim}"]
        if self.causal:
            parts.append("causal")
        if self.entropy is not None:
            parts.append(f"H{self.entropy:g}")
        if self.sink is not None:
            parts.append(f"sink{self.sink:g}")
        if self.k_outliers and self.k_bias:
            parts.append(f"kout{self.k_outliers}x{self.k_bias:g}")
        if self.rope:
            parts.append("rope" + ("" if self.rope_theta == 10000.0 else f"{self.rope_theta:g}"))
        if self.dtype != "bf16":
            parts.append(self.dtype)
        parts.append(f"seed{self.seed}")
        return "-".join(parts)

    def spec_string(self) -> str:
        """The ``synthetic:KEY=VALUE,...`` text that parses back to this spec (non-default keys only)."""
        kv = [f"{k}={getattr(self, k):g}" if isinstance(getattr(self, k), float) else f"{k}={getattr(self, k)}"
              for k, (default, _) in SYNTHETIC_KEYS.items() if getattr(self, k) != default]
        return PREFIX + (":" + ",".join(kv) if kv else "")


def parse_synthetic(text: str) -> SyntheticSpec:
    """``synthetic:KEY=VALUE,...`` (or ``synthetic``, or the ``KEY=VALUE,...`` part alone) -> spec.

    A bad key or value raises ValueError in one line listing the valid keys."""
    body = text.strip()
    if body == PREFIX:
        body = ""
    elif body.startswith(PREFIX + ":"):
        body = body[len(PREFIX) + 1:]
    valid = ", ".join(SYNTHETIC_KEYS)
    values: dict = {}
    for item in (s.strip() for s in body.split(",") if s.strip()):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or key not in SYNTHETIC_KEYS:
            what = f"unknown synthetic key {key!r}" if eq else f"synthetic: {item!r} is not KEY=VALUE"
            raise ValueError(f"{what}; valid keys: {valid}")
        if key in values:
            raise ValueError(f"synthetic: {key} given twice; valid keys: {valid}")
        raw = raw.strip()
        try:
            if key == "dtype":
                values[key] = raw
            elif key in _INT_KEYS:
                values[key] = int(raw)
            else:
                values[key] = float(raw)
        except ValueError:
            kind = "an integer" if key in _INT_KEYS else "a number"
            raise ValueError(f"synthetic: {key} must be {kind}, got {raw!r}; valid keys: {valid}") from None
    return SyntheticSpec(**values)


def split_inputs(text: str) -> list[str]:
    """``--inputs``' comma-separated items, with each ``synthetic:KEY=VALUE,...`` kept whole: the KEY=VALUE items
    after a ``synthetic`` item belong to it (``gaussian,synthetic:entropy=2,sink=0.3,a.h5`` -> three items)."""
    items: list[str] = []
    for raw in (s.strip() for s in text.split(",") if s.strip()):
        if items and is_synthetic(items[-1]) and "=" in raw:
            items[-1] += ("," if ":" in items[-1] else ":") + raw
        else:
            items.append(raw)
    return items


def is_synthetic(item: str) -> bool:
    """Whether an ``--inputs`` item names a synthetic input."""
    return item == PREFIX or item.startswith(PREFIX + ":")
