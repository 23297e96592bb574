"""The writer of the HDF5 capture store (schema and reader: :mod:`zyfa.capture.store`, datasets/README.md).

Crash safety: the file is built under a temporary name (root attributes and token ids, no layer) and renamed
into place, so the final name never holds a half-made root. A layer group gets ``complete = True`` only after
its three datasets are written and flushed, and the file is flushed again after that; the root gets
``complete = True`` only after every requested layer is complete. A rerun of the same capture skips complete
layers and rewrites incomplete ones. A write error (full disk) becomes a ``CaptureWriteError`` naming the file;
layers already complete stay readable. Each dataset records the sha256 of its values, which the reader checks.

Exposed: ``CaptureWriter``, ``check_writable``, ``KILL_AT_ENV`` (the crash tests' fault injection).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np
import torch
from zyfa.capture.store import (
    IDENTITY,
    SCHEMA,
    SCHEMA_VERSION,
    CaptureFormatError,
    CaptureMismatchError,
    CaptureWriteError,
    from_stored,
    layer_key,
    open_capture,
    open_h5,
    values_sha256,
)
from zyfa.capture.version import git_label


def _to_numpy(t: torch.Tensor) -> tuple[np.ndarray, str]:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    if t.dtype in (torch.float32, torch.float16):
        return t.numpy(), str(t.dtype).removeprefix("torch.")
    raise TypeError(f"cannot store {t.dtype} exactly; capture in fp32 or bf16")



def _chunks(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    b, h, s, d = shape
    rows = max(1, min(s, (1 << 20) // max(1, d * itemsize)))  # about 1 MiB per chunk, one head at a time
    return (1, 1, rows, d)


# Fault injection for the crash tests: when this variable names a write boundary (see the _boundary calls:
# "create:opened", "create:written", "create:renamed", "layer:N:group", "layer:N:q:half", ..., "layer:N:data",
# "layer:N:flag", "finish:layers", "finish:flag"), the writing process kills itself there with SIGKILL.
KILL_AT_ENV = "ZYFA_CAPTURE_KILL_AT"


def _boundary(name: str) -> None:
    if os.environ.get(KILL_AT_ENV) == name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def check_writable(path: str | os.PathLike) -> Path:
    """Refuse an output path that cannot be written, before any work: one line naming the problem.

    Creates missing parent folders, then really tries: a probe file in the folder (created and removed), and
    an existing file opened for update (not changed). Raises CaptureWriteError.
    """
    path = Path(path)
    if path.is_dir():
        raise CaptureWriteError(f"cannot write the capture to {path}: it is a folder; give a file name")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CaptureWriteError(
            f"cannot write the capture to {path}: the folder {parent} is not writable ({e.strerror or e})") from None
    if path.exists():
        try:
            with open(path, "r+b"):
                pass
        except OSError as e:
            raise CaptureWriteError(
                f"cannot write the capture to {path}: the file is not writable ({e.strerror or e})") from None
    return path


class CaptureWriter:
    """Write (or resume) one capture file, layer by layer.

    Args:
        path: the output file.
        meta: root attributes (provenance); must include the IDENTITY keys and REQUIRED_ROOT ones except
            schema, schema_version, complete, created and git_commit, which the writer sets.
        token_ids: (batch, seq) integer array.
        overwrite: replace an existing file (resumable or not) instead of resuming it.
        fail_after_layers: test hook: raise RuntimeError after writing this many layers (simulated crash).

    Use as a context manager, or call ``close()``; ``finish()`` marks the file complete.
    """

    def __init__(self, path: str | os.PathLike, meta: dict, token_ids, *, overwrite: bool = False,
                 compression: str = "gzip", fail_after_layers: int | None = None):
        self.path = Path(path)
        self.compression = compression
        self._fail_after = fail_after_layers
        self._written = 0
        raw = np.asarray(token_ids)
        integral = raw.dtype.kind in "iub" or (raw.dtype.kind == "f" and bool(np.all(np.round(raw) == raw)))
        if raw.size and not integral:
            raise ValueError(f"token_ids must be integers, got {raw.dtype} values such as {raw.flat[0]!r}")
        ids = raw.astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
            raise ValueError(f"token_ids must lie in [0, 2^31 - 1] (the file stores them as int32), got "
                             f"{int(ids.min())} to {int(ids.max())}")
        if ids.ndim == 1:
            ids = ids[None]
        meta = dict(meta)
        meta.setdefault("batch", ids.shape[0])
        meta.setdefault("seq_len", ids.shape[1])
        meta["layers"] = np.asarray(sorted(int(i) for i in meta["layers"]), dtype=np.int64)
        meta["q_heads"] = np.asarray(sorted(int(i) for i in meta["q_heads"]), dtype=np.int64)
        self.layers = [int(i) for i in meta["layers"]]
        self.resumed = False
        check_writable(self.path)
        if self.path.exists() and not overwrite:
            try:
                info = open_capture(self.path)
            except CaptureFormatError as e:
                if "is locked" in str(e):
                    raise
                raise CaptureMismatchError(
                    f"{e}. It is not a capture this command can resume: pass --overwrite to replace it, or "
                    "choose another output file") from None
            diff = [k for k in IDENTITY if _norm(info.attrs.get(k)) != _norm(meta.get(k))]
            with open_h5(self.path, "r") as f:
                if not diff and not np.array_equal(f["token_ids"][()], ids):
                    diff.append("token_ids")
            if diff:
                raise CaptureMismatchError(
                    f"{self.path} exists and holds a different capture ({', '.join(diff)} differ); pass "
                    "--overwrite to replace it, or choose another output file")
            self.resumed = True
            self._f = self._guard(lambda: h5py.File(self.path, "a"))
            self._guard(self._drop_incomplete)
        else:
            self._create_file(meta, ids)

    # -- internals ----------------------------------------------------------------------------------------

    def _guard(self, fn):
        try:
            return fn()
        except OSError as e:
            self._abort()
            raise CaptureWriteError(
                f"could not write {self.path} ({e}); is the disk full or the file-size limit reached? Layers "
                "completed before this one are kept; free space and rerun the same command to resume") from e

    def _abort(self):
        f = getattr(self, "_f", None)
        if f is not None:
            with contextlib.suppress(Exception):
                f.close()
            self._f = None

    def _create_file(self, meta: dict, ids: np.ndarray) -> None:
        """Build the root (provenance, token ids, no layer) under a temporary name, then rename it into place.

        So the final name only ever holds a valid capture: a kill before the rename leaves the old file (or
        none) and a hidden ``.NAME.creating`` that the next run replaces.
        """
        tmp = self.path.with_name(f".{self.path.name}.creating")
        self._f = self._guard(lambda: h5py.File(tmp, "w"))
        _boundary("create:opened")
        self._guard(lambda: self._create(meta, ids))
        self.close()
        _boundary("create:written")
        self._guard(lambda: os.replace(tmp, self.path))
        _boundary("create:renamed")
        self._f = self._guard(lambda: h5py.File(self.path, "a"))

    def _create(self, meta: dict, ids: np.ndarray) -> None:
        f = self._f
        f.attrs["schema"] = SCHEMA
        f.attrs["schema_version"] = SCHEMA_VERSION
        f.attrs["complete"] = False
        f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        f.attrs["git_commit"] = git_label()
        for k, v in meta.items():
            if v is None:
                continue
            if isinstance(v, dict):
                v = json.dumps(v)
            elif isinstance(v, str):
                v = str(v)  # plain str: subclasses such as torch's TorchVersion become numpy unicode arrays
            f.attrs[k] = v
        f.create_group("layers")
        f.create_dataset("token_ids", data=ids.astype(np.int32), compression=self.compression)
        f.flush()

    def _drop_incomplete(self) -> None:
        g = self._f["layers"]
        for key in list(g):
            if not bool(g[key].attrs.get("complete", False)):
                del g[key]
        self._f.attrs["complete"] = False
        self._f.flush()

    # -- API ----------------------------------------------------------------------------------------------

    @property
    def complete_layers(self) -> list[int]:
        g = self._f["layers"]
        return sorted(int(k) for k in g if bool(g[k].attrs.get("complete", False)))

    @property
    def pending_layers(self) -> list[int]:
        done = set(self.complete_layers)
        return [i for i in self.layers if i not in done]

    def write_layer(self, call) -> None:
        """Store one ``LayerRecord`` (from the hook); the group is marked complete only after its data."""
        if call.layer not in self.layers:
            raise ValueError(f"layer {call.layer} was not requested for {self.path} ({self.layers})")
        self._check_space(call)
        self._guard(lambda: self._write_layer(call))
        self._written += 1
        if self._fail_after is not None and self._written >= self._fail_after:
            raise RuntimeError(f"simulated crash after {self._written} layer(s) (test hook)")

    def _check_space(self, call) -> None:
        """Refuse a layer that may not fit (free disk, file-size limit) before touching the file.

        HDF5 does not survive a failed write well (h5py can crash in the flush that follows), so running out
        of space is detected up front; the file then still holds every layer completed so far.
        """
        need = sum(getattr(call, n).numel() * getattr(call, n).element_size() for n in "qkv") + (1 << 20)
        free = shutil.disk_usage(self.path.parent).free
        try:
            import resource

            soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
            if soft != resource.RLIM_INFINITY:
                free = min(free, soft - self.path.stat().st_size)
        except (ImportError, OSError, ValueError):
            pass
        if free < need:
            self._abort()
            raise CaptureWriteError(
                f"not enough space to write layer {call.layer} to {self.path}: about {need / 1e6:.1f} MB needed, "
                f"{max(free, 0) / 1e6:.1f} MB available (disk full or file-size limit). Layers completed so far "
                "are kept; free space and rerun the same command to resume")

    def _write_layer(self, call) -> None:
        layers = self._f["layers"]
        key = layer_key(call.layer)
        if key in layers:
            del layers[key]
        g = layers.create_group(key)
        g.attrs["complete"] = False
        g.attrs["layer"] = int(call.layer)
        g.attrs["layer_type"] = str(call.layer_type)
        g.attrs["sm_scale"] = float(call.sm_scale)
        g.attrs["causal"] = bool(call.causal)
        g.attrs["window"] = -1 if call.window is None else int(call.window)
        g.attrs["q_heads"] = np.asarray(call.q_heads, dtype=np.int64)
        g.attrs["kv_heads"] = np.asarray(call.kv_heads, dtype=np.int64)
        g.attrs["kv_head_of_q"] = np.asarray(call.kv_head_of_q, dtype=np.int64)
        g.attrs["num_q_heads"] = int(call.num_q_heads)
        g.attrs["num_kv_heads"] = int(call.num_kv_heads)
        _boundary(f"layer:{call.layer}:group")
        for name in ("q", "k", "v"):
            arr, dtype = _to_numpy(getattr(call, name))
            ds = g.create_dataset(name, shape=arr.shape, dtype=arr.dtype, chunks=_chunks(arr.shape, arr.itemsize),
                                  compression=self.compression, shuffle=True)
            ds.attrs["dtype"] = dtype
            ds.attrs["amax"] = float(np.abs(from_stored(arr, dtype).float().numpy()).max()) if arr.size else 0.0
            ds.attrs["sha256"] = values_sha256(arr)
            half = arr.shape[2] // 2  # written in two halves along the sequence: a named point mid-dataset
            if half:
                ds[:, :, :half] = arr[:, :, :half]
                self._f.flush()
            _boundary(f"layer:{call.layer}:{name}:half")
            ds[:, :, half:] = arr[:, :, half:]
        self._f.flush()  # data first ...
        _boundary(f"layer:{call.layer}:data")
        g.attrs["complete"] = True  # ... then the flag, so no half-written layer ever looks complete
        self._f.flush()
        _boundary(f"layer:{call.layer}:flag")

    def finish(self) -> None:
        """Mark the file complete if every requested layer is; close it."""
        if self._f is None:
            return
        pending = self.pending_layers
        if pending:
            raise RuntimeError(f"{self.path}: layers {pending} were not written")
        _boundary("finish:layers")
        self._guard(lambda: (self._f.attrs.__setitem__("complete", True), self._f.flush()))
        _boundary("finish:flag")
        self.close()

    def close(self) -> None:
        if self._f is not None:
            f, self._f = self._f, None
            try:
                f.close()
            except OSError as e:
                raise CaptureWriteError(f"could not close {self.path} ({e}); is the disk full?") from e

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:
            with contextlib.suppress(Exception):
                self.close()
        return False


def _norm(v):
    if isinstance(v, np.ndarray):
        return [_norm(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, bytes):
        return v.decode()
    return v
