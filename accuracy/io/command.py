"""What the accuracy commands share (``zyfa accuracy``, ``longctx``, ``tasks``, ``cliffs``): :class:`UsageError`, a
bad command line, which each command reports in one line with exit status 2 before any file is written.

Exposed: ``UsageError``.
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A bad command line (reported in one line, exit status 2)."""
