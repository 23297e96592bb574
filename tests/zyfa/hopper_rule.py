"""The H200's FP8 accumulation rule as docs/PLATFORMS.md documents it, written out independently of
``zyfa.platforms`` in float64 (exact here): the reference the emulator's Hopper paths are tested against."""

import numpy as np


def hopper_mma(a: np.ndarray, b: np.ndarray, acc: np.ndarray | None, bits: int) -> np.ndarray:
    """acc + a @ b on Hopper's FP8 accumulator as docs/PLATFORMS.md documents it (fitted on the H200): every
    k = 32 step, the 32 exact products, each at the sum of its operands' exponents (-6 for a subnormal e4m3fn
    operand), and the incoming accumulator are aligned to the largest exponent among them and truncated toward
    zero to ``bits`` bits below it, summed exactly, and the sum truncated toward zero to ``bits`` bits below its
    own leading bit."""
    c = None if acc is None else acc.copy()
    if a.shape[1] == 0:
        return np.zeros((a.shape[0], b.shape[1])) if c is None else c

    def lg(x):  # floor(log2|x|), exact; -inf for 0
        return np.where(x == 0, -np.inf, np.frexp(x)[1] - 1.0)

    ea, eb = np.maximum(lg(a), -6), np.maximum(lg(b), -6)
    for k0 in range(0, a.shape[1], 32):
        prods = a[:, None, k0:k0 + 32] * b.T[None, :, k0:k0 + 32]  # (rows, cols, <= 32), exact in float64
        e = np.where(prods == 0, -np.inf, ea[:, None, k0:k0 + 32] + eb.T[None, :, k0:k0 + 32]).max(-1)
        if c is not None:
            e = np.maximum(e, lg(c))
        e = np.where(np.isinf(e), 0.0, e)  # nothing non-zero: the sum is 0
        quantum = 2.0 ** (e - bits)
        total = np.trunc(prods / quantum[..., None]).sum(-1) * quantum
        if c is not None:
            total = total + np.trunc(c / quantum) * quantum
        q_sum = 2.0 ** (np.maximum(lg(total), e) - bits)
        c = np.trunc(total / q_sum) * q_sum
    return c
