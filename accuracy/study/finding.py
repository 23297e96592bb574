"""One row of the generated findings table (:mod:`zyfa.accuracy.study.findings`): a question with its condition,
unit and n, figure, verdict and the files it comes from.

Exposed: ``Finding``, ``UNTESTED``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UNTESTED", "Finding"]

#: the verdict of a plan none of whose rows exist yet (figure "–", n = 0)
UNTESTED = "untested at the condition: no rows under this plan yet"


@dataclass(frozen=True)
class Finding:
    question: str
    condition: str
    unit: str
    figure: str
    verdict: str
    source: str

    def row(self) -> str:
        cells = [self.question, self.condition, self.unit, self.figure, self.verdict, self.source]
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
