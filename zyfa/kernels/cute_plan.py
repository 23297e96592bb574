"""Which recipes and head dims the CuTe DSL FP8 kernel (:mod:`zyfa.kernels.attention_cute`) takes, with no heavy
import (no torch, no cutlass): the bench's argument checks and the wrapper ask the same questions here.

:func:`cute_plan` maps a recipe onto the Triton kernel's switches (:func:`~zyfa.kernels.kernel_plan.kernel_plan`,
its refusals included) and then refuses, in one line naming the field, anything the narrower CuTe kernel does not
implement; :func:`check_head_dims` refuses head dims outside :data:`CUTE_HEAD_DIMS`. :data:`NOT_FOR_DECODING` says
why the commands that decode greedily (``zyfa tasks``, ``zyfa longctx --generate``) refuse the kernel.
"""

from __future__ import annotations

from zyfa.kernels.kernel_plan import KernelPlan, default_mad_cvt, fused_mad_is_exact, kernel_plan, mad_m_safe
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import Recipe

__all__ = ["CUTE_FIRST_FORM", "CUTE_HEAD_DIMS", "CUTE_RECIPE", "H200_SMS", "NOT_FOR_DECODING", "PV_BLOCKS",
           "PV_WHOLE_MAX", "check_form", "check_head_dims", "cute_config", "cute_plan", "persistent_item",
           "persistent_pass_item"]

CUTE_RECIPE = "zyfa-hopper"  # the numerics the kernel implements
# (d_qk, d_v). Above d_v PV_WHOLE_MAX, P·V runs in column blocks of PV_BLOCK columns (O's accumulator and a whole
# fresh product would need 2 x 128 registers a thread at d_v 256), and PV_OVERLAP is refused
CUTE_HEAD_DIMS = ((64, 64), (128, 128), (192, 128), (256, 256))
PV_WHOLE_MAX = 128
PV_BLOCKS = (32, 64)
# the SMs of an H200 (and an H100 SXM): the PERSISTENT form's grid where no device says otherwise (a CPU compile)
H200_SMS = 132
# The kernel is compiled for one shape (b, h, h_kv, s_q, s_k, head dims: attention_cute.compile_for caches one per
# shape; docs/KERNEL.md measures 1.5-3.5 s a compile), and each greedy decode step attends to one more key
NOT_FOR_DECODING = ("the CuTe FP8 kernel is compiled for each shape (1.5-3.5 s a compile) and every decode step has "
                    "one more key, so greedy decoding would compile a kernel per generated token")


# The kernel's forms (compile-time switches; every form gives the same output bits, tests/kernels/
# test_cute_kernel_gpu.py checks it): MAD_CVT 3 keeps the fp32 min at code 126 on every code, 6 leaves it out in a CTA
# whose bound on the row maxima (d_qk·448²·c <= mad_m_safe) shows it cannot bind (the Triton kernel's MAD_CVT values,
# zyfa.kernels.tuning); MASK_SPLIT 1 runs the KV tiles every row of the CTA sees whole in a loop without the mask's
# code, 0 tests each tile inside one loop; BOOKKEEPING 1 takes a KV tile's pipeline stage and phase from a mask and
# a shift (0: a signed division and modulo) and starts each row sum at its first group of codes (0: at 0 + it);
# PV_OVERLAP 1 commits a KV tile's S and the previous tile's P·V as two wgmma groups, runs the tile's softmax as soon
# as S is done (its codes and alpha into a second set of registers) while P·V still runs, then flushes P·V with the
# previous alpha (0: both groups waited for, then the flush, then the softmax; 2: as 1 in the KV loops without the
# mask's code, as 0 in the masked one, where with rowsum=rounded_mma ptxas packs the tile's mask predicates into
# registers inside the turn to keep them across the wait: hd128 causal 32K, a masked tile 971 SASS instructions
# against 699, 328 of them in the turn against 76, as scripts/cute_sass.py prints them; the default recipe's masked
# loop has no such cost); PV_BLOCK, where d_v > PV_WHOLE_MAX (ignored below): P·V's column block, 32 (two fresh
# accumulators, block b flushed while block b + 1 runs) or 64 (one, each block waited for and flushed in turn: fewer
# instructions, the unit idle during each flush; the default, from reports/bench/cute_hd256_ab.txt); EPILOGUE 1: O =
# acc / l from one rcp.rn per row and Markstein's correction per element (div.rn's bits, _cute_ptx.div_by_rcp), two
# columns per 32-bit store (0: div.rn and a 16-bit store per element); PERSISTENT 1: one CTA per SM, each taking work
# items (128 query rows of one head) pass by pass, causal the heaviest first in a serpentine, its pipelines and turns
# going on from item to item, so that an item's Q loads under the last one's P·V and store (0: one CTA per item). Same
# arithmetic, reordered.
# The form that first ran on a GPU (cc8e3cc; the same cubin), kept for A/B runs:
CUTE_FIRST_FORM = {"MAD_CVT": 3, "MASK_SPLIT": 0, "BOOKKEEPING": 0, "PV_OVERLAP": 0, "EPILOGUE": 0, "PERSISTENT": 0}


def cute_config(plan: KernelPlan, config: dict | None = None, *, causal: bool = False,
                d_v: int | None = None) -> dict:
    """The kernel's form for a plan (:func:`cute_plan`) and mask: the defaults (MAD_CVT 6 where the recipe's
    :func:`~zyfa.kernels.kernel_plan.mad_m_safe` leaves a margin, as :func:`~zyfa.kernels.kernel_plan.default_mad_cvt`
    says for the fused MAD, else 3; MASK_SPLIT 1; BOOKKEEPING 1; PV_OVERLAP 1 where ``causal`` and ``d_v`` <=
    PV_WHOLE_MAX, else 0; PV_BLOCK 64; EPILOGUE 1; PERSISTENT 0) with ``config``'s overrides; ValueError in one line
    for an unknown key or value. PV_OVERLAP is the causal default because it passed the rule written before its
    rerun (scripts/ab_kernel_variants.py, the cute-rowsum set, 10 rounds on one H100: hd128 causal 1.07 [1.05-1.11]
    per round over the form without it); non-causal it did not (hd128's minimum 0.96; docs/KERNEL.md, "A/B")."""
    if causal and d_v is None:
        raise ValueError("cute_config: the causal default depends on d_v (PV_OVERLAP only up to PV_WHOLE_MAX)")
    cfg = {"MAD_CVT": default_mad_cvt(plan, 0), "MASK_SPLIT": 1, "BOOKKEEPING": 1,
           "PV_OVERLAP": int(causal and d_v <= PV_WHOLE_MAX), "PV_BLOCK": 64, "EPILOGUE": 1, "PERSISTENT": 0}
    for key, value in (config or {}).items():
        if key not in cfg:
            raise ValueError(f"the CuTe FP8 kernel has no switch {key!r} (switches: {', '.join(cfg)})")
        cfg[key] = value
    if cfg["MAD_CVT"] not in (3, 6) or isinstance(cfg["MAD_CVT"], bool):
        raise ValueError(f"MAD_CVT={cfg['MAD_CVT']!r}: the CuTe FP8 kernel takes 3 (the clamp at 126 on every code) "
                         "or 6 (left out where the CTA's bound allows)")
    if cfg["MAD_CVT"] == 6 and mad_m_safe(plan) <= 0:
        raise ValueError(f"MAD_CVT=6 needs a recipe whose codes stay below 126.5 with a margin (recipe "
                         f"{plan.recipe!r} has none): use MAD_CVT=3")
    if cfg["PV_OVERLAP"] not in (0, 1, 2) or isinstance(cfg["PV_OVERLAP"], bool):
        raise ValueError(f"PV_OVERLAP={cfg['PV_OVERLAP']!r}: expected 0, 1 or 2")
    for key in ("MASK_SPLIT", "BOOKKEEPING", "EPILOGUE", "PERSISTENT"):
        if cfg[key] not in (0, 1) or isinstance(cfg[key], bool):
            raise ValueError(f"{key}={cfg[key]!r}: expected 0 or 1")
    if cfg["PV_BLOCK"] not in PV_BLOCKS or isinstance(cfg["PV_BLOCK"], bool):
        raise ValueError(f"PV_BLOCK={cfg['PV_BLOCK']!r}: expected one of {PV_BLOCKS}")
    return cfg


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
        ("rowsum", r.rowsum, ("rounded", "rounded_mma"), "'rounded', 'rounded_mma'"),
        ("accumulator", r.accumulator, "matrix_unit", "'matrix_unit'"),
        ("accum_flush_tiles", int(r.accum_flush_tiles), 1, "1"),
        ("reciprocal", r.reciprocal, "div", "'div'"),
        ("out_format", r.out_format, "bf16_rne", "'bf16_rne'"),
        ("block_n", r.block_n, 128, "128"),
        ("k_smoothing", bool(r.k_smoothing), False, "False"),
        ("kv_order", r.kv_order, "forward", "'forward'"),
    ]
    for fld, value, ok, allowed in checks:
        if value not in (ok if isinstance(ok, tuple) else (ok,)):
            raise _refuse(r, fld, value, allowed)
    for fld in ("q_scale", "k_scale", "v_scale"):
        if getattr(r, fld) not in ("tensor", "head", "head_kv"):
            raise _refuse(r, fld, getattr(r, fld), "'tensor', 'head', 'head_kv'")
    if not fused_mad_is_exact(plan):
        raise _refuse(r, "mad_offset", r.mad_offset,
                      "an offset that keeps the row max off the rounding boundary (the kernel runs the fused MAD)")
    return plan


def check_form(cfg: dict, d_v: int) -> None:
    """ValueError in one line for a form (:func:`cute_config`) the head dims rule out: PV_OVERLAP above d_v
    PV_WHOLE_MAX (P·V then runs in column blocks before S, while S's registers are free, not beside it)."""
    if d_v > PV_WHOLE_MAX and cfg["PV_OVERLAP"]:
        raise ValueError(f"PV_OVERLAP={cfg['PV_OVERLAP']} needs d_v <= {PV_WHOLE_MAX} (got {d_v}: P·V runs in column "
                         "blocks before S, while S's registers are free)")


def check_head_dims(d_qk: int, d_v: int) -> None:
    """ValueError in one line for head dims the kernel does not take."""
    if (d_qk, d_v) not in CUTE_HEAD_DIMS:
        raise ValueError(f"the CuTe FP8 kernel supports head dims {CUTE_HEAD_DIMS} (d_qk, d_v), got ({d_qk}, {d_v}); "
                         "use attention_fp8 for the others")


def persistent_pass_item(cta, it, n_ctas: int):
    """The ``PERSISTENT`` form's order: the work item of CTA ``cta`` in its pass ``it``, one per CTA and pass, the
    passes alternating in direction (a serpentine: CTA 0 takes a pass's first item, then the next pass's last), so
    that with the heaviest items first (:func:`persistent_item`) each CTA's sum of work evens out. Plain integer
    arithmetic: the kernel runs it on its registers (``cta`` and ``it`` runtime ints), the tests on Python ints."""
    return it * n_ctas + cta + (it & 1) * (n_ctas - 1 - 2 * cta)


def persistent_item(g, *, causal: bool, n_blocks_m: int, n_heads: int):
    """Work item ``g`` of the ``PERSISTENT`` order as (row block, batch·head), ``n_heads`` = batch·heads. Causal: the
    row blocks with the most KV tiles first, every head's before the next lighter one (longest first); non-causal
    (all items alike): head by head, so that the CTAs at work at one time share K and V in L2."""
    if causal:
        return n_blocks_m - 1 - g // n_heads, g % n_heads
    return g % n_blocks_m, g // n_blocks_m
