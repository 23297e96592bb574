"""The HDF5 store of captured Q/K/V: schema, writer, validating reader.

The schema (``zyfa-capture`` version 1) is documented in ``datasets/README.md``. In short: root attributes
hold the provenance, ``/token_ids`` the input, and one group per layer, ``/layers/NNN``, holds ``q``, ``k``,
``v`` as exact values (float32, float16, or bfloat16 kept as its uint16 bits; the ``dtype`` attribute of each
dataset says which), chunked and gzip-compressed, with the attention's attributes.

Crash safety: the file is built under a temporary name (root attributes and token ids, no layer) and renamed
into place, so the final name never holds a half-made root. A layer group gets ``complete = True`` only after
its three datasets are written and flushed, and the file is flushed again after that; the root gets
``complete = True`` only after every requested layer is complete. A rerun of the same capture skips complete
layers and rewrites incomplete ones. A write error (full disk) becomes a ``CaptureWriteError`` naming the file;
layers already complete stay readable. Each dataset records the sha256 of its values, and ``read_capture``
checks it (files written before this attribute existed are read without it) and refuses NaN/Inf values, naming
file, layer and tensor.

Exposed: ``CaptureWriter``, ``read_capture``, ``open_capture``, ``CaptureInfo``, ``LayerRecord``,
``check_writable``, ``SCHEMA``, ``SCHEMA_VERSION``, ``CaptureFormatError``, ``CaptureMismatchError``,
``CaptureWriteError``, ``KILL_AT_ENV`` (the crash tests' fault injection).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import torch
from zyfa.capture.record import LayerRecord
from zyfa.capture.version import git_label

SCHEMA = "zyfa-capture"
SCHEMA_VERSION = 1

# root attributes every capture must have (the writer sets more when it knows them)
REQUIRED_ROOT = (
    "schema", "schema_version", "complete", "model", "model_source", "model_package", "model_sha256",
    "transformers_version", "torch_version", "text_source", "text_sha256", "seq_len", "batch", "dtype",
    "layers", "q_heads", "num_layers", "num_q_heads", "num_kv_heads", "head_dim", "created", "git_commit",
)
REQUIRED_LAYER = (
    "complete", "layer", "layer_type", "sm_scale", "causal", "window", "q_heads", "kv_heads", "kv_head_of_q",
    "num_q_heads", "num_kv_heads",
)
# root attributes that identify a capture: a rerun resumes only if they all match
IDENTITY = ("model", "model_sha256", "text_source", "text_sha256", "window_offset", "seq_len", "dtype",
            "layers", "q_heads")

_STORED = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class CaptureFormatError(ValueError):
    """The file is not a readable, valid capture of this schema version."""


class CaptureMismatchError(ValueError):
    """The output file exists and holds a different capture."""


class CaptureWriteError(OSError):
    """Writing failed (disk full, file too large, I/O error); complete layers were kept."""


def layer_key(layer: int) -> str:
    return f"{layer:03d}"


def _to_numpy(t: torch.Tensor) -> tuple[np.ndarray, str]:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    if t.dtype in (torch.float32, torch.float16):
        return t.numpy(), str(t.dtype).removeprefix("torch.")
    raise TypeError(f"cannot store {t.dtype} exactly; capture in fp32 or bf16")


def _digest(a: np.ndarray) -> str:
    """sha256 of an array's values (C order, stored dtype): written with each dataset, checked as it loads."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _to_torch(a: np.ndarray, dtype: str) -> torch.Tensor:
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def _attr(v):
    """h5py attribute value -> plain Python."""
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray):
        return [_attr(x) for x in v.tolist()]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _open_h5(path: Path, mode: str) -> h5py.File:
    if not path.exists():
        raise FileNotFoundError(f"no capture file at {path}")
    try:
        return h5py.File(path, mode)
    except OSError as e:
        if "unable to lock file" in str(e):
            raise CaptureFormatError(
                f"{path} is locked: another process (a capture still running?) has it open for writing") from None
        raise CaptureFormatError(
            f"{path} cannot be read as an HDF5 file (truncated or corrupted? an interrupted copy?): {e}") from None


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_types(a: dict, where: str, schema: dict[str, str]) -> None:
    """CaptureFormatError naming ``where`` and the attribute unless each attribute of ``schema`` has its type:
    ``bool`` (a real boolean, or the integer 0 or 1), ``int``, ``posint`` (>= 1), ``window`` (>= 1, or -1 for
    none), ``ints`` (a list of integers), ``scale`` (a finite float > 0)."""
    for name, kind in schema.items():
        if name not in a:
            continue
        v = a[name]
        if kind == "bool":
            ok = isinstance(v, (bool, np.bool_)) or (_is_int(v) and v in (0, 1))
            want = "true/false (or 0/1)"
        elif kind == "int":
            ok, want = _is_int(v), "an integer"
        elif kind == "posint":
            ok, want = _is_int(v) and v >= 1, "an integer >= 1"
        elif kind == "window":
            ok, want = _is_int(v) and (v >= 1 or v == -1), "an integer >= 1 (or -1 for no window)"
        elif kind == "ints":
            ok = isinstance(v, list) and all(_is_int(x) for x in v)
            want = "a list of integers"
        else:  # scale
            ok = (isinstance(v, (float, int, np.floating, np.integer)) and not isinstance(v, (bool, np.bool_))
                  and bool(np.isfinite(v)) and v > 0)
            want = "a finite number > 0"
        if not ok:
            raise CaptureFormatError(f"{where}: attribute {name!r} must be {want}, got {v!r} "
                                     f"({type(v).__name__})")


# The types of the attributes the reader uses (see _check_types); a wrong one is refused, never coerced.
ROOT_TYPES = {"complete": "bool", "schema_version": "int", "seq_len": "posint", "batch": "posint",
              "num_layers": "posint", "num_q_heads": "posint", "num_kv_heads": "posint", "head_dim": "posint",
              "layers": "ints", "q_heads": "ints"}
LAYER_TYPES = {"complete": "bool", "layer": "int", "sm_scale": "scale", "causal": "bool", "window": "window",
               "q_heads": "ints", "kv_heads": "ints", "kv_head_of_q": "ints", "num_q_heads": "posint",
               "num_kv_heads": "posint"}


def _check_stored_here(f: h5py.File | h5py.Group, name: str, where: str) -> None:
    """Refuse a member that is not an object stored in this file: a soft or external link, or a dataset whose
    data lives elsewhere (external raw storage, a virtual dataset)."""
    link = f.get(name, getlink=True)
    if isinstance(link, h5py.SoftLink):
        raise CaptureFormatError(f"{where}/{name} is a soft link to {link.path}; a capture's datasets must be "
                                 "stored in it, not linked")
    if isinstance(link, h5py.ExternalLink):
        raise CaptureFormatError(f"{where}/{name} is an external link to {link.filename}:{link.path}; a "
                                 "capture's datasets must be stored in it, not linked")
    obj = f.get(name)
    if isinstance(obj, h5py.Dataset):
        if obj.external:
            raise CaptureFormatError(f"{where}/{name} keeps its data in external file(s) "
                                     f"{', '.join(str(e[0]) for e in obj.external)}; a capture's datasets must be "
                                     "stored in it")
        if obj.is_virtual:
            raise CaptureFormatError(f"{where}/{name} is a virtual dataset (its data lives in other datasets or "
                                     "files); a capture's datasets must be stored in it")


def _validate_root(f: h5py.File, path: Path) -> dict:
    schema = _attr(f.attrs.get("schema"))
    if schema != SCHEMA:
        raise CaptureFormatError(
            f"{path} is an HDF5 file but not a ZYFA capture: root attribute 'schema' is {schema!r}, "
            f"expected {SCHEMA!r}")
    version = _attr(f.attrs.get("schema_version"))
    if version != SCHEMA_VERSION:
        raise CaptureFormatError(
            f"{path} has {SCHEMA} schema version {version!r}; this reader reads version {SCHEMA_VERSION} "
            "(regenerate the file with this version of zyfa, or use the matching zyfa version)")
    missing = [a for a in REQUIRED_ROOT if a not in f.attrs]
    if missing:
        raise CaptureFormatError(f"{path}: root attributes missing: {', '.join(missing)}")
    attrs = {k: _attr(v) for k, v in f.attrs.items()}
    _check_types(attrs, f"{path} (root)", ROOT_TYPES)
    for name in ("token_ids", "layers"):
        if f.get(name, getlink=True) is not None:  # a dangling link too (``name in f`` is False for one)
            _check_stored_here(f, name, str(path) + ":")
    if "token_ids" not in f or tuple(f["token_ids"].shape) != (attrs["batch"], attrs["seq_len"]):
        got = tuple(f["token_ids"].shape) if "token_ids" in f else None
        raise CaptureFormatError(
            f"{path}: dataset token_ids has shape {got}, expected ({attrs['batch']}, {attrs['seq_len']})")
    if attrs["dtype"] not in _STORED:
        raise CaptureFormatError(f"{path}: unknown dtype {attrs['dtype']!r}")
    return attrs


def _validate_layer(g: h5py.Group, root: dict, path: Path) -> dict:
    where = f"{path}:{g.name}"
    if not bool(g.attrs.get("complete", False)):
        # a layer a crash interrupted: whatever it holds is ignored, and a rerun rewrites it
        return {"complete": False, "layer": int(g.name.rsplit("/", 1)[-1])}
    missing = [a for a in REQUIRED_LAYER if a not in g.attrs]
    if missing:
        raise CaptureFormatError(f"{where}: layer attributes missing: {', '.join(missing)}")
    a = {k: _attr(v) for k, v in g.attrs.items()}
    _check_types(a, where, LAYER_TYPES)
    b, s = root["batch"], root["seq_len"]
    nq, nkv = len(a["q_heads"]), len(a["kv_heads"])
    for name, heads in (("q", nq), ("k", nkv), ("v", nkv)):
        if g.get(name, getlink=True) is not None:
            _check_stored_here(g, name, where)
        if name not in g:
            raise CaptureFormatError(f"{where}: dataset {name} missing")
        ds = g[name]
        if not isinstance(ds, h5py.Dataset):
            raise CaptureFormatError(f"{where}/{name} is a {type(ds).__name__}, not a dataset")
        shape = tuple(ds.shape)
        if len(shape) != 4 or shape[:3] != (b, heads, s):
            raise CaptureFormatError(f"{where}/{name}: shape {shape}, expected ({b}, {heads}, {s}, head_dim)")
        dt = _attr(ds.attrs.get("dtype"))
        if dt not in _STORED or ds.dtype != np.dtype(_STORED[dt]):
            raise CaptureFormatError(f"{where}/{name}: dtype attribute {dt!r} does not match storage {ds.dtype}")
    if len(a["kv_head_of_q"]) != nq or any(not 0 <= i < nkv for i in a["kv_head_of_q"]):
        raise CaptureFormatError(f"{where}: kv_head_of_q {a['kv_head_of_q']} inconsistent with the heads")
    return a


@dataclass
class CaptureInfo:
    """Validated metadata of a capture file."""

    path: Path
    attrs: dict
    layers: dict[int, dict]  # layer index -> layer attributes, for every group present
    complete: bool
    # complete layer index -> {"q"|"k"|"v": (stored shape, bytes per stored value)}: what reading it allocates
    datasets: dict[int, dict[str, tuple[tuple[int, ...], int]]] = field(default_factory=dict)

    def read_bytes(self, layer: int) -> int:
        """Bytes of the stored q, k, v of ``layer`` (the arrays :func:`read_capture` reads whole)."""
        return sum(int(np.prod(shape, dtype=object)) * size for shape, size in self.datasets[layer].values())

    @property
    def complete_layers(self) -> list[int]:
        return sorted(i for i, a in self.layers.items() if a["complete"])


def open_capture(path: str | os.PathLike) -> CaptureInfo:
    """Validate a capture file's schema and structure (not the data) and return its metadata."""
    path = Path(path)
    with _open_h5(path, "r") as f:
        try:
            root = _validate_root(f, path)
            layers, datasets = {}, {}
            for key in f.get("layers", []):
                _check_stored_here(f["layers"], key, f"{path}:/layers")
                g = f["layers"][key]  # not .items(): it turns a dangling link into None instead of a KeyError
                if not isinstance(g, h5py.Group):
                    raise CaptureFormatError(f"{path}: layers/{key} is a {type(g).__name__}, not a layer group")
                a = _validate_layer(g, root, path)
                layers[int(a["layer"])] = a
                if a["complete"]:
                    datasets[int(a["layer"])] = {n: (tuple(int(x) for x in g[n].shape), int(g[n].dtype.itemsize))
                                                 for n in ("q", "k", "v")}
                if layer_key(int(a["layer"])) != key:
                    raise CaptureFormatError(f"{path}: group layers/{key} holds layer {a['layer']}")
        except (OSError, KeyError) as e:
            raise CaptureFormatError(f"{path}: unreadable structure (truncated or corrupted?): {e}") from None
    if root["complete"]:
        lost = [i for i in root["layers"] if not layers.get(i, {}).get("complete")]
        if lost:
            raise CaptureFormatError(f"{path} is marked complete but layers {lost} are missing or incomplete")
    return CaptureInfo(path=path, attrs=root, layers=layers, complete=bool(root["complete"]), datasets=datasets)


def read_capture(
    path: str | os.PathLike,
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    *,
    allow_incomplete: bool = False,
) -> Iterator[LayerRecord]:
    """Yield the validated layers of a capture file as ``LayerRecord``s, in layer order.

    Args:
        layers: layer indices to read (None: all complete layers); asking for an absent one is an error.
        heads: the model's query-head indices to read (None: all stored); each must have been captured.
            K/V come with the KV heads those query heads use; if the selection does not form equal groups,
            K/V are expanded to one head per query head so that the GQA convention holds.
        allow_incomplete: read the complete layers of an interrupted capture instead of raising.

    Raises: CaptureFormatError (truncated, foreign, wrong version, inconsistent, incomplete, or a NaN/Inf
        value in a tensor read: the message names the file, layer, tensor, head and token), FileNotFoundError.
    """
    info = open_capture(path)
    path = info.path
    if not info.complete and not allow_incomplete:
        raise CaptureFormatError(
            f"{path} is an incomplete capture (complete layers: {info.complete_layers or 'none'}); rerun the "
            "capture command that made it to resume, or pass allow_incomplete=True")
    want = info.complete_layers if layers is None else sorted(set(int(i) for i in layers))
    absent = [i for i in want if i not in info.complete_layers]
    if absent:
        raise CaptureFormatError(f"{path}: layers {absent} not captured; complete layers: {info.complete_layers}")
    with _open_h5(path, "r") as f:
        for i in want:
            a = info.layers[i]
            g = f["layers"][layer_key(i)]
            try:
                arrays = {n: g[n][()] for n in ("q", "k", "v")}
            except OSError as e:
                raise CaptureFormatError(f"{path}: layer {i} data unreadable (truncated or corrupted?): {e}") \
                    from None
            for n, arr in arrays.items():
                want = _attr(g[n].attrs.get("sha256"))
                if want is not None and _digest(arr) != want:
                    raise CaptureFormatError(
                        f"{path}: layer {i} tensor {n} does not match the sha256 recorded when it was written "
                        "(half-written or altered); recapture it (--overwrite)")
            q, k, v = (_to_torch(arrays[n], _attr(g[n].attrs["dtype"])) for n in ("q", "k", "v"))
            q_heads, kv_heads, kv_of_q = tuple(a["q_heads"]), tuple(a["kv_heads"]), list(a["kv_head_of_q"])
            if heads is not None:
                sel = sorted(set(int(h) for h in heads))
                missing = [h for h in sel if h not in q_heads]
                if missing:
                    raise CaptureFormatError(f"{path}: layer {i} has no query heads {missing}; captured: {q_heads}")
                rows = [q_heads.index(h) for h in sel]
                q = q[:, rows]
                used = sorted({kv_of_q[r] for r in rows})
                k, v = k[:, used], v[:, used]
                kv_heads = tuple(kv_heads[u] for u in used)
                kv_of_q = [used.index(kv_of_q[r]) for r in rows]
                q_heads = tuple(sel)
            for name, t, rows_of in (("q", q, q_heads), ("k", k, kv_heads), ("v", v, kv_heads)):
                _check_finite(t, path, i, name, rows_of)
            group = len(q_heads) // len(kv_heads)
            if len(q_heads) % len(kv_heads) or kv_of_q != [r // group for r in range(len(q_heads))]:
                # not equal consecutive groups: one KV head per query head
                k, v = k[:, kv_of_q], v[:, kv_of_q]
                kv_heads = tuple(kv_heads[j] for j in kv_of_q)
                kv_of_q = list(range(len(q_heads)))
            yield LayerRecord(
                layer=i, layer_type=a["layer_type"], q=q, k=k, v=v, sm_scale=float(a["sm_scale"]),
                causal=bool(a["causal"]), window=None if a["window"] < 0 else int(a["window"]),
                q_heads=q_heads, kv_heads=kv_heads, kv_head_of_q=tuple(kv_of_q),
                num_q_heads=int(a["num_q_heads"]), num_kv_heads=int(a["num_kv_heads"]),
                model=info.attrs["model"], path=str(path), meta=info.attrs,
            )


def _check_finite(t: torch.Tensor, path: Path, layer: int, name: str, heads: Sequence[int]) -> None:
    """Raise CaptureFormatError naming file, layer, tensor and the first bad value's head and token."""
    bad = ~torch.isfinite(t)
    if not bool(bad.any()):
        return
    n_nan, n_inf = int(torch.isnan(t).sum()), int(bad.sum()) - int(torch.isnan(t).sum())
    b, h, s, _ = (int(x) for x in bad.nonzero()[0])
    raise CaptureFormatError(
        f"{path}: layer {layer} tensor {name} holds {n_nan} NaN and {n_inf} Inf values (first at batch {b}, head "
        f"{heads[h]}, token {s}); the model overflowed in this dtype or the file was altered: recapture "
        "(e.g. with --dtype fp32)")


def read_token_ids(path: str | os.PathLike) -> torch.Tensor:
    info = open_capture(path)
    with _open_h5(info.path, "r") as f:
        return torch.from_numpy(f["token_ids"][()].astype(np.int64))


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
            with _open_h5(self.path, "r") as f:
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
            ds.attrs["amax"] = float(np.abs(_to_torch(arr, dtype).float().numpy()).max()) if arr.size else 0.0
            ds.attrs["sha256"] = _digest(arr)
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
