"""Report rendering: result rows into tables, figures, Markdown and one self-contained HTML file.

Modules: :mod:`accuracy.report.blocks` (report blocks as Markdown, and the one number format),
:mod:`accuracy.report.document` (the document: Markdown, HTML, writing, the headless-Chromium check),
:mod:`accuracy.report.plots` (matplotlib, headless), :mod:`accuracy.report.build` (the accuracy sections and
:func:`~accuracy.report.build.build_report`), :mod:`accuracy.report.speed` (the benchmark tables) and
:mod:`accuracy.report.front` (the front page). The report imports the accuracy core only; the ``zyfa report``
command, which adds the model-impact section, is :mod:`accuracy.study.report_cli`.
"""
