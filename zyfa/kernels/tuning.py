"""The Triton FP8 kernel's launch configuration: the defaults per shape and recipe (:func:`default_config`, each
set by a measurement on the H200: docs/KERNEL.md, "The launch defaults"), a caller's overrides checked
(:func:`resolve_config`), and the constexpr arguments and launch options a resolved configuration compiles to
(:func:`launch_constexprs`, :func:`launch_options`: what :func:`zyfa.kernels.attention_fp8.launch` passes, so an
offline compile builds the same binary). Nothing here imports Triton.
"""

from __future__ import annotations

from zyfa.kernels.kernel_plan import (
    KernelPlan,
    default_mad_cvt,
    fused_mad_is_exact,
    mad_code_bound,
    mad_codes_bounded,
    mad_m_safe,
)

__all__ = [
    "HD128_CAUSAL_MAXNREG",
    "P_PERM_DEFAULT",
    "REMOVED_MAD_CVT",
    "REMOVED_SWITCHES",
    "default_config",
    "launch_constexprs",
    "launch_options",
    "resolve_config",
    "vt_key_order_for",
]

HD128_CAUSAL_MAXNREG = 168  # register cap for hd128 causal: three programs per SM (measured: docs/KERNEL.md)
P_PERM_DEFAULT = 1  # P's columns and V's keys in k32_key_order (see prepare_vt)
# Switches removed from the kernel after they lost their A/B against the kept form (docs/KERNEL.md, "Tried and not
# kept"): an override naming one is refused rather than silently ignored.
REMOVED_SWITCHES = {
    "PIPELINE_QK": "the hand-pipelined S of the next tile (Triton 3.6 serialised it on sm_90: slower)",
    "EXP2_SUM": "the exp2 row sum's forms (P's codes from a conversion of their own is the one kept)",
    "WS": "Triton 3.6's Hopper warp specialization (slower, 2.75 against 2.36 ms on one profiled launch, and its "
          "output differed from the plain launch's)",
}
REMOVED_MAD_CVT = {1: "cvt.rni (F2I, quarter rate: slower than the magic add)", 2: "cvt.rzi (F2I, as 1)",
                   5: "the packed u16x2 clamp (no faster than 3)"}


def default_config(d_qk: int, d_v: int, causal: bool, plan: KernelPlan) -> dict:
    """Tile sizes and launch options, each set by a measurement on the H200 (docs/KERNEL.md, "The launch defaults",
    has every one beside the command that measured it).

    MAD_T: 0 (one fused FFMA per score) for MAD recipes whose row maxima are off the rounding boundary
    (:func:`fused_mad_is_exact`: the zyfa family), else 1 (t exactly as the emulator).
    MAD_CVT: :func:`default_mad_cvt` (the FFMA's saturation is the clamp at 0: fewer FMNMX per score).
    P_PERM: 1 (P's columns and V's keys reordered within each 32-key step: no shuffles before the P·V wgmma).
    PV_MODE 2 instead of the plan's 4 at d 256 (the same per-tile flush, through Triton's partial accumulator: fewer
    spills). maxnreg 168 (three programs per SM) for hd128 causal and for the exp2 recipes at d 64 non-causal; at
    d 64 causal, for every recipe, three pipeline stages and maxnreg 128 (four programs per SM); at d 64 non-causal
    for the MAD recipes three stages in 128-row programs of two warpgroups without the cap (slower causal, at d 128
    and at MLA, so only there).
    DV_SPLIT 2 at d 256 (O's columns in two halves, one P·V dot each: fewer spills, the same output bit for bit);
    slower at d_v 128, so 1 there. VT_EARLY 1 at d 256 for the Hopper-accumulator recipes (Vᵀ's tile loaded beside
    K's, the same bits; slower below d 256). The exp2 recipes with the rounded row sum take P's codes from a
    conversion of their own and decode the sum from them (the sum read back from P's FP8 tensor was compiled
    wrong; re-rounding p in fp32 cost more instructions).
    """
    # 64-row tiles, one warpgroup, two programs per SM (their softmax and matmuls interleave) beat 128-row tiles on
    # two warpgroups for d <= 192; d = 256 needs 128 rows.
    mad_t = 0 if fused_mad_is_exact(plan) else 1
    cfg = {"BLOCK_M": 64, "num_warps": 4, "num_stages": 2, "TMA": True,
           "MAD_CVT": default_mad_cvt(plan, mad_t), "MAD_T": mad_t, "P_PERM": P_PERM_DEFAULT}
    if d_v >= 256 or d_qk >= 256:
        cfg.update(BLOCK_M=128, num_warps=8, num_stages=3)
        if plan.pv_mode == 4:
            cfg["PV_MODE"] = 2  # per-tile flush through Triton's partial accumulator: fewer spills at hd256
        if plan.pv_mode != 3:
            # P·V as two dots over O's column halves: the per-tile product needs half the registers (spills
            # far fewer LDL/STL), bit-identical output (docs/KERNEL.md)
            cfg["DV_SPLIT"] = 2
        if plan.rowsum_rounded == 2:
            cfg["num_stages"] = 2  # the ones tile of the tensor-core row sum: 3 stages need 236.5 KB > 227 KB
        if not plan.qk_k32:
            # Vᵀ's tile loaded beside K's (one mbarrier per stage, no CTA barrier inside the softmax): faster at
            # hd256, not at d <= 192 (docs/KERNEL.md); the fp32-accumulation recipes are refused it (resolve_config)
            cfg["VT_EARLY"] = 1
    elif d_qk <= 64 and not plan.qk_k32:
        if causal:
            # four programs per SM (54 KB of shared memory each, at most 128 registers): faster than three for
            # zyfa-hopper and fa3 flushed per tile (docs/KERNEL.md)
            cfg.update(num_stages=3, maxnreg=128)
        elif plan.exp_mad:  # measured with zyfa-hopper; the exp2 recipes keep the older form
            # K/V three tiles deep and two warpgroups sharing K/V (faster non-causal, slower causal)
            cfg.update(num_stages=3, BLOCK_M=128, num_warps=8)
        else:
            cfg["maxnreg"] = 168  # no spills at d 64: three programs per SM
    elif d_qk == 128 and d_v == 128 and causal and not plan.qk_k32:
        cfg["maxnreg"] = HD128_CAUSAL_MAXNREG  # small spills, but three programs per SM
    if plan.block_m is not None:
        cfg["BLOCK_M"] = plan.block_m
        cfg["num_warps"] = 8 if plan.block_m >= 128 else 4
    return cfg



def vt_key_order_for(config: dict | None) -> bool:
    """Whether a launch with these overrides expects Vt in :func:`k32_key_order` (its P_PERM)."""
    return bool((config or {}).get("P_PERM", P_PERM_DEFAULT))



def resolve_config(d_qk: int, d_v: int, causal: bool, plan: KernelPlan, config: dict | None = None):
    """:func:`default_config` with the caller's overrides, checked; returns (config, MAD_CVT, MAD bias: the
    plan's). An override naming a removed switch (:data:`REMOVED_SWITCHES`, :data:`REMOVED_MAD_CVT`) is refused."""
    cfg = default_config(d_qk, d_v, causal, plan)
    gone = [k for k in (config or {}) if k in REMOVED_SWITCHES]
    if gone:
        raise ValueError(f"{gone[0]} was removed from the kernel: {REMOVED_SWITCHES[gone[0]]}; docs/KERNEL.md")
    if (config or {}).get("MAD_CVT") in REMOVED_MAD_CVT:
        raise ValueError(f"MAD_CVT={config['MAD_CVT']} was removed from the kernel: "
                         f"{REMOVED_MAD_CVT[config['MAD_CVT']]}; docs/KERNEL.md")
    if config:
        if "MAD_T" in config and "MAD_CVT" not in config:
            cfg["MAD_CVT"] = default_mad_cvt(plan, config["MAD_T"])
        cfg.update(config)
    if plan.block_m is not None and cfg["BLOCK_M"] != plan.block_m:
        raise ValueError(f"recipe {plan.recipe!r} fixes BLOCK_M={plan.block_m} (per-tile P exponent)")
    if cfg.get("PV_MODE", plan.pv_mode) == 3 and "DV_SPLIT" not in (config or {}):
        cfg["DV_SPLIT"] = 1  # a PV_MODE 3 override keeps its second accumulator: no column halves
    vt_early = cfg.get("VT_EARLY", 0)
    if vt_early not in (0, 1):
        raise ValueError(f"VT_EARLY={vt_early!r}: expected 0 (Vᵀ loaded after the softmax) or 1 (beside K)")
    if vt_early and (cfg.get("QK_K32", plan.qk_k32) or cfg.get("PV_MODE", plan.pv_mode) == 1):
        raise ValueError(f"VT_EARLY=1 is not supported with the fp32 accumulation of recipe {plan.recipe!r} (QK_K32 / "
                         "PV_MODE 1): Triton 3.6 compiled it to wrong output for zyfa-exp2 at d 256 on the H200")
    dv_split = cfg.get("DV_SPLIT", 1)
    if dv_split not in (1, 2):
        raise ValueError(f"DV_SPLIT={dv_split!r}: expected 1 (one P·V dot) or 2 (O's columns in two halves)")
    if dv_split == 2 and cfg.get("PV_MODE", plan.pv_mode) == 3:
        raise ValueError("DV_SPLIT=2 cannot be combined with PV_MODE 3 (the accumulator flushed every N tiles keeps "
                         "its own second accumulator)")
    if dv_split == 2 and d_v < 64:
        raise ValueError(f"DV_SPLIT=2 needs d_v >= 64 (halves of at least 32 columns), got d_v={d_v}")
    mad_cvt = cfg["MAD_CVT"]
    if mad_cvt not in (0, 3, 4, 6):
        raise ValueError(f"MAD_CVT={mad_cvt!r}: expected 0 (magic add), 3/4/6 (fma.rn.sat, with an fp32 clamp at "
                         "126 / none / none where a per-program bound allows)")
    if mad_cvt == 6 and not (plan.exp_mad and mad_m_safe(plan) > 0):
        raise ValueError(f"MAD_CVT=6 needs a MAD recipe whose codes stay below 126.375 in exact arithmetic (recipe "
                         f"{plan.recipe!r}: x <= {mad_code_bound(plan):.3f}): use MAD_CVT=3")
    if mad_cvt == 4 and not (cfg["MAD_T"] == 1 and mad_codes_bounded(plan)):
        raise ValueError(f"MAD_CVT=4 leaves out the clamp at code 126, which is safe only with MAD_T=1 and a "
                         f"recipe whose codes stay below 126.5 (recipe {plan.recipe!r}: x <= "
                         f"{mad_code_bound(plan):.3f}, MAD_T={cfg['MAD_T']}): use MAD_CVT="
                         + ("6 (no clamp where the program's bound allows) or 3" if mad_m_safe(plan) > 0
                            else "3"))
    if cfg.get("DEBUG", 0) and mad_cvt >= 3:
        raise ValueError("DEBUG routes exist only for MAD_CVT 0")
    return cfg, mad_cvt, plan.mad_bias



def launch_constexprs(plan: KernelPlan, cfg: dict, mad_cvt: int, d_qk: int, d_v: int, causal: bool,
                      window: bool = False, qd_row: int = 0, kd_tile: bool = False) -> dict:
    """The kernel's constexpr arguments for a resolved config (:func:`resolve_config`) and MAD_CVT after
    :func:`mad_cvt_for_descales`: what :func:`launch` passes, so an offline compile (``scripts/inspect_sass.py``)
    builds the same binary."""
    d1, d2 = (128, 64) if d_qk == 192 else (d_qk, 0)
    return dict(
        CAUSAL=bool(causal or window), WINDOW=bool(window),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg.get("BLOCK_N", plan.block_n), D1=d1, D2=d2, DV=d_v,
        EXP_MAD=plan.exp_mad, MAD_CVT=mad_cvt, P_SCALE=plan.p_scale, E_FIXED=plan.e_fixed,
        TILE_GRAN=plan.tile_gran, E_CAP=plan.e_cap, ROWSUM_ROUNDED=plan.rowsum_rounded,
        QK_K32=cfg.get("QK_K32", plan.qk_k32), PV_MODE=cfg.get("PV_MODE", plan.pv_mode),
        FLUSH=max(plan.flush, 1), RCP=plan.rcp, OUT_MODE=plan.out_mode, TMA=cfg["TMA"],
        DEBUG=cfg.get("DEBUG", 0), MAD_T=cfg["MAD_T"],
        P_PERM=int(bool(cfg["P_PERM"])), QD_ROW=qd_row, KD_TILE=int(kd_tile),
        VD_MODE=plan.vd_mode, DV_SPLIT=cfg.get("DV_SPLIT", 1), VT_EARLY=cfg.get("VT_EARLY", 0))


def launch_options(cfg: dict) -> dict:
    """Triton's launch options for a resolved config: warps, pipeline stages and the register cap if any."""
    return {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
            **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {})}

