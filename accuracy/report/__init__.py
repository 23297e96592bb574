"""Report rendering: result rows into tables, figures, Markdown and one self-contained HTML file.

Modules: :mod:`zyfa.accuracy.report.blocks` (report blocks as Markdown, and the one number format),
:mod:`zyfa.accuracy.report.document` (the document: Markdown, HTML, writing, the headless-Chromium check),
:mod:`zyfa.accuracy.report.plots` (matplotlib, headless), the accuracy report (:mod:`zyfa.accuracy.report.results`
loads its rows, :mod:`zyfa.accuracy.report.stats` computes its intervals, :mod:`zyfa.accuracy.report.sections`
renders each section, :func:`zyfa.accuracy.report.build.build_report` puts them in order),
:mod:`zyfa.accuracy.report.speed` (the benchmark tables) and :mod:`zyfa.accuracy.report.front` (the front page).
The report imports ``accuracy.io`` and ``accuracy.scoring`` only; the ``zyfa report`` command, which adds the
model-impact section, is :mod:`zyfa.accuracy.study.report_cli`.
"""
