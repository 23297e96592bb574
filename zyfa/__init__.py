"""ZYFA: speed and numerical error of FP8 FlashAttention.

The core of this package (formats, quantizers, recipes, the emulator) imports nothing else of ours; the
Triton kernels are imported lazily (GPU only); only :mod:`zyfa.cli` wires the other packages together.
"""

__version__ = "0.1.0"
