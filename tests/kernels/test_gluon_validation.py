"""CPU tests of attention_fp8_gluon's validation: clear errors before Triton / Gluon loads (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.fresh_import import imports_heavy
from tests.kernels.test_wrapper_validation import FP8
from tests.kernels.test_wrapper_validation import qkv as _qkv
from zyfa.kernels.attention_gluon import attention_fp8_gluon


def qkv(b=1, h=2, h_kv=2, s_q=128, s_k=128, d=128, dtype=FP8):
    """The wrapper tests' inputs at the Gluon kernel's shape (whole 128-token tiles, one head dim)."""
    return _qkv(b, h, h_kv, s_q, s_k, d, d, dtype)


def test_import_does_not_import_gluon():
    assert not imports_heavy("zyfa.kernels.attention_gluon", "triton.experimental.gluon")


@pytest.mark.parametrize("pingpong", [False, True])
def test_cpu_tensors_refused(pingpong):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="CUDA GPU"):
        attention_fp8_gluon(q, k, v, 1.0, 1.0, 1.0, pingpong=pingpong)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e5m2])
def test_wrong_dtype(dtype):
    q, k, v = qkv(dtype=dtype)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        attention_fp8_gluon(q, k, v, 1.0, 1.0, 1.0, pingpong=False)


@pytest.mark.parametrize("d", [64, 256])
def test_wrong_head_dim(d):
    q, k, v = qkv(d=d)
    with pytest.raises(ValueError, match="head dim 128"):
        attention_fp8_gluon(q, k, v, 1.0, 1.0, 1.0, pingpong=True)


def test_unsupported_head_dim_named_by_shared_check():
    q, k, v = qkv(d=96)
    with pytest.raises(ValueError, match="unsupported head dims"):
        attention_fp8_gluon(q, k, v, 1.0, 1.0, 1.0, pingpong=False)


def test_mla_head_dims_refused():
    q = torch.randn(1, 2, 128, 192).to(FP8)
    k = torch.randn(1, 2, 128, 192).to(FP8)
    v = torch.randn(1, 2, 128, 128).to(FP8)
    with pytest.raises(ValueError, match="head dim 128"):
        attention_fp8_gluon(q, k, v, 1.0, 1.0, 1.0, pingpong=False)


def test_causal_refused():
    from zyfa.kernels.attention_gluon import _validate_gluon

    q, k, v = qkv()
    with pytest.raises(ValueError, match="non-causal"):
        _validate_gluon(q, k, v, True, None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'causal'"):
        attention_fp8_gluon(q, k, v, 1.0, 1.0, 1.0, pingpong=False, causal=True)


@pytest.mark.parametrize("s_q,s_k", [(100, 128), (128, 200), (129, 129)])
def test_seq_not_multiple_of_tile(s_q, s_k):
    q, k, v = qkv(s_q=s_q, s_k=s_k)
    with pytest.raises(ValueError, match="multiples of 128"):
        attention_fp8_gluon(q, k, v, 1.0, 1.0, 1.0, pingpong=True)


def test_shape_and_stride_errors():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="4-D"):
        attention_fp8_gluon(q[0], k, v, 1.0, 1.0, 1.0, pingpong=False)
    with pytest.raises(ValueError, match="share batch, heads and seq"):
        attention_fp8_gluon(q, k, v[:, :, :64], 1.0, 1.0, 1.0, pingpong=False)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention_fp8_gluon(*qkv(h=3, h_kv=2), 1.0, 1.0, 1.0, pingpong=False)
    qt = torch.randn(1, 2, 128, 128).to(FP8).transpose(-1, -2)  # (1, 2, 128, 128), last dim strided
    with pytest.raises(ValueError, match="contiguous last dim"):
        attention_fp8_gluon(qt, k, v, 1.0, 1.0, 1.0, pingpong=False)
    with pytest.raises(TypeError, match="torch.Tensor"):
        attention_fp8_gluon([1], k, v, 1.0, 1.0, 1.0, pingpong=False)


def test_bad_descales_and_scalars():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="q_descale must be a positive"):
        attention_fp8_gluon(q, k, v, -1.0, 1.0, 1.0, pingpong=False)
    with pytest.raises(ValueError, match="k_descale must be one scalar or of shape"):
        attention_fp8_gluon(q, k, v, 1.0, torch.ones(3), 1.0, pingpong=False)
    with pytest.raises(ValueError, match="sm_scale"):
        attention_fp8_gluon(q, k, v, 1.0, 1.0, 1.0, pingpong=False, sm_scale=-0.1)
    with pytest.raises(TypeError, match="pingpong must be a bool"):
        attention_fp8_gluon(q, k, v, 1.0, 1.0, 1.0, pingpong=1)
