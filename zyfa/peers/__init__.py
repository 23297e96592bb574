"""The real peer kernels, one module per peer, below both the benchmark (:mod:`zyfa.bench`) and the accuracy
runner's registry (:mod:`zyfa.accuracy.implementations.registry`), which wrap them: each module installs nothing,
imports its package only when called, and says whether it can run here (``check()``).

| module | peer | package |
|---|---|---|
| :mod:`zyfa.peers.cudnn_fp8` | cuDNN's FP8 SDPA (graph ``sdpa_fp8``) | nvidia-cudnn-frontend |
| :mod:`zyfa.peers.flashinfer_fa3` | FA3's FP8 forward as FlashInfer builds it for sm_90 | flashinfer-python |
| :mod:`zyfa.peers.flash_attn_amd` | AMD's Triton FP8 forward (``flash_attn_triton_amd``) | flash-attn |
| :mod:`zyfa.peers.sdpa` | PyTorch SDPA, BF16 (cuDNN, flash backends) or fp32 | torch |
| :mod:`zyfa.peers.common` | availability checks, descale layouts, ``Prepared`` | — |
| :mod:`zyfa.peers.registry` | the one table of peer names (``PEERS``) and ``prepare(name, q, k, v, ...)`` | — |

Each peer module has ``prepare(q, k, v, *, causal, sm_scale) -> Prepared``: "prepare once, call many" (its
recipe's quantizer and any graph or layout made once; ``call()`` launches, ``output()`` reads the last output).
``zyfa bench`` times those calls; the accuracy registry runs one call per input.

Our own Triton kernel is :mod:`zyfa.kernels.attention_fp8`.
"""
