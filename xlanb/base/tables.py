"""Plain-text tables: the one formatter behind graph lists, metrics and profiles."""
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
