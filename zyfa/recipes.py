"""Recipes: every numerics choice of an FP8 attention kernel, named.

A :class:`Recipe` is one frozen dataclass; :data:`RECIPES` holds the named ones. Each named recipe's
``source`` cites where its numerics come from: the public repositories, files and papers of each peer (read in
source, or in disassembly for AITER's assembly kernels). ``status`` says how far the emulation is backed:
``verified`` against the real kernel on a named GPU, ``from source`` (every field read in the peer's code),
``assumed`` (the fields named in ``status_note`` are not known) or ``modelled`` (hardware arithmetic fitted by
measurement, e.g. the Hopper FP8 accumulator). ``platform`` names the GPU whose arithmetic the recipe is
emulated on by default (:mod:`zyfa.platforms`: ``mi355x`` for ZYFA and the AMD peers, ``h200`` for the NVIDIA
ones); any recipe runs on any platform. The emulator (:mod:`zyfa.emulator`) and the Triton kernels read these
fields and the platform; nothing else decides numerics.

The recipe-spec grammar that names a recipe on the command line (``zyfa:accum_flush_tiles=1@h200``) is
:mod:`zyfa.recipe_spec`.

Notation (docs/DESIGN.md): S = Q8·K8ᵀ in fp32; c = sm_scale·q_descale·k_descale·log2(e); t = c·S − c·m ≤ 0 is the
log2 probability of a score relative to the running row max m.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from zyfa.platforms import PLATFORM_NAMES, Platform, get_platform
from zyfa.rotation import KINDS as ROTATIONS

FP8_FORMATS = ("e4m3fn", "e4m3fnuz", "e5m2")
QKV_FORMATS = (*FP8_FORMATS, "bf16", "fp32")
QK_FORMATS = (*QKV_FORMATS, "int8")
SCALE_GRANULARITIES = ("tensor", "head", "head_kv", "block", "channel", "none")
EXP_METHODS = ("exp2", "exp2_bittrick", "mad_fp8")
P_FORMATS = (*FP8_FORMATS, "bf16", "fp32")
P_SCALES = ("none", "fmax", "pow2", "pow2_block", "tile_amax")
P_SCALE_GRANULARITIES = ("row", "tile")
ROWSUMS = ("fp32", "rounded", "rounded_mma")
KV_ORDERS = ("forward", "reverse")
V_DESCALES = ("end", "tile")
ACCUMULATORS = ("fp32", "matrix_unit")
# Old accumulator names still read (specs, committed rows), each normalised to its current name by the Recipe and
# the grammar: "hopper_fp8" meant "sums stay in the matrix unit" on every platform (fp32 on mi355x).
ACCUMULATOR_ALIASES = {"hopper_fp8": "matrix_unit"}
RECIPROCALS = ("div", "rcp")
OUT_FORMATS = ("bf16_rne", "bf16_trunc", "fp32", "e4m3fn")
STATUSES = ("verified", "from source", "assumed", "modelled")
# Fields that describe a recipe rather than decide its numerics (left out of short_str and of comparisons).
DESCRIPTIVE_FIELDS = ("name", "source", "status", "status_note", "tags")


@dataclass(frozen=True)
class Recipe:
    """Every numerics choice of one FP8 attention forward kernel.

    Attributes:
        name: registry name, e.g. ``"zyfa"``.
        source: where these numerics come from (file, disassembly, paper).
        q_format, k_format, v_format: element format of Q, K, V after quantization (``int8`` for Q/K only:
            SageAttention2). ``bf16``/``fp32`` mean no FP8 quantization (the input is rounded to that format).
        q_scale, k_scale, v_scale: descale granularity. ``tensor``: one scalar; ``head``: per (batch, head);
            ``head_kv``: Q per (batch, kv head), its GQA group shares one (FA3's ``q_descale`` shape);
            ``block``: per (batch, head, block of ``scale_block_*`` tokens) (CK block-scale); ``channel``:
            per (batch, head, channel) over the sequence (SageAttention2's V); ``none``: unit descale.
        scale_block_q, scale_block_kv: tokens per descale block for ``block`` granularity.
        k_smoothing: subtract K's per-channel mean over the sequence before quantizing (SageAttention;
            softmax-invariant).
        qk_rotation: rotate Q and K along the head dim by the same orthogonal matrix before quantizing
            (:mod:`zyfa.rotation`, FA3's "incoherent processing"; Q·Kᵀ unchanged in exact arithmetic):
            ``none``, ``hadamard`` (normalised Walsh–Hadamard) or ``random_hadamard`` (random ±1 signs, seeded by
            ``rotation_seed``, then Hadamard). Power-of-two head dims only. The rotation runs before the kernel.
        rotation_seed: seed of ``random_hadamard``'s signs.
        block_m, block_n: query rows per program and KV columns per tile: the online softmax runs over
            KV tiles of ``block_n``; ``tile_amax`` scaling spans a ``block_m × block_n`` tile.
        kv_order: the order the online softmax visits KV tiles: ``forward`` (key 0 first, as our kernels and
            CK) or ``reverse`` (the last tile first, as FA3's and FlashInfer's Hopper mainloops, which take the
            masked diagonal tiles first). Where a few keys dominate (attention sinks at the first tokens) the
            order decides how small the running sums are when the dominant keys arrive, so it moves the error of
            an unflushed FP8 accumulator. Keys inside a tile stay in order.
        head_dim_tiles: tiles that depend on the head dim, as ``(max d_qk, block_m, block_n)`` entries in
            increasing order: the first entry with ``d_qk <= max d_qk`` applies, and ``block_m``/``block_n``
            above every entry (FA3's FP8 tiles, hopper/tile_size.h). Empty: ``block_m``/``block_n`` always.
            :meth:`tiles` resolves it; the emulator uses it, so a kernel running the recipe must too.
        log2e_folded: fold log2(e) into the score scale (exp2(c·S − c·m)); False: Triton-on-AMD's
            natural-log scores with exp2((s − m)·(1/ln 2)).
        exp_method: ``exp2`` fp32 exp2 then an RNE cast to ``p_format``; ``exp2_bittrick``: fp32
            Schraudolph bits (u32(2^23·t + 127·2^23 − 486411), CK unified attention / AITER hd256) then the
            cast; ``mad_fp8``: ZYFA technique 1, e4m3fn bits straight from t by one multiply-add and an
            integer conversion (offset ``mad_offset`` in code units, rounding ``mad_rounding``).
        p_format: format P is rounded to before the P·V matmul.
        p_scale: multiplier applied to P before its cast. ``none``: P in (0, 1]; ``fmax``: ×format max
            (448, CK); ``pow2``: ×2^``p_scale_log2`` (FA3/FA4, CK block-scale); ``pow2_block``: ×2^e with e
            chosen per block from the block's max so that the block max lands in (max/2, max] (ZYFA
            technique 3); ``tile_amax``: ×max/amax(tile) (AITER Triton).
        p_scale_granularity: for ``pow2_block``: ``row`` (one exponent per query row per KV tile; free on
            hardware, the row max is already known) or ``tile`` (one per block_m × block_n tile).
        p_block_max_log2: cap on the per-block exponent (keeps the scaled accumulator inside fp32 range).
        rowsum: ``fp32`` row sum from the unrounded probabilities (every peer), or ``rounded``: from the
            same rounded P that feeds P·V (ZYFA technique 3), summed in fp32; ``rounded_mma``: the same sum
            taken on the matrix unit as P8 · ones, a fresh accumulator every KV tile (with ``matrix_unit`` it
            truncates like P·V; our Hopper kernel's cheap form of technique 3, docs/KERNEL.md).
        v_descale: apply V's descale to each tile's P·V product (``tile``) or once to the output (``end``).
        accumulator: where the kernel keeps its sums, an algorithm choice whose numerics depend on the platform.
            ``fp32``: in true fp32: on a platform whose matrix unit accumulates FP8 in fp32 (``mi355x``) that
            is the unit's own accumulator; on one that truncates (``h200``) the kernel adds each k step's
            result into fp32 (each 32-product step starts from zero: our Triton kernel's QK_K32 / PV_MODE 1).
            ``matrix_unit`` (the old name ``hopper_fp8`` is read as this, :data:`ACCUMULATOR_ALIASES`): in the
            matrix unit's accumulator: Q·K over the whole head dim, P·V across KV tiles until a flush
            (``accum_flush_tiles``); on ``h200`` each k=32 step aligns the
            products (each at the sum of its operands' exponents) and the accumulator to the largest, truncates
            them the platform's ``accum_bits`` bits below it and truncates the sum to as many bits below its own
            leading bit (zyfa.platforms.truncating_mma, fitted bit for bit on the H200); on ``mi355x`` it is fp32.
            The bits are the platform's (:attr:`zyfa.platforms.Platform.accum_bits`), never the recipe's: they
            describe the hardware, and no kernel chooses them.
        accum_flush_tiles: with ``matrix_unit``, add the tensor-core accumulator into a true fp32
            accumulator every N KV tiles (two-level accumulation, SageAttention2 / vLLM FA); 0 = never.
        reciprocal: ``div``: O = acc / l (correctly rounded); ``rcp``: O = acc · fp32(1/l).
        out_format: output rounding: bf16 nearest-even, bf16 truncation (CK's default conversion on GPUs
            before gfx950), fp32, or e4m3fn scaled by the output amax (cuDNN FP8 on Hopper writes FP8 only).
        platform: the default platform (:data:`zyfa.platforms.PLATFORM_NAMES`): the GPU whose arithmetic the
            emulation uses unless another is asked for (``emulate(..., platform=...)``, ``--platform``).
        status: how far the emulation is backed, one of :data:`STATUSES`: ``verified`` (run against the real
            kernel on a named GPU), ``from source`` (every field read in the cited code), ``assumed`` (some
            fields not known), ``modelled`` (hardware arithmetic fitted by measurement).
        status_note: one line behind the status: the kernel, GPU and measured agreement (``verified``), the
            assumed fields (``assumed``), the model and its fit (``modelled``). Required unless ``from source``.
    """

    name: str
    source: str
    q_format: str = "e4m3fn"
    k_format: str = "e4m3fn"
    v_format: str = "e4m3fn"
    q_scale: str = "tensor"
    k_scale: str = "tensor"
    v_scale: str = "tensor"
    scale_block_q: int = 128
    scale_block_kv: int = 128
    k_smoothing: bool = False
    qk_rotation: str = "none"
    rotation_seed: int = 0
    block_m: int = 128
    block_n: int = 128
    head_dim_tiles: tuple[tuple[int, int, int], ...] = ()
    kv_order: str = "forward"
    log2e_folded: bool = True
    exp_method: str = "exp2"
    mad_offset: float = 0.0
    mad_rounding: str = "nearest"
    p_format: str = "e4m3fn"
    p_scale: str = "none"
    p_scale_log2: int = 8
    p_scale_granularity: str = "row"
    p_block_max_log2: int = 64
    rowsum: str = "fp32"
    v_descale: str = "end"
    accumulator: str = "fp32"
    accum_flush_tiles: int = 0
    reciprocal: str = "div"
    out_format: str = "bf16_rne"
    platform: str = "mi355x"
    tags: tuple[str, ...] = field(default=())
    status: str = "from source"
    status_note: str = ""

    def __post_init__(self) -> None:
        if self.accumulator in ACCUMULATOR_ALIASES:  # an old name (a committed row, an old spec) -> today's
            object.__setattr__(self, "accumulator", ACCUMULATOR_ALIASES[self.accumulator])
        choices = {
            "q_format": QK_FORMATS, "k_format": QK_FORMATS, "v_format": QKV_FORMATS,
            "q_scale": SCALE_GRANULARITIES, "k_scale": SCALE_GRANULARITIES,
            "v_scale": SCALE_GRANULARITIES, "exp_method": EXP_METHODS, "p_format": P_FORMATS,
            "p_scale": P_SCALES, "p_scale_granularity": P_SCALE_GRANULARITIES, "rowsum": ROWSUMS,
            "v_descale": V_DESCALES, "accumulator": ACCUMULATORS, "reciprocal": RECIPROCALS,
            "out_format": OUT_FORMATS, "mad_rounding": ("nearest", "trunc"), "status": STATUSES,
            "qk_rotation": ROTATIONS, "kv_order": KV_ORDERS,
            "platform": PLATFORM_NAMES,
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"recipe {self.name!r}: {name}={value!r} is not one of {allowed}")
        if self.status != "from source" and not self.status_note.strip():
            raise ValueError(f"recipe {self.name!r}: status={self.status!r} needs a status_note saying what "
                             f"backs it (kernel and GPU, the assumed fields, or the fitted model)")
        if self.exp_method == "mad_fp8" and self.p_format != "e4m3fn":
            raise ValueError(f"recipe {self.name!r}: exp_method='mad_fp8' produces e4m3fn bits, "
                             f"p_format must be 'e4m3fn', not {self.p_format!r}")
        if self.exp_method == "mad_fp8" and self.p_scale not in ("none", "pow2", "pow2_block"):
            raise ValueError(f"recipe {self.name!r}: exp_method='mad_fp8' folds only power-of-two P scales "
                             f"into its bias, not p_scale={self.p_scale!r}")
        for fname in ("q_scale", "k_scale"):
            if getattr(self, fname) == "channel":
                raise ValueError(f"recipe {self.name!r}: {fname}='channel': per-channel descales are supported for "
                                 f"V only")
        self._check_head_dim_tiles()
        for _, _, block_n in ((0, self.block_m, self.block_n), *self.head_dim_tiles):
            if self.v_scale == "block" and (self.v_descale != "tile" or self.scale_block_kv % block_n):
                raise ValueError(f"recipe {self.name!r}: per-block V descales need v_descale='tile' and "
                                 f"scale_block_kv a multiple of block_n, got v_descale={self.v_descale!r}, "
                                 f"scale_block_kv={self.scale_block_kv}, block_n={block_n}")
        if self.p_scale == "tile_amax" and self.rowsum in ("rounded", "rounded_mma"):
            raise ValueError(f"recipe {self.name!r}: rowsum={self.rowsum!r} with tile_amax scaling is not modelled")
        self._check_numbers()
        for name in ("block_m", "block_n", "scale_block_q", "scale_block_kv"):
            if getattr(self, name) < 1:
                raise ValueError(f"recipe {self.name!r}: {name} must be >= 1")
        for _, _, block_n in ((0, self.block_m, self.block_n), *self.head_dim_tiles):
            if block_n % 32 and self.accumulator == "matrix_unit":
                raise ValueError(f"recipe {self.name!r}: matrix_unit accumulation needs block_n % 32 == 0, "
                                 f"got {block_n}")

    def _check_head_dim_tiles(self) -> None:
        """``head_dim_tiles``: a tuple of (max d_qk, block_m, block_n) int triples >= 1, max d_qk increasing."""
        entries = self.head_dim_tiles
        ok = isinstance(entries, tuple) and all(
            isinstance(e, tuple) and len(e) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in e) for e in entries)
        if not ok or any(a[0] >= b[0] for a, b in zip(entries, entries[1:], strict=False)):
            raise ValueError(f"recipe {self.name!r}: head_dim_tiles must be a tuple of (max head dim, block_m, "
                             f"block_n) int triples >= 1 in increasing head dim, got {entries!r}")

    def tiles(self, d_qk: int) -> tuple[int, int]:
        """(block_m, block_n) at QK head dim ``d_qk``: the first ``head_dim_tiles`` entry covering it, else the
        ``block_m``/``block_n`` fields."""
        for max_d, block_m, block_n in self.head_dim_tiles:
            if d_qk <= max_d:
                return block_m, block_n
        return self.block_m, self.block_n

    def _check_numbers(self) -> None:
        """Every numeric field a number of the right kind and in range (overrides such as
        ``zyfa:mad_offset=nan`` are refused here, not turned into silent zeros by the emulator)."""
        v = self.mad_offset
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"recipe {self.name!r}: mad_offset must be a finite number, got {v!r}")
        ranges = {"block_m": (1, None), "block_n": (1, None), "scale_block_q": (1, None),
                  "scale_block_kv": (1, None), "p_scale_log2": (-126, 127), "p_block_max_log2": (-126, 127),
                  "accum_flush_tiles": (0, None),
                  "rotation_seed": (0, None)}
        for name, (lo, hi) in ranges.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"recipe {self.name!r}: {name} must be an int, got {v!r}")
            if v < lo or (hi is not None and v > hi):
                bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
                raise ValueError(f"recipe {self.name!r}: {name} must be {bound}, got {v}")
        for name in ("k_smoothing", "log2e_folded"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"recipe {self.name!r}: {name} must be True or False, got {getattr(self, name)!r}")

    @property
    def p_is_fp8(self) -> bool:
        return self.p_format in FP8_FORMATS

    def truncated_gemms(self, platform: str | Platform | None = None) -> tuple[bool, bool]:
        """(Q·K, P·V): whether each GEMM's sums go through the truncating accumulator of ``platform`` (default the
        recipe's own): both operands FP8, or both BF16, on a platform whose model for them is ``align_truncate``
        (:meth:`zyfa.platforms.Platform.truncates`). :func:`zyfa.emulator.emulate` models such a GEMM product by
        product (:func:`zyfa.platforms.truncating_mma`), which makes it costly (``accuracy/io/cost_model.py``)."""
        plat = get_platform(platform or self.platform)
        qk_fp8 = self.q_format in FP8_FORMATS and self.k_format in FP8_FORMATS
        qk_bf16 = self.q_format == self.k_format == "bf16"
        pv_bf16 = self.p_format == self.v_format == "bf16"
        return ((qk_fp8 or qk_bf16) and plat.truncates("qk", qk_fp8),
                (self.p_is_fp8 or pv_bf16) and plat.truncates("pv", self.p_is_fp8))

    @property
    def quantizes_inputs(self) -> bool:
        return any(f not in ("bf16", "fp32") for f in (self.q_format, self.k_format, self.v_format))

    def on(self, platform: str) -> Recipe:
        """This recipe emulated on ``platform`` by default: itself where that is already its platform, else a
        copy named ``name@platform`` (so rows, tables and resumed runs tell the two apart)."""
        plat = get_platform(platform).name
        return self if plat == self.platform else self.replace(name=f"{self.name}@{plat}", platform=plat)

    def replace(self, **changes) -> Recipe:
        """A copy with some fields changed (its name should change too)."""
        return dataclasses.replace(self, **changes)

    def short_str(self) -> str:
        """Compact id of the numerics that differ from the defaults, for tables and test ids."""
        default = Recipe(name="", source="")
        diffs = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                 if f.name not in DESCRIPTIVE_FIELDS and getattr(self, f.name) != getattr(default, f.name)]
        return ",".join(diffs) or "defaults"


_ZYFA = Recipe(
    name="zyfa",
    source=("ZYFA, arXiv 2611.07496 (docs/DESIGN.md 'The three ZYFA techniques'): per-tensor e4m3fn Q/K/V on "
            "MI355X (true fp32 MFMA accumulation); P bits from t by one multiply-add + integer conversion "
            "(technique 1); P scaled per row and KV tile by a power of two chosen from the block max, row "
            "sum from the rounded P (technique 3). Open choices set here by measurement (docs/numerics.md): "
            "MAD with a truncating conversion (the plain float-to-int cast) and an offset of 1/16 code, "
            "which keeps each row max off the conversion's rounding boundary so a fused multiply-add is "
            "exact there (as accurate as the best measured), per-row exponents, 128x128 tiles."),
    exp_method="mad_fp8", mad_offset=0.0625, mad_rounding="trunc",
    p_scale="pow2_block", p_scale_granularity="row", rowsum="rounded",
    tags=("zyfa",),
    status="assumed",
    status_note=("the paper's code is not public: mad_offset, mad_rounding, p_scale_granularity and the 128x128 "
                 "tiles are our choices, set by measurement (docs/numerics.md); the rest follows the paper"),
)
_ABLATION_NOTE = "an ablation of zyfa (one field changed); assumed as zyfa: mad_offset, mad_rounding, tiles"

# Public repositories the peer recipes are read from (file paths in each source are relative to them).
_CK = "https://github.com/ROCm/composable_kernel"
# FA3's FP8 forward tiles on sm90 by QK head dim, (max d, block_m, block_n): Dao-AILab/flash-attention
# hopper/tile_size.h (commit 07602ad), tile_size_fwd_sm90, the element_size == 1 branch (lines 53-73): d <= 64
# 192x160 (line 58), <= 96 192x128 (61), <= 128 128x224 (66), <= 192 128x160 (69), above 128x128 (71). These
# are the two-MMA-warpgroup tiles without paged KV, V column-major or softcap; a sliding window changes only
# d > 192 (64-key tiles), which the recipe does not model.
_FA3_FP8_TILES = ((64, 192, 160), (96, 192, 128), (128, 128, 224), (192, 128, 160))
# CK's FP8 (fp8bf16) fmha forward tiles by head dim, (max d, block_m, block_n): ROCm/rocm-libraries @014d097d
# projects/composablekernel/example/ck_tile/01_fmha/codegen/ops/fmha_fwd.py, KernelComponentFactoryGfx9
# .get_hdim_tile_size_dict, fp8/fp8bf16 branch: key (64, 64) bm0 128 x bn0 64; keys (128, 128), (192, 128) and
# (256, 256) 128 x 128 (the block_m/block_n fields). zyfa.dispatch holds the rest of CK's table.
_CK_FP8_TILES = ((64, 128, 64),)
_AITER = "https://github.com/ROCm/aiter"
_FA = "https://github.com/Dao-AILab/flash-attention"
# CK's bf16 output on gfx950 (MI355X), read in _CK (docs/PLATFORMS.md 'CK output rounding'). The fmha forward
# writes O through Default2DEpilogue -> cast_tile -> type_convert<bf16_t, float> (type_convert.hpp @05c9e2a,
# line 61) -> float_to_bf16 (bfloat16.hpp @0281878, lines 280-287), whose gfx950 branch ignores the rounding
# argument and casts to bfloat16_t, the compiler's __bf16 (lines 108-109) when CK_TILE_USE_LLVM_BUILTIN_BF16
# (config.hpp @01fa232, lines 199-207: ROCm >= 6.5.50421 or >= 7): round to nearest even. The TRUNCATE default
# (config.hpp lines 75-77) holds on the other targets (gfx942 and older) only.
_CK_BF16_OUT = ("bf16 round-to-nearest-even on gfx950: include/ck_tile/core/numeric/bfloat16.hpp (commit 0281878) "
                "lines 280-287 convert with the compiler's __bf16 there (lines 108-109; "
                "include/ck_tile/core/config.hpp (commit 01fa232) lines 199-207 enable it for ROCm >= 6.5), not "
                "with the truncating default of config.hpp lines 75-77, which holds on older GPUs")

_NAMED: list[Recipe] = [
    _ZYFA,
    _ZYFA.replace(
        name="zyfa-exp2",
        source="ZYFA with technique 1 off: fp32 exp2 then an RNE cast to e4m3fn (same block scaling and sum).",
        exp_method="exp2", tags=("zyfa", "ablation"),
        status="assumed", status_note=_ABLATION_NOTE),
    _ZYFA.replace(
        name="zyfa-fp32sum",
        source="ZYFA with technique 3's normalization off: row sum from fp32 exp2 of the same scores.",
        rowsum="fp32", tags=("zyfa", "ablation"),
        status="assumed", status_note=_ABLATION_NOTE),
    _ZYFA.replace(
        name="zyfa-noscale",
        source="ZYFA with technique 3's block scaling off: MAD bits of P in (0, 1] (e = 0).",
        p_scale="none", tags=("zyfa", "ablation"),
        status="assumed", status_note=_ABLATION_NOTE),
    _ZYFA.replace(
        name="zyfa-pow2fixed",
        source="ZYFA with a fixed 2^8 P scale (FA3/FA4's choice) instead of per-block exponents.",
        p_scale="pow2", p_scale_log2=8, tags=("zyfa", "ablation"),
        status="assumed", status_note=_ABLATION_NOTE),
    _ZYFA.replace(
        name="zyfa-tilescale",
        source="ZYFA with one power-of-two exponent per 128x128 tile instead of per row and tile.",
        p_scale_granularity="tile", tags=("zyfa", "ablation"),
        status="assumed", status_note=_ABLATION_NOTE),
    _ZYFA.replace(
        name="zyfa-hopper",
        source=("ZYFA's numerics as our Triton kernel runs them fast on the H200: Hopper's FP8 wgmma "
                "accumulator flushed into fp32 after every KV tile (the MI355X's MFMA accumulates in true "
                "fp32, which Hopper can only approach by flushing every k=32 step at half the speed)"),
        accumulator="matrix_unit", accum_flush_tiles=1, platform="h200", tags=("zyfa", "hopper"),
        status="verified",
        status_note=("our Triton kernel under this recipe (triton:zyfa-hopper) run on the H200 in the study "
                     "(reports/study/): its error 0.9990-1.0000 times this emulation's on all 22 inputs, the "
                     "two outputs apart by a rel-L2 of at most 3.8e-4 (median 3.5e-5); the sums stay in the "
                     "tensor-core accumulator (Q.K over the head dim, P.V flushed into fp32 every KV tile), "
                     "whose rule is fitted bit-exact on the H200 (zyfa.platforms, docs/PLATFORMS.md)")),
    Recipe(
        name="ck",
        source=("Composable Kernel fmha fwd fp8bf16, PERTENSOR (" + _CK + ": "
                "include/ck_tile/ops/fmha/pipeline/block_fmha_pipeline_qr_ks_vs[_async].hpp, "
                "include/ck_tile/ops/fmha/kernel/fmha_fwd_kernel.hpp): P*448 before the cast, "
                "row sum from fp32 P, O = acc/l * (vd/448), " + _CK_BF16_OUT + "; tiles by head dim from the "
                "fp8bf16 codegen (example/ck_tile/01_fmha/codegen/ops/fmha_fwd.py: 128x64 at d 64, 128x128 above)"),
        p_scale="fmax", block_m=128, block_n=128, head_dim_tiles=_CK_FP8_TILES, v_descale="end", reciprocal="div",
        out_format="bf16_rne", tags=("amd",)),
    Recipe(
        name="ck-blockscale",
        source=("Composable Kernel BLOCKSCALE (" + _CK + ": include/ck_tile/ops/fmha/kernel/fmha_fwd_kernel.hpp, "
                "include/ck_tile/ops/fmha/pipeline/block_fmha_pipeline_qr_ks_vs.hpp): Q descale per 128 query "
                "rows, K/V per 128 KV tokens; P = exp2(.. + 8) i.e. x2^8; V descale per tile; fp32 row sum; "
                + _CK_BF16_OUT),
        q_scale="block", k_scale="block", v_scale="block", p_scale="pow2", p_scale_log2=8,
        head_dim_tiles=_CK_FP8_TILES, v_descale="tile", out_format="bf16_rne", tags=("amd",)),
    Recipe(
        name="aiter",
        source=("AITER gfx950 assembly fmha_v3 fp8 hd128 (" + _AITER + ": "
                "hsa/gfx950/fmha_v3_fwd/fwd_hd128_fp8.co, disassembled; tiles from "
                "hsa/gfx950/fmha_v3_fwd/fmha_fwd.csv): ts_qo=256, ts_kv=128; P cast to e4m3fn UNSCALED "
                "(P < ~2^-10 -> 0); serial fp32 row sum of unrounded P; O = acc * (rcp(l) * vd); bf16 RNE "
                "(v_cvt_pk_bf16_f32)"),
        block_m=256, block_n=128, p_scale="none", reciprocal="rcp", v_descale="end",
        out_format="bf16_rne", tags=("amd",)),
    Recipe(
        name="aiter-triton",
        source=("AITER Triton mha (" + _AITER + ": aiter/ops/triton/_triton_kernels/attention/mha.py): descales per "
                "(batch, head); P scaled by 448/amax over the BLOCK_M x BLOCK_N tile, the tile's P.V "
                "product times amax/448*vd; fp32 row sum; 1/l; fp32 output"),
        q_scale="head", k_scale="head", v_scale="head", block_m=128, block_n=64,
        p_scale="tile_amax", v_descale="tile", reciprocal="rcp", out_format="fp32", tags=("amd",)),
    Recipe(
        name="triton-amd",
        source=("flash_attn_triton_amd fwd_prefill.py (" + _FA + ": flash_attn/flash_attn_triton_amd/fwd_prefill.py; "
                "the same file in ROCm/aiter): "
                "descales per (batch, kv head); scores in natural-log units, exp2((s - m)*RCP_LN2); "
                "BLOCK_M=128, BLOCK_N=64; P cast UNSCALED; per-tile dot * vd; 1/l; fp32 output"),
        q_scale="head_kv", k_scale="head", v_scale="head", block_m=128, block_n=64, log2e_folded=False,
        p_scale="none", v_descale="tile", reciprocal="rcp", out_format="fp32", tags=("amd",),
        status_note=("every field read in a later source than the released package: flash-attn 2.8.3's forward, "
                     "run on the H200, scales P by 448/amax per tile, so that real kernel is checked against "
                     "triton-amd:p_scale=tile_amax (docs/real_kernels.md), not against this recipe")),
    Recipe(
        name="fa3",
        source=("FlashAttention-3 FP8 forward (" + _FA + ": hopper/softmax.h Max_offset=8, hopper/flash_api.cpp "
                "descale (batch, num_heads_k); arXiv 2407.08608): P = exp2(t + 8) -> e4m3fn, fp32 row sum, "
                "V descale at the end; Hopper FP8 wgmma accumulator never flushed to fp32 upstream (two-level "
                "accumulation is an open pull request, Dao-AILab/flash-attention#2250); tiles by head dim from "
                "hopper/tile_size.h lines 53-73 (FP8: 128x224 at d <= 128, 128x160 at d <= 192, 128x128 above, "
                "192x160 at d <= 64); KV tiles from the last to the first (hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp: "
                "n_block = n_block_max - 1, then --n_block)"),
        q_scale="head_kv", k_scale="head", v_scale="head", block_m=128, block_n=128,
        head_dim_tiles=_FA3_FP8_TILES, kv_order="reverse",
        p_scale="pow2", p_scale_log2=8, accumulator="matrix_unit", accum_flush_tiles=0,
        reciprocal="rcp", out_format="bf16_rne", platform="h200", tags=("nvidia",),
        status="modelled",
        status_note=("Hopper FP8 wgmma accumulator fitted on the H200, on Q.K and P.V (zyfa.platforms); tiles "
                     "by head dim from hopper/tile_size.h (two MMA warpgroups, no paged KV, no softcap: at hd256 "
                     "a sliding window would take 64-key tiles, not modelled); FA3's own build is not run here; "
                     "FlashInfer's FA3-derived FP8 prefill (flashinfer-fa3: this recipe with P x448, Q per query "
                     "head and its tiles) is within 0.01% of its emulation on the H200 with the KV tiles visited "
                     "last to first, and 6-22% off on four real layers in the forward order (docs/real_kernels.md)")),
    Recipe(
        name="sage2",
        source=("SageAttention2 sm90 qk_int8_pv_fp8 (https://github.com/thu-ml/SageAttention: "
                "csrc/qattn/qk_int_sv_f8_cuda_sm90.cuh; arXiv 2411.10958): "
                "INT8 Q/K with K smoothing (per 64-row Q blocks and 128-token K blocks here, a coarser stand-in "
                "for per-thread scales), V e4m3 per channel, P x448 -> e4m3, fp32 row sum, FP8 accumulator "
                "flushed into fp32 every KV tile"),
        q_format="int8", k_format="int8", q_scale="block", k_scale="block", v_scale="channel",
        scale_block_q=64, scale_block_kv=128, k_smoothing=True, block_m=64, block_n=128,
        p_scale="fmax", accumulator="matrix_unit", accum_flush_tiles=1, reciprocal="rcp",
        out_format="bf16_rne", platform="h200", tags=("nvidia",),
        status="assumed",
        status_note=("scale_block_q, scale_block_kv: per-block Q/K scales stand in for the kernel's per-thread "
                     "ones; the Hopper accumulator is modelled (fitted on the H200)")),
    Recipe(
        name="cudnn-fp8",
        source=("cuDNN sdpa_fp8 on Hopper (closed source; https://github.com/NVIDIA/cudnn-frontend: "
                "docs/operations/Attention.md): per-tensor descales, "
                "scale_s = 448 on P (docs), FP8 e4m3 output with scale_o from the output amax. The row sum "
                "source and accumulation are unknown: fp32 and a Hopper accumulator are assumed"),
        p_scale="fmax", accumulator="matrix_unit", reciprocal="rcp", out_format="e4m3fn", platform="h200",
        tags=("nvidia", "assumed"),
        status="verified",
        status_note=("the real kernel (cuDNN sdpa_fp8 through cudnn-frontend) run on the H200 in the study "
                     "(reports/study/): its error 0.9999-1.0038 times this emulation's on all 21 inputs it "
                     "takes (1.0000-1.0049 with the oracle's output scale), Q.K and P.V through the fitted "
                     "Hopper accumulator; the row sum's source and how P.V accumulates stay assumed")),
    Recipe(
        name="bf16",
        source=("BF16 flash attention (FA2/FA3/cuDNN BF16): bf16 Q/K/V, fp32 softmax, P rounded to bf16 "
                "for the P.V matmul, fp32 row sum and accumulator, bf16 RNE output"),
        q_format="bf16", k_format="bf16", v_format="bf16", q_scale="none", k_scale="none",
        v_scale="none", p_format="bf16", p_scale="none", out_format="bf16_rne", platform="h200",
        tags=("baseline",)),
    Recipe(
        name="fp32",
        source="Control: no quantization anywhere (fp32 inputs, P and output): the emulator's own fp32 error",
        q_format="fp32", k_format="fp32", v_format="fp32", q_scale="none", k_scale="none", v_scale="none",
        p_format="fp32", p_scale="none", out_format="fp32", platform="h200", tags=("baseline",)),
]

# ZYFA with another quantization of Q, K and V (issue 14): the P handling, accumulator and output of `zyfa` kept,
# so that against `zyfa` (per-tensor e4m3fn) each changes only how Q, K and V are quantized. A '+' joins the
# remedies in a name: it is neither the override separator ':' of a spec (NAME:field=value) nor the platform
# separator '@' (NAME@PLATFORM), nor the ',' of a list, so `zyfa+block@h200` and `zyfa+block:scale_block_q=64`
# parse as the others do.
_FA3_PAPER = "FlashAttention-3 (Shah et al., arXiv 2407.08608)"
_SAGE = "SageAttention (Zhang et al., arXiv 2410.02367)"
_SAGE2 = "SageAttention2 (Zhang et al., arXiv 2411.10958)"
_QUAROT = "QuaRot (Ashkboos et al., arXiv 2404.00456)"
_REMEDY_NOTE = ("zyfa's assumed fields (mad_offset, mad_rounding, tiles) plus a quantization of Q/K/V that no "
                "released kernel combines with zyfa's P handling: our combination, with no peer kernel to check it "
                "against")
_REMEDY_TAGS = ("zyfa", "quantization")
_BLOCK_QKV = {"q_scale": "block", "k_scale": "block", "v_scale": "block", "scale_block_q": 128,
              "scale_block_kv": 128, "v_descale": "tile"}
_NAMED += [
    _ZYFA.replace(
        name="zyfa+hadamard",
        source=("zyfa with Q and K rotated along the head dim by D*H (random +-1 signs, seed 0, times the normalised "
                "Walsh-Hadamard matrix) before per-tensor quantization: the 'incoherent processing' of "
                + _FA3_PAPER + ", the randomized Hadamard rotation of " + _QUAROT + "; Q.K^T unchanged in exact "
                "arithmetic, outlier channels spread over all channels"),
        qk_rotation="random_hadamard", rotation_seed=0, tags=_REMEDY_TAGS,
        status="assumed", status_note=_REMEDY_NOTE),
    _ZYFA.replace(
        name="zyfa+block",
        source=("zyfa with one descale per block of 128 tokens of each head for Q, K and V (V's applied to each "
                "128-key tile's P.V product): the 'block quantization' of " + _FA3_PAPER + "; the same "
                "granularity as Composable Kernel's BLOCKSCALE pipeline (recipe ck-blockscale)"),
        tags=_REMEDY_TAGS, status="assumed", status_note=_REMEDY_NOTE, **_BLOCK_QKV),
    _ZYFA.replace(
        name="zyfa+smooth",
        source=("zyfa with K smoothed before per-tensor quantization: K minus its per-channel mean over the "
                "sequence, which shifts each score row by a constant (softmax-invariant), from " + _SAGE),
        k_smoothing=True, tags=_REMEDY_TAGS, status="assumed", status_note=_REMEDY_NOTE),
    _ZYFA.replace(
        name="zyfa+block+smooth",
        source=("zyfa with " + _SAGE2 + "'s quantization of Q, K and V in FP8: Q and K one descale per block of "
                "128 tokens (SageAttention2 uses finer per-block/per-thread INT4/INT8 scales), K smoothed first "
                "(K minus its per-channel mean, from " + _SAGE + "), V e4m3 with one descale per channel"),
        q_scale="block", k_scale="block", v_scale="channel", scale_block_q=128, scale_block_kv=128,
        k_smoothing=True, tags=_REMEDY_TAGS, status="assumed", status_note=_REMEDY_NOTE),
    _ZYFA.replace(
        name="zyfa+block+hadamard",
        source=("zyfa with both FP8 remedies of " + _FA3_PAPER + ": Q and K rotated by D*H (random +-1 signs, "
                "seed 0, times the normalised Walsh-Hadamard matrix; " + _QUAROT + "), then one descale per "
                "block of 128 tokens for Q, K and V (V's per 128-key tile)"),
        qk_rotation="random_hadamard", rotation_seed=0, tags=_REMEDY_TAGS,
        status="assumed", status_note=_REMEDY_NOTE, **_BLOCK_QKV),
]

# The quantization schemes compared in the study's quantization section, `zyfa` (per tensor) first.
QUANT_SCHEMES = ("zyfa", "zyfa+smooth", "zyfa+hadamard", "zyfa+block", "zyfa+block+smooth", "zyfa+block+hadamard")

RECIPES: dict[str, Recipe] = {r.name: r for r in _NAMED}
