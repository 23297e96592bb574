"""cuDNN's FP8 SDPA through nvidia-cudnn-frontend's graph API (``sdpa_fp8``) on Hopper: one forward on FP8 Q, K, V
with per-tensor descales.

On Hopper it writes FP8 output only, so its output scale must be chosen: from a first pass's amax(O) (taken
before the FP8 cast) or from a given amax (the FP64 oracle's, for the ``oracle-scale`` variant). The choice is
returned with the output.

Exposed: ``CUDNN_FP8_RECIPE``, ``check()``, ``prepare(q, k, v, ...)`` (the peer API's "prepare once, call many":
the recipe's quantizer, then the graph built once; what the bench times and the accuracy registry runs),
``PreparedCudnnFp8`` (the graph on given FP8 tensors), ``SEQ_BUCKET``, ``GRAPH_CACHE_SIZE``, ``cached_graphs()``,
``clear_graph_cache()``. The graph is built here and nowhere else, once per shape (a model's layers and a
recomputing decode's steps reuse it; the data, descales and output scale are bound per call).

Building a graph costs seconds (cuDNN compiles the FP8 kernel at run time), so a length that is not a multiple of
:data:`SEQ_BUCKET` runs in the graph of the next multiple: Q, K and V padded with zeros, cuDNN's padding mask given
the true lengths, and the rows past the true length dropped. A decode that re-runs the sequence each step then builds
one graph per 64 tokens instead of one per token. The padded graph gives the exact-length graph's output, lse and
output amax bit for bit (checked on the GPU, tests/zyfa/test_cudnn_fp8_graph_cache_gpu.py); a length that is a
multiple runs unpadded, as before.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from zyfa.emulator import quantize_inputs
from zyfa.peers.common import Prepared, all_checks, cuda_check, dist_version, expand_kv, package_check

__all__ = ["CUDNN_FP8_RECIPE", "GRAPH_CACHE_SIZE", "SEQ_BUCKET", "PreparedCudnnFp8", "cached_graphs", "check",
           "clear_graph_cache", "prepare"]

CUDNN_FP8_RECIPE = "cudnn-fp8"  # the recipe whose quantizer feeds it (per-tensor descales) and whose numerics it has

check = all_checks(lambda: cuda_check(exact_major=9), lambda: package_check("cudnn", "nvidia-cudnn-frontend"))


@dataclass
class _Built:
    """One built cuDNN FP8 SDPA graph and its tensor handles (Q, K, V, the six scalars, O, stats, both amaxes, and
    the true lengths where it is padded) and workspace. A graph is fixed to its shapes, strides, mask and softmax
    scale, not to the data it runs on."""
    graph: Any
    handles: dict
    workspace: torch.Tensor


# built graphs by (shapes, strides, causal, sm_scale, padded, device): a model's layers share one shape per forward,
# and a recomputing decode's steps one bucket of SEQ_BUCKET lengths, so each is built once, not once per layer and call
_GRAPHS: OrderedDict[tuple, _Built] = OrderedDict()
GRAPH_CACHE_SIZE = 32
SEQ_BUCKET = 64  # lengths run in the graph of the next multiple of this (padding mask), one graph per bucket


def cached_graphs() -> int:
    """How many built graphs the cache holds (at most :data:`GRAPH_CACHE_SIZE`)."""
    return len(_GRAPHS)


def clear_graph_cache() -> None:
    """Forget every built graph (the next call of each shape builds it again)."""
    _GRAPHS.clear()


def _graph_key(q8, k8, v8, causal: bool, sm_scale: float, padded: bool) -> tuple:
    return (tuple(q8.shape), tuple(q8.stride()), tuple(k8.shape), tuple(k8.stride()), tuple(v8.shape),
            tuple(v8.stride()), bool(causal), float(sm_scale), bool(padded), str(q8.device))


def _bucket(s: int) -> int:
    return -(-s // SEQ_BUCKET) * SEQ_BUCKET


def _pad_seq(x: torch.Tensor, s: int) -> torch.Tensor:
    """x (b, h, n, d) with zero rows appended up to n = s (x itself when n = s)."""
    if x.shape[2] == s:
        return x
    out = torch.zeros((*x.shape[:2], s, x.shape[3]), dtype=x.dtype, device=x.device)
    out[:, :, :x.shape[2]] = x
    return out


def _build(q8, k8, v8, causal: bool, sm_scale: float, padded: bool) -> _Built:
    """The graph for these tensors' shapes, from the cache or built (heuristics A, then the fallback). ``padded``:
    the graph takes the true lengths (b, 1, 1, 1) and masks the rows and keys past them (cuDNN's padding mask)."""
    key = _graph_key(q8, k8, v8, causal, sm_scale, padded)
    hit = _GRAPHS.get(key)
    if hit is not None:
        _GRAPHS.move_to_end(key)
        return hit
    import cudnn

    b, h, s_q, _ = q8.shape
    d_v = v8.shape[3]
    dt = cudnn.data_type
    g = cudnn.pygraph(io_data_type=dt.FP8_E4M3, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT)

    def tensor(name, t):
        return g.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=dt.FP8_E4M3)

    def scalar(name):
        return g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=dt.FLOAT)

    Q, K, V = tensor("Q", q8), tensor("K", k8), tensor("V", v8)
    names = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
    S = {n: scalar(n) for n in names}
    lengths = {}
    if padded:
        lengths = {n: g.tensor(name=n, dim=[b, 1, 1, 1], stride=[1, 1, 1, 1], data_type=dt.INT32)
                   for n in ("seq_len_q", "seq_len_kv")}
    O, stats, amax_s, amax_o = g.sdpa_fp8(
        Q, K, V, S["descale_q"], S["descale_k"], S["descale_v"], S["descale_s"], S["scale_s"], S["scale_o"],
        generate_stats=True, attn_scale=float(sm_scale), use_causal_mask=bool(causal), name="sdpa_fp8",
        **({"use_padding_mask": True, **lengths} if padded else {}))
    O.set_output(True).set_dim([b, h, s_q, d_v]).set_stride([h * s_q * d_v, s_q * d_v, d_v, 1]).set_data_type(
        dt.FP8_E4M3)
    stats.set_output(True).set_data_type(dt.FLOAT)
    for a in (amax_o, amax_s):
        a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(dt.FLOAT)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    built = _Built(graph=g, handles={"Q": Q, "K": K, "V": V, **S, **lengths, "O": O, "stats": stats,
                                     "amax_o": amax_o, "amax_s": amax_s},
                   workspace=torch.empty(g.get_workspace_size(), device=q8.device, dtype=torch.uint8))
    _GRAPHS[key] = built
    while len(_GRAPHS) > GRAPH_CACHE_SIZE:
        _GRAPHS.popitem(last=False)
    return built


class PreparedCudnnFp8:
    """cuDNN's FP8 SDPA graph for one shape (built once per bucket of :data:`SEQ_BUCKET` lengths and kept:
    :data:`GRAPH_CACHE_SIZE` graphs), with this call's tensors bound (padded where the length is not a multiple):
    ``call()`` launches it (what a benchmark times), ``output()`` is the last output dequantized (fp32 (b, h, s_q,
    d_v)), ``lse()`` its log-sum-exp (b, h, s_q, natural log), ``details`` the output-scale choice and versions."""

    def __init__(self, q8, k8, v8, q_descale, k_descale, v_descale, *, causal: bool, sm_scale: float,
                 out_amax: float | None = None):
        b, h, s_q, _ = q8.shape
        s_k, d_v = v8.shape[2], v8.shape[3]
        pq, pk = _bucket(s_q), _bucket(s_k)
        padded = (pq, pk) != (s_q, s_k)
        if padded:
            q8, k8, v8 = _pad_seq(q8, pq), _pad_seq(k8, pk), _pad_seq(v8, pk)
        built = _build(q8, k8, v8, causal, sm_scale, padded)
        H = built.handles
        dev = q8.device
        self._graph = built.graph
        self._ws = built.workspace
        one = torch.ones((1, 1, 1, 1), dtype=torch.float32, device=dev)
        self._scale_o = one.clone()
        self._o_full = torch.empty((b, h, pq, d_v), dtype=torch.float8_e4m3fn, device=dev)
        self._lse_full = torch.empty((b, h, pq, 1), dtype=torch.float32, device=dev)
        self._o, self._lse = self._o_full[:, :, :s_q], self._lse_full[:, :, :s_q]
        self._shape = (b, h, s_q)

        def d(t):
            return torch.as_tensor(t, dtype=torch.float32, device=dev).reshape(1, 1, 1, 1).contiguous()

        amax_o = torch.empty_like(one)
        self._pack = {H["Q"]: q8, H["K"]: k8, H["V"]: v8, H["descale_q"]: d(q_descale),
                      H["descale_k"]: d(k_descale), H["descale_v"]: d(v_descale), H["descale_s"]: one / 448.0,
                      H["scale_s"]: one * 448.0, H["scale_o"]: self._scale_o, H["O"]: self._o_full,
                      H["stats"]: self._lse_full, H["amax_o"]: amax_o, H["amax_s"]: torch.empty_like(one)}
        if padded:
            for name, n in (("seq_len_q", s_q), ("seq_len_kv", s_k)):
                self._pack[H[name]] = torch.full((b, 1, 1, 1), n, dtype=torch.int32, device=dev)
        if out_amax is not None:
            amax, choice = float(out_amax), "oracle amax: 448 / max|O_fp64|"
        else:
            self.call()  # first pass at scale_o = 1: its amax(O) (taken before the FP8 cast) sets the scale
            torch.cuda.synchronize(dev)
            amax = float(amax_o.reshape(-1)[0])
            choice = "first-pass amax: 448 / amax(O) of a run at scale_o=1"
        if not (math.isfinite(amax) and amax > 0):
            amax = 448.0  # all-zero output: keep scale_o = 1
        self._scale_o.fill_(448.0 / amax)
        # one launch at the chosen scale, so output() and lse() are this data's before any call(): the first pass
        # left O at scale 1 in the buffer, which output() would divide by the new scale (a rel-L2 of ~1 against any
        # reference: scripts/ab_kernel_variants.py read it so until 7 December)
        self.call()
        self.details = {"scale_o_choice": choice, "scale_o": 448.0 / amax,
                        "graph_lengths": [pq, pk] if padded else None,
                        "cudnn_frontend": dist_version("nvidia-cudnn-frontend"),
                        "cudnn_backend": torch.backends.cudnn.version()}

    def call(self) -> torch.Tensor:
        """One launch; returns the FP8 output tensor (scaled by ``details['scale_o']``)."""
        self._graph.execute(self._pack, self._ws)
        return self._o

    def output(self) -> torch.Tensor:
        return self._o.float() / self._scale_o

    def lse(self) -> torch.Tensor:
        return self._lse.reshape(self._shape)  # a copy where padded (the rows are strided)


def prepare(q, k, v, *, causal: bool, sm_scale: float, out_amax: float | None = None) -> Prepared:
    """cuDNN's FP8 SDPA prepared once on q (b, h, s_q, d_qk), k/v (b, h_kv, s_k, d): the FP8 values and per-tensor
    descales of :data:`CUDNN_FP8_RECIPE`'s quantizer, GQA's K/V heads repeated after quantizing (same FP8 values and
    descales, so no reliance on the graph's GQA support), then the graph built with them bound. ``out_amax``: the
    output amax its FP8 output scale is set from (None: a first pass at scale 1 measures it). ``output()`` is
    dequantized (fp32); ``details`` holds ``scale_o``, ``scale_o_choice`` and versions."""
    qi = quantize_inputs(q, k, v, CUDNN_FP8_RECIPE)
    h = q.shape[1]
    q8 = qi.q_values.to(torch.float8_e4m3fn).contiguous()
    k8 = expand_kv(qi.k_values, h).to(torch.float8_e4m3fn).contiguous()
    v8 = expand_kv(qi.v_values, h).to(torch.float8_e4m3fn).contiguous()
    graph = PreparedCudnnFp8(q8, k8, v8, qi.q_descale.float(), qi.k_descale.float(), qi.v_descale.float(),
                             causal=causal, sm_scale=sm_scale, out_amax=out_amax)
    return Prepared(call=graph.call, output=graph.output, lse=graph.lse, details=graph.details)
