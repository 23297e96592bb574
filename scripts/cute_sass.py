"""The CuTe DSL kernel's SASS, per form and shape, without a GPU: the cubin's sha256, its registers and stack, and per
KV-tile loop the instructions (and those of its turn, BAR.SYNC to BAR.ARV), wgmma and local-memory accesses, and the
instructions after the last loop (the epilogue, with the last tile's P·V and flush). A change that must not move a
binary is checked by its sha256.

    python scripts/cute_sass.py SPEC [SPEC ...]          # SPEC: SHAPE/MASK/RECIPE[/FORM-JSON]
    python scripts/cute_sass.py hd128/causal/zyfa-hopper 'hd128/causal/zyfa-hopper/{"EPILOGUE": 0}'

SHAPE: hd64, hd128, hd256 or mla; MASK: causal or non-causal; FORM-JSON: the kernel's form overrides
(:func:`zyfa.kernels.cute_plan.cute_config`). ``--shape b,h,h_kv,s_q,s_k`` (default 1,16,16,32768,32768, the
bench's hd128 case) sets the lengths. Needs nvidia-cutlass-dsl importable and cuobjdump on PATH (docs/KERNEL.md).
``sass_kv_loops`` is the loop finder tests/kernels/test_cute_compile.py uses.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

DIMS = {"hd64": (64, 64), "hd128": (128, 128), "hd256": (256, 256), "mla": (192, 128)}


def instructions(sass: str) -> list[tuple[int, str]]:
    """(address, text) of every instruction of a cuobjdump -sass listing."""
    return [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]


def _loop_spans(ins: list[tuple[int, str]]) -> list[tuple[int, int]]:
    at = {a: i for i, (a, _) in enumerate(ins)}
    spans = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"\bBRA\s+(?:`\(.*?\)\s*)?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in at:
            body = [t for _, t in ins[at[int(m.group(1), 16)]:i + 1]]
            if any("GMMA" in t for t in body) and not any("EXIT" in t.split() for t in body):
                spans.append((at[int(m.group(1), 16)], i))
    return innermost(spans)


def innermost(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (first, last) spans that hold no other: a loop around KV loops (the PERSISTENT form's loop over work
    items) is not one of them."""
    return [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]


def sass_kv_loops(sass: str) -> list[list[str]]:
    """The SASS loops that issue wgmma (a backward branch to an address before it), leaving out the mbarrier retry
    paths after the kernel's exits, whose branches jump back over whole regions (their bodies hold an EXIT), and any
    loop around such loops (``PERSISTENT``'s loop over work items)."""
    ins = instructions(sass)
    return [[t for _, t in ins[lo:hi + 1]] for lo, hi in _loop_spans(ins)]


def turn_length(body: list[str]) -> int | None:
    """Instructions of a KV loop's turn: from the ``BAR.SYNC`` that waits for it to the ``BAR.ARV`` that hands it to
    the other warpgroup, both counted (what the other warpgroup waits behind); None for a loop without a turn."""
    start = next((i for i, t in enumerate(body) if t.startswith("BAR.SYNC")), None)
    if start is None:
        return None
    end = next((i for i in range(start, len(body)) if body[i].startswith("BAR.ARV")), None)
    return None if end is None else end - start + 1


def after_last_loop(sass: str) -> int:
    """Instructions from the end of the last KV loop to the kernel's last EXIT."""
    ins = instructions(sass)
    last = max(hi for _, hi in _loop_spans(ins))
    return max(i for i, (_, t) in enumerate(ins) if "EXIT" in t.split()) - last


def _cuobjdump(option: str, cubin: str) -> str:
    return subprocess.run(["cuobjdump", option, cubin], capture_output=True, text=True, check=True).stdout


def report(spec: str, shape: dict) -> str:
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from zyfa.kernels.attention_cute import compile_for

    dims, mask, recipe, *form = spec.split("/", 3)
    if dims not in DIMS or mask not in ("causal", "non-causal"):
        raise SystemExit(f"cute_sass: {spec!r}: expected SHAPE/MASK/RECIPE[/FORM-JSON] (SHAPE in {', '.join(DIMS)})")
    with tempfile.TemporaryDirectory() as out:
        compile_for(**shape, d_qk=DIMS[dims][0], d_v=DIMS[dims][1], causal=mask == "causal", recipe=recipe,
                    config=json.loads(form[0]) if form else None, options=f"--keep-cubin --dump-dir={out}")
        cubin, = glob.glob(f"{out}/*.sm_90a.cubin")
        digest = hashlib.sha256(Path(cubin).read_bytes()).hexdigest()
        usage = re.search(r"REG:(\d+) STACK:(\d+)", _cuobjdump("--dump-resource-usage", cubin))
        sass = _cuobjdump("-sass", cubin)
    loops = "; ".join(f"{len(b)} instr ({turn_length(b)} in the turn), {sum('GMMA' in t for t in b)} wgmma, "
                      f"{sum(t.startswith('STL') for t in b)} STL, {sum(t.startswith('LDL') for t in b)} LDL"
                      for b in sass_kv_loops(sass))
    return (f"{spec}: sha256 {digest[:12]}, REG {usage.group(1)}, STACK {usage.group(2)}; KV loops: {loops}; "
            f"after the last loop: {after_last_loop(sass)} instr")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", nargs="+")
    ap.add_argument("--shape", default="1,16,16,32768,32768", help="b,h,h_kv,s_q,s_k")
    a = ap.parse_args(argv)
    parts = a.shape.split(",")
    if len(parts) != 5 or not all(x.isdigit() and int(x) > 0 for x in parts):
        raise SystemExit(f"cute_sass: --shape takes five positive ints b,h,h_kv,s_q,s_k, got {a.shape!r}")
    shape = dict(zip(("b", "h", "h_kv", "s_q", "s_k"), map(int, parts), strict=True))
    for spec in a.spec:
        print(report(spec, shape), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
