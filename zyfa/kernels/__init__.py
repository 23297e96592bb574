"""GPU kernels (Triton, Hopper). Importing this package does not import Triton; the kernels load lazily.

Use ``from zyfa.kernels.attention_fp8 import attention_fp8, attention_fp8_quantized, kernel_plan``; the
Triton code itself is :mod:`zyfa.kernels._triton_fp8`.
"""
