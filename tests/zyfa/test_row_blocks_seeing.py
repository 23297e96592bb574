"""zyfa.emulator_tile.row_blocks_seeing (which query blocks compute a KV tile, found on the host) against the mask
the emulator builds on the device, read back as it was before: over prefill, decode (s_q = 1 against a cache) and
chunked shapes, causal and windowed, every tile of every query chunk."""

from __future__ import annotations

import itertools

import torch

from zyfa.emulator_tile import row_blocks_seeing


def _from_the_mask(r0, rows, block_m, s_q, s_k, c0, c1, window):
    q_pos = torch.arange(r0, r0 + rows) + (s_k - s_q)
    row_valid = (torch.arange(r0, r0 + rows) < s_q)[:, None]
    kp = torch.arange(c0, c1)
    allowed = row_valid & (kp[None, :] <= q_pos[:, None])
    if window is not None:
        allowed = allowed & (kp[None, :] > q_pos[:, None] - window)
    seen = allowed.view(rows // block_m, block_m, -1).any(-1).any(-1).nonzero()
    return None if seen.numel() == 0 else (int(seen[0]) * block_m, (int(seen[-1]) + 1) * block_m)


def test_the_host_answer_is_the_masks():
    checked = 0
    for s_q, s_k, block_m, block_n, window, chunk in itertools.product(
            (1, 5, 64, 130, 300), (1, 7, 64, 129, 300, 517), (16, 64), (16, 32, 128), (None, 1, 3, 50, 200),
            (64, 128)):
        if s_q > s_k:
            continue
        chunk = max(block_m, chunk // block_m * block_m)
        s_q_pad = -(-s_q // block_m) * block_m
        for r0 in range(0, s_q_pad, chunk):
            rows = min(r0 + chunk, s_q_pad) - r0
            for c0 in range(0, s_k, block_n):
                c1 = min(c0 + block_n, s_k)
                want = _from_the_mask(r0, rows, block_m, s_q, s_k, c0, c1, window)
                got = row_blocks_seeing(r0, rows, block_m, s_q, s_k, c0, c1, window)
                assert got == want, (s_q, s_k, block_m, block_n, window, r0, c0, got, want)
                checked += 1
    assert checked > 10_000
