"""V's transpose for the P·V wgmma, as one Triton copy kernel. Imported lazily (needs triton).

Hopper's FP8 wgmma reads its B operand K-major, so V (b, h_kv, s_k, d_v) goes to Vt (b, h_kv, d_v, s_pad), keys
zero-padded, and with PERM the keys reordered within each 32-key block by ``attention_fp8.k32_key_order``. One
program moves BLOCK_S keys of one head: a coalesced load of BLOCK_S rows of V, the reorder and the transpose in
registers / shared memory, a coalesced store of d_v rows of BLOCK_S bytes. The data are moved as bytes (any
1-byte dtype), so the result is bit for bit what the torch permute-and-copy gives, at memory speed.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def vt_transpose(V, VT, s_k, s_pad, DV: tl.constexpr, BLOCK_S: tl.constexpr, PERM: tl.constexpr):
    start = tl.program_id(0) * BLOCK_S
    bh = tl.program_id(1).to(tl.int64)
    keys = start + tl.arange(0, BLOCK_S)
    cols = tl.arange(0, DV)
    v = tl.load(V + bh * s_k * DV + keys[:, None].to(tl.int64) * DV + cols[None, :],
                mask=keys[:, None] < s_k, other=0)
    if PERM:
        # key 32s+16h+8a+2t+b -> position 32s+16h+4t+2a+b: axes (s, h, a, t, b) of the keys become (s, h, t, a, b)
        v = tl.reshape(tl.permute(tl.reshape(v, (BLOCK_S // 32, 2, 2, 4, 2, DV)), (0, 1, 3, 2, 4, 5)),
                       (BLOCK_S, DV))
    vt = v.T
    tl.store(VT + bh * DV * s_pad + cols[:, None].to(tl.int64) * s_pad + keys[None, :], vt,
             mask=keys[None, :] < s_pad)
