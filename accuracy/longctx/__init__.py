"""Long-context retrieval with any attention implementation in a real model: ``zyfa longctx``.

- :mod:`zyfa.accuracy.longctx.tasks`: needle-in-a-haystack and passkey prompts, exactly ``length`` tokens each.
- :mod:`zyfa.accuracy.longctx.run`: the grid (model x task x length x depth x seed x implementation), scored by
  teacher forcing, rows appended as batches finish.
- :mod:`zyfa.accuracy.longctx.scores`: cell and length aggregates, intervals, the baseline exclusion, paired
  differences against the FP32 baseline.
- :mod:`zyfa.accuracy.longctx.section`: the report section (heatmaps, accuracy against length, error curves).
- :mod:`zyfa.accuracy.longctx.args`: the command's flags and their torch-free checks.
- :mod:`zyfa.accuracy.longctx.cli`: the command.
"""
