"""The HDF5 store of captured Q/K/V: schema and validating reader (the writer is :mod:`zyfa.capture.writer`).

The schema (``zyfa-capture`` version 1) is documented in ``datasets/README.md``. In short: root attributes
hold the provenance, ``/token_ids`` the input, and one group per layer, ``/layers/NNN``, holds ``q``, ``k``,
``v`` as exact values (float32, float16, or bfloat16 kept as its uint16 bits; the ``dtype`` attribute of each
dataset says which), chunked and gzip-compressed, with the attention's attributes.

What the reader relies on from the writer: a layer group is ``complete`` only after its three datasets are
written and flushed, and the root only after every requested layer (a half-written layer is never read as
complete). Each dataset records the sha256 of its values, and ``read_capture`` checks it (files written before
this attribute existed are read without it) and refuses NaN/Inf values, naming file, layer and tensor.

Exposed: ``read_capture``, ``open_capture``, ``read_token_ids``, ``CaptureInfo``, ``LayerRecord``, ``SCHEMA``,
``SCHEMA_VERSION``, ``IDENTITY``, ``CaptureFormatError``, ``CaptureMismatchError``, ``CaptureWriteError``, and the
encoding both sides share: ``layer_key``, ``from_stored``, ``values_sha256``, ``open_h5``. The writer
(:mod:`zyfa.capture.writer`) exposes ``CaptureWriter``, ``check_writable`` and ``KILL_AT_ENV``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import torch
from zyfa.capture.record import LayerRecord

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


def values_sha256(a: np.ndarray) -> str:
    """sha256 of an array's values (C order, stored dtype): written with each dataset, checked as it loads."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def from_stored(a: np.ndarray, dtype: str) -> torch.Tensor:
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


def open_h5(path: Path, mode: str) -> h5py.File:
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
    with open_h5(path, "r") as f:
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
    with open_h5(path, "r") as f:
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
                if want is not None and values_sha256(arr) != want:
                    raise CaptureFormatError(
                        f"{path}: layer {i} tensor {n} does not match the sha256 recorded when it was written "
                        "(half-written or altered); recapture it (--overwrite)")
            q, k, v = (from_stored(arrays[n], _attr(g[n].attrs["dtype"])) for n in ("q", "k", "v"))
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
    with open_h5(info.path, "r") as f:
        return torch.from_numpy(f["token_ids"][()].astype(np.int64))
