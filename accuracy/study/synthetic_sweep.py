"""Synthetic attention against the captures, and each recipe's error ratio against attention entropy and P flushing.

Two studies (issue 40, item 2):

1. **Calibration** (:func:`calibrate`): for each capture layer, the attention statistics that decide FP8 error
   (mean entropy in nats, sink mass = mean probability on key 0, ``p_flushed_frac`` = the fraction of P that an
   unscaled e4m3 cast flushes to zero, as the ``aiter`` recipe's emulation counts it, and max|K| with
   max|K| / rms(K)), then the synthetic input set to the same entropy, sink and K outlier ratio (same shape), and
   the same statistics realised by it, side by side.
2. **Sweep** (:func:`run_sweep`): synthetic inputs over entropy (and sink, K outliers) at each head dim, run
   through the accuracy runner with ``zyfa`` and the peers (``ck``, ``aiter``, ``triton-amd`` by default), then
   ``zyfa``'s error over each peer's (the paper's "ZYFA / peer" ratio) plotted against entropy and against
   ``p_flushed_frac`` (:func:`plot_ratios`). A peer refused on a shape (:mod:`zyfa.dispatch`: ``aiter`` at head dims
   64 and 256) has no point there; the table says so.

``p_flushed_frac`` here is a property of the input, measured with the ``aiter`` recipe's P handling at every head
dim (it is the emulator's count; it does not mean AITER runs that shape).

Command (CPU at small sizes; the full sweep on a GPU)::

    python -m zyfa.accuracy.study.synthetic_sweep --out synth --seq 2048 --heads 4 --kv-heads 1 \\
        --entropies 0.5,1,1.5,2,3,4,5 --head-dims 64,128,256 --sinks none,0.3 --k-outliers 0:0,2:20 \\
        --captures datasets/*.h5 --device auto

Writes into ``--out`` (a new folder, or ``--force``): ``calibration.md``, ``sweep.jsonl`` (the runner's rows with
the input statistics), ``sweep.md``, ``fig_ratio_vs_entropy.png``, ``fig_ratio_vs_p_flushed.png``, each with the
command and provenance.

Exposed:
    input_stats(inp, *, device="cpu") -> dict     entropy, sink mass, p_flushed_frac, max|K|, max|K|/rms(K)
    matching_spec(stats, *, seed=0) -> SyntheticSpec   the synthetic input with a capture layer's statistics
    calibrate(inputs, *, device="cpu") -> list[dict]
    sweep_specs(...) -> list[SyntheticSpec];  run_sweep(specs, recipes, *, device) -> (rows, skipped)
    ratio_points(rows, *, base="zyfa", metric="deq_rel_l2") -> list[dict]
    plot_ratios(points, x) -> PNG bytes
    main(argv) -> int
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import shlex
import sys
import time
from pathlib import Path

import torch
from zyfa.accuracy.inputs.attention_input import AttentionInput, capture_inputs
from zyfa.accuracy.inputs.synthetic import SyntheticSpec, attention_profile, make_synthetic
from zyfa.accuracy.io.device import resolve_device
from zyfa.accuracy.io.provenance import provenance
from zyfa.accuracy.io.results_io import write_results
from zyfa.accuracy.operator.runner import run_accuracy
from zyfa.accuracy.report.plots import png, pyplot

from zyfa.emulator import emulate
from zyfa.recipe_spec import parse_recipes

__all__ = ["calibrate", "input_stats", "main", "matching_spec", "plot_ratios", "ratio_points", "run_sweep",
           "sweep_specs"]

SWEEP_RECIPES = ("zyfa", "ck", "aiter", "triton-amd")
FLUSH_RECIPE = "aiter"  # the unscaled e4m3 cast of P whose flushed fraction is the x axis


def _outlier_ratio(k: torch.Tensor) -> float:
    k = k.double()
    return float(k.abs().max() / k.pow(2).mean().sqrt())


@torch.no_grad()
def input_stats(inp: AttentionInput, *, device: str = "cpu") -> dict:
    """Entropy (nats), sink mass, ``p_flushed_frac`` (the ``aiter`` recipe's P cast), max|K| and max|K|/rms(K)."""
    x = inp.to(device)
    prof = attention_profile(x.q, x.k, sm_scale=x.sm_scale, causal=bool(x.causal) or x.window is not None)
    em = emulate(x.q, x.k, x.v, FLUSH_RECIPE, causal=x.causal, sm_scale=x.sm_scale, window=x.window)
    return {"entropy_nats": prof["entropy_nats"], "sink_mass": prof["sink_mass"],
            "p_flushed_frac": float(em.stats.get("p_flushed_frac", 0.0)),
            "max_abs_k": float(x.k.float().abs().max()), "k_outlier_ratio": _outlier_ratio(x.k)}


def _bias_for_ratio(ratio: float, d: int, s: int) -> tuple[int, float, bool]:
    """(channels, bias, reached): a K bias giving max|K|/rms(K) ~ ``ratio`` with unit-normal bulk, from
    max|K| ~ bias + z (z = sqrt(2 ln 2s), the largest of s normals) and rms = sqrt(1 + n bias^2 / d); on the rising
    branch bias <= d / (n z). Two channels (a RoPE pair) first, one where two cannot reach the ratio."""
    z = math.sqrt(2 * math.log(2 * s))
    if ratio <= z:
        return 0, 0.0, True
    for n in (2, 1):
        top = d / (n * z)

        def f(b: float, n: int = n) -> float:
            return (b + z) / math.sqrt(1 + n * b * b / d)

        if f(top) >= ratio:
            lo, hi = 0.0, top
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if f(mid) < ratio else (lo, mid)
            return n, round(hi, 2), True
    return 1, round(d / z, 2), False


def matching_spec(inp: AttentionInput, stats: dict, *, seed: int = 0) -> tuple[SyntheticSpec, bool]:
    """The synthetic input of ``inp``'s shape and mask with its entropy, sink mass and K outlier ratio (RoPE on,
    theta 1e4); the bool says whether the K ratio is reachable by a bias alone."""
    s = inp.shape
    n, bias, reached = _bias_for_ratio(stats["k_outlier_ratio"], s["head_dim"], s["seq_k"])
    sink = min(max(stats["sink_mass"], 1e-3), 0.99)
    spec = SyntheticSpec(entropy=round(stats["entropy_nats"], 3), sink=round(sink, 4), k_outliers=n, k_bias=bias,
                         rope=1, head_dim=s["head_dim"], seq=s["seq_q"], heads=s["heads_q"], kv_heads=s["heads_kv"],
                         batch=s["batch"], causal=int(bool(inp.causal)), seed=seed)
    return spec, reached


def calibrate(inputs: list[AttentionInput], *, device: str = "cpu", log=print) -> list[dict]:
    """Per capture layer: its statistics, the matching synthetic spec, and that input's realised statistics."""
    out = []
    for inp in inputs:
        cap = input_stats(inp, device=device)
        spec, reached = matching_spec(inp, cap)
        try:
            syn = input_stats(make_synthetic(spec, device=device), device=device)
            err = None
        except ValueError as e:
            syn, err = {}, str(e)
        out.append({"input": inp.name, "head_dim": inp.shape["head_dim"], "capture": cap,
                    "synthetic_spec": spec.spec_string(), "synthetic": syn, "k_ratio_reached": reached,
                    "error": err})
        log(f"calibration: {inp.name}: capture H {cap['entropy_nats']:.2f} flushed {cap['p_flushed_frac']:.3f}; "
            + (f"synthetic H {syn['entropy_nats']:.2f} flushed {syn['p_flushed_frac']:.3f}" if syn else err))
    return out


def _none_or_float(text: str) -> float | None:
    return None if text.strip().lower() == "none" else float(text)


def sweep_specs(*, entropies, head_dims, sinks=(None,), k_settings=((0, 0.0),), seq=2048, heads=4, kv_heads=1,
                rope=1, seeds=(0,)) -> list[SyntheticSpec]:
    """Every combination, head dim outermost then sink, K setting, entropy, seed (the order of the rows)."""
    return [SyntheticSpec(entropy=e, sink=sk, k_outliers=n, k_bias=b if n else 0.0, rope=rope, head_dim=d, seq=seq,
                          heads=heads, kv_heads=kv_heads, seed=sd)
            for d in head_dims for sk in sinks for n, b in k_settings for e in entropies for sd in seeds]


def run_sweep(specs, recipes=SWEEP_RECIPES, *, device: str = "cpu", log=print) -> tuple[list[dict], list[str]]:
    """The runner's rows on each synthetic input, each row with the input's statistics (``stat_*``) and whether
    the recipe was refused; specs whose entropy or sink cannot be reached are skipped (their one-line reasons)."""
    dev = resolve_device(device)
    rows, skipped = [], []
    for spec in specs:
        try:
            inp = make_synthetic(spec, device=dev)
        except ValueError as e:
            skipped.append(f"{spec.spec_string()}: {e}")
            continue
        stats = input_stats(inp, device=str(dev))
        got = run_accuracy([inp], list(recipes), device=dev, progress=False)
        for r in got:
            r.update({f"stat_{k}": v for k, v in stats.items()})
            r["stat_requested_entropy"] = spec.entropy
            rows.append(r)
        log(f"sweep: {inp.name}: H {stats['entropy_nats']:.2f}, flushed {stats['p_flushed_frac']:.3f}")
    return rows, skipped


def ratio_points(rows: list[dict], *, base: str = "zyfa", metric: str = "deq_rel_l2") -> list[dict]:
    """One point per (input, peer): ``base``'s error over the peer's (the paper's ZYFA / peer); refused peers
    give no point."""
    by_input: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_input.setdefault(r["input"], {})[r["recipe"]] = r
    pts = []
    for name, recs in by_input.items():
        b = recs.get(base)
        if b is None or b.get(metric) is None:
            continue
        for peer, r in recs.items():
            if peer == base or r.get("status") == "refused" or not r.get(metric):
                continue
            pts.append({"input": name, "peer": peer, "head_dim": r["head_dim"], "ratio": b[metric] / r[metric],
                        "entropy_nats": r["stat_entropy_nats"], "p_flushed_frac": r["stat_p_flushed_frac"],
                        "sink": r.get("input_spec_sink"), "k_bias": r.get("input_spec_k_bias")})
    return pts


def plot_ratios(points: list[dict], x: str, *, metric: str = "deq_rel_l2") -> bytes:
    """One panel per head dim: ZYFA / peer error ratio against ``x`` (``entropy_nats`` or ``p_flushed_frac``),
    one marker series per peer; the line at 1 is parity."""
    plt = pyplot()
    dims = sorted({p["head_dim"] for p in points}) or [0]
    fig, axes = plt.subplots(1, len(dims), figsize=(4.2 * len(dims), 3.4), squeeze=False, sharey=True)
    peers = sorted({p["peer"] for p in points})
    colors = {peer: f"C{i}" for i, peer in enumerate(peers)}  # one colour per peer in every panel
    for ax, d in zip(axes[0], dims, strict=True):
        for peer in peers:
            pts = sorted((p[x], p["ratio"]) for p in points if p["head_dim"] == d and p["peer"] == peer)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", linestyle="", color=colors[peer],
                        label=f"zyfa / {peer}")
            elif any(p["peer"] == peer for p in points):
                ax.plot([], [], marker="x", linestyle="", color=colors[peer], label=f"{peer}: refused here")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(f"head dim {d}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax.set_xlabel({"entropy_nats": "attention entropy (nats)",
                       "p_flushed_frac": "fraction of P an unscaled e4m3 cast flushes"}[x])
    axes[0][0].set_ylabel(f"zyfa error / peer error ({metric})")
    return png(fig)


def _md_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in body])


def _calibration_md(cal: list[dict]) -> str:
    body = []
    for c in cal:
        cap, syn = c["capture"], c["synthetic"]

        def pair(key: str, fmt: str, cap=cap, syn=syn) -> str:
            return f"{format(cap[key], fmt)} / " + (format(syn[key], fmt) if key in syn else "-")

        body.append([c["input"], str(c["head_dim"]), pair("entropy_nats", ".2f"), pair("sink_mass", ".3f"),
                     pair("p_flushed_frac", ".3f"), pair("max_abs_k", ".3g"), pair("k_outlier_ratio", ".1f"),
                     f"`{c['synthetic_spec']}`" + ("" if c["k_ratio_reached"] else " (K ratio not reachable)")
                     + (f" ({c['error']})" if c["error"] else "")])
    return _md_table(["layer", "d", "entropy (nats)", "sink mass", "p_flushed_frac", "max abs K",
                      "max abs K / rms K", "synthetic input"], body)


def _sweep_md(points: list[dict], rows: list[dict]) -> str:
    body = [[p["input"], str(p["head_dim"]), p["peer"], f"{p['entropy_nats']:.2f}", f"{p['p_flushed_frac']:.3f}",
             f"{p['ratio']:.3f}"] for p in points]
    refused = sorted({(r["recipe"], r["head_dim"], r["reason"]) for r in rows if r.get("status") == "refused"})
    out = _md_table(["input", "d", "peer", "entropy (nats)", "p_flushed_frac", "zyfa / peer (deq_rel_l2)"], body)
    if refused:
        out += "\n\nRefused (no point): " + "; ".join(f"`{r}` at head dim {d}: {why}" for r, d, why in refused)
    return out


def _parse_k(text: str) -> list[tuple[int, float]]:
    out = []
    for item in (s for s in text.split(",") if s.strip()):
        n, _, b = item.partition(":")
        out.append((int(n), float(b or 0)))
    return out


def _floats(text: str) -> list[float]:
    return [float(s) for s in text.split(",") if s.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zyfa.accuracy.study.synthetic_sweep",
                                description="Synthetic attention calibrated against captures, and the recipes' "
                                            "error ratio against entropy and P flushing.")
    p.add_argument("--out", required=True, help="output folder (new, or --force)")
    p.add_argument("--force", action="store_true", help="write into an existing folder")
    p.add_argument("--captures", default="", help="capture files (globs allowed), comma-separated: calibration")
    p.add_argument("--max-tokens", type=int, help="first N tokens of each capture layer")
    p.add_argument("--entropies", default="0.5,1,1.5,2,3,4,5", help="mean attention entropies (nats)")
    p.add_argument("--head-dims", default="64,128,256")
    p.add_argument("--sinks", default="none", help="sink masses, 'none' for no sink (comma-separated)")
    p.add_argument("--k-outliers", default="0:0", help="K bias settings CHANNELS:BIAS, comma-separated")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--rope", type=int, default=1, choices=(0, 1))
    p.add_argument("--seeds", default="0")
    p.add_argument("--recipes", default=",".join(SWEEP_RECIPES))
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the calibration and the sweep; 0 on success, 2 on bad input (one line on stderr, nothing written)."""
    args = build_parser().parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    try:
        recipes = [r.name for r in parse_recipes(args.recipes)]
        specs = sweep_specs(entropies=_floats(args.entropies), head_dims=[int(x) for x in args.head_dims.split(",")],
                            sinks=[_none_or_float(s) for s in args.sinks.split(",")],
                            k_settings=_parse_k(args.k_outliers), seq=args.seq, heads=args.heads,
                            kv_heads=args.kv_heads, rope=args.rope, seeds=[int(s) for s in args.seeds.split(",")])
        files = [f for pat in args.captures.split(",") if pat.strip() for f in sorted(glob.glob(pat.strip()))
                 or [pat.strip()]]
        for f in files:
            if not Path(f).is_file():
                raise ValueError(f"no such capture file: {f}")
        out = Path(args.out)
        if out.exists() and not args.force:
            raise ValueError(f"{out} exists (use --force to write into it)")
        if not out.parent.is_dir():
            raise ValueError(f"the folder of --out ({out.parent}) does not exist")
        device = str(resolve_device(args.device))
    except ValueError as e:
        print(f"synthetic_sweep: error: {e}", file=sys.stderr)
        return 2
    out.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    command = "python -m zyfa.accuracy.study.synthetic_sweep " + shlex.join(argv)
    prov = provenance({"command": command, "device": device})
    head = f"Command: `{command}`\n\nProvenance: git {prov.get('git_commit')} (dirty: {prov.get('git_dirty')}), " \
           f"{prov.get('date_utc')}, {device}\n\n"
    cal = calibrate([i for f in files for i in capture_inputs(f, max_tokens=args.max_tokens)], device=device) \
        if files else []
    if cal:
        (out / "calibration.md").write_text(
            "# Synthetic attention calibrated against the captures\n\n" + head
            + "Each cell: capture / synthetic. The synthetic input is set to the capture's entropy, sink mass and "
              "max|K| / rms(K) (a per-tensor FP8 scale is scale-free, so max|K| itself is not matched); "
              "p_flushed_frac, the fraction of P an unscaled e4m3 cast (the aiter recipe's) flushes to zero, is "
              "the test of the match.\n\n" + _calibration_md(cal) + "\n")
        (out / "calibration.json").write_text(json.dumps({"provenance": prov, "rows": cal}, indent=1) + "\n")
    rows, skipped = run_sweep(specs, recipes, device=device)
    write_results(rows, out / "sweep.jsonl", provenance={**prov, "skipped": skipped})
    pts = ratio_points(rows)
    (out / "fig_ratio_vs_entropy.png").write_bytes(plot_ratios(pts, "entropy_nats"))
    (out / "fig_ratio_vs_p_flushed.png").write_bytes(plot_ratios(pts, "p_flushed_frac"))
    (out / "sweep.md").write_text(
        "# ZYFA / peer error ratio on synthetic attention\n\n" + head
        + "![ratio vs entropy](fig_ratio_vs_entropy.png)\n\n![ratio vs flushed](fig_ratio_vs_p_flushed.png)\n\n"
        + _sweep_md(pts, rows) + ("\n\nSkipped (not reachable): " + "; ".join(skipped) if skipped else "")
        + f"\n\nWall time {time.perf_counter() - t0:.0f} s.\n")
    print(f"wrote {out} ({len(rows)} rows, {len(skipped)} specs skipped) in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
