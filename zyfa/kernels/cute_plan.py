"""Which recipes and head dims the CuTe DSL FP8 kernel (:mod:`zyfa.kernels.attention_cute`) takes, with no heavy
import (no torch, no cutlass): the bench's argument checks and the wrapper ask the same questions here.

:func:`cute_plan` maps a recipe onto the Triton kernel's switches (:func:`~zyfa.kernels.kernel_plan.kernel_plan`,
its refusals included) and then refuses, in one line naming the field, anything the narrower CuTe kernel does not
implement; :func:`check_head_dims` refuses head dims outside :data:`CUTE_HEAD_DIMS`. :data:`NOT_FOR_DECODING` says
why the commands that decode greedily (``zyfa tasks``, ``zyfa longctx --generate``) refuse the kernel.
"""

from __future__ import annotations

from zyfa.kernels.kernel_plan import KernelPlan, fused_mad_is_exact, kernel_plan
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import Recipe

__all__ = ["CUTE_HEAD_DIMS", "CUTE_RECIPE", "NOT_FOR_DECODING", "check_head_dims", "cute_plan"]

CUTE_RECIPE = "zyfa-hopper"  # the numerics the kernel implements
# (d_qk, d_v). Not d 256: O's accumulator and the tile's fresh P·V product alone need 256 registers a thread
CUTE_HEAD_DIMS = ((64, 64), (128, 128), (192, 128))
# The kernel is compiled for one shape (b, h, h_kv, s_q, s_k, head dims: attention_cute.compile_for caches one per
# shape; docs/KERNEL.md measures 1.5-3.5 s a compile), and each greedy decode step attends to one more key
NOT_FOR_DECODING = ("the CuTe FP8 kernel is compiled for each shape (1.5-3.5 s a compile) and every decode step has "
                    "one more key, so greedy decoding would compile a kernel per generated token")


def _refuse(r: Recipe, fld: str, value, allowed: str) -> ValueError:
    return ValueError(f"recipe {r.name!r}: the CuTe FP8 kernel does not support {fld}={value!r} "
                      f"(supported: {allowed})")


def cute_plan(recipe: Recipe | str) -> KernelPlan:
    """The recipe as the Triton kernel's switches (:func:`~zyfa.kernels.kernel_plan.kernel_plan`, its refusals
    included), then the narrower set this kernel implements; ValueError naming the first field it cannot honour."""
    r = get_recipe(recipe)
    plan = kernel_plan(r)
    checks = [
        ("exp_method", r.exp_method, "mad_fp8", "'mad_fp8'"),
        ("p_scale", r.p_scale, "pow2_block", "'pow2_block'"),
        ("p_scale_granularity", r.p_scale_granularity, "row", "'row'"),
        ("rowsum", r.rowsum, "rounded", "'rounded'"),
        ("accumulator", r.accumulator, "matrix_unit", "'matrix_unit'"),
        ("accum_flush_tiles", int(r.accum_flush_tiles), 1, "1"),
        ("reciprocal", r.reciprocal, "div", "'div'"),
        ("out_format", r.out_format, "bf16_rne", "'bf16_rne'"),
        ("block_n", r.block_n, 128, "128"),
        ("k_smoothing", bool(r.k_smoothing), False, "False"),
        ("kv_order", r.kv_order, "forward", "'forward'"),
    ]
    for fld, value, ok, allowed in checks:
        if value != ok:
            raise _refuse(r, fld, value, allowed)
    for fld in ("q_scale", "k_scale", "v_scale"):
        if getattr(r, fld) not in ("tensor", "head", "head_kv"):
            raise _refuse(r, fld, getattr(r, fld), "'tensor', 'head', 'head_kv'")
    if not fused_mad_is_exact(plan):
        raise _refuse(r, "mad_offset", r.mad_offset,
                      "an offset that keeps the row max off the rounding boundary (the kernel runs the fused MAD)")
    return plan


def check_head_dims(d_qk: int, d_v: int) -> None:
    """ValueError in one line for head dims the kernel does not take."""
    if (d_qk, d_v) not in CUTE_HEAD_DIMS:
        raise ValueError(f"the CuTe FP8 kernel supports head dims {CUTE_HEAD_DIMS} (d_qk, d_v), got ({d_qk}, {d_v}); "
                         "use attention_fp8 for the others")
