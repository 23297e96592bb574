"""The FP64 oracle: exact attention in float64. Imports torch only."""

from zyfa.reference.attention import attention_fp64

__all__ = ["attention_fp64"]
