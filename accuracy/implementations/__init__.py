"""Real attention implementations beside the recipes' emulations: the registry with its built-in adapters and
user plug-ins (``registry``), the worker process that walls a plug-in off (``plugin_worker``), the conformance
probes a kernel passes before it is scored (``conformance``), and one result row per real implementation and
input beside its paired emulation's (``real_rows``). Imports ``accuracy.io``, ``accuracy.scoring`` and
``accuracy.inputs``."""
