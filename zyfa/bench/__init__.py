"""``zyfa bench``: TFLOP/s of the Triton FP8 kernel (recipes and ablations) against cuDNN and SDPA (GPU only).

Every case runs in one process on one GPU, so ratios between implementations come from the same run:
our kernel per recipe (kernel time; V's one-off transpose timed separately, and for recipes with ``qk_rotation``
the rotation of Q and K before the kernel, also on its own: :func:`zyfa.bench.cases.rotation_times`), PyTorch SDPA
in bf16 with the cuDNN and flash backends, cuDNN's FP8 attention (``nvidia-cudnn-frontend`` graph ``sdpa_fp8``; FP8
output on Hopper), AMD's Triton FP8 forward from the ``flash-attn`` package (``flash-attn-triton-amd``: it
reads V as stored, so it has no transpose to time; docs/real_kernels.md) and FA3's FP8 forward as FlashInfer builds
it for sm_90 (``flashinfer-fa3``, NHD layout, one launch per sequence; d_qk = d_v in 64, 128, 256 only).
With ``--cute-recipes``, our CuTe DSL kernel (:mod:`zyfa.kernels.attention_cute`, ``cute-fp8`` rows; V's transpose
timed apart as for the Triton kernel) runs in the same interleaving.
Shapes: batch 1, ``--hidden`` / d_v heads (MLA: 16 heads, QK 192 / V 128), sequence lengths 8K, 16K, 32K
(s_q = s_k). FLOPs = 4·b·h·s_q·s_k·d (2·(d_qk + d_v) for MLA), halved for causal.

Method (docs/DESIGN.md 'Measuring speed'): inputs never zeros (Gaussian, or a captured HDF5 slice tiled to the
length), each output checked against an SDPA bf16 reference before timing, ``triton.testing.do_bench``
medians, SM clock and power sampled by NVML (nvidia-ml-py) in a background thread during each timed run.
Writes ``--out`` (default ``bench.json`` in the current directory; never over an existing file unless
``--overwrite``) and the Markdown next to it (``bench.md``), with the command, date, versions, device and git
commit inside; both are rewritten atomically after every shape, so an interrupted run keeps what it measured.
The committed run is ``reports/bench/bench.json`` / ``.md``, written by ``scripts/gpu_check.sh``.

Modules, by role:

| module | role |
|---|---|
| :mod:`zyfa.bench.cli` | the command: arguments, the loop over shapes and inputs, the result files |
| :mod:`zyfa.bench.cases` | one case: inputs, our kernel and the peers prepared (:mod:`zyfa.peers`), checked, timed |
| :mod:`zyfa.bench.table` | the bench table: Markdown from the rows (no torch; the report's speed section uses it) |
"""
