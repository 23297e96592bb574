"""The dequantized weights of a GGUF model, kept in the cache so that later loads skip the dequantization.

transformers' GGUF path dequantizes every tensor with numpy on each load (minutes for a 1.5B model on 2 cores).
After the first load, the model is saved as safetensors (in the dtype it was loaded in, so a later load gives the
same tensors bit for bit), with its config and tokenizer, into ``cache_dir()/weights/<key>/``. The key is the
GGUF file's sha256, the dtype and the versions of the code that dequantized it (transformers, gguf); a different
version makes a new entry. The entry is built in a temporary folder and renamed into place only when complete;
its manifest (``zyfa-weights.json``) lists every file's size and sha256, checked before each use: an entry that
fails the check is deleted (one line on stderr) and the model is loaded from the GGUF file again.

Exposed: ``weights_key``, ``weights_dir``, ``lookup``, ``store``, ``MANIFEST``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from zyfa.capture.fetch import cache_dir, cache_folder, sha256_file

MANIFEST = "zyfa-weights.json"
_CHUNK = 1 << 22

Progress = Callable[[str, int, int], None] | None


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def weights_key(gguf_sha256: str, dtype: str) -> dict:
    """What a cached entry must match: the GGUF file, the dtype, and the dequantizing code's versions."""
    return {"gguf_sha256": gguf_sha256, "dtype": dtype, "transformers": _version("transformers"),
            "gguf": _version("gguf")}


def weights_dir(gguf_sha256: str, dtype: str) -> Path:
    k = weights_key(gguf_sha256, dtype)
    return cache_dir() / "weights" / f"{gguf_sha256[:16]}-{dtype}-transformers{k['transformers']}-gguf{k['gguf']}"


def _hash(path: Path, progress: Progress, done: int, total: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress("verify cached weights", done, total)
    return h.hexdigest()


def _check(folder: Path, gguf_sha256: str, dtype: str, progress: Progress) -> str | None:
    """None when the entry is whole and matches its key; else why not (one line)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return f"no readable manifest ({e.__class__.__name__})"
    if manifest.get("key") != weights_key(gguf_sha256, dtype):
        return f"made for {manifest.get('key')}, not {weights_key(gguf_sha256, dtype)}"
    files = manifest.get("files") or {}
    if not files:
        return "the manifest lists no files"
    total, done = sum(int(f["size"]) for f in files.values()), 0
    for name, want in files.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != int(want["size"]):
            return f"{name} is missing or not {want['size']} bytes"
        if _hash(path, progress, done, total) != want["sha256"]:
            return f"{name} does not match its sha256 {want['sha256']}"
        done += int(want["size"])
    return None


def lookup(gguf_sha256: str, dtype: str, *, progress: Progress = None) -> Path | None:
    """The verified cache entry for this GGUF file and dtype, or None (an entry failing its check is deleted)."""
    folder = weights_dir(gguf_sha256, dtype)
    if not folder.is_dir():
        return None
    why = _check(folder, gguf_sha256, dtype, progress)
    if why is None:
        return folder
    print(f"zyfa: the cached weights in {folder} are not used ({why}); deleted, loading from the GGUF file again",
          file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)
    return None


def _save_weights(model, folder: Path, shard_bytes: int = 1 << 30) -> None:
    """The state dict as safetensors shards of about ``shard_bytes`` with transformers' index file.

    (transformers' ``save_pretrained`` refuses a model loaded from GGUF; shards keep the memory that
    ``safetensors`` needs to serialize one file small.) Tensors sharing storage (tied weights) are stored apiece.
    """
    from safetensors.torch import save_file

    shards: list[dict] = [{}]
    size, seen = 0, set()
    for name, t in model.state_dict().items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(ptr)
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += n
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, folder / fname, metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")


def store(model, tokenizer, gguf_sha256: str, dtype: str, *, progress: Progress = None) -> Path:
    """Save ``model`` (safetensors) and ``tokenizer`` as the cache entry of this GGUF file and dtype, atomically.

    The caller passes the model exactly as loaded from the GGUF file in ``dtype``. Returns the entry's folder.
    """
    final = weights_dir(gguf_sha256, dtype)
    cache_folder(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        if progress is not None:
            progress("write cached weights", 0, 1)
        _save_weights(model, tmp)
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):  # the weights are plain tensors now; no quantizer on reload
            del config.quantization_config
        config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        names = sorted(p.name for p in tmp.iterdir() if p.is_file())
        files = {}
        for i, name in enumerate(names):
            files[name] = {"size": (tmp / name).stat().st_size, "sha256": sha256_file(tmp / name)}
            if progress is not None:
                progress("write cached weights", i + 1, len(names) + 1)
        manifest = {"key": weights_key(gguf_sha256, dtype), "files": files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if progress is not None:
            progress("write cached weights", len(names) + 1, len(names) + 1)
        if final.exists():  # another process made it meanwhile: theirs is kept (it was checked as it was made)
            shutil.rmtree(tmp)
            return final
        os.rename(tmp, final)
        return final
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
