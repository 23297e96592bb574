"""What FP8 attention does to the model: perplexity and next-token KL with a recipe's emulator swapped in.

Operator error (accuracy.operator.runner) is a proxy; this module measures the model itself. Every attention layer
of a real model (or one layer at a time) runs a recipe's tiled emulator instead of the model's own
attention, through capture.hook.swap_attention, on held-out text windows (``zyfa.capture.text.token_window``,
``split="heldout"``: the odd slices of the token stream, never the capture windows). Against the stock
model (transformers' ``sdpa``, run once per window and reused) we report:

* ``delta_ppl`` = ppl_recipe - ppl_stock and ``ppl_ratio`` = ppl_recipe / ppl_stock (perplexity of the
  window's own next tokens, positions 0..s-2);
* ``kl_mean``: mean over positions of KL(stock || recipe) of the next-token distributions, in nats/token
  (computed in float64 from the fp32 logits), plus its p99 and max, and the top-1 agreement;
* confidence intervals over windows (scipy bootstrap, accuracy.scoring.metrics.bootstrap_ci) and, because windows
  are few, also over 256-token blocks of all windows pooled (blocks are not independent: a rough guide);
* per-layer sensitivity: one layer swapped at a time; that layer sees exactly the stock q/k/v, so the
  recipe's operator error there (rel-L2 against reference.attention_fp64 of the original q/k/v, and of the
  dequantized ones: the kernel's own error) comes from the same forward pass; Spearman's rho between
  per-layer operator error and per-layer KL says whether operator error predicts the damage.

The adaptor (:class:`RecipeAttention`) is a transformers attention function: ``fn(module, query, key,
value, attention_mask, *, scaling, sliding_window=None, **kw) -> ((b, s, h, d) output, None)``. It runs
``emulate(q, k, v, recipe, causal=True, sm_scale=scaling, window=sliding_window)`` and returns the output in
the model's dtype. It expresses only causal and causal+sliding-window attention: a tensor mask must be
exactly that pattern (padding or packed-sequence masks raise :class:`UnsupportedMaskError`); the expected
pattern is built once per (s_q, s_k, window) and each mask costs one ``torch.equal``.

Modules: :mod:`zyfa.accuracy.impact.model` (the attention adaptor and the logits comparison, torch),
:mod:`zyfa.accuracy.impact.run` (running models: :func:`~accuracy.impact.run.run_impact`),
:mod:`zyfa.accuracy.impact.rows` (result files: merging, corrections, dropping rows; torch-free),
:mod:`zyfa.accuracy.impact.section` (the report section and ``impact.md``; torch-free) and
:mod:`zyfa.accuracy.impact.cli` (the ``zyfa impact`` command). Rendering uses :mod:`zyfa.accuracy.report`'s blocks.
"""
