"""The one home of every small format: durations, bytes (and their parsing), a shown
hash, a percent increase, the "fits" verdict, a ``file:line`` location, a notebook cell's
location, and a table in text and in HTML. Every surface (messages, text and HTML tables,
pdb, widgets) calls these, so the same thing is said the same way everywhere;
tests/test_layers.py fails on a hash sliced or a ``file:line`` built anywhere else."""
from __future__ import annotations

import html
from typing import Sequence

# Characters of a hash that messages, tables and widgets show (``graph 3f9a0c21b7de``).
HASH_SHOWN = 12
# Characters that name a graph: ``CompiledGraph.hash`` and its HLO module's name.
HASH_ID = 16


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


def format_table_html(header: Sequence[str], rows: Sequence[Sequence[str]], *,
                      right: Sequence[int] = (), cls: str = "xlanb-table") -> str:
    """The same table as HTML (cells are plain text, escaped here), for notebooks."""
    def cell(tag, i, v):
        align = "right" if i in right else "left"
        return f"<{tag} style='text-align:{align}'>{html.escape(str(v))}</{tag}>"
    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>"
                   for r in rows)
    return f"<table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


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


BYTE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"2G"`` -> 2147483648: a positive byte count, with an optional K/M/G/T suffix."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in BYTE_UNITS else ""
    try:
        n = int(float(t[:len(t) - len(unit)]) * BYTE_UNITS[unit])
    except (ValueError, OverflowError):
        n = 0
    if n <= 0:
        raise ValueError(f"not a positive size in bytes (e.g. 2147483648, 500M, 2G): {text!r}")
    return n


def format_duration(seconds: float | None, sep: str = " ") -> str:
    """``218 ms``, ``2.13 s``, ``310 µs``, ``3.12 ns``: a duration for people (three significant
    digits; whole seconds from 100 s); ``-`` for None or NaN. ``sep=""`` packs it for a
    ``key=value`` line (``total=1.5s``)."""
    if seconds is None or seconds != seconds:
        return "-"
    a = abs(seconds)
    if a == 0:
        return f"0{sep}s"
    if a >= 100:
        return f"{seconds:.0f}{sep}s"
    if a >= 1:
        return f"{seconds:.3g}{sep}s"
    if a >= 1e-3:
        return f"{seconds * 1e3:.3g}{sep}ms"
    if a >= 1e-6:
        return f"{seconds * 1e6:.3g}{sep}µs"
    return f"{seconds * 1e9:.3g}{sep}ns"  # a tiny graph's TPU estimate (not 0.00312 µs)


def format_cell_loc(number: int, line: int, function: str = "") -> str:
    """``In[5]:3 forward``: a line of notebook cell ``number``, as every message, table
    and graph names it."""
    return format_location(f"In[{number}]", line, function)


def format_hash(h: str, chars: int = HASH_SHOWN) -> str:
    """A hash as shown (its first ``HASH_SHOWN`` characters; ``HASH_ID`` for a graph's id)."""
    return h[:chars]


def format_pct(extra: int, base: int) -> str:
    """``+12.5%``, ``0%``, ``x14``: what ``extra`` adds to ``base`` (``-`` for no base)."""
    if not base:
        return "-"
    if extra > 9 * base:
        return f"x{(base + extra) / base:.0f}"
    return f"+{100 * extra / base:.1f}%" if extra else "0%"


def format_fits(fits: bool | None, column: bool = False) -> str:
    """The verdict on whether a graph fits a device: ``fits``/``DOES NOT FIT``/``?`` in a
    sentence, ``yes``/``NO``/``?`` in a table's "fits" column."""
    if column:
        return {True: "yes", False: "NO", None: "?"}[fits]
    return {True: "fits", False: "DOES NOT FIT", None: "?"}[fits]


def format_location(file: str, line: int | str, function: str = "") -> str:
    """``model.py:42 forward`` (``file:line`` without a function): how a line of source
    is written, whatever names the file (a path, a base name, ``In[5]``)."""
    return f"{file}:{line} {function}" if function else f"{file}:{line}"
