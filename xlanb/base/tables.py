"""Plain-text formats: the one table formatter behind graph lists, metrics and profiles,
and the one way each of bytes, durations and notebook-cell locations is written, so that
every surface (text, HTML, pdb, widgets) says the same thing the same way."""
from __future__ import annotations

from typing import Sequence


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], *,
                 right: Sequence[int] = (), indent: str = "") -> str:
    """Columns padded to their widest cell, two spaces apart; ``right`` lists the
    columns to right-align (numbers)."""
    table = [tuple(header)] + [tuple(r) for r in rows]
    widths = [max(len(r[c]) for r in table) for c in range(len(header))]
    lines = []
    for r in table:
        cells = [v.rjust(w) if c in right else v.ljust(w)
                 for c, (v, w) in enumerate(zip(r, widths))]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines)


def format_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``: a byte count for people (powers of 1024)."""
    if n < 1024:
        return f"{n} B"
    x = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        x /= 1024
        if x < 1024 or unit == "TiB":
            return f"{x:.1f} {unit}"
    return f"{x:.1f} TiB"


def format_duration(seconds: float | None) -> str:
    """``218 ms``, ``2.13 s``, ``310 µs``, ``3.12 ns``: a duration for people (three significant
    digits; whole seconds from 100 s); ``-`` for None or NaN."""
    if seconds is None or seconds != seconds:
        return "-"
    a = abs(seconds)
    if a == 0:
        return "0 s"
    if a >= 100:
        return f"{seconds:.0f} s"
    if a >= 1:
        return f"{seconds:.3g} s"
    if a >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    if a >= 1e-6:
        return f"{seconds * 1e6:.3g} µs"
    return f"{seconds * 1e9:.3g} ns"  # a tiny graph's TPU estimate (not 0.00312 µs)


def format_cell_loc(number: int, line: int, function: str) -> str:
    """``In[5]:3 forward``: a line of notebook cell ``number``, as every message, table
    and graph names it."""
    return f"In[{number}]:{line} {function}"
