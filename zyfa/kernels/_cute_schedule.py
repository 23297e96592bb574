"""Which query rows and KV tiles each CTA of the CuTe DSL FP8 kernel (zyfa/kernels/_cute_fp8.py) takes, and in what
order: a work item is a block of 128 query rows of one (batch, head); KV tiles are 128 keys. One item per CTA, or,
with the form ``PERSISTENT``, one CTA per SM taking items pass by pass in a fixed order (no atomics: every
warpgroup of a CTA computes the same sequence). A mixin of :class:`zyfa.kernels._cute_fp8.CuteFp8Attention`, whose
shape fields it reads. Needs nvidia-cutlass-dsl."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cutlass_dsl import Int32

from zyfa.kernels.cute_plan import persistent_item, persistent_pass_item

BLOCK_N = 128  # keys per KV tile


class CuteSchedule:
    """kv_head, kv_range, item_index and item, for a class with the shape fields (``b``, ``h``, ``h_kv``,
    ``group``, ``s_q``, ``s_k``, ``block_m``, ``n_blocks_m``) and, persistent, ``n_ctas``."""

    def kv_head(self, bh):
        """The K/V head of query head ``bh`` (GQA: ``group`` query heads per K/V head)."""
        return (bh // self.h) * self.h_kv + (bh % self.h) // self.group

    @cute.jit
    def kv_range(self, mb: Int32):
        """The KV tiles row block ``mb`` visits: [0, n_tiles), the first n_full unmasked for all of its rows."""
        off = self.s_k - self.s_q  # bottom-right alignment: query i sits at key position i + off
        p0 = mb * self.block_m + off
        n_tiles = Int32(-(-self.s_k // BLOCK_N))
        n_full = Int32(self.s_k // BLOCK_N)
        if cutlass.const_expr(self.causal):
            hi = cutlass.min(Int32(self.s_k), p0 + self.block_m)
            hi = cutlass.max(hi, Int32(0))
            n_tiles = (hi + BLOCK_N - 1) // BLOCK_N
            n_full = cutlass.min(n_full, cutlass.max(p0 + 1, Int32(0)) // BLOCK_N)
        return n_tiles, n_full

    def item_index(self, cta, it):
        """``PERSISTENT``: the item of CTA ``cta`` in its pass ``it`` (``cute_plan.persistent_pass_item``)."""
        return persistent_pass_item(cta, it, self.n_ctas)

    def item(self, g):
        """``PERSISTENT``: work item g as (row block, batch·head) (``cute_plan.persistent_item``)."""
        return persistent_item(g, causal=self.causal, n_blocks_m=self.n_blocks_m, n_heads=self.b * self.h)
