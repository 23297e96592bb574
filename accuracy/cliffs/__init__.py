"""``zyfa cliffs``: operator error against FP64 at every sequence length, and the rule that flags NaN/Inf rows,
error jumps and refused lengths (docs/CLIFFS.md). ``sweep`` runs the lengths and finds the flags, ``section``
renders them (also for ``zyfa longctx --render``), ``cli`` is the command."""
