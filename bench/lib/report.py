"""Reports: markdown tables and ratio cells, rendered from results."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A markdown table; ``align`` is one character per column (``l`` or ``r``), left
    unaligned by default."""
    marks = [{"l": ":---", "r": "---:"}.get(a, "---") for a in align.ljust(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def median_range(values: Sequence[float]) -> str:
    """``median (min–max)`` with two decimals; the value alone for one, ``—`` for none."""
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"
