"""The real peer kernels, one module per peer, below both the benchmark (:mod:`zyfa.bench`) and the accuracy
runner's registry (:mod:`accuracy.implementations`), which wrap them: each module installs nothing, imports its
package only when called, and says whether it can run here (``check()``).

| module | peer | package |
|---|---|---|
| :mod:`zyfa.peers.cudnn_fp8` | cuDNN's FP8 SDPA (graph ``sdpa_fp8``) | nvidia-cudnn-frontend |
| :mod:`zyfa.peers.flashinfer_fa3` | FA3's FP8 forward as FlashInfer builds it for sm_90 | flashinfer-python |
| :mod:`zyfa.peers.flash_attn_amd` | AMD's Triton FP8 forward (``flash_attn_triton_amd``) | flash-attn |
| :mod:`zyfa.peers.sdpa` | PyTorch SDPA, BF16 (cuDNN, flash backends) or fp32 | torch |
| :mod:`zyfa.peers.common` | availability checks, the recipe-spec resolver, descale layouts | — |

Our own Triton kernel is :mod:`zyfa.kernels.attention_fp8`.
"""
