"""GPU kernels (Triton, Hopper). Importing this package does not import Triton; the kernels load lazily.

Use ``from zyfa.kernels.attention_fp8 import attention_fp8, attention_fp8_quantized, kernel_plan`` (the wrapper
re-exports the public names of its role modules: ``kernel_plan`` for a recipe as the kernel's switches and the MAD
bounds, ``tuning`` for the launch configuration, ``validation`` for the input checks); the Triton code itself is
:mod:`zyfa.kernels._triton_fp8`.
"""
