"""Conformance probes before scoring (issue 32): wrong kernels come out ``nonconforming``, never ``ok``.

The two wrong plug-ins of the issue (an LSE in log2; a kernel that ignores ``causal``) through ``zyfa accuracy``,
the correct example plug-in staying ``ok``, the other probes (unscaled LSE, the GQA head mapping, the window,
the output's device), a paired row whose error ratio is outside the band (``suspect``), a pairing whose
quantization granularity differs from what the kernel reports (warned), and built-ins probed once per session.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from zyfa.accuracy.implementations import conformance
from zyfa.accuracy.implementations.base import Implementation, ImplResult
from zyfa.accuracy.implementations.plugins import load_plugin
from zyfa.accuracy.implementations.registry import builtin_names, get_implementation
from zyfa.accuracy.io.results_io import read_results
from zyfa.accuracy.scoring.tolerances import SUSPECT_BAND

from zyfa.cli import main

EXAMPLE_FILE = Path(__file__).resolve().parents[2] / "examples" / "fp8_torch_attention.py"
EXAMPLE = f"{EXAMPLE_FILE}:attention"
SMALL = ["accuracy", "--seq", "128", "--head-dim", "64", "--heads", "4", "--kv-heads", "2", "--device", "cpu",
         "--no-progress", "--recipes", "zyfa"]
WRONG = {  # name -> body calling the correct example's `attention`
    "log2": "    out, lse = attention(q, k, v, causal=causal, sm_scale=sm_scale, window=window)\n"
            "    return out, lse / 0.6931471805599453\n",
    "nocausal": "    return attention(q, k, v, causal=False, sm_scale=sm_scale, window=None)\n",
    "unscaled": "    out, _ = attention(q, k, v, causal=causal, sm_scale=sm_scale, window=window)\n"
                "    return out, attention(q, k, v, causal=causal, sm_scale=1.0, window=window)[1]\n",
    "tiled_gqa": "    r = q.shape[1] // k.shape[1]\n"
                 "    return attention(q, k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1), causal=causal, "
                 "sm_scale=sm_scale, window=window)\n",
    "nowindow": "    return attention(q, k, v, causal=causal, sm_scale=sm_scale, window=None)\n",
}


def _plugin(tmp_path, name, body=None, extra=""):
    p = tmp_path / f"{name}.py"
    p.write_text(EXAMPLE_FILE.read_text() + f"\n\ndef kern(q, k, v, *, causal, sm_scale, window):\n"
                 f"{body or WRONG[name]}{extra}")
    return f"{p}:kern"


@pytest.mark.parametrize("name, probe, seen", [
    ("log2", "lse", "LSE looks like log2: ratio 1.44"),
    ("nocausal", "causal", "causal=True ignored: queries see future keys"),
])
def test_the_issues_wrong_plugins_are_nonconforming_through_zyfa_accuracy(tmp_path, capsys, name, probe, seen):
    out = tmp_path / "r.jsonl"
    code = main([*SMALL, "--causal", "--kernel", _plugin(tmp_path, name), "--kernel", EXAMPLE,
                 "--kernel-recipe", "zyfa", "--out", str(out)])
    text = capsys.readouterr()
    assert code == 3, text.err  # written, then exit 3: a nonconforming kernel is not a measurement
    assert "(1 nonconforming)" in text.err
    rows = {r.get("implementation"): r for r in read_results(out)}
    bad = rows[f"plugin:{_plugin(tmp_path, name)}"]
    assert bad["status"] == "nonconforming" and f"conformance probe '{probe}': {seen}" in bad["reason"], bad
    assert f"nonconforming: plugin:{_plugin(tmp_path, name)} on " in text.out and seen in text.out
    assert rows[f"plugin:{EXAMPLE}"]["status"] == "ok"  # the correct example stays ok
    assert "reason" not in rows[f"plugin:{EXAMPLE}"]
    prov = read_results(out).provenance["implementations_conformance"]
    assert prov[f"plugin:{EXAMPLE}"]["ok"] and not prov[f"plugin:{_plugin(tmp_path, name)}"]["ok"]


@pytest.mark.parametrize("name, probe, seen", [
    ("unscaled", "lse", "LSE looks unscaled"),
    ("tiled_gqa", "gqa", "query head 1 reads KV head 1; the contract maps query head i to KV head i // 2 = 0"),
    ("nowindow", "window", "window=16 ignored"),
])
def test_other_probes_name_what_they_saw(tmp_path, name, probe, seen):
    conf = conformance.probe(load_plugin(_plugin(tmp_path, name)))
    assert not conf.ok and seen in conf.failures[probe], conf.failures
    assert conf.line().startswith("conformance probe ")


def test_the_example_passes_every_probe():
    conf = conformance.probe(load_plugin(EXAMPLE))
    assert conf.ok and sorted(conf.passed) == ["causal", "gqa", "lse", "output", "window"], conf.record()


def test_output_on_another_device_and_a_kernel_that_raises(tmp_path):
    def elsewhere(x, context):
        return ImplResult(torch.zeros(x.q.shape[:3] + (x.v.shape[3],), device="meta"))

    conf = conformance.probe(Implementation(name="plugin:meta", fn=elsewhere, plugin=True))
    assert "returned its output on meta; the inputs are on cpu" in conf.failures["output"]
    boom = _plugin(tmp_path, "boom", "    if causal:\n        raise RuntimeError('no masks here')\n"
                   "    return attention(q, k, v, causal=causal, sm_scale=sm_scale, window=window)\n")
    conf = conformance.probe(load_plugin(boom))
    assert conf.ok and "no masks here" in conf.skipped["causal"]  # could not run: skipped, not a finding
    mha_only = _plugin(tmp_path, "mha", "    if q.shape[1] != k.shape[1]:\n        raise ValueError('MHA only')\n"
                       "    return attention(q, k, v, causal=causal, sm_scale=sm_scale, window=window)\n")
    conf = conformance.probe(load_plugin(mha_only))
    assert conf.ok and "MHA only" in conf.skipped["gqa"] and sorted(conf.passed) == ["causal", "lse", "output",
                                                                                     "window"]
    nan = _plugin(tmp_path, "nanout", "    return q * float('nan')\n")
    assert "non-finite output" in conformance.probe(load_plugin(nan)).failures["output"]  # returned: a finding


def test_ratio_outside_the_band_is_suspect(tmp_path, capsys):
    """The example (per-tensor FP8) paired with fp32: its error is ~1e5x the emulation's: suspect, not ok."""
    out = tmp_path / "r.jsonl"
    assert main([*SMALL, "--kernel", EXAMPLE, "--kernel-recipe", "fp32", "--out", str(out)]) == 0
    row = read_results(out)[-1]
    lo, hi = SUSPECT_BAND
    assert row["status"] == "suspect" and not lo <= row["real_emu_ratio"] <= hi
    assert f"outside [{lo}, {hi}]" in row["reason"]
    assert "suspect: plugin:" in capsys.readouterr().out
    assert conformance.suspect_reason({"real_emu_ratio": 1.1}) is None


def test_pairing_with_another_quantization_granularity_is_warned(tmp_path, capsys):
    per_head = _plugin(tmp_path, "perhead", "    return attention(q, k, v, causal=causal, sm_scale=sm_scale, "
                       "window=window)\n", extra="\n\nkern.quantization = 'head'\n")
    out = tmp_path / "r.jsonl"
    assert main([*SMALL, "--kernel", per_head, "--kernel-recipe", "zyfa", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "warning: plugin:" in text and "q per head (the recipe: per tensor)" in text
    assert "an emulation that quantizes otherwise" in read_results(out)[-1]["pairing_warning"]
    same = _plugin(tmp_path, "pertensor", "    return attention(q, k, v, causal=causal, sm_scale=sm_scale, "
                   "window=window)\n", extra="\n\nkern.quantization = {'q': 'tensor', 'k': 'tensor'}\n")
    assert conformance.pairing_warning(load_plugin(same, recipe="zyfa")) is None
    assert conformance.pairing_warning(load_plugin(EXAMPLE, recipe="zyfa")) is None  # says nothing: no warning


def test_builtins_are_probed_once_per_session():
    calls = []
    example = load_plugin(EXAMPLE)

    def fn(x, context):
        calls.append(x.name)
        return example.fn(x, context)

    builtin = Implementation(name="builtin-under-test", fn=fn)
    assert conformance.probe_cached(builtin).ok
    n = len(calls)
    assert n >= 4 and conformance.probe_cached(builtin).ok and len(calls) == n  # cached for the session
    plug = Implementation(name="plugin:again", fn=fn, plugin=True)
    conformance.probe_cached(plug)
    conformance.probe_cached(plug)
    assert len(calls) == 3 * n  # plug-ins: every time


@pytest.mark.gpu
@pytest.mark.parametrize("name", builtin_names())
def test_builtin_kernels_conform_on_the_gpu(name):
    impl = get_implementation(name)
    ok, why = impl.available()
    if not ok:
        pytest.skip(why)
    conf = conformance.probe(impl, "cuda")
    assert conf.ok, conf.line()
    assert "output" in conf.passed
