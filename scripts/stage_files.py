"""Split large files into chunks for a machine that takes a limited size per transfer, and join them there.

The GPU machine gets at most 64 MiB per call, the working tree included, and the three models' GGUF files are
98, 253 and 491 MB. ``split`` cuts files into chunks of at most ``--chunk-mb`` under ``--out`` (git-ignored) and
writes ``manifest.json`` with each file's size, sha256 and parts; each call carries one chunk, and the command on
the other side copies it to a folder that lives as long as the machine. ``join`` puts the parts together there,
checks each file's size and sha256 against the manifest before anything reads it, and moves it into place
atomically (a partial or corrupt file is never left under its final name). A file it verified is noted in
``<into>/.joined.json`` with its size and mtime; a later join (every call runs one) takes it without hashing it again
while both match.

    python3 scripts/stage_files.py split --out .stage --chunk-mb 56 FILE...
    python3 scripts/stage_files.py join --parts /tmp/stage --into "$ZYFA_CACHE/models" [--manifest M]
    python3 scripts/stage_files.py plan --out .stage           # which chunk each call carries, in order
    python3 scripts/stage_files.py calls --out .stage-all --into . [--first FILE...]   # .stage-01/, .stage-02/, ...

``calls`` makes every call's folder before the first call (``<into>/.stage-NN/``: the manifest and that call's
parts, hard links where the file system allows; the small parts share a call up to one chunk's size; ``--first``
files, e.g. a text or a cut run's ``.partial``, ride with the first call), so the calls follow one another with
nothing to do here between them: call N carries ``.stage-NN`` (``carry``) and runs with ``STAGE=.stage-NN``
(scripts/longctx_h200_call.sh). A machine given back after 30 idle seconds loses what the earlier calls brought.

For the registry models, the pinned sha256 of ``zyfa.capture.models.MODELS`` is checked too (``join`` refuses a file
whose name is a registry model's and whose hash is not the pinned one).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_BLOCK = 1 << 20


def sha256_file(path: Path) -> str:
    """The file's sha256, read in blocks (also the CuTe wheels' manifest: scripts/stage_cute_wheels.py)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_BLOCK):
            h.update(chunk)
    return h.hexdigest()


def split(files: list[Path], out: Path, chunk_mb: float) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    size = int(chunk_mb * 1e6)
    manifest = {"chunk_bytes": size, "files": []}
    for f in files:
        parts = []
        with f.open("rb") as src:
            k = 0
            while data := src.read(size):
                name = f"{f.name}.part{k:03d}"
                (out / name).write_bytes(data)
                parts.append({"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
                k += 1
        manifest["files"].append({"name": f.name, "bytes": f.stat().st_size, "sha256": sha256_file(f), "parts": parts})
        print(f"{f.name}: {len(parts)} parts", file=sys.stderr)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _pinned() -> dict[str, str]:
    try:
        from zyfa.capture.models import MODELS
    except ImportError:  # the project is not importable there: the manifest's hashes still hold
        return {}
    return {m.file_name: m.file_sha256 for m in MODELS.values()}


JOINED = ".joined.json"  # in --into: each file this join verified, with its size and mtime then


def _joined(into: Path) -> dict:
    try:
        return json.loads((into / JOINED).read_text())
    except (OSError, ValueError):
        return {}


def _record(into: Path, name: str, sha256: str) -> None:
    """Note that ``into/name`` was verified (sha256) as it is now: a later join of the same file, with the same size
    and mtime, takes it without hashing it again (the 1.1 GB model took ~3 s of device time a call)."""
    seen = _joined(into)
    st = (into / name).stat()
    seen[name] = {"sha256": sha256, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    tmp = into / (JOINED + ".tmp")
    tmp.write_text(json.dumps(seen, indent=1) + "\n")
    os.replace(tmp, into / JOINED)


def join(parts: Path, into: Path, manifest: Path | None) -> int:
    man = json.loads((manifest or parts / "manifest.json").read_text())
    into.mkdir(parents=True, exist_ok=True)
    pinned = _pinned()
    seen = _joined(into)
    bad = 0
    for f in man["files"]:
        dest = into / f["name"]
        st = dest.stat() if dest.is_file() else None
        if st is not None and st.st_size == f["bytes"]:
            if seen.get(f["name"]) == {"sha256": f["sha256"], "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}:
                print(f"{f['name']}: already in place (verified when joined)", file=sys.stderr)
                continue
            if sha256_file(dest) == f["sha256"]:
                _record(into, f["name"], f["sha256"])
                print(f"{f['name']}: already in place", file=sys.stderr)
                continue
        missing = [p["name"] for p in f["parts"] if not (parts / p["name"]).is_file()]
        if missing:
            print(f"{f['name']}: {len(missing)} of {len(f['parts'])} parts missing (first {missing[0]})",
                  file=sys.stderr)
            bad += 1
            continue
        tmp = dest.with_name(dest.name + ".joining")
        h = hashlib.sha256()
        with tmp.open("wb") as out:
            for p in f["parts"]:
                data = (parts / p["name"]).read_bytes()
                if hashlib.sha256(data).hexdigest() != p["sha256"]:
                    raise SystemExit(f"{p['name']}: sha256 differs from the manifest (a corrupt transfer)")
                h.update(data)
                out.write(data)
        want = pinned.get(f["name"], f["sha256"])
        if h.hexdigest() != f["sha256"] or h.hexdigest() != want:
            tmp.unlink()
            raise SystemExit(f"{f['name']}: sha256 {h.hexdigest()} is not the pinned {want}")
        os.replace(tmp, dest)
        _record(into, f["name"], want)
        print(f"{f['name']}: joined and verified ({f['bytes']} bytes, sha256 {want[:12]}...)", file=sys.stderr)
    return 1 if bad else 0


def plan(out: Path) -> None:
    man = json.loads((out / "manifest.json").read_text())
    for f in man["files"]:
        for p in f["parts"]:
            print(out / p["name"])


CALL_PREFIX = ".stage-"


def calls(out: Path, into: Path, first: list[Path]) -> list[Path]:
    """One folder per device call (module docstring); returns them in call order. Folders of an earlier ``calls``
    under ``into`` are replaced."""
    man = json.loads((out / "manifest.json").read_text())
    limit = int(man["chunk_bytes"])
    groups: list[list[str]] = []
    size = 0
    for f in man["files"]:
        for p in f["parts"]:
            if not groups or size + p["bytes"] > limit:  # a new call
                groups.append([])
                size = 0
            groups[-1].append(p["name"])
            size += p["bytes"]
    for old in sorted(into.glob(CALL_PREFIX + "[0-9][0-9]")):
        shutil.rmtree(old)
    made = []
    for k, names in enumerate(groups or [[]], start=1):
        d = into / f"{CALL_PREFIX}{k:02d}"
        d.mkdir(parents=True)
        for src in [out / "manifest.json", *(out / n for n in names), *(first if k == 1 else [])]:
            try:
                os.link(src, d / src.name)
            except OSError:  # another file system, or links not allowed: a copy
                shutil.copy2(src, d / src.name)
        made.append(d)
        print(f"{d}: {', '.join(names) or 'no parts'}", file=sys.stderr)
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("files", nargs="+", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--chunk-mb", type=float, default=56.0)
    j = sub.add_parser("join")
    j.add_argument("--parts", type=Path, required=True)
    j.add_argument("--into", type=Path, required=True)
    j.add_argument("--manifest", type=Path, default=None)
    p = sub.add_parser("plan")
    p.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("calls")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--into", type=Path, default=Path("."))
    c.add_argument("--first", type=Path, nargs="*", default=[])
    a = ap.parse_args(argv)
    for f in [*getattr(a, "files", []), *getattr(a, "first", [])]:
        if not f.is_file():
            print(f"stage_files: {f}: no such file", file=sys.stderr)
            return 2
    if a.cmd == "split":
        split(a.files, a.out, a.chunk_mb)
        return 0
    if a.cmd == "join":
        return join(a.parts, a.into, a.manifest)
    if a.cmd == "calls":
        if not (a.out / "manifest.json").is_file():
            print(f"stage_files: {a.out}: no manifest.json (run split first)", file=sys.stderr)
            return 2
        calls(a.out, a.into, a.first)
        return 0
    plan(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
