"""Matplotlib for the report: the headless backend, and figures as PNG bytes."""

from __future__ import annotations

import io


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    # lazy: matplotlib is optional (and heavy)
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib is optional (and heavy)
    import matplotlib.pyplot as plt

    return plt


def png(fig) -> bytes:
    """The figure as PNG bytes (no timestamp, so unchanged figures give identical files); closes it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    pyplot().close(fig)
    return buf.getvalue()
