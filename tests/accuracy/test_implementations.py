"""CPU tests of the implementation registry, the plug-in loader (every failure case) and the example plug-in."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
from zyfa.accuracy.implementations.base import ImplementationError, call_implementation, pairing
from zyfa.accuracy.implementations.plugins import load_plugin, load_plugins
from zyfa.accuracy.implementations.registry import builtin_names, get_implementation, parse_implementations
from zyfa.accuracy.inputs.attention_input import AttentionInput, GaussianSpec, make_gaussian
from zyfa.reference.attention import attention_fp64

from zyfa.norms import rel_l2
from zyfa.recipe_spec import get_recipe
from zyfa.recipes import Recipe

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fp8_torch_attention.py"
# the recipes the Triton wrapper's docstring says it honours (zyfa/kernels/attention_fp8.py)
TRITON_RECIPES = {"zyfa", "zyfa-exp2", "zyfa-fp32sum", "zyfa-noscale", "zyfa-pow2fixed", "zyfa-tilescale",
                  "zyfa-hopper", "ck", "aiter", "fa3",
                  # per-block Q/K descales, K smoothing and Q/K rotation (issue 14): the quantization schemes
                  "ck-blockscale", "zyfa+smooth", "zyfa+hadamard", "zyfa+block", "zyfa+block+smooth",
                  "zyfa+block+hadamard"}


def _input(seq=96, heads=4, heads_kv=2, d=64, causal=True, window=None, seed=0) -> AttentionInput:
    return make_gaussian(GaussianSpec(seq=seq, heads_q=heads, heads_kv=heads_kv, head_dim=d, causal=causal,
                                      window=window, seed=seed))


# ---------------------------------------------------------------------------------------------- registry

def test_builtins_cover_every_kind():
    names = builtin_names()
    assert {n.split(":", 1)[1] for n in names if n.startswith("triton:")} == TRITON_RECIPES
    assert [n for n in names if n.startswith("cute:")] == ["cute:zyfa-hopper"]  # the one recipe cute_plan takes
    for n in ("cudnn-fp8", "cudnn-fp8:oracle-scale", "sdpa-bf16:cudnn", "sdpa-bf16:flash", "flash-attn-triton-amd",
              "flashinfer-fa3"):
        assert n in names
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", builtin_names())
def test_builtin_fields(name):
    impl = get_implementation(name)
    assert impl.name == name and not impl.plugin
    assert impl.quantizes in ("recipe", "none")
    r = impl.paired_recipe()
    assert isinstance(r, Recipe)
    if name.startswith(("triton:", "cute:")):
        assert r.name == name.split(":", 1)[1] and impl.quantizes == "recipe"
        assert impl.device == "CUDA, Hopper (sm_90)" and impl.emulation == "triton-kernel"
    if name.startswith("sdpa-bf16"):
        assert r.name == "bf16" and impl.quantizes == "none"
    if name.startswith("cudnn-fp8"):
        assert r.name == "cudnn-fp8" and r.out_format == "e4m3fn"
    if name == "flash-attn-triton-amd":
        # the released flash-attn 2.8.3 scales P per tile (docs/real_kernels.md); the rest is triton-amd's
        base = get_recipe("triton-amd")
        assert r.p_scale == "tile_amax" and r.log2e_folded is False and r.v_descale == base.v_descale
        assert (r.block_m, r.block_n) == (128, 64)
        # its FP8 tl.dots keep their k chain in the matrix unit; each tile's P·V is a fresh dot
        assert r.accumulator == "matrix_unit" and r.accum_flush_tiles == 1
    if name == "flashinfer-fa3":
        # FA3's numerics (never-flushed Hopper accumulator, fp32 sum, rcp) with P x448, Q per query head and
        # FlashInfer's single-prefill FP8 tiles (CTA_Q x CTA_KV of prefill_sm90.cuh), on the H200
        fa3 = get_recipe("fa3")
        assert r.p_scale == "fmax" and r.q_scale == "head" and r.k_scale == fa3.k_scale == r.v_scale
        assert r.accumulator == "matrix_unit" and r.accum_flush_tiles == 0 and r.rowsum == fa3.rowsum
        assert (r.reciprocal, r.out_format, r.platform) == ("rcp", "bf16_rne", "h200")
        assert [r.tiles(d) for d in (64, 128, 256)] == [(192, 128), (128, 192), (128, 128)]
        assert r.kv_order == "reverse"  # its mainloop takes the last KV tile first
        assert impl.quantizes == "recipe"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reasons given on a machine without a GPU")
@pytest.mark.parametrize("name", [n for n in builtin_names() if n != "sdpa-fp32"])
def test_unavailable_on_cpu_with_a_reason(name):
    ok, why = get_implementation(name).available()
    assert ok is False
    assert why == "no CUDA device"


def test_sdpa_fp32_runs_anywhere():
    assert get_implementation("sdpa-fp32").available() == (True, "")


def test_unknown_implementation_lists_builtins():
    with pytest.raises(ValueError, match="unknown implementation 'cudnn-fp9'.*triton:zyfa.*--kernel"):
        get_implementation("cudnn-fp9")


def test_parse_implementations():
    assert parse_implementations(None) == [] and parse_implementations("none") == []
    assert [i.name for i in parse_implementations("all")] == [n for n in builtin_names() if n != "sdpa-fp32"]
    assert [i.name for i in parse_implementations("sdpa-fp32")] == ["sdpa-fp32"]  # a baseline, named explicitly
    got = parse_implementations("triton:zyfa-hopper, cudnn-fp8,triton:zyfa-hopper")
    assert [i.name for i in got] == ["triton:zyfa-hopper", "cudnn-fp8"]
    if not torch.cuda.is_available():
        assert parse_implementations("available") == []
    # triton:SPEC: any recipe spec the kernel honours, named by its canonical spec; one it cannot run is refused
    got = parse_implementations("triton:fa3:accumulator=matrix_unit,accum_flush_tiles=1,triton:zyfa@h200")
    assert [(i.name, i.recipe) for i in got] == [
        ("triton:fa3:accumulator=matrix_unit,accum_flush_tiles=1", "fa3:accumulator=matrix_unit,accum_flush_tiles=1"),
        ("triton:zyfa@h200", "zyfa@h200")]
    assert got[0].paired_recipe().accum_flush_tiles == 1
    with pytest.raises(ValueError, match="implementation 'triton:bf16': recipe 'bf16': the Triton FP8 kernel does "
                                         "not support q_format='bf16'"):
        parse_implementations("triton:zyfa,triton:bf16")
    with pytest.raises(ValueError, match="unknown implementation 'cudnn-fp9'"):
        parse_implementations("cudnn-fp9")


def test_cute_names_parse_canonicalize_and_refuse_in_one_line():
    """cute:SPEC is our CuTe kernel under any spec cute_plan takes, named by its canonical spec as triton:SPEC is; a
    spec it does not take is refused by the registry's path in one line naming the field."""
    got = parse_implementations("cute:zyfa-hopper, cute:zyfa-hopper:q_scale=head , cute:zyfa-hopper@h200,"
                                "triton:zyfa-hopper")
    assert [(i.name, i.recipe) for i in got] == [("cute:zyfa-hopper", "zyfa-hopper"),
                                                 ("cute:zyfa-hopper:q_scale=head", "zyfa-hopper:q_scale=head"),
                                                 ("cute:zyfa-hopper@h200", "zyfa-hopper@h200"),
                                                 ("triton:zyfa-hopper", "zyfa-hopper")]
    cute = got[0]
    assert (cute.package, cute.quantizes, cute.plugin) == ("nvidia-cutlass-dsl", "recipe", False)
    # paired, as triton:zyfa-hopper, with the h200 emulation of the recipe
    assert pairing(cute, "h200").recipe == pairing(got[3], "h200").recipe == get_recipe("zyfa-hopper")
    assert get_recipe("zyfa-hopper").platform == "h200"
    assert get_implementation("cute:zyfa-hopper:q_scale=head").paired_recipe().q_scale == "head"
    for name, message in [
        ("cute:zyfa", "implementation 'cute:zyfa': recipe 'zyfa': the CuTe FP8 kernel does not support "
                      "accumulator='fp32' (supported: 'matrix_unit')"),
        ("cute:fa3", "implementation 'cute:fa3': recipe 'fa3': the CuTe FP8 kernel does not support "
                     "exp_method='exp2' (supported: 'mad_fp8')"),
        ("cute:zyfa-hopper:block_n=64", "the CuTe FP8 kernel does not support block_n=64 (supported: 128)"),
        ("cute:zyfa-hopper:nosuch=1", "bad recipe override 'nosuch=1'"),
        ("cute:nosuchrecipe", "unknown recipe 'nosuchrecipe'"),
        ("cute:triton:zyfa-hopper", "cute:SPEC takes a recipe spec, not another kernel's name (triton:...)"),
    ]:
        with pytest.raises(ValueError) as e:
            parse_implementations(f"cudnn-fp8,{name}")
        assert message in str(e.value) and len(str(e.value).splitlines()) == 1, (name, str(e.value))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reasons given on a machine without a GPU")
def test_cute_is_unavailable_without_cuda_or_the_cute_dsl(monkeypatch):
    """On this CPU machine: no CUDA device. With a Hopper GPU but no CuTe DSL: the package named (the check finds the
    module without importing it). The GPU half is torch's answer, replaced here."""
    cute = get_implementation("cute:zyfa-hopper")
    assert cute.available() == (False, "no CUDA device")
    if importlib.util.find_spec("cutlass") is not None:
        pytest.skip("the CuTe DSL is installed here: the missing-package reason cannot be seen")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100")
    assert cute.available() == (False, "package nvidia-cutlass-dsl is not installed (import cutlass not found)")
    assert "cutlass" not in sys.modules


def test_limits_of_builtins():
    sdpa = get_implementation("sdpa-bf16:flash")
    fa = get_implementation("flash-attn-triton-amd")
    tri = get_implementation("triton:zyfa")
    windowed = _input(seq=64, window=16)
    assert "sliding window" in sdpa.limits(windowed)
    assert sdpa.limits(_input(seq=64, window=64)) is None  # window covering the sequence = causal: allowed
    mla = make_gaussian(GaussianSpec(seq=32, head_dim=192, head_dim_v=128, heads_q=2, heads_kv=2))
    assert "192 != d_v 128" in fa.limits(mla)
    assert tri.limits(mla) is None
    absorbed = make_gaussian(GaussianSpec(seq=32, head_dim=576, head_dim_v=512, heads_q=1, heads_kv=1))
    assert "576/512 not supported" in tri.limits(absorbed)
    # the CuTe kernel: hd 64, 128, 256 and MLA 192/128, no sliding window (a window equal to the causal mask is fine)
    cute = get_implementation("cute:zyfa-hopper")
    assert cute.limits(mla) is None and cute.limits(_input(seq=64, d=128)) is None
    assert cute.limits(windowed) == "sliding window (16 keys) not supported"
    assert cute.limits(_input(seq=64, window=64)) is None
    assert cute.limits(make_gaussian(GaussianSpec(seq=32, head_dim=256, heads_q=1, heads_kv=1))) is None
    assert cute.limits(absorbed) == "head dims 576/512 not supported (takes 64/64, 128/128, 192/128, 256/256)"
    fi = get_implementation("flashinfer-fa3")
    assert "sliding window" in fi.limits(windowed)
    assert "192/128 not supported" in fi.limits(mla)
    assert "576/512 not supported" in fi.limits(absorbed)
    # bottom-right causal alignment, as ours: s_q != s_k is fine
    x = _input(seq=64, d=128)
    x.q = x.q[:, :, :40]
    assert fi.limits(x) is None and fa.limits(x) is None


def test_flashinfer_inputs_are_the_recipe_quantizers_values_in_nhd():
    """The adapter hands FlashInfer the recipe quantizer's FP8 values, per sequence in its (s, h, d) layout, with
    Q's descale per query head (a GQA group's equal values) and K's and V's per KV head."""
    from zyfa.emulator import quantize_inputs
    from zyfa.peers.flashinfer_fa3 import FLASHINFER_FA3_RECIPE, flashinfer_fa3_inputs

    x = make_gaussian(GaussianSpec(seq=48, heads_q=4, heads_kv=2, head_dim=64, batch=2, seed=3))
    qi = quantize_inputs(x.q, x.k, x.v, get_recipe(FLASHINFER_FA3_RECIPE))
    per = flashinfer_fa3_inputs(qi, 4, 2)
    assert len(per) == 2
    for i, (q8, k8, v8, sq, sk, sv) in enumerate(per):
        assert q8.dtype == k8.dtype == v8.dtype == torch.float8_e4m3fn
        assert q8.shape == (48, 4, 64) and k8.shape == v8.shape == (48, 2, 64) and q8.is_contiguous()
        assert torch.equal(q8.float(), qi.q_values[i].transpose(0, 1).float())
        assert torch.equal(v8.float(), qi.v_values[i].transpose(0, 1).float())
        assert sq.shape == (4,) and sk.shape == sv.shape == (2,)
        # values x descales are the dequantized inputs the emulation sees
        dq, dk, dv = (t[i].transpose(0, 1) for t in qi.dequantized())
        assert torch.equal(q8.float() * sq[None, :, None], dq)
        assert torch.equal(k8.float() * sk[None, :, None], dk) and torch.equal(v8.float() * sv[None, :, None], dv)


def test_bench_peer_rows_name_the_registrys_recipes():
    """zyfa bench's rows of the real peers name the recipe the registry pairs them with, also where the peer
    cannot run (here: no GPU, or no package), and carry the reason instead of a speed."""
    from zyfa.bench.cases import run_case
    from zyfa.peers.flash_attn_amd import FLASH_ATTN_AMD_RECIPE
    from zyfa.peers.flashinfer_fa3 import FLASHINFER_FA3_RECIPE
    from zyfa.timing import cpu_timer

    if torch.cuda.is_available():
        pytest.skip("checks the rows of peers that cannot run, on a machine without a GPU")
    q = torch.randn(1, 2, 64, 128)
    rows = run_case([], label="gaussian", inputs=(q, q, q), causal=False, recipes=[],
                    peers=["flash-attn-triton-amd", "flashinfer-fa3"], repeats=1, timer=cpu_timer(1), clock=None,
                    config=None, log=lambda r: None)
    assert [(r["impl"], r["recipe"]) for r in rows] == [("flash-attn-triton-amd", FLASH_ATTN_AMD_RECIPE),
                                                         ("flashinfer-fa3", FLASHINFER_FA3_RECIPE)]
    assert all("error" in r and "tflops" not in r for r in rows)
    assert "no CUDA device" in rows[1]["error"]


def test_amd_forward_refuses_mla_head_dims():
    """AMD's Triton FP8 forward takes one head size (Q's) for Q, K and V, so MLA's 192/128 is refused in one line
    before the kernel runs (it read past V's rows there and wrote NaN), and zyfa bench's row says why, with no speed."""
    from zyfa.bench.cases import run_case
    from zyfa.peers.flash_attn_amd import flash_attn_amd_forward
    from zyfa.timing import cpu_timer

    q = torch.randn(1, 2, 64, 192).to(torch.float8_e4m3fn)
    v = torch.randn(1, 2, 64, 128).to(torch.float8_e4m3fn)
    d = torch.ones(1, 2)
    with pytest.raises(ValueError, match="one head size for Q, K and V, not 192/192/128"):
        flash_attn_amd_forward(q, q, v, d, d, d, causal=False, sm_scale=0.1)
    qf, vf = torch.randn(1, 2, 64, 192), torch.randn(1, 2, 64, 128)
    rows = run_case([], label="gaussian", inputs=(qf, qf, vf), causal=True, recipes=[],
                    peers=["flash-attn-triton-amd"], repeats=1, timer=cpu_timer(1), clock=None, config=None,
                    log=lambda r: None)
    assert len(rows) == 1 and "tflops" not in rows[0]
    assert "one head size for Q, K and V, not 192/192/128" in rows[0]["error"]


# ---------------------------------------------------------------------------------------------- plug-in loader

def _write(tmp_path: Path, body: str, name="kern.py") -> Path:
    p = tmp_path / name
    p.write_text("import torch\n\n" + body)
    return p


def test_loader_bad_module_path():
    with pytest.raises(ImplementationError, match="kernel 'no_such_module_zz:attn': cannot import module"):
        load_plugin("no_such_module_zz:attn")
    with pytest.raises(ImplementationError, match="kernel 'missing/file.py:attn': no such file"):
        load_plugin("missing/file.py:attn")
    with pytest.raises(ImplementationError, match="expected module:function"):
        load_plugin("examples.fp8_torch_attention")
    with pytest.raises(ImplementationError, match="defines no 'nope' \\(the file was not run\\)"):
        load_plugin(f"{EXAMPLE}:nope")


def test_loader_import_error_in_file(tmp_path):
    p = _write(tmp_path, "raise RuntimeError('broken at import')\n\n\ndef attn(q, k, v, **kw):\n    return q\n")
    with pytest.raises(ImplementationError, match=r"importing .*kern.py failed: RuntimeError: broken at import"):
        load_plugin(f"{p}:attn")


@pytest.mark.parametrize("sig, why", [
    ("def attn(q, k, *, causal, sm_scale, window):", "needs q, k, v"),
    ("def attn(q, k, v, *, causal, sm_scale):", "no keyword argument.* window"),
    ("def attn(q, k, v, *, causal, sm_scale, window, block):", "requires argument.* block"),
])
def test_loader_wrong_signature(tmp_path, sig, why):
    p = _write(tmp_path, f"{sig}\n    return q\n")
    with pytest.raises(ImplementationError, match=f"kernel '.*kern.py:attn': wrong signature.*{why}"):
        load_plugin(f"{p}:attn")


def test_loader_accepts_kwargs_catchall(tmp_path):
    p = _write(tmp_path, "def attn(q, k, v, **kw):\n    return torch.zeros_like(q)\n")
    impl = load_plugin(f"{p}:attn")
    res = call_implementation(impl, _input(heads_kv=4))
    assert res.out.shape == (1, 4, 96, 64) and res.lse is None


@pytest.mark.parametrize("body, why", [
    ("return q[:, :, :-1]", r"returned shape \(1, 4, 95, 64\), expected \(b, h, s_q, d_v\) = \(1, 4, 96, 64\)"),
    ("return q * float('nan')", r"returned 24576 non-finite output value\(s\) \(24576 NaN\)"),
    ("raise ValueError('tile too large')", "raised ValueError: tile too large"),
    ("return 3.0", "returned float, expected a torch.Tensor"),
    ("return q, q, q", "returned a tuple of 3 items"),
    ("return q.to(torch.int32)", "returned a torch.int32 output"),
    ("return q, q[..., 0, 0]", r"returned lse of shape \(1, 4\)"),
    # output and lse are checked with one host sync when both are fine; a bad one is named as before, the output
    # first
    ("return q, torch.full(q.shape[:3], float('nan'))", "returned NaN in its lse"),
    ("return torch.full_like(q, float('inf')), torch.full(q.shape[:3], float('nan'))",
     r"returned 24576 non-finite output value\(s\) \(0 NaN\)"),
    ("return q * float('nan'), q[..., 0, 0]", r"returned 24576 non-finite output value\(s\) \(24576 NaN\)"),
])
def test_failing_kernels_name_the_kernel(tmp_path, body, why):
    p = _write(tmp_path, f"def attn(q, k, v, *, causal, sm_scale, window):\n    {body}\n")
    impl = load_plugin(f"{p}:attn")
    with pytest.raises(ImplementationError, match=f"kernel '{p}:attn' {why}"):
        call_implementation(impl, _input(heads_kv=4))


def test_plugin_gets_the_contract_arguments(tmp_path):
    p = _write(tmp_path, (
        "SEEN = {}\n"
        "def attn(q, k, v, *, causal, sm_scale, window):\n"
        "    SEEN.update(shapes=(tuple(q.shape), tuple(k.shape), tuple(v.shape)), dtype=q.dtype, causal=causal,\n"
        "                sm_scale=sm_scale, window=window)\n"
        "    return torch.zeros(q.shape[:3] + (v.shape[3],), dtype=torch.float16)\n"))
    impl = load_plugin(f"{p}:attn", recipe="zyfa", in_process=True)  # SEEN is read in this process
    assert impl.recipe == "zyfa" and impl.quantizes == "self" and impl.plugin
    x = make_gaussian(GaussianSpec(seq=40, heads_q=4, heads_kv=1, head_dim=192, head_dim_v=128, causal=True,
                                   window=8))
    call_implementation(impl, x)
    import sys

    seen = next(m.SEEN for n, m in sys.modules.items() if n.startswith("zyfa_plugin_") and hasattr(m, "SEEN")
                and m.SEEN)
    assert seen["shapes"] == ((1, 4, 40, 192), (1, 1, 40, 192), (1, 1, 40, 128))
    assert seen["dtype"] == torch.bfloat16 and seen["causal"] is True and seen["window"] == 8
    assert math.isclose(seen["sm_scale"], 1 / math.sqrt(192))


def test_kernel_recipe_must_exist():
    with pytest.raises(ImplementationError, match="--kernel-recipe: .*nope"):
        load_plugin(f"{EXAMPLE}:attention", recipe="nope")


# ---------------------------------------------------------------------------------------------- example plug-in

def _expected_example(x: AttentionInput):
    """The example's maths computed independently: FP8 values by the project's bit-level format code
    (not PyTorch's float8 cast), FP64 attention by the oracle."""
    from zyfa.formats import E4M3FN, round_to_fp8

    def fq(t):
        t = t.double()
        scale = 448.0 / t.abs().max()
        return round_to_fp8((t * scale).float(), E4M3FN).double() / scale

    return attention_fp64(fq(x.q), fq(x.k), fq(x.v), causal=x.causal, window=x.window, sm_scale=x.sm_scale)


@pytest.mark.parametrize("kw", [dict(causal=False), dict(causal=True), dict(causal=True, window=20),
                                dict(heads=4, heads_kv=1, causal=True)])
def test_example_plugin_matches_independent_reference(kw):
    x = _input(**kw)
    for spec in (f"{EXAMPLE}:attention", "examples.fp8_torch_attention:attention"):
        res = call_implementation(load_plugin(spec), x)
        ref_out, ref_lse = _expected_example(x)
        err_vs_expected = rel_l2(res.out, ref_out)
        assert err_vs_expected < 2e-6, err_vs_expected  # the same maths in fp32
        assert float((res.lse.double() - ref_lse).abs().max()) < 1e-4
        # and a sensible FP8 error against FP64 on the original inputs: per-tensor e4m3 costs a few percent
        orig = attention_fp64(x.q, x.k, x.v, causal=x.causal, window=x.window)[0]
        err = rel_l2(res.out, orig)
        assert 0.005 < err < 0.08, err


def test_load_plugins_pairs_recipes_and_refuses_one_that_does_not_load():
    with pytest.raises(ValueError, match="kernel 'no_such_module_zz:attn': cannot import module"):
        load_plugins([f"{EXAMPLE}:attention", "no_such_module_zz:attn"], ["zyfa"])
    assert [i.recipe for i in load_plugins([f"{EXAMPLE}:attention"] * 2, ["zyfa", "ck"])] == ["zyfa", "ck"]
    assert [i.recipe for i in load_plugins([f"{EXAMPLE}:attention"])] == [None]
    with pytest.raises(ValueError, match="--kernel-recipe given 2 times for 3 --kernel"):
        load_plugins([f"{EXAMPLE}:attention"] * 3, ["zyfa", "ck"])


def test_flash_attn_amd_pairing_fields_are_inert_where_the_matrix_unit_keeps_fp32():
    """The in-unit accumulation fields of AMD's kernel's recipe change nothing on mi355x (fp32 MFMA sums) and
    change the result on the H200 (its truncating FP8 accumulator)."""
    from zyfa.emulator import emulate

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 192, 64, generator=g) for _ in range(3))
    k[..., :2] *= 20  # outlier channels: the in-unit chain then truncates differently from per-step flushes
    paired = get_recipe(get_implementation("flash-attn-triton-amd").recipe)
    plain = get_recipe("triton-amd:p_scale=tile_amax")
    on_mi = [emulate(q, k, v, r.on("mi355x"), causal=True).out for r in (paired, plain)]
    assert torch.equal(on_mi[0], on_mi[1])
    on_h200 = [emulate(q, k, v, r.on("h200"), causal=True).out for r in (paired, plain)]
    assert not torch.equal(on_h200[0], on_h200[1])


def test_flashinfer_pack_refuses_head_dims_it_does_not_hold(tmp_path, monkeypatch):
    """A packed FlashInfer (scripts/build_flashinfer_fa3.py) holds some head dims; another would start a JIT build
    the pack cannot do, so the implementation refuses it in one line (a whole install takes every head dim)."""
    import json
    import sys

    from zyfa.accuracy.implementations.registry import get_implementation
    from zyfa.accuracy.inputs.attention_input import GaussianSpec, make_gaussian

    from zyfa.peers.flashinfer_fa3 import PACK_MANIFEST, packed_head_dims

    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    impl = get_implementation("flashinfer-fa3")
    x128 = make_gaussian(GaussianSpec(heads_q=2, heads_kv=2, head_dim=128, seq=64))
    packed_head_dims.cache_clear()  # read once per process: this test changes the install under it
    assert packed_head_dims() is None and impl.limits(x128) is None  # no manifest: a whole install
    (site / PACK_MANIFEST).write_text(json.dumps({"modules": {"64": "m64", "256": "m256"}}))
    packed_head_dims.cache_clear()
    assert packed_head_dims() == (64, 256)
    why = impl.limits(x128)
    assert why.startswith("head dim 128 is not in this FlashInfer FA3 pack (built for 64, 256;")
    assert impl.limits(make_gaussian(GaussianSpec(heads_q=2, heads_kv=2, head_dim=64, seq=64))) is None
    packed_head_dims.cache_clear()  # the next test's install is this process's own again
