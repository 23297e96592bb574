"""CPU tests that compile the CuTe FP8 kernel for sm_90a (no GPU) and check properties of its PTX that could fail.

Needs nvidia-cutlass-dsl 4.8.1 importable (skipped with the reason otherwise; docs/KERNEL.md has the environment).
Each compile takes a few seconds (hd128, 1.5-3.5 s on 2 busy cores).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.load_file import load_script
from zyfa.kernels.attention_cute import compile_for
from zyfa.kernels.cute_plan import CUTE_FIRST_FORM, H200_SMS, PV_WHOLE_MAX, cute_config, cute_plan

# the DSL reads its target when it is imported; a CPU machine has no GPU to ask
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl (CuTe DSL) is not importable: set PYTHONPATH to its "
                                           "install (docs/KERNEL.md, 'The CuTe DSL kernel')")

# b, h, h_kv, s_q, s_k: GQA, lengths not a multiple of the 128-row / 128-key tiles, enough KV tiles that the loops
# over them stay loops
SHAPE = {"b": 1, "h": 4, "h_kv": 2, "s_q": 300, "s_k": 1333}


DIMS = {"hd128": (128, 128), "mla": (192, 128), "hd256": (256, 256)}
FORMS = {"default": None, "first": CUTE_FIRST_FORM, "pv-overlap": {"PV_OVERLAP": 1},
         "pv-overlap-off": {"PV_OVERLAP": 0}, "pv-overlap-unmasked": {"PV_OVERLAP": 2}, "rowsum-mma": None,
         "pv-block-32": {"PV_BLOCK": 32},
         "epilogue-div": {"EPILOGUE": 0}, "persistent": {"PERSISTENT": 1}}
# the recipe of each form: the default's, or technique 3's row sum on the tensor core (P8·ones on the wgmma)
RECIPES = {"rowsum-mma": "zyfa-hopper:rowsum=rounded_mma", "pv-overlap-unmasked": "zyfa-hopper:rowsum=rounded_mma"}
# (form, causal): the places the softmax and each matmul are emitted (tile 0's S and the last tile's P·V count one
# each), then per KV-tile loop of the PTX its clamps at code 126 and whether it masks. The default form: tile 0; the
# tiles every row sees whole without the clamp (the CTA's guard holds) and with it (it does not); the masked tiles
# (non-causal at SHAPE: only the last, which the compiler knows, so no loop); the last P·V. The first form: tile 0,
# one loop testing the mask on each tile (non-causal: a test the check below does not recognise), the last P·V.
EXPECTED = {("default", False): (4, [0, 64], [False, False]),
            ("default", True): (4, [0, 64, 64], [False, False, True]),
            ("pv-overlap", False): (4, [0, 64], [False, False]),
            ("pv-overlap-off", True): (4, [0, 64, 64], [False, False, True]),
            ("pv-overlap-unmasked", True): (4, [0, 64, 64], [False, False, True]),
            ("rowsum-mma", True): (4, [0, 64, 64], [False, False, True]),
            ("pv-block-32", True): (4, [0, 64, 64], [False, False, True]),
            ("epilogue-div", True): (4, [0, 64, 64], [False, False, True]),
            ("persistent", True): (4, [0, 64, 64], [False, False, True]),
            ("persistent", False): (4, [0, 64], [False, False]),
            ("first", False): (2, [64], None),
            ("first", True): (2, [64], [True])}


@pytest.fixture(scope="module", params=[("hd128", False, "default"), ("hd128", True, "default"),
                                        ("mla", True, "default"), ("hd128", False, "first"),
                                        ("hd128", True, "first"), ("hd128", False, "pv-overlap"),
                                        ("hd128", True, "pv-overlap-off"), ("hd128", True, "pv-overlap-unmasked"),
                                        ("hd128", True, "rowsum-mma"), ("hd256", True, "default"),
                                        ("hd256", True, "pv-block-32"), ("hd128", True, "epilogue-div"),
                                        ("hd128", True, "persistent"), ("mla", False, "persistent")],
                ids=["hd128-non-causal", "hd128-causal", "mla-causal", "hd128-non-causal-first-form",
                     "hd128-causal-first-form", "hd128-non-causal-pv-overlap",
                     "hd128-causal-pv-overlap-off", "hd128-causal-pv-overlap-unmasked", "hd128-causal-rowsum-mma",
                     "hd256-causal",
                     "hd256-causal-pv-block-32", "hd128-causal-epilogue-div", "hd128-causal-persistent",
                     "mla-non-causal-persistent"])
def compiled(request, tmp_path_factory):
    """(head dims, the PTX, (the form's name, causal)) of the kernel (compiled with --keep-ptx, written into a
    temporary directory)."""
    out = tmp_path_factory.mktemp("cute_ptx")
    d_qk, d_v = DIMS[request.param[0]]
    form = request.param[2]
    # PERSISTENT on 5 SMs: SHAPE's 12 work items take three passes (on 132, one: no loop left to see)
    compile_for(**SHAPE, d_qk=d_qk, d_v=d_v, causal=request.param[1], config=FORMS[form],
                recipe=RECIPES.get(form, "zyfa-hopper"), options=f"--keep-ptx --keep-cubin --dump-dir={out}",
                sms=5 if form == "persistent" else H200_SMS)
    files = sorted(Path(out).glob("*.ptx"))
    assert len(files) == 1, files
    cubins = sorted(Path(out).glob("*.sm_90a.cubin"))
    assert cubins, "no sm_90a cubin written"
    return (d_qk, d_v), files[0].read_text(), (form, request.param[1]), cubins[0]


def pv_block(compiled) -> int:
    """P·V's columns per wgmma: d_v, or above PV_WHOLE_MAX the form's PV_BLOCK (default 64)."""
    d_v = compiled[0][1]
    return d_v if d_v <= PV_WHOLE_MAX else (FORMS[compiled[2][0]] or {}).get("PV_BLOCK", 64)


@pytest.fixture(scope="module")
def ptx(compiled):
    return compiled[1]


def loop_spans(ptx: str) -> list[tuple[int, int]]:
    """(first, last) line of each PTX loop that issues wgmma (from a label to the branch back to it)."""
    lines = ptx.splitlines()
    labels: dict[str, int] = {}
    spans = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\$L__BB\d+_\d+):", line)
        if m:
            labels[m.group(1)] = i
        m = re.search(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", line)
        if m and labels.get(m.group(1), i) < i and "wgmma.mma_async" in "\n".join(lines[labels[m.group(1)]:i + 1]):
            spans.append((labels[m.group(1)], i))
    return spans


def kv_loops(ptx: str) -> list[str]:
    """The bodies of the KV-tile loops: the innermost loops that issue wgmma (not the PERSISTENT form's loop over work
    items around them)."""
    lines = ptx.splitlines()
    return ["\n".join(lines[a:b + 1]) for a, b in load_script("cute_sass").innermost(loop_spans(ptx))]


@pytest.fixture(scope="module")
def places(compiled):
    """How many times the softmax and each matmul are emitted (:data:`EXPECTED`)."""
    return EXPECTED[compiled[2]][0]


def test_targets_sm90a(ptx):
    assert re.search(r"^\.target\s+sm_90a", ptx, re.M)


def test_fp8_wgmma_for_both_matmuls(compiled, places):
    (d_qk, d_v), ptx = compiled[:2]
    wgmma = [ln for ln in ptx.splitlines() if "wgmma.mma_async" in ln]
    assert wgmma and all(".e4m3.e4m3" in ln and ".f32." in ln for ln in wgmma)
    # S = Q·Kᵀ: both operands from shared memory (two descriptors); P·V: P from four registers
    qk = [ln for ln in wgmma if re.search(r"\}, %rd\d+, %rd\d+,", ln)]
    from_regs = [ln for ln in wgmma if re.search(r"\}, \{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+,", ln)]
    assert qk and from_regs and len(qk) + len(from_regs) == len(wgmma)
    # 64 rows per warpgroup; S: 128 keys, O: d_v columns (above PV_WHOLE_MAX, d_v / n blocks of n columns); with the
    # row sum on the tensor core, P·ones: 8 columns
    n = pv_block(compiled)
    pv = [ln for ln in from_regs if f"m64n{n}k32" in ln]
    ones = [ln for ln in from_regs if "m64n8k32" in ln]
    assert all("m64n128k32" in ln for ln in qk) and len(pv) + len(ones) == len(from_regs)
    # each matmul issued in `places` places (the first tile or the last, each loop); a k-step per 32 of the
    # contraction (d_qk, 128 keys), for each column block; P·ones beside every P·V (its first block)
    assert len(qk) == places * d_qk // 32 and len(pv) == places * 128 // 32 * (d_v // n)
    assert len(ones) == (len(pv) if "rowsum" in RECIPES.get(compiled[2][0], "") else 0)


def test_producer_consumer_register_split(ptx):
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)


def test_pingpong_named_barriers(ptx):
    assert re.search(r"bar\.sync\s+%r\d+, 256;", ptx)  # a consumer waits for its turn (barrier id in a register)
    assert re.search(r"bar\.arrive\s+%r\d+, 256;", ptx)  # and hands the turn to the other
    assert re.search(r"cp\.async\.bulk\.tensor", ptx)  # TMA loads
    assert re.search(r"mbarrier\.arrive\.expect_tx", ptx)


def test_p_off_the_mufu(ptx, places):
    """Technique 1: P's codes by the MAD (fma.rn.sat, the magic add), no exp2 per score. The only ex2 is alpha's,
    one per row (2 per thread) in each of the places the softmax is emitted."""
    assert len(re.findall(r"ex2\.approx", ptx)) <= 2 * places
    # 64 scores per thread in each place (fewer where the compiler knows keys past the end are masked)
    assert 64 * (places - 1) < len(re.findall(r"fma\.rn\.sat\.f32", ptx)) <= places * 64
    assert "0f47C00000" in ptx  # 1.5·2^16, the magic-number add
    # 16 P registers, 3 byte permutes each
    assert 48 * (places - 1) < len(re.findall(r"prmt\.b32", ptx)) <= places * 16 * 3


def masks(body: str) -> bool:
    """Whether a KV loop's PTX applies the mask: 64 or more selects of -inf (0fFF800000), one per score or more."""
    return len(re.findall(r"selp\.f32\s.*0fFF800000", body)) >= 64


def test_kv_loops_of_each_form(compiled):
    """Each KV-tile loop (:data:`EXPECTED`): its 64 codes, its clamps at code 126 (an fp32 min by 126/128 =
    0f3F7C0000 per code) and whether it masks (64 or more selects of -inf, 0fFF800000); in the default form the
    loop of the tiles every row sees whole runs with neither where the CTA's guard holds."""
    _places, clamps, masked = EXPECTED[compiled[2]]
    loops = sorted(kv_loops(compiled[1]), key=lambda body: (body.count("0f3F7C0000"), len(body)))
    assert [body.count("fma.rn.sat.f32") for body in loops] == [64] * len(clamps)
    assert [body.count("0f3F7C0000") for body in loops] == clamps
    if masked is not None:
        assert [masks(body) for body in loops] == masked


def test_overlapped_loops_wait_for_s_first(compiled):
    """PV_OVERLAP 1: each KV loop commits S and P·V as two groups and waits for the first (wait_group 1) before the
    softmax, then for both; PV_OVERLAP 2 so in the loops without the mask's code only; the other forms and loops wait
    once for both. Above d_v PV_WHOLE_MAX, P·V's column blocks come first, then S: with two accumulators (blocks of
    32) each wait leaves the next block running (wait_group 1) but the last; with one (64) each block is waited for
    alone; then S's wait."""
    loops = kv_loops(compiled[1])
    waits = [re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+);", body) for body in loops]
    d_v, n = compiled[0][1], pv_block(compiled)
    if d_v > PV_WHOLE_MAX:
        blocks = d_v // n
        expected = [(["1"] * (blocks - 1) + ["0"] if n < 64 else ["0"] * blocks) + ["0"]] * len(loops)
    else:
        form, causal = compiled[2]
        overlap = cute_config(cute_plan(RECIPES.get(form, "zyfa-hopper")), FORMS[form], causal=causal,
                              d_v=d_v)["PV_OVERLAP"]
        masked = [masks(body) for body in loops]
        expected = [["1", "0"] if overlap == 1 or (overlap == 2 and not m) else ["0"] for m in masked]
        assert (overlap == 2) <= (True in masked and False in masked), masked  # both kinds of loop there
    assert waits and waits == expected, waits


def test_row_sum_decoded_or_on_the_tensor_core(compiled):
    """Technique 3's row sum of the rounded P: decoded from the codes (a shift by 20 per score, 64 in each KV loop),
    or, with rowsum 'rounded_mma', on the tensor core: no shift in the loops, the ones tile written once (0x38 per
    byte) and fenced for the async proxy before wgmma reads it."""
    ptx = compiled[1]
    shifts = [len(re.findall(r"shl\.b32\s+t, %r\d+, 20;", body)) for body in kv_loops(ptx)]  # code_value
    mma = "rowsum" in RECIPES.get(compiled[2][0], "")
    assert shifts and all(n == (0 if mma else 64) for n in shifts), shifts
    assert ("fence.proxy.async.shared::cta" in ptx) == mma
    assert (str(0x38383838) in ptx or "0x38383838" in ptx.lower()) == mma


def _cuobjdump(option: str, cubin: Path) -> str:
    """cuobjdump's output for the cubin the DSL wrote; it is not part of the DSL: skipped where no cuobjdump is on
    PATH (e.g. ``pip install nvidia-cuda-cuobjdump`` and its bin/)."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump is not on PATH")
    return subprocess.run([tool, option, str(cubin)], capture_output=True, text=True).stdout


def test_wgmma_not_serialized(compiled):
    """ptxas makes every wgmma wait for itself (C7513, "wgmma.mma_async instructions are serialized") when a non-wgmma
    instruction writes a register operand of a wgmma in flight: then each QGMMA of the SASS has its own
    WARPGROUP.DEPBAR. Here a wait only ends a group of them (4 to 8 k-steps). Read from the SASS, not from ptxas's
    advisory as scripts/inspect_sass.py does for Triton: the DSL's PTX (9.4) is newer than the ptxas at hand."""
    sass = _cuobjdump("-sass", compiled[3])
    qgmma, depbar = sass.count("QGMMA."), sass.count("WARPGROUP.DEPBAR")
    assert qgmma and depbar * 4 <= qgmma, (qgmma, depbar)


def test_persistent_loops_over_work_items(compiled):
    """PERSISTENT: one loop (over the CTA's work items) around every KV loop and tile 0's and the last tile's
    matmuls; the other forms have no loop around their KV loops (one item per CTA)."""
    spans = loop_spans(compiled[1])
    inner = load_script("cute_sass").innermost(spans)
    outer = [sp for sp in spans if sp not in inner]
    if compiled[2][0] != "persistent":
        assert not outer, outer
        return
    assert len(outer) == 1 and all(outer[0][0] <= a and b <= outer[0][1] for a, b in inner), (outer, inner)
    lines = compiled[1].splitlines()
    first, last = (next(i for i, t in enumerate(lines) if "wgmma.mma_async" in t),
                   max(i for i, t in enumerate(lines) if "wgmma.mma_async" in t))
    assert outer[0][0] < first and last < outer[0][1]


def test_no_local_memory(compiled):
    """No spills or stack at any form up to d_v PV_WHOLE_MAX (cuobjdump's resource usage). At d_v 256 (O's
    accumulator alone is 128 of a consumer thread's 240 registers) ptxas keeps at most two words on the stack: in each
    KV loop at most one store (a row's P exponent, read after the loop) and no load."""
    res = _cuobjdump("--dump-resource-usage", compiled[3])
    usage = re.search(r"REG:(\d+) STACK:(\d+) .*LOCAL:(\d+)", res)
    assert usage, res
    if compiled[0][1] <= PV_WHOLE_MAX:
        assert int(usage.group(2)) == 0 and int(usage.group(3)) == 0, usage.group(0)
        return
    assert int(usage.group(2)) <= 8 and int(usage.group(3)) == 0, usage.group(0)
    loops = load_script("cute_sass").sass_kv_loops(_cuobjdump("-sass", compiled[3]))
    assert len(loops) == len(EXPECTED[compiled[2]][1]), len(loops)
    for body in loops:
        assert sum(t.startswith("STL") for t in body) <= 1 and not any(t.startswith("LDL") for t in body)


def test_output_and_lse(compiled):
    """O = acc / l by one rcp.rn per row and two fma per element (EPILOGUE 1, the default;
    tests/kernels/test_cute_division.py: div.rn's bits), two columns per bf16x2 store; or (EPILOGUE 0: the first form
    too) by div.rn and a bf16 store per element. LSE by lg2."""
    ptx = compiled[1]
    assert "lg2.approx.f32" in ptx
    if compiled[2][0] not in ("epilogue-div", "first"):
        assert "div.rn.f32" not in ptx and "cvt.rn.bf16.f32" not in ptx
        assert len(re.findall(r"rcp\.rn\.f32", ptx)) == 2  # the thread's two rows
        assert len(re.findall(r"cvt\.rn\.bf16x2\.f32", ptx)) == compiled[0][1] // 4  # d_v·64 / 128 / 2 a thread
    else:
        assert "div.rn.f32" in ptx and "cvt.rn.bf16.f32" in ptx and "rcp.rn.f32" not in ptx
