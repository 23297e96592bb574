"""One row of the generated findings table (:mod:`zyfa.accuracy.study.findings`): a question with its condition,
unit and n, figure, verdict and the files it comes from.

Exposed: ``Finding``, ``UNTESTED``, ``UNTESTED_PREFIX``, ``untested_unpaired``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["UNTESTED", "UNTESTED_PREFIX", "Finding", "untested_unpaired"]

#: how every untested verdict starts (the findings table sorts those rows last)
UNTESTED_PREFIX = "untested at the condition"
#: the verdict of a plan none of whose rows exist yet (figure "–", n = 0)
UNTESTED = f"{UNTESTED_PREFIX}: no rows under this plan yet"


def untested_unpaired(n_rows: int) -> str:
    """The verdict of a plan whose rows exist but pair nothing yet (a cut run that ran one arm only)."""
    return (f"{UNTESTED_PREFIX}: {n_rows} rows under this plan, none paired yet (a cut run; the plan's command "
            "resumes it)")


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
