"""The Python API (accuracy.api) and its pytest helper, on the shipped example kernel and a mask-ignoring one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from zyfa.accuracy.api import api_inputs, assert_kernel_conforms, measure

from tests.load_file import load_module

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fp8_torch_attention.py"


def _example():
    return load_module(EXAMPLE, "fp8_torch_attention_api_test").attention


def test_a_correct_kernel_conforms_as_a_callable_and_as_a_spec():
    attention = _example()
    rows = assert_kernel_conforms(attention, recipe="zyfa", max_error_ratio=1.1, device="cpu")
    mine = [r for r in rows if r.get("real")]
    assert len(mine) == 2 and all(r["status"] == "ok" for r in mine)  # no mask, causal
    assert {r["causal"] for r in mine} == {False, True}
    assert all(r["paired_spec"] == "zyfa" and 0 < r["real_emu_ratio"] <= 1.1 for r in mine)
    assert rows.provenance["implementations_conformance"][mine[0]["implementation"]]["ok"]
    rows = assert_kernel_conforms(f"{EXAMPLE}:attention", device="cpu")
    assert rows[-1]["implementation"] == f"plugin:{EXAMPLE}:attention" and rows[-1]["plugin_sha256"]


def test_a_mask_ignoring_kernel_fails_with_the_reason():
    attention = _example()

    def no_mask(q, k, v, *, causal, sm_scale, window):
        return attention(q, k, v, causal=False, sm_scale=sm_scale, window=None)

    with pytest.raises(AssertionError) as e:
        assert_kernel_conforms(no_mask, recipe="zyfa", device="cpu", name="no-mask")
    msg = str(e.value)
    assert msg.startswith("kernel no-mask does not conform:")
    assert "conformance probe 'causal': causal=True ignored" in msg and "window=16 ignored" in msg


def test_an_error_beyond_the_bound_fails_naming_the_ratio():
    with pytest.raises(AssertionError, match=r"orig_rel_l2 .* is 0\.8\d*x the zyfa emulation's .* above "
                                             r"max_error_ratio 0\.5"):
        assert_kernel_conforms(_example(), recipe="zyfa", max_error_ratio=0.5, device="cpu")


def test_measure_recipes_on_captures_and_bad_arguments():
    rows = measure(recipes="bf16,zyfa", inputs=[ROOT / "datasets" / "smollm2-lee-2048.h5"], layers=[0],
                   max_tokens=32, device="cpu")
    assert [(r["input"], r["recipe"]) for r in rows] == [("smollm2-L0-full_attention-h0.1.2-s32", "bf16"),
                                                         ("smollm2-L0-full_attention-h0.1.2-s32", "zyfa")]
    with pytest.raises(ValueError, match="keyword argument"):
        measure(lambda q, k, v: q, device="cpu")
    with pytest.raises(ValueError, match="nothing to measure"):
        measure(device="cpu")
    with pytest.raises(ValueError, match="no such input file"):
        api_inputs(["nope.h5"])
    with pytest.raises(ValueError, match="max_error_ratio needs a recipe"):
        assert_kernel_conforms(_example(), recipe=None, device="cpu")


def test_the_package_re_exports_the_api_lazily():
    code = ("import sys, zyfa.accuracy; light = 'torch' not in sys.modules; from zyfa.accuracy import measure; "
            "import zyfa.accuracy.api; print(light, measure is zyfa.accuracy.api.measure)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert res.stdout.split() == ["True", "True"], res.stderr


@pytest.mark.gpu
def test_a_correct_kernel_conforms_on_the_gpu():
    rows = assert_kernel_conforms(_example(), recipe="zyfa", max_error_ratio=1.1, device="cuda")
    mine = [r for r in rows if r.get("real")]
    assert mine and all(r["status"] == "ok" and r["device"].startswith("cuda") for r in mine)
