"""FP8 formats and exact casts, written in plain tensor arithmetic (CPU or CUDA, no element loops).

Emulates the three 8-bit float formats FP8 attention kernels use:

- ``float8_e4m3fn``: OCP E4M3 (OCP 8-bit Floating Point Specification (OFP8) rev. 1.0, 2023-12-01):
  bias 7, max 448, min normal 2^-6, min subnormal 2^-9, no infinities, NaN = S.1111.111 (0x7F/0xFF).
- ``float8_e4m3fnuz``: AMD MI300 (CDNA3) FP8: bias 8, max 240, min subnormal 2^-10, no infinities,
  no -0, a single NaN 0x80 (the "negative zero" code). ``fnuz`` = finite, NaN, unsigned zero.
- ``float8_e5m2``: OCP E5M2, IEEE-754-like: bias 15, max 57344, infinities 0x7C/0xFC, NaNs S.11111.xx.

Casts round to nearest, ties to even (RNE), with OFP8's two overflow modes: saturating (a result past
``max_normal``, and +-inf, becomes +-max; NaN stays NaN) and non-saturating (IEEE overflow: a value whose
RNE rounding with unbounded exponent exceeds max becomes NaN for the e4m3 formats, +-inf for e5m2). So
e4m3fn's 464 (the tie between 448 and 480, even side 448) stays 448, while fnuz's 248 and e5m2's 61440
(ties whose even side is past max) overflow.

The rounding is our own arithmetic, two independent ways that the tests check against each other:
``encode_fp8`` (frexp, an exact power-of-two scale, ``torch.round`` (half-to-even), integer packing) and
``round_to_fp8`` (the ulp read off x's exponent bits). torch's float8 dtypes (``x.to(torch.float8_e4m3fn)``)
are the third, checked against ``round_to_fp8``: ``round_to_fp8_fast`` clamps first (recent torch's e4m3fn cast
saturates, pytorch PR #178817, its fnuz and e5m2 casts do not) and serves the hot paths, a third of the kernels.
float16/bfloat16 inputs are upcast to float32 (exactly); float64 is rounded directly, once (torch
itself goes through float32, which double-rounds a few float64 values).

Also the bf16 and reduced-mantissa roundings of fp32 values, and ZYFA technique 1 (FP8 probabilities from
one multiply-add and an integer conversion).

Exposed: FP8Format, E4M3FN, E4M3FNUZ, E5M2, FORMATS, get_format, encode_fp8, decode_fp8, round_to_fp8,
round_to_fp8_fast, round_to_bf16, round_mantissa, e4m3fn_bits_from_log2, e4m3fn_mad_closed_form.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

__all__ = [
    "E4M3FN",
    "E4M3FNUZ",
    "E5M2",
    "FORMATS",
    "FP8Format",
    "decode_fp8",
    "e4m3fn_bits_from_log2",
    "e4m3fn_mad_closed_form",
    "encode_fp8",
    "get_format",
    "round_mantissa",
    "round_to_bf16",
    "round_to_fp8",
    "round_to_fp8_fast",
]


@dataclass(frozen=True)
class FP8Format:
    """One 8-bit float format. Codes are ``sign << 7 | exponent_field << mantissa_bits | mantissa``.

    ``max_code`` is the byte of +max_normal; ``nan_code`` the byte of the positive (or only) NaN.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_normal: float
    min_normal: float
    min_subnormal: float
    torch_dtype: torch.dtype
    max_code: int
    nan_code: int
    has_inf: bool
    has_negative_zero: bool

    @property
    def short_name(self) -> str:
        """``"e4m3fn"`` for ``"float8_e4m3fn"``: the form used in ids."""
        return self.name.removeprefix("float8_")

    @property
    def emin(self) -> int:
        """Exponent of min_normal (also the exponent of the subnormal binade's grid)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of max_normal."""
        return self.max_code // (1 << self.mantissa_bits) - self.bias

    def __repr__(self) -> str:
        return f"FP8Format({self.name})"


E4M3FN = FP8Format(
    name="float8_e4m3fn", exponent_bits=4, mantissa_bits=3, bias=7, max_normal=448.0,
    min_normal=2.0**-6, min_subnormal=2.0**-9, torch_dtype=torch.float8_e4m3fn,
    max_code=0x7E, nan_code=0x7F, has_inf=False, has_negative_zero=True,
)  # fmt: skip
E4M3FNUZ = FP8Format(
    name="float8_e4m3fnuz", exponent_bits=4, mantissa_bits=3, bias=8, max_normal=240.0,
    min_normal=2.0**-7, min_subnormal=2.0**-10, torch_dtype=torch.float8_e4m3fnuz,
    max_code=0x7F, nan_code=0x80, has_inf=False, has_negative_zero=False,
)  # fmt: skip
E5M2 = FP8Format(
    name="float8_e5m2", exponent_bits=5, mantissa_bits=2, bias=15, max_normal=57344.0,
    min_normal=2.0**-14, min_subnormal=2.0**-16, torch_dtype=torch.float8_e5m2,
    max_code=0x7B, nan_code=0x7F, has_inf=True, has_negative_zero=True,
)  # fmt: skip

FORMATS: dict[str, FP8Format] = {f.name: f for f in (E4M3FN, E4M3FNUZ, E5M2)}


def get_format(name: str | FP8Format | torch.dtype) -> FP8Format:
    """The format called ``name``: "e4m3fn" or "float8_e4m3fn" (any case), a torch float8 dtype, or a format."""
    if isinstance(name, FP8Format):
        return name
    if isinstance(name, torch.dtype):
        for fmt in FORMATS.values():
            if fmt.torch_dtype == name:
                return fmt
        raise ValueError(f"no FP8 format for dtype {name}; known: {', '.join(FORMATS)}")
    key = str(name).strip().lower()
    key = key if key.startswith("float8_") else "float8_" + key
    if key not in FORMATS:
        known = ", ".join(f"{f.short_name!r}" for f in FORMATS.values())
        raise ValueError(f"unknown FP8 format {name!r}; known: {known} (with or without 'float8_')")
    return FORMATS[key]


# ----------------------------------------------------------------------------------------------------------
# helpers


def _exp2i(n: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """2**n for integer tensors n in the normal exponent range of ``dtype``, built from the bits (exact)."""
    if dtype == torch.float64:
        return ((n.to(torch.int64) + 1023) << 52).view(torch.float64)
    return ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def _work_dtype(x: torch.Tensor, what: str) -> torch.dtype:
    if not x.dtype.is_floating_point:
        raise ValueError(f"{what}: expected a floating-point tensor, got {x.dtype}")
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz):
        raise ValueError(f"{what}: input is already {x.dtype}; decode it (decode_fp8 or .float()) first")
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _round_parts(x: torch.Tensor, fmt: FP8Format):
    """RNE-round |x| onto the format's grid with an unbounded top exponent.

    Returns (negative, magnitude code as int32 (may exceed max_code: overflow), is_nan, is_inf). The
    magnitude code of a value q * 2**(e - M) (q integer, e >= emin the binade exponent) is
    (e - emin) * 2**M + q: this is the usual exponent/mantissa packing, and it also covers the subnormal
    binade (e = emin, q < 2**M) and the carry of q = 2**(M+1) into the next binade.
    """
    dtype = _work_dtype(x, "FP8 cast")
    x = x.to(dtype)
    m = fmt.mantissa_bits
    negative = torch.signbit(x)
    is_nan = torch.isnan(x)
    is_inf = torch.isinf(x)
    a = torch.where(is_nan, 0.0, x.abs())
    # Anything >= 2**(emax+2) (inf included) overflows; clamping keeps every integer below small and every
    # scale exact.
    a = torch.clamp(a, max=2.0 ** (fmt.emax + 2))
    # Binade exponent e: floor(log2 a), at least emin (subnormals and zero share the emin grid).
    _, ex = torch.frexp(torch.clamp(a, min=fmt.min_normal, max=2.0 ** (fmt.emax + 1)))
    e = ex.to(torch.int32) - 1
    # a * 2**(M - e) is exact (a power-of-two scale that stays in range); torch.round is half-to-even.
    q = torch.round(a * _exp2i(m - e, dtype)).to(torch.int32)
    mag = (e - fmt.emin) * (1 << m) + q
    return negative, mag, is_nan, is_inf


def encode_fp8(x: torch.Tensor, fmt: FP8Format | str, *, saturate: bool = True) -> torch.Tensor:
    """RNE cast of a float tensor to FP8 codes.

    Args:
        x: any shape, float16/bfloat16/float32 (rounded from fp32) or float64 (rounded directly).
        fmt: the format (or its name).
        saturate: True: overflow and +-inf give +-max_normal. False: overflow and +-inf give NaN
            (e4m3fn: 0x7F/0xFF with the sign; fnuz: 0x80) or +-inf (e5m2). NaN gives NaN either way.

    Returns:
        uint8 codes, same shape and device. -0 keeps its sign except in fnuz (no -0: it encodes as 0x00).
    """
    fmt = get_format(fmt)
    negative, mag, is_nan, is_inf = _round_parts(x, fmt)
    overflow = (mag > fmt.max_code) | is_inf
    if not fmt.has_negative_zero:
        negative = negative & (mag != 0)
    sign = negative.to(torch.int32) << 7
    if saturate:
        code = torch.clamp(mag, max=fmt.max_code) | sign
    else:
        code = mag | sign
        if fmt.has_inf:  # e5m2: +-inf is exponent all ones, mantissa 0
            code = torch.where(overflow, (fmt.max_code + 1) | sign, code)
        elif fmt.nan_code == 0x80:  # fnuz: the single unsigned NaN
            code = torch.where(overflow, 0x80, code)
        else:  # e4m3fn: NaN keeps the sign
            code = torch.where(overflow, fmt.nan_code | sign, code)
    nan = fmt.nan_code if fmt.nan_code == 0x80 else fmt.nan_code | sign
    code = torch.where(is_nan, nan, code)
    return code.to(torch.uint8)


def decode_fp8(bits: torch.Tensor, fmt: FP8Format | str) -> torch.Tensor:
    """FP8 codes (uint8, or a torch float8 tensor, read as its bytes) to their exact float32 values."""
    fmt = get_format(fmt)
    if bits.dtype != torch.uint8:
        if bits.element_size() != 1:
            raise ValueError(f"decode_fp8: expected uint8 codes, got {bits.dtype}")
        bits = bits.view(torch.uint8)
    c = bits.to(torch.int32)
    m = fmt.mantissa_bits
    field = (c >> m) & ((1 << fmt.exponent_bits) - 1)
    mant = c & ((1 << m) - 1)
    # normal: (2**M + mant) * 2**(field - bias - M); subnormal (field 0): mant * 2**(emin - M)
    significand = torch.where(field == 0, mant, mant + (1 << m)).to(torch.float32)
    exponent = torch.clamp(field, min=1) - fmt.bias - m
    value = significand * _exp2i(exponent, torch.float32)
    mag = c & 0x7F
    if fmt.has_inf:  # e5m2: exponent field all ones is inf (mantissa 0) or NaN
        top = (1 << fmt.exponent_bits) - 1
        value = torch.where((field == top) & (mant == 0), torch.inf, value)
        value = torch.where((field == top) & (mant != 0), torch.nan, value)
    elif fmt.nan_code == 0x80:  # fnuz: 0x80 is the one NaN, not -0
        value = torch.where(c == 0x80, torch.nan, value)
    else:
        value = torch.where(mag == fmt.nan_code, torch.nan, value)
    return torch.where((c & 0x80) != 0, -value, value)


def round_to_fp8(x: torch.Tensor, fmt: FP8Format | str, *, saturate: bool = True) -> torch.Tensor:
    """``decode_fp8(encode_fp8(x, fmt, saturate=saturate), fmt)``, computed without codes (faster).

    A second algorithm, independent of ``encode_fp8``'s: the ulp of x in the format,
    max(2**(floor(log2|x|) - M), min_subnormal), is read off x's exponent bits; x / ulp is then the FP8
    significand as a number, ``torch.round`` rounds it half-to-even (its parity is the FP8 mantissa's last
    bit), and multiplying back by the ulp is exact. A carry to 2**(emax+1) is an overflow.

    Returns:
        float32 tensor of exactly representable values, same shape and device; NaN stays NaN, overflow
        and +-inf follow ``saturate`` as in ``encode_fp8``; -0 stays -0 except in fnuz (+0).
    """
    fmt = get_format(fmt)
    dtype = _work_dtype(x, "FP8 cast")
    x = x.to(dtype)
    if dtype == torch.float64:
        int_t, exp_mask, mant_bits = torch.int64, 0x7FF0000000000000, 52
    else:
        int_t, exp_mask, mant_bits = torch.int32, 0x7F800000, 23
    # the bits of the smallest subnormal as an integer of the work dtype's width (host arithmetic, no tensor)
    min_sub = struct.unpack("<q" if dtype == torch.float64 else "<i",
                            struct.pack("<d" if dtype == torch.float64 else "<f", fmt.min_subnormal))[0]
    # exponent bits of x, less M: the bits of 2**(e - M); clamped below at the subnormal grid spacing
    ulp_bits = torch.clamp((x.view(int_t) & exp_mask) - (fmt.mantissa_bits << mant_bits), min=min_sub)
    ulp = ulp_bits.view(dtype)
    r = torch.round(x / ulp) * ulp  # NaN stays NaN; inf / ulp = inf
    if saturate:
        r = torch.clamp(r, -fmt.max_normal, fmt.max_normal)
    else:
        overflow = r.abs() > fmt.max_normal
        r = torch.where(overflow, r * torch.inf if fmt.has_inf else torch.nan, r)
    if not fmt.has_negative_zero:
        r = r + 0.0  # -0 + 0 = +0 under round-to-nearest
    return r.to(torch.float32)


def round_to_fp8_fast(x: torch.Tensor, fmt: FP8Format | str) -> torch.Tensor:
    """:func:`round_to_fp8` with ``saturate=True`` through torch's native FP8 dtype: a clamp and two casts (three
    kernels on a GPU, where ``round_to_fp8`` takes about ten). The hot paths use it: P in the emulator's tile loop
    and Q, K, V in :func:`zyfa.quant.quantize`, once per layer in every decode step.

    Bit-identical to ``round_to_fp8(x, fmt, saturate=True)`` on finite float32 inputs (the tests check every format
    on the CPU and on CUDA); a float64 input would be rounded twice (torch goes through float32), so callers keep
    :func:`round_to_fp8` for float64.
    """
    f = get_format(fmt)
    return x.clamp(-f.max_normal, f.max_normal).to(f.torch_dtype).float()


# ----------------------------------------------------------------------------------------------------------
# bf16 and reduced-mantissa roundings of fp32


def round_mantissa(x: torch.Tensor, mantissa_bits: int, mode: str = "trunc") -> torch.Tensor:
    """Keep ``mantissa_bits`` explicit mantissa bits of fp32 values (bit surgery on the fp32 word).

    Models Hopper's FP8 tensor-core accumulator, which keeps only about 13 mantissa bits per fp32 partial
    sum: SageAttention2 (Zhang et al. 2024, arXiv 2411.10958) measured the FP8 ``mma`` accumulator as
    "FP22" (1 sign, 8 exponent, 13 mantissa bits); DeepSeek-V3 (arXiv 2412.19437, sec. 3.3.2) reports
    "around 14 bits" on H800 and promotes partial sums to fp32 every 128 elements.

    Args:
        x: float tensor (computed in float32).
        mantissa_bits: 0..23 explicit bits to keep (23: identity; 7: bfloat16; 10: fp16's mantissa width
            but with fp32's exponent range).
        mode: "trunc" (toward zero: drop the bits) or "rne" (round to nearest, ties to even; may carry
            into the exponent, and past fp32's max to inf as IEEE rounding does).

    Returns:
        float32 tensor. NaN stays NaN (quietened, sign and top payload bits kept); inf stays inf. fp32
        subnormals are rounded on the fixed grid of their fraction field, as the bit pattern dictates.
    """
    if not 0 <= int(mantissa_bits) <= 23:
        raise ValueError(f"round_mantissa: mantissa_bits must be in 0..23, got {mantissa_bits}")
    if mode not in ("trunc", "rne"):
        raise ValueError(f"round_mantissa: mode must be 'trunc' or 'rne', got {mode!r}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"round_mantissa: expected a floating-point tensor, got {x.dtype}")
    x = x.to(torch.float32)
    shift = 23 - int(mantissa_bits)
    if shift == 0:
        return x.clone()
    b = x.view(torch.int32)
    keep = -(1 << shift)  # ...1110000 in two's complement: clears the low `shift` bits
    if mode == "rne":
        # add 0111..1 plus the lowest kept bit, then clear: round half to even on the magnitude
        # (the fp32 word is sign-magnitude, so the integer add rounds |x| and leaves the sign bit alone)
        b = b + (((1 << (shift - 1)) - 1) + ((b >> shift) & 1))
    out = (b & keep).view(torch.float32)
    quiet_nan = ((x.view(torch.int32) & keep) | 0x00400000).view(torch.float32)
    return torch.where(torch.isnan(x), quiet_nan, out)


def round_to_bf16(x: torch.Tensor, mode: str = "rne") -> torch.Tensor:
    """Round to bfloat16 (7 mantissa bits), returned as float32 values.

    ``mode="rne"`` equals ``x.float().to(torch.bfloat16).float()`` bit for bit on non-NaN values (and
    NaN stays NaN); ``"trunc"`` (toward zero) keeps the top 16 bits of the fp32 word, as bf16 stores from
    hardware without rounding do.
    """
    return round_mantissa(x, 7, mode)


# ----------------------------------------------------------------------------------------------------------
# ZYFA technique 1: e4m3fn probabilities from one multiply-add and an integer conversion

_ROUNDINGS = ("nearest", "trunc")


def _mad_integer(t: torch.Tensor, offset: float, rounding: str) -> torch.Tensor:
    if rounding not in _ROUNDINGS:
        raise ValueError(f"rounding must be 'nearest' or 'trunc', got {rounding!r}")
    if not t.dtype.is_floating_point:
        raise ValueError(f"t must be a floating-point tensor of log2 probabilities, got {t.dtype}")
    t = t.to(torch.float32)
    # the kernel's fp32 constants, filled on t's device (a copy from the host would be a sync on CUDA)
    bias = torch.full((), 56.0 + float(offset), dtype=torch.float32, device=t.device)
    # t * 8 is exact (power of two), so this is a single fp32 rounding, the same as one fused FMA.
    y = torch.addcmul(bias, t, torch.full((), 8.0, dtype=torch.float32, device=t.device))
    # Clamping first (to integer bounds) is the same as converting then clamping, and keeps -inf out of the
    # integer conversion. NaN t (never produced by a max-subtracted score) maps to code 0, as PTX cvt does.
    y = torch.nan_to_num(torch.clamp(y, 0.0, 126.0), nan=0.0)
    return torch.round(y) if rounding == "nearest" else torch.trunc(y)


def e4m3fn_bits_from_log2(t: torch.Tensor, *, offset: float = 0.0, rounding: str = "nearest") -> torch.Tensor:
    """ZYFA technique 1: the e4m3fn code of (about) 2**t from one multiply-add and one float-to-int.

    The e4m3fn bit pattern of 2**x is, to first order, linear in x: with exponent bias 7 and 3 mantissa
    bits, ``bits(2**x) = 8 * (x + 7)`` at integer x, and reading the 3 mantissa bits as a fraction gives
    ``2**floor(x) * (1 + frac(x))`` in between: the Schraudolph (1999) exponential at a 3-bit mantissa.
    So

        bits = clamp(R(8 * t + 56 + offset), 0, 0x7E)

    with R round-to-nearest-even ("nearest") or truncation toward zero ("trunc"), then reinterpreted as
    e4m3fn: no exp2 and no separate fp32->fp8 rounding. ``offset`` (in code units, 1 = one mantissa step)
    shifts the piecewise-linear curve, e.g. to centre its error. At offset 0 the value is exactly 2**t at
    integer t in [-6, 8]; t in [-7, -6) lands in the subnormal codes, a linear ramp from 0 to 2**-6
    ((t + 7) * 2**-6), and t <= -7 (R(...) <= 0), including masked entries t = -inf, gives code 0 (+0).
    The clamp at 0x7E (448 = 1.75 * 2**8) is reached at t >= 8.75 ("trunc") or t >= 8.6875 ("nearest"),
    never the NaN code 0x7F.

    Args:
        t: log2 probabilities (any shape; float, computed in fp32), already including any power-of-two
            block scale; -inf for masked entries.
        offset: added to the fp32 bias constant 56 (rounded to fp32 once, as a kernel constant).
        rounding: "nearest" (cvt.rni / half-to-even) or "trunc" (cvt.rzi, toward zero; negatives clamp to 0).

    Returns:
        uint8 e4m3fn codes; ``decode_fp8(bits, E4M3FN)`` gives the values.
    """
    return _mad_integer(t, offset, rounding).to(torch.uint8)


def e4m3fn_mad_closed_form(t: torch.Tensor, offset: float = 0.0, rounding: str = "nearest") -> torch.Tensor:
    """The value technique 1 produces, from the piecewise-linear formula instead of an FP8 decode.

    With n = clamp(R(8t + 56 + offset), 0, 126) (the same fp32 multiply-add and conversion), E = n // 8 and
    M = n % 8: the value is 2**(E - 7) * (1 + M/8) for E >= 1 and M * 2**-9 for E = 0. Evaluated in float64
    and returned as float32 (every such value is exact in both), independently of ``decode_fp8``.
    """
    n = _mad_integer(t, offset, rounding).to(torch.float64)
    big_e = torch.floor(n / 8.0)
    mant = n - 8.0 * big_e
    normal = torch.exp2(big_e - 7.0) * (1.0 + mant / 8.0)
    subnormal = mant * 2.0**-9
    return torch.where(big_e >= 1, normal, subnormal).to(torch.float32)
