"""The names of the error metrics (no torch: the CLIs list them in their flags before any heavy import);
:func:`zyfa.accuracy.scoring.metrics.compute_metrics` computes them."""

# The float metrics of compute_metrics, in table order; the remaining keys are flags and counts.
ERROR_METRICS = (
    "rel_l2",
    "rmse",
    "max_abs_err",
    "cosine",
    "row_rel_err_p50",
    "row_rel_err_p99",
    "row_rel_err_max",
    "sqnr_db",
    "lse_max_abs_err",
    "lse_rmse",
)
