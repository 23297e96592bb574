"""Which vendor kernel runs a shape: the dispatch tables of the recipes that name a vendor kernel, read in source.

A recipe such as ``aiter`` emulates one kernel (AITER's hd128 FP8 assembly kernel on gfx950). The vendor's
dispatcher picks that kernel for some shapes only; elsewhere it runs another kernel (CK's fmha, AITER's hd256
assembly kernel) or none. Applying the recipe there would compute numbers no vendor kernel produces. This module
holds, as data, for each (recipe, head dim, FP8 dtype, mask, layout) the kernel the vendor's dispatcher selects,
each row citing the file and line it was read from (read, not copied: the conditions are paraphrased), and
:func:`route` answers for one problem: the kernel, and whether the recipe models it (``refused`` is then None)
or not (``refused`` is one line saying why and what runs there instead).

Scope of the tables: the FP8 forward with e4m3 Q/K/V, one fp32 descale per tensor, bf16 output, dense batch
layout (B, S, H, D) or (B, H, S, D) (no varlen, paged KV, bias, dropout, ALiBi, soft-cap or sink tokens), on
gfx950 (MI355X), the GPU the AMD recipes default to. Masks: ``none``; ``causal`` (bottom-right aligned, as this
toolkit's inputs; top-left is the same when s_q = s_k); ``window`` (a sliding window narrower than the keys).

Sources (snapshot commits): ROCm/aiter @ e4048607 (2026-08-22): ``aiter/ops/mha.py``,
``csrc/cpp_itfs/mha_fwd.cu``, ``hsa/gfx950/fmha_v3_fwd/fmha_fwd.csv``; Composable Kernel as developed in
ROCm/rocm-libraries @ 014d097d: ``projects/composablekernel/example/ck_tile/01_fmha/codegen/ops/fmha_fwd.py``
(the codegen that decides which fp8bf16 kernels exist; cited by class, method and dictionary key, the snapshot
could not be brought here whole to number its lines).

Exposed:
    Route                       one row of a table: conditions, kernel, whether the recipe models it, source
    TABLES                      {recipe base name: [Route, ...]} (first match wins)
    Decision                    route()'s answer: kernel, refused (reason or None), source
    route(recipe, *, head_dim, head_dim_v, causal, window, seq_q, seq_k, heads_q, heads_kv) -> Decision | None
    route_input(recipe, inp) -> Decision | None       the same from an input's ``shape``/mask
    base_name(recipe) -> str    ``aiter@h200`` / ``aiter:p_scale=fmax`` -> ``aiter``
    table_rows() -> list[dict]  every row, for docs and reports
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["TABLES", "Decision", "Route", "base_name", "route", "route_input", "table_rows"]

AITER = "ROCm/aiter@e4048607"
MHA_PY = f"{AITER}:aiter/ops/mha.py"
MHA_CU = f"{AITER}:csrc/cpp_itfs/mha_fwd.cu"
CSV = f"{AITER}:hsa/gfx950/fmha_v3_fwd/fmha_fwd.csv"
CK_CODEGEN = ("ROCm/rocm-libraries@014d097d:projects/composablekernel/example/ck_tile/01_fmha/codegen/ops/fmha_fwd.py")
CK_TILES = f"{CK_CODEGEN} KernelComponentFactoryGfx9.get_hdim_tile_size_dict, fp8/fp8bf16 branch"
DOMAIN = "FP8 e4m3, per-tensor descales, bf16 out, dense batch layout, gfx950"


@dataclass(frozen=True)
class Problem:
    """The facts of one attention problem a dispatcher looks at."""

    head_dim: int
    head_dim_v: int
    mask: str  # "none", "causal", "window"
    seq_q: int
    seq_k: int
    heads_q: int
    heads_kv: int


@dataclass(frozen=True)
class Route:
    """One row of a dispatch table.

    Attributes:
        dims: (d_qk, d_v) pairs it covers; None: any.
        masks: masks it covers.
        when: an extra condition on the :class:`Problem` (e.g. s_q > 128), None: always; ``when_text`` says it.
        kernel: the kernel the vendor's dispatcher selects, None where there is none.
        models: whether the recipe's emulation is that kernel's numerics.
        reason: for ``models=False``: one line, what runs instead and why the recipe does not apply.
        source: file:line (or file and definition) the row is read from.
    """

    dims: tuple[tuple[int, int], ...] | None
    masks: tuple[str, ...]
    kernel: str | None
    models: bool
    source: str
    when: Callable[[Problem], bool] | None = field(default=None, compare=False)
    when_text: str = ""
    reason: str = ""

    def matches(self, p: Problem) -> bool:
        return ((self.dims is None or (p.head_dim, p.head_dim_v) in self.dims) and p.mask in self.masks
                and (self.when is None or self.when(p)))


@dataclass(frozen=True)
class Decision:
    """What :func:`route` found: the kernel the vendor runs, ``refused`` (one line) when the recipe does not model
    it, and the source row."""

    recipe: str
    kernel: str | None
    refused: str | None
    source: str


def _pow2_group(p: Problem) -> bool:
    g = p.heads_q // max(1, p.heads_kv)
    return g >= 1 and g & (g - 1) == 0


ALL_MASKS = ("none", "causal", "window")
_V3 = (f"{MHA_PY}:1796-1813 (is_fmha_v3_fp8: FP8 at d 128/128, or 256/256 on gfx950), :1815-1838 "
       f"(can_impl_fmha_v3_fwd: no sliding window (:1790-1794, :1828), power-of-two GQA ratio (:1833-1835)), "
       f":2075 (the assembly path only when s_q > 128); {MHA_CU}:12-23 (mask none, or causal bottom-right)")
_TO_CK = (f"{MHA_PY}:2096-2097 (else: mha_fwd), {MHA_CU}:372-379 (fmha_fwd_v3 returns -1, then fmha_fwd_ck)")

TABLES: dict[str, list[Route]] = {
    "aiter": [
        Route(dims=((128, 128),), masks=("none", "causal"),
              when=lambda p: p.seq_q > 128 and _pow2_group(p), when_text="s_q > 128, power-of-two GQA ratio",
              kernel="AITER asm fmha_v3 fwd_hd128_fp8.co (causal: fwd_hd128_fp8_causal.co), ts_qo 256, ts_kv 128",
              models=True, source=f"{_V3}; {CSV}:10-11"),
        Route(dims=((256, 256),), masks=("none", "causal"),
              when=lambda p: p.seq_q > 128 and _pow2_group(p), when_text="s_q > 128, power-of-two GQA ratio",
              kernel="AITER asm fmha_v3 fwd_hd256_fp8.co (causal: fwd_hd256_fp8_causal.co), ts_qo 256, ts_kv 64",
              models=False, source=f"{_V3}; {CSV}:14-15",
              reason=("AITER runs its hd256 FP8 assembly kernel here (64-key tiles, a Schraudolph exp2 in tiles "
                      "that add little mass: research/amd_peers.md 2a), which the aiter recipe (its hd128 "
                      "kernel) does not model")),
        Route(dims=((128, 128), (256, 256)), masks=ALL_MASKS,
              kernel="CK tile fmha fwd fp8bf16 pertensor (AITER's fallback)", models=False,
              source=f"{_V3}; {_TO_CK}",
              reason=("AITER runs CK's fmha (recipe ck) here, not its assembly kernel: the assembly path takes "
                      "no sliding window, s_q <= 128 or a GQA ratio that is not a power of two")),
        Route(dims=((64, 64), (192, 128)), masks=ALL_MASKS,
              kernel="CK tile fmha fwd fp8bf16 pertensor (AITER's fallback)", models=False,
              source=f"{MHA_PY}:1796-1800 (FP8 assembly kernels only at d 128/128 and 256/256); {_TO_CK}",
              reason=("AITER has no FP8 assembly kernel at this head dim; its dispatcher runs CK's fmha "
                      "(recipe ck) here")),
        Route(dims=None, masks=ALL_MASKS, kernel=None, models=False,
              source=f"{MHA_PY}:1796-1800; {CK_TILES} (keys stop at (256, 256))",
              reason="neither AITER's assembly kernels nor the CK fmha it falls back to has an FP8 kernel at this "
                     "head dim"),
    ],
    "ck": [
        Route(dims=((64, 64),), masks=ALL_MASKS,
              kernel="CK tile fmha fwd fp8bf16 d64, pipeline qr, tile bm0 128 x bn0 64", models=True,
              source=f"{CK_TILES}, key (64, 64); get_pipelines: qr at hdim 64 (recipe ck's head_dim_tiles)"),
        Route(dims=((128, 128), (192, 128), (256, 256)), masks=ALL_MASKS,
              kernel="CK tile fmha fwd fp8bf16, pipeline qr_async, tile bm0 128 x bn0 128", models=True,
              source=(f"{CK_TILES}, keys (128, 128), (192, 128), (256, 256); on gfx950 "
                      "KernelComponentFactoryGfx950 adds a 256x64 qr_async_trload_v3 kernel at d 128 (no mask or "
                      "causal, pertensor): which of the two the generated dispatcher tries first is not settled "
                      "here")),
        Route(dims=None, masks=ALL_MASKS, kernel=None, models=False, source=f"{CK_TILES} (keys stop at (256, 256))",
              reason="Composable Kernel generates no FP8 fmha forward kernel at this head dim"),
    ],
}
# CK's block-scale pipeline is generated for the same fp8bf16 head dims (get_pipelines: qscale "blockscale" in
# the gfx9 fp8bf16 list), so it shares CK's table.
TABLES["ck-blockscale"] = [
    Route(dims=r.dims, masks=r.masks, when=r.when, when_text=r.when_text,
          kernel=r.kernel.replace("pertensor", "blockscale") if r.kernel else None, models=r.models,
          source=r.source.replace("(recipe ck's head_dim_tiles)", "(qscale blockscale)"),
          reason=r.reason)
    for r in TABLES["ck"]]


def base_name(recipe) -> str:
    """The named recipe a name, spec or :class:`~zyfa.recipes.Recipe` derives from (``aiter@h200``,
    ``aiter:p_scale=fmax`` -> ``aiter``)."""
    name = recipe if isinstance(recipe, str) else recipe.name
    return name.split(":", 1)[0].rsplit("@", 1)[0]


def _mask(causal: bool, window: int | None, seq_k: int) -> str:
    if window is not None and window < seq_k:
        return "window"
    return "causal" if causal or window is not None else "none"


def route(recipe, *, head_dim: int, head_dim_v: int | None = None, causal: bool = False, window: int | None = None,
          seq_q: int, seq_k: int | None = None, heads_q: int = 1, heads_kv: int | None = None) -> Decision | None:
    """The kernel the vendor of ``recipe`` runs on this problem, or None when the recipe names no vendor kernel
    (ours, ablations, baselines: no table)."""
    name = base_name(recipe)
    table = TABLES.get(name)
    if table is None:
        return None
    seq_k = seq_q if seq_k is None else seq_k
    p = Problem(head_dim=head_dim, head_dim_v=head_dim if head_dim_v is None else head_dim_v,
                mask=_mask(causal, window, seq_k), seq_q=seq_q, seq_k=seq_k, heads_q=heads_q,
                heads_kv=heads_q if heads_kv is None else heads_kv)
    for row in table:
        if row.matches(p):
            refused = None if row.models else (
                f"recipe {name} refused at head dim {p.head_dim}/{p.head_dim_v}, mask {p.mask}, s_q {p.seq_q}: "
                f"{row.reason} ({row.source.split(';')[0]})")
            return Decision(recipe=name, kernel=row.kernel, refused=refused, source=row.source)
    raise AssertionError(f"dispatch table of {name} has no row for {p}")  # every table ends with a catch-all


def route_input(recipe, inp) -> Decision | None:
    """:func:`route` for an attention input (anything with ``shape``, ``causal`` and ``window``)."""
    s = inp.shape
    return route(recipe, head_dim=s["head_dim"], head_dim_v=s["head_dim_v"], causal=bool(inp.causal),
                 window=inp.window, seq_q=s["seq_q"], seq_k=s["seq_k"], heads_q=s["heads_q"], heads_kv=s["heads_kv"])


def table_rows() -> list[dict]:
    """Every table row as a dict (recipe, head dims, masks, condition, kernel, models, reason, source)."""
    return [{"recipe": name, "head_dims": "any other" if r.dims is None else
             ", ".join(f"{a}" if a == b else f"{a}/{b}" for a, b in r.dims),
             "masks": ", ".join(r.masks), "condition": r.when_text or "-", "kernel": r.kernel or "none",
             "recipe_applies": r.models, "reason": r.reason or "-", "source": r.source, "domain": DOMAIN}
            for name, rows in TABLES.items() for r in rows]
