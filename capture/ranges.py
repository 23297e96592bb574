"""Integer lists given on a command line (``N``, ``A-B``, ``A-B:STEP``, comma-separated), bounded before expansion.

A range is checked against its flag's upper bound before it becomes a list, so ``--lengths 1-1000000000`` is refused
in one line at once instead of filling the memory first. It lives in ``capture`` (``--layers``, ``--heads``), the
lowest package of ours that needs it; ``accuracy`` (``zyfa cliffs --lengths``) imports it from here.

Exposed: ``expand_ranges(spec, flag, *, lowest, highest, step) -> list[int]`` (sorted, distinct).
"""

from __future__ import annotations

__all__ = ["expand_ranges"]


def expand_ranges(spec: str, flag: str, *, lowest: int, highest: int, step: bool = True) -> list[int]:
    """``"1-1024,2000-2100:4,4096"`` -> sorted distinct integers in ``lowest..highest``.

    Items: ``N``, ``A-B`` (inclusive) or, with ``step``, ``A-B:STEP``. ValueError (one line naming ``flag``, the
    item and, for a number out of bounds, the bound) on an empty item, a malformed one, ``B < A``, a step below 1 or
    a number outside ``lowest..highest``; every item is checked before any is expanded."""
    if spec is None or not str(spec).strip():
        raise ValueError(f"{flag} is empty")
    form = "N, A-B or A-B:STEP" if step else "N or A-B"
    items: list[tuple[int, int, int]] = []
    for item in (s.strip() for s in str(spec).split(",")):
        if not item:
            raise ValueError(f"{flag} {spec!r}: an empty item (two commas?)")
        rng, colon, step_s = item.partition(":")
        try:
            if colon and not step:
                raise ValueError
            k = int(step_s) if colon else 1
            a_s, dash, b_s = rng.partition("-")
            a = int(a_s)
            b = int(b_s) if dash else a
        except ValueError:
            raise ValueError(f"{flag}: bad item {item!r}; use {form}, comma-separated") from None
        for n in (a, b):
            if n < lowest:
                raise ValueError(f"{flag}: {n} in {item!r} is below the lowest accepted, {lowest}")
            if n > highest:
                raise ValueError(f"{flag}: {n} in {item!r} is above the highest accepted, {highest}")
        if b < a or k < 1:
            raise ValueError(f"{flag}: bad item {item!r}; a range A-B has A <= B and a step of at least 1")
        items.append((a, b, k))
    out: set[int] = set()
    for a, b, k in items:
        out.update(range(a, b + 1, k))
    return sorted(out)
