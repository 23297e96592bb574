"""The FP64 oracle against 50-digit arithmetic (mpmath), against a naive unchunked float64 attention, its
masks, its fully masked rows, its input checks, and (slow) a 32K-token run in bounded memory."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import mpmath
import pytest
import torch
from zyfa.reference import attention_fp64

ROOT = Path(__file__).resolve().parents[2]
# float64 rounding of the scores and of P @ V: a few 1e-16 relative; the chunked and naive paths run the
# same float64 operations on differently shaped blocks, so they differ only in BLAS summation order.
HP_RTOL = 1e-13  # measured worst: 4e-15
NAIVE_ATOL = 2e-14  # measured worst: 4.4e-15


def _qkv(b, h_q, h_kv, s_q, s_k, d_qk, d_v=None, *, seed=0, spread=1.0, dtype=torch.float64):
    """Gaussian inputs with distinct KV heads; ``spread`` > 1 makes the softmax peaky."""
    gen = torch.Generator().manual_seed(seed)
    d_v = d_qk if d_v is None else d_v
    q = torch.randn(b, h_q, s_q, d_qk, generator=gen, dtype=torch.float64) * spread
    k = torch.randn(b, h_kv, s_k, d_qk, generator=gen, dtype=torch.float64) * spread
    v = torch.randn(b, h_kv, s_k, d_v, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _allowed(s_q, s_k, causal, window):
    """(s_q, s_k) bool: key j visible from query i (query i at key position i + s_k - s_q)."""
    pos = torch.arange(s_q)[:, None] + (s_k - s_q)
    key = torch.arange(s_k)[None, :]
    ok = torch.ones(s_q, s_k, dtype=torch.bool)
    if causal or window is not None:
        ok &= key <= pos
    if window is not None:
        ok &= key > pos - window
    return ok


def _naive(q, k, v, *, causal=False, sm_scale=None, window=None):
    """Unchunked float64 attention with K/V expanded by HF repeat_kv; empty rows give 0 and -inf."""
    q, k, v = q.double(), k.double(), v.double()
    n_rep = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(n_rep, dim=1)  # repeat_kv: query head i uses kv head i // n_rep
    v = v.repeat_interleave(n_rep, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    scores = (q @ k.transpose(-1, -2)) * scale
    ok = _allowed(q.shape[2], k.shape[2], causal, window)
    scores = scores.masked_fill(~ok, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.exp(scores - lse[..., None]) @ v
    empty = ~ok.any(dim=-1)
    out[..., empty, :] = 0.0
    return out, lse


def _hp_row(q_row, k, v, *, scale, allowed):
    """One query row in 50-digit arithmetic from the exact float64 input values: (out list, lse)."""
    keys = [j for j in range(k.shape[0]) if allowed[j]]
    if not keys:
        return [mpmath.mpf(0)] * v.shape[1], -mpmath.inf
    qs = [mpmath.mpf(float(x)) for x in q_row]
    scores = {}
    for j in keys:
        dot = mpmath.fsum(a * mpmath.mpf(float(b)) for a, b in zip(qs, k[j].tolist(), strict=True))
        scores[j] = dot * scale
    m = max(scores.values())
    w = {j: mpmath.exp(s - m) for j, s in scores.items()}
    l = mpmath.fsum(w.values())
    vt = v.tolist()
    out = [mpmath.fsum(w[j] * mpmath.mpf(vt[j][c]) for j in keys) / l for c in range(v.shape[1])]
    return out, m + mpmath.log(l)


HP_CASES = {
    # name: (h_q, h_kv, s_q, s_k, d_qk, d_v, causal, window, spread)
    "mha-d64": (2, 2, 64, 64, 64, 64, False, None, 1.0),
    "gqa-causal-peaky": (4, 2, 37, 53, 32, 32, True, None, 2.5),
    "mqa-window": (3, 1, 48, 48, 16, 16, True, 9, 1.5),
    "mla-dims": (2, 1, 40, 40, 48, 24, False, None, 1.0),
    "logits-beyond-exp-range": (2, 2, 40, 45, 16, 16, True, None, 30.0),  # |score| ~ 1e3 > log(max float)
}


@pytest.mark.parametrize("case", list(HP_CASES), ids=list(HP_CASES))
def test_matches_50_digit_arithmetic(case):
    h_q, h_kv, s_q, s_k, d_qk, d_v, causal, window, spread = HP_CASES[case]
    q, k, v = _qkv(1, h_q, h_kv, s_q, s_k, d_qk, d_v, seed=1, spread=spread)
    out, lse = attention_fp64(q, k, v, causal=causal, window=window, chunk_size=16)
    allowed = _allowed(s_q, s_k, causal, window)
    n_rep = h_q // h_kv
    with mpmath.workdps(50):
        scale = 1 / mpmath.sqrt(d_qk)  # the exact scale, not its float64 rounding
        for h in (0, h_q - 1):
            for i in (0, 1, s_q // 2, s_q - 1):
                out_hp, lse_hp = _hp_row(
                    q[0, h, i], k[0, h // n_rep], v[0, h // n_rep], scale=scale, allowed=allowed[i]
                )
                out_hp = torch.tensor([float(x) for x in out_hp], dtype=torch.float64)
                err = (out[0, h, i] - out_hp).abs().max().item()
                assert err <= HP_RTOL * v.abs().max().item(), f"head {h} row {i}: out err {err:.3e}"
                lse_err = abs(lse[0, h, i].item() - float(lse_hp))
                assert lse_err <= HP_RTOL * max(1.0, abs(float(lse_hp))), f"head {h} row {i}: lse {lse_err}"


NAIVE_CASES = {
    # name: (b, h_q, h_kv, s_q, s_k, d_qk, d_v, causal, window, chunk_size)
    "mha": (2, 3, 3, 113, 113, 64, 64, False, None, 32),
    "gqa-causal": (1, 6, 2, 239, 239, 32, 32, True, None, 50),
    "mqa-causal": (2, 4, 1, 113, 113, 16, 16, True, None, 7),
    "window": (1, 4, 2, 239, 239, 32, 32, True, 17, 64),
    "window-noncausal-flag": (1, 2, 1, 113, 113, 16, 16, False, 10, 30),
    "window-1": (1, 2, 2, 64, 64, 16, 16, True, 1, 13),
    "sq<sk-causal": (1, 4, 2, 113, 203, 32, 32, True, None, 40),
    "sq<sk-window": (1, 2, 1, 57, 203, 32, 32, True, 33, 20),
    "sq>sk-causal": (1, 2, 2, 203, 113, 32, 32, True, None, 64),
    "sq>sk-noncausal": (1, 2, 1, 203, 113, 32, 32, False, None, 64),
    "decode-1-row": (2, 4, 2, 1, 239, 64, 64, True, None, 1024),
    "mla-192-128": (1, 4, 4, 113, 113, 192, 128, True, None, 48),
    "mla-absorbed-576-512": (1, 4, 1, 61, 61, 576, 512, True, None, 16),
}


@pytest.mark.parametrize("case", list(NAIVE_CASES), ids=list(NAIVE_CASES))
def test_matches_naive_unchunked(case):
    b, h_q, h_kv, s_q, s_k, d_qk, d_v, causal, window, chunk = NAIVE_CASES[case]
    q, k, v = _qkv(b, h_q, h_kv, s_q, s_k, d_qk, d_v, seed=2, spread=1.5)
    out, lse = attention_fp64(q, k, v, causal=causal, window=window, chunk_size=chunk)
    out_ref, lse_ref = _naive(q, k, v, causal=causal, window=window)
    assert out.dtype == lse.dtype == torch.float64
    assert out.shape == (b, h_q, s_q, d_v) and lse.shape == (b, h_q, s_q)
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out, out_ref, rtol=0, atol=NAIVE_ATOL)
    torch.testing.assert_close(lse, lse_ref, rtol=0, atol=NAIVE_ATOL * 10)


@pytest.mark.parametrize("chunk", [1, 7, 64, 113, 4096])
def test_chunk_size_does_not_change_result(chunk):
    q, k, v = _qkv(1, 4, 2, 113, 150, 32, seed=3)
    out_one, lse_one = attention_fp64(q, k, v, causal=True, window=40, chunk_size=113)
    out, lse = attention_fp64(q, k, v, causal=True, window=40, chunk_size=chunk)
    torch.testing.assert_close(out, out_one, rtol=0, atol=NAIVE_ATOL)
    torch.testing.assert_close(lse, lse_one, rtol=0, atol=NAIVE_ATOL)


def test_gqa_head_mapping_is_repeat_kv():
    """Query head i must use kv head i // n_rep, not i % h_kv: the two disagree far above tolerance."""
    q, k, v = _qkv(1, 4, 2, 33, 33, 16, seed=4)
    out, _ = attention_fp64(q, k, v)
    out_interleave, _ = _naive(q, k, v)
    out_tiled, _ = _naive(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1))  # head i -> kv head i % 2
    torch.testing.assert_close(out, out_interleave, rtol=0, atol=NAIVE_ATOL)
    assert (out - out_tiled).abs().max() > 1e-2


def test_masks_change_the_result():
    """Causal and window cases must not pass vacuously: each mask changes the output."""
    q, k, v = _qkv(1, 2, 2, 64, 64, 16, seed=5)
    plain, _ = attention_fp64(q, k, v)
    causal, _ = attention_fp64(q, k, v, causal=True)
    windowed, _ = attention_fp64(q, k, v, causal=True, window=8)
    assert (plain - causal).abs().max() > 1e-2
    assert (causal - windowed).abs().max() > 1e-2
    # first row sees only key 0; with window 1 every row sees only its own key
    torch.testing.assert_close(causal[:, :, 0], v[:, :, 0], rtol=0, atol=1e-15)
    only_self, lse_self = attention_fp64(q, k, v, causal=True, window=1)
    torch.testing.assert_close(only_self, v, rtol=0, atol=1e-15)
    torch.testing.assert_close(lse_self, (q * k).sum(-1) / 4.0, rtol=1e-15, atol=1e-15)


def test_fully_masked_rows_give_zero_and_minus_inf():
    # s_q > s_k, causal bottom-right: query i sits at key position i - 40, so rows 0..39 see no key
    q, k, v = _qkv(1, 2, 1, 100, 60, 16, seed=6)
    out, lse = attention_fp64(q, k, v, causal=True, chunk_size=16)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out[:, :, :40] == 0).all()
    assert torch.isneginf(lse[:, :, :40]).all()
    assert torch.isfinite(lse[:, :, 40:]).all()
    torch.testing.assert_close(out[:, :, 40], v[:, 0, 0].expand(2, -1)[None], rtol=0, atol=1e-15)
    out_ref, lse_ref = _naive(q, k, v, causal=True)
    torch.testing.assert_close(out, out_ref, rtol=0, atol=NAIVE_ATOL)
    torch.testing.assert_close(lse, lse_ref, rtol=0, atol=NAIVE_ATOL)


def test_no_keys_at_all():
    q, _, _ = _qkv(1, 2, 2, 5, 5, 8)
    k = torch.zeros(1, 2, 0, 8, dtype=torch.float64)
    v = torch.zeros(1, 2, 0, 4, dtype=torch.float64)
    out, lse = attention_fp64(q, k, v)
    assert out.shape == (1, 2, 5, 4) and (out == 0).all()
    assert torch.isneginf(lse).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
def test_low_precision_inputs_are_upcast_exactly(dtype):
    q, k, v = _qkv(1, 4, 2, 45, 45, 32, seed=7, dtype=dtype)
    out, lse = attention_fp64(q, k, v, causal=True)
    out64, lse64 = attention_fp64(q.double(), k.double(), v.double(), causal=True)
    assert out.dtype == lse.dtype == torch.float64
    assert torch.equal(out, out64) and torch.equal(lse, lse64)


def test_sm_scale_and_device_arguments():
    q, k, v = _qkv(1, 2, 2, 20, 20, 16, seed=8)
    out, lse = attention_fp64(q, k, v, sm_scale=0.3, device="cpu")
    out_ref, lse_ref = _naive(q, k, v, sm_scale=0.3)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, out_ref, rtol=0, atol=NAIVE_ATOL)
    torch.testing.assert_close(lse, lse_ref, rtol=0, atol=NAIVE_ATOL)
    default, _ = attention_fp64(q, k, v, sm_scale=None)
    quarter, _ = attention_fp64(q, k, v, sm_scale=0.25)  # 1/sqrt(16)
    assert torch.equal(default, quarter)


def _bad(shape_q=(1, 4, 8, 16), shape_k=(1, 2, 8, 16), shape_v=(1, 2, 8, 16)):
    return torch.randn(shape_q), torch.randn(shape_k), torch.randn(shape_v)


BAD_INPUTS = {
    "rank": (lambda: (torch.randn(4, 8, 16), *_bad()[1:]), {}, r"q must be 4-D .* got 3-D"),
    "batch": (lambda: _bad(shape_k=(2, 2, 8, 16)), {}, r"batch sizes differ: q 1, k 2, v 1"),
    "head_dim": (lambda: _bad(shape_k=(1, 2, 8, 32), shape_v=(1, 2, 8, 32)), {}, r"same head_dim"),
    "kv-heads": (lambda: _bad(shape_v=(1, 1, 8, 16)), {}, r"same number of heads, got k 2, v 1"),
    "kv-seq": (lambda: _bad(shape_v=(1, 2, 9, 16)), {}, r"same seq length, got k 8, v 9"),
    "gqa-ratio": (lambda: _bad(shape_k=(1, 3, 8, 16), shape_v=(1, 3, 8, 16)), {}, r"multiple of kv heads"),
    "int-dtype": (lambda: (torch.ones(1, 4, 8, 16, dtype=torch.int32), *_bad()[1:]), {}, r"q must .*float"),
    "window-0": (_bad, {"window": 0}, r"window must be an int >= 1"),
    "window-float": (_bad, {"window": 2.5}, r"window must be an int >= 1"),
    "chunk-0": (_bad, {"chunk_size": 0}, r"chunk_size must be an int >= 1"),
    "scale-nan": (_bad, {"sm_scale": float("nan")}, r"sm_scale must be finite"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_inputs_raise(case):
    make, kwargs, match = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=match):
        attention_fp64(*make(), **kwargs)


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_inputs_name_the_tensor(name, bad):
    q, k, v = _bad()
    {"q": q, "k": k, "v": v}[name][0, 1, 3, 5] = bad
    with pytest.raises(ValueError, match=rf"^{name} contains non-finite values"):
        attention_fp64(q, k, v)


def test_non_tensor_input_raises_type_error():
    q, k, v = _bad()
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        attention_fp64(q, k.numpy(), v)


@pytest.mark.gpu
def test_cuda_matches_cpu():
    q, k, v = _qkv(2, 8, 2, 239, 239, 128, seed=9, dtype=torch.bfloat16)
    out_cpu, lse_cpu = attention_fp64(q, k, v, causal=True, window=64, chunk_size=50)
    out_gpu, lse_gpu = attention_fp64(q.cuda(), k.cuda(), v.cuda(), causal=True, window=64, chunk_size=50)
    assert out_gpu.device.type == "cuda"
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, rtol=0, atol=NAIVE_ATOL)
    torch.testing.assert_close(lse_gpu.cpu(), lse_cpu, rtol=0, atol=NAIVE_ATOL)


_LONG_RUN = textwrap.dedent(
    """
    import math, resource, torch
    from zyfa.reference import attention_fp64
    s, d = 32768, 64
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, s, d, generator=gen, dtype=torch.bfloat16) for _ in range(3))
    out, lse = attention_fp64(q, k, v, chunk_size=1024)
    rows = [0, 1, 12345, s - 1]
    scores = q[0, 0, rows].double() @ k[0, 0].double().T / math.sqrt(d)  # 4 full rows, direct
    # their log-sum-exp by math.fsum: torch.logsumexp's first call in a process after a matmul came out 1.5e-11 off
    # (1.4e-12 relative) in about one process in three on an Intel (AVX-512) host, PyTorch 2.13 CPU
    lse_rows = torch.tensor([mx + math.log(math.fsum(torch.exp(r - mx).tolist()))
                             for r, mx in zip(scores, scores.amax(-1).tolist())], dtype=torch.float64)
    out_rows = torch.exp(scores - lse_rows[:, None]) @ v[0, 0].double()
    err_out = (out[0, 0, rows] - out_rows).abs().max().item()
    err = max(err_out, (lse[0, 0, rows] - lse_rows).abs().max().item())
    try:  # this process's own peak: ru_maxrss also counts the parent's RSS at fork, VmHWM does not
        with open("/proc/self/status") as f:
            peak = next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) // 1024
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(peak, err, bool(out.isfinite().all()))
    """
)


@pytest.mark.slow
def test_32k_tokens_in_bounded_memory():
    """32K x 32K scores would need 8 GiB in float64; the chunked oracle stays far below it."""
    done = subprocess.run([sys.executable, "-c", _LONG_RUN], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    peak_mib, err, finite = done.stdout.split()
    assert finite == "True"
    assert float(err) < 1e-13
    assert int(peak_mib) < 2048, f"peak RSS {peak_mib} MiB"
