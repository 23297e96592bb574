"""scripts/inspect_sass.py compiles, without a GPU, the binary the wrapper launches (Triton's bundled ptxas).

Needs triton (not on the CPU CI machine, so these skip there; developers' machines and the GPU image have it).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "inspect_sass.py"


@pytest.fixture(scope="module")
def inspect_sass():
    pytest.importorskip("triton", reason="triton is not installed here (the offline compile needs its ptxas)")
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import inspect_sass as mod
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return mod


def test_the_default_compile_is_the_wrappers_launch(inspect_sass):
    """No flags: the resolved config of attention_fp8 (MAD_CVT after its rules), three programs per SM at hd128
    (<= 168 registers, no spills, <= 75 KB of shared memory), one mbarrier wait per stage for K and V with
    VT_EARLY at d 256."""
    from zyfa.kernels.attention_fp8 import kernel_plan, resolve_config

    ck, cfg, _ = inspect_sass.compile_variant("zyfa-hopper", 128, 128, False)
    want, mad_cvt, _ = resolve_config(128, 128, False, kernel_plan("zyfa-hopper"))
    assert cfg == {**want, "MAD_CVT": mad_cvt}
    sass, ops = inspect_sass.sass_histogram(ck.asm["cubin"])
    assert ck.metadata.num_warps == 4 and ck.metadata.shared <= 75 * 1024
    assert int(sass.split("REG:")[1].split()[0]) <= 168 and ops.get("LDL", 0) == 0
    ck2, cfg2, _ = inspect_sass.compile_variant("zyfa-hopper", 128, 128, False, config={"VT_EARLY": 1})
    assert cfg2["VT_EARLY"] == 1
    waits = [inspect_sass.sass_histogram(c.asm["cubin"])[0].count("SYNCS.PHASECHK") for c in (ck, ck2)]
    assert waits[1] < waits[0], waits  # K and Vᵀ under one mbarrier: fewer waits in the binary


def test_a_refused_config_is_one_line():
    pytest.importorskip("triton", reason="triton is not installed here (the offline compile needs its ptxas)")
    r = subprocess.run([sys.executable, str(SCRIPT), "--recipe", "zyfa-exp2", "--dqk", "256", "--dv", "256",
                        "--const", "VT_EARLY=1"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "VT_EARLY=1 is not supported" in r.stderr


def test_serialized_wgmma_is_reported(inspect_sass):
    """ptxas's advisory that it serialized every wgmma: absent from the default launches at hd128 and MLA, present
    with the per-tile flush through Triton's partial accumulator at hd256 (PV_MODE 2) and absent with the explicit
    fresh product (PV_MODE 4), the same bits (docs/KERNEL.md)."""
    for dqk, dv in ((128, 128), (192, 128)):
        ck, cfg, _ = inspect_sass.compile_variant("zyfa-hopper", dqk, dv, True)
        # the check reruns ptxas with the compile's own register cap (168 at hd128 causal)
        assert getattr(ck.metadata, "maxnreg", None) == cfg.get("maxnreg")
        assert inspect_sass.wgmma_serialized(ck) is None
    ck, cfg, _ = inspect_sass.compile_variant("zyfa-hopper", 256, 256, False, config={"PV_MODE": 2})
    assert "serialized" in inspect_sass.wgmma_serialized(ck)
    ck, cfg, _ = inspect_sass.compile_variant("zyfa-hopper", 256, 256, False, config={"PV_MODE": 4})
    assert inspect_sass.wgmma_serialized(ck) is None

