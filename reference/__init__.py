"""The FP64 oracle: exact attention in float64. Imports torch only."""
