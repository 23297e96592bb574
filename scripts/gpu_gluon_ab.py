"""H200 A/B of technique 2 with ZYFA numerics: Triton kernel vs Gluon (1 warpgroup) vs Gluon (ping-pong).

One process, hd128 non-causal, 32K tokens, 16 heads, batch 1, recipe ``zyfa-hopper`` for all three:
  * triton  : zyfa.kernels.attention_fp8.attention_fp8 (default config)
  * gluon pp0: zyfa.kernels.attention_gluon.attention_fp8_gluon(pingpong=False)
  * gluon pp1: attention_fp8_gluon(pingpong=True) (STAGES=4, LAG=2: best of scripts/gluon_pingpong_sm90.py)
Prints TFLOP/s, same-run ratios and the rel L2 error vs SDPA (bf16 of the same dequantized FP8 inputs); each
variant in try/except; a watchdog (default 110 s) reports a hung variant. Writes $OUT/gluon_ab.txt when OUT is set.

    PYTHONPATH=. python scripts/gpu_gluon_ab.py [--seq 32768] [--heads 16]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

LINES: list[str] = []
CURRENT = {"tag": "start"}
T0 = time.time()


def say(msg: str) -> None:
    print(msg, flush=True)
    LINES.append(msg)


def write_out() -> None:
    out = os.environ.get("OUT")
    if out and LINES:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "gluon_ab.txt"), "w") as f:
            f.write("\n".join(LINES) + "\n")


def watchdog(seconds: float) -> None:
    def fire():
        say(f"WATCHDOG: no finish after {seconds:.0f} s, hung in: {CURRENT['tag']}")
        write_out()
        os._exit(3)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--rep", type=int, default=60, help="do_bench rep (ms)")
    ap.add_argument("--watchdog", type=float, default=110.0)
    a = ap.parse_args()
    if a.watchdog > 0:
        watchdog(a.watchdog)
    try:
        run(a.seq, a.heads, a.rep)
    finally:
        write_out()
    return 0


def run(s: int, h: int, rep: int) -> None:
    import torch
    import triton

    from zyfa.bench import flops, gaussian_qkv
    from zyfa.kernels.attention_fp8 import attention_fp8, quantize_for_kernel
    from zyfa.kernels.attention_gluon import GLUON_RECIPE, LAST_LAUNCH, attention_fp8_gluon

    d = 128
    say(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}; "
        f"hd{d} non-causal s={s} h={h} b=1, recipe {GLUON_RECIPE}")
    q, k, v = gaussian_qkv(1, h, h, s, d, d)
    q8, k8, v8, qd, kd, vd = quantize_for_kernel(q, k, v, GLUON_RECIPE)
    deq = [x.to(torch.bfloat16).float() * dd[:, :, None, None] for x, dd in ((q8, qd), (k8, kd), (v8, vd))]
    ref = torch.nn.functional.scaled_dot_product_attention(*(x.to(torch.bfloat16) for x in deq)).float()
    del deq
    fl = flops(1, h, s, s, d, d, False)
    variants = {
        "triton zyfa-hopper (default config)": lambda: attention_fp8(q8, k8, v8, recipe=GLUON_RECIPE, q_descale=qd,
                                                                      k_descale=kd, v_descale=vd),
        "gluon pingpong=0 (1 warpgroup)": lambda: attention_fp8_gluon(q8, k8, v8, qd, kd, vd, pingpong=False),
        "gluon pingpong=1 (STAGES=4 LAG=2)": lambda: attention_fp8_gluon(q8, k8, v8, qd, kd, vd, pingpong=True,
                                                                          config={"STAGES": 4, "LAG": 2}),
    }
    times = {}
    for tag, fn in variants.items():
        CURRENT["tag"] = tag
        print(f"[{time.time() - T0:.0f}s] running {tag}", file=sys.stderr, flush=True)
        try:
            out, _ = fn()
            torch.cuda.synchronize()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            ms = triton.testing.do_bench(lambda fn=fn: fn(), warmup=10, rep=rep, return_mode="median")
            times[tag] = ms
            regs = ""
            kern = LAST_LAUNCH.get("kernel") if tag.startswith("gluon") else None
            if kern is not None:
                regs = f", regs {getattr(kern, 'n_regs', '?')} spills {getattr(kern, 'n_spills', '?')}"
            say(f"{tag}: {fl / ms / 1e9:.1f} TFLOP/s ({ms:.3f} ms), rel L2 vs SDPA bf16 {err:.4f}{regs}")
        except Exception as e:  # noqa: BLE001
            tb = traceback.format_exc().strip().splitlines()
            say(f"{tag}: FAILED {type(e).__name__}: {str(e)[:300]} | {' / '.join(tb[-4:])[:400]}")
        torch.cuda.empty_cache()
    names = list(times)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            say(f"ratio {y} / {x}: {times[x] / times[y]:.3f}x (>1 = faster)")
    say(f"total {time.time() - T0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
