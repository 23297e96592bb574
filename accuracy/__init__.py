"""Accuracy of FP8 attention: the core (metrics, inputs, runner, results I/O, provenance, features, the
``zyfa accuracy`` command) as top-level modules, and three packages by role: :mod:`accuracy.report` (rendering),
:mod:`accuracy.impact` (model impact) and :mod:`accuracy.study` (the study and ``zyfa report``, composing the
others). The core imports none of the three; the report imports the core; impact imports the core and the
report's rendering; the study imports all (tests/test_layout.py).

Sits on top of zyfa, reference and capture's store.
"""
