"""What cuDNN's FP8 attention (zyfa.peers.cudnn_fp8) costs to prepare per sequence length, with a graph per exact
length and with the padded graph of the next multiple of SEQ_BUCKET, and whether the two give the same bits (GPU,
nvidia-cudnn-frontend; docs/TASKS.md, "On the H200").

    PYTHONPATH=.:/tmp/site python3 scripts/probe_cudnn_fp8_graphs.py

For causal (1, 12, s, 128) inputs (GQA 6:1, as the hd128 model's) at s = 480, 481, 517, 600: the time of
``prepare`` (the graph built or taken from the cache, plus the first pass that sets the output scale; a process's first
graph compiles at run time) with exact-length graphs, then with padded ones, and whether each length's output, lse
and output scale are equal bit for bit. Random data, fixed seed.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zyfa.peers import cudnn_fp8  # noqa: E402

LENGTHS = (480, 481, 517, 600)


def prepared(s: int):
    """(seconds, output, lse, scale_o) of cudnn_fp8.prepare on length s."""
    g = torch.Generator(device="cuda").manual_seed(s)
    q, k, v = (torch.randn(1, n, s, 128, generator=g, device="cuda") * (1 + 4 * (i == 1))
               for i, n in enumerate((12, 2, 2)))
    t = time.perf_counter()
    p = cudnn_fp8.prepare(q, k, v, causal=True, sm_scale=1 / math.sqrt(128))
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    p.call()
    torch.cuda.synchronize()
    return seconds, p.output().clone(), p.lse().clone(), p.details["scale_o"]


def main() -> None:
    ok, why = cudnn_fp8.check()
    if not ok:
        sys.exit(f"probe_cudnn_fp8_graphs: cudnn-fp8 cannot run here: {why}")
    bucket = cudnn_fp8.SEQ_BUCKET
    runs = {}
    for name, size in (("exact", 1), ("padded", bucket)):
        cudnn_fp8.SEQ_BUCKET = size
        cudnn_fp8.clear_graph_cache()
        runs[name] = {s: prepared(s) for s in LENGTHS}
        times = ", ".join(f"s={s} {r[0]:.3f} s" for s, r in runs[name].items())
        print(f"{name} graphs (bucket {size}): prepare {times}; graphs built: {cudnn_fp8.cached_graphs()}")
    cudnn_fp8.SEQ_BUCKET = bucket
    for s in LENGTHS:
        e, p = runs["exact"][s], runs["padded"][s]
        print(f"s={s}: padded = exact bit for bit: output {torch.equal(e[1], p[1])}, lse {torch.equal(e[2], p[2])}, "
              f"scale_o {e[3] == p[3]}")


if __name__ == "__main__":
    main()
