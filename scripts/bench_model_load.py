"""Time a registry model's load twice, each in a fresh process: from the GGUF file, then from the weights cache.

    python3 scripts/bench_model_load.py --model qwen25coder-1.5b [--dtype fp32] [--rebuild] [--out result.json]

Each load runs ``zyfa.capture.models.load_model`` in its own Python process (nothing warm in memory but the OS page
cache) and reports the wall time of the load, where the weights came from (``model_weights`` provenance), the peak
resident memory, the greedy continuation of "The capital of France is" and a sha256 of that prompt's next-token
logits, and a sha256 of the token ids of the first 2048-token window of the pydoc text (the tokenizer is cached too).
The second load must come from the cache (``capture.weights_cache``) and give the same logits (bit for bit) and ids.
``--rebuild`` deletes the model's cache entry first, so that the first load dequantizes the GGUF file; without it
an existing entry is kept and both loads come from the cache. Exit 1 if the second load is not from the cache, its
logits or ids differ, or the continuation does not start with " Paris".
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

PROMPT = "The capital of France is"

_CHILD = r"""
import hashlib, json, resource, sys, time
t0 = time.perf_counter()
import torch
from zyfa.capture.models import load_model
from zyfa.capture.text import token_window
lm = load_model(sys.argv[1], dtype=sys.argv[2])
load_s = time.perf_counter() - t0
ids = lm.tokenizer(sys.argv[3], return_tensors="pt").input_ids
with torch.no_grad():
    logits = lm.model(input_ids=ids, use_cache=False).logits[0, -1].float().contiguous()
    out = lm.model.generate(ids, max_new_tokens=4, do_sample=False)
print(json.dumps({
    "load_s": round(load_s, 1),
    "weights": lm.provenance.get("model_weights", ""),
    "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    "continuation": lm.tokenizer.decode(out[0, ids.shape[1]:]),
    "logits_sha256": hashlib.sha256(logits.numpy().tobytes()).hexdigest(),
    "pydoc_window_sha256": hashlib.sha256(str(token_window(lm.tokenizer, "pydoc", 2048, 0).ids).encode()).hexdigest(),
}))
"""


def _one(model: str, dtype: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, model, dtype, PROMPT], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench_model_load: the load of {model} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    from zyfa.capture.models import MODELS, get_model_spec
    from zyfa.capture.weights_cache import weights_dir

    p = argparse.ArgumentParser(prog="scripts/bench_model_load.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen25coder-1.5b", help=f"a registry model ({', '.join(MODELS)})")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--rebuild", action="store_true", help="delete the cache entry first (the first load dequantizes)")
    p.add_argument("--out", help="also write the result as JSON here")
    a = p.parse_args(argv)
    spec = get_model_spec(a.model)
    if not spec.cache_weights:
        print(f"bench_model_load: {a.model} does not cache its weights (ModelSpec.cache_weights)", file=sys.stderr)
        return 2
    entry = weights_dir(spec.file_sha256, {"fp32": "float32", "bf16": "bfloat16"}[a.dtype])
    if a.rebuild and entry.exists():
        shutil.rmtree(entry)
    first = _one(a.model, a.dtype)
    second = _one(a.model, a.dtype)
    result = {"model": a.model, "dtype": a.dtype, "cache_entry": str(entry), "first": first, "second": second,
              "speedup": round(first["load_s"] / second["load_s"], 1)}
    print(json.dumps(result, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    ok = (second["weights"].startswith("cached") and first["logits_sha256"] == second["logits_sha256"]
          and first["pydoc_window_sha256"] == second["pydoc_window_sha256"]
          and first["continuation"].startswith(" Paris"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
