"""``zyfa accuracy``: each recipe's and each real implementation's operator error against the FP64 oracle.
``runner`` turns inputs x recipes into result rows (the Python API and the study call it too); ``cli`` is the
command: its flags, checks, dry run and table."""
