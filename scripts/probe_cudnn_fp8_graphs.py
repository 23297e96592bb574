"""What a cuDNN FP8 SDPA graph costs to build per sequence length, and which way of sharing graphs across lengths
keeps the exact-length graph's bits (GPU, nvidia-cudnn-frontend; docs/TASKS.md, "On the H200").

    PYTHONPATH=.:/tmp/site python3 scripts/probe_cudnn_fp8_graphs.py

Prints the build time of exact-length causal graphs (1, 12, s, 128) at s = 480, 481, 517, 600 (the first of a
process compiles at run time), one execute, whether a one-query graph against a cache builds, and for graphs built
with dynamic shapes (a kernel cache) and for one padded graph of 640 under cuDNN's padding mask: their build time and
whether each length's FP8 output, lse and output amax equal the exact graph's. Random FP8 data, fixed seed. The graph
the toolkit runs is built in zyfa/peers/cudnn_fp8.py; this script builds its own variants to compare them.
"""

from __future__ import annotations

import time
import traceback

import cudnn
import torch

H, D = 12, 128
LENGTHS = (480, 481, 517, 600)
PADDED = 640
DEV = torch.device("cuda")
DT = cudnn.data_type


def build(s_q: int, s_kv: int, causal: bool, *, cache=None, pad: bool = False):
    """A causal or plain FP8 SDPA graph (1, H, s, D): static, dynamic-shaped with ``cache``, or padded."""
    kw = {"is_dynamic_shape_enabled": True, "kernel_cache": cache} if cache is not None else {}
    g = cudnn.pygraph(io_data_type=DT.FP8_E4M3, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT, **kw)

    def ten(name, s):
        return g.tensor(name=name, dim=[1, H, s, D], stride=[H * s * D, s * D, D, 1], data_type=DT.FP8_E4M3)

    def scalar(name, dtype=DT.FLOAT):
        return g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=dtype)

    h = {"Q": ten("Q", s_q), "K": ten("K", s_kv), "V": ten("V", s_kv)}
    h.update({n: scalar(n) for n in ("dq", "dk", "dv", "ds", "ss", "so")})
    extra = {}
    if pad:
        h.update({"lq": scalar("lq", DT.INT32), "lk": scalar("lk", DT.INT32)})
        extra = {"use_padding_mask": True, "seq_len_q": h["lq"], "seq_len_kv": h["lk"]}
    o, st, a_s, a_o = g.sdpa_fp8(h["Q"], h["K"], h["V"], h["dq"], h["dk"], h["dv"], h["ds"], h["ss"], h["so"],
                                 generate_stats=True, attn_scale=D ** -0.5, use_causal_mask=causal, name="sdpa_fp8",
                                 **extra)
    o.set_output(True).set_dim([1, H, s_q, D]).set_stride([H * s_q * D, s_q * D, D, 1]).set_data_type(DT.FP8_E4M3)
    st.set_output(True).set_data_type(DT.FLOAT)
    for a in (a_o, a_s):
        a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(DT.FLOAT)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    h.update({"O": o, "st": st, "a_o": a_o, "a_s": a_s})
    return g, h


def run(gh, q8, k8, v8, s_out: int, lengths: tuple[int, int] | None = None):
    """(FP8 output, lse, amax(O), amax(S)) of one execute at unit scales."""
    g, h = gh
    one = torch.ones((1, 1, 1, 1), device=DEV)
    o = torch.zeros((1, H, s_out, D), dtype=torch.float8_e4m3fn, device=DEV)
    lse = torch.zeros((1, H, s_out, 1), device=DEV)
    amax_o, amax_s = torch.zeros_like(one), torch.zeros_like(one)
    pack = {h["Q"]: q8, h["K"]: k8, h["V"]: v8, h["dq"]: one * 0.01, h["dk"]: one * 0.01, h["dv"]: one * 0.01,
            h["ds"]: one / 448, h["ss"]: one * 448, h["so"]: one, h["O"]: o, h["st"]: lse, h["a_o"]: amax_o,
            h["a_s"]: amax_s}
    if lengths is not None:
        for name, n in zip(("lq", "lk"), lengths, strict=True):
            pack[h[name]] = torch.full((1, 1, 1, 1), n, dtype=torch.int32, device=DEV)
    g.execute(pack, torch.empty(g.get_workspace_size(), device=DEV, dtype=torch.uint8))
    torch.cuda.synchronize()
    return o, lse, float(amax_o), float(amax_s)


def timed(f):
    t = time.perf_counter()
    r = f()
    return r, time.perf_counter() - t


def same(a, b) -> tuple[bool, float, bool]:
    """(FP8 output bits equal, max |lse difference|, output amax equal)."""
    return (bool(torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))), float((a[1] - b[1]).abs().max()),
            a[2] == b[2])


def main() -> None:
    print("cudnn backend", torch.backends.cudnn.version(), "frontend", getattr(cudnn, "__version__", "?"), flush=True)
    torch.manual_seed(0)
    static = {}
    for s in LENGTHS:
        static[s], t = timed(lambda s=s: build(s, s, True))
        print(f"static causal build s={s}: {t:.2f} s", flush=True)
    q8, k8, v8 = ((torch.randn(1, H, 600, D, device=DEV) * 40).clamp(-440, 440).to(torch.float8_e4m3fn).contiguous()
                  for _ in range(3))

    def cut(x, s):
        return x[:, :, :s].contiguous()

    ref = {s: run(static[s], cut(q8, s), cut(k8, s), cut(v8, s), s) for s in LENGTHS}
    t = time.perf_counter()
    for _ in range(20):
        run(static[600], q8, k8, v8, 600)
    print(f"execute s=600 (incl. alloc): {(time.perf_counter() - t) / 20 * 1e3:.2f} ms", flush=True)
    for s in (480, 481):  # one query against a cache, no mask
        try:
            _, t = timed(lambda s=s: build(1, s, False))
            print(f"static s_q=1 s_kv={s} non-causal build: {t:.2f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - cuDNN's refusal is the answer
            print("s_q=1 build failed:", str(e).splitlines()[0][:300])
    try:
        cache = cudnn.create_kernel_cache()
        for s in LENGTHS:
            gh, t = timed(lambda s=s: build(s, s, True, cache=cache))
            r = run(gh, cut(q8, s), cut(k8, s), cut(v8, s), s)
            print(f"dynamic causal build s={s}: {t:.2f} s; same as static (O bits, max|dlse|, amax_o): "
                  f"{same(r, ref[s])}", flush=True)
    except Exception:  # noqa: BLE001 - a refusal is the answer
        print("dynamic failed:", traceback.format_exc()[-800:])
    try:
        gh, t = timed(lambda: build(PADDED, PADDED, True, pad=True))
        print(f"padded causal build S={PADDED}: {t:.2f} s", flush=True)
        for s in LENGTHS:
            qp, kp, vp = (torch.zeros(1, H, PADDED, D, device=DEV).to(torch.float8_e4m3fn) for _ in range(3))
            for padded, x in ((qp, q8), (kp, k8), (vp, v8)):
                padded[:, :, :s] = x[:, :, :s]
            r = run(gh, qp, kp, vp, PADDED, lengths=(s, s))
            r = (r[0][:, :, :s].contiguous(), r[1][:, :, :s], r[2], r[3])
            print(f"padded s={s}: same as static: {same(r, ref[s])}", flush=True)
    except Exception:  # noqa: BLE001 - a refusal is the answer
        print("padded failed:", traceback.format_exc()[-800:])


if __name__ == "__main__":
    main()
