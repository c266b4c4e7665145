"""What every widget shares: colours, sizes, escaping, source labels, snapshots and
the HTML boxes text is shown in."""
from __future__ import annotations

import html
import re

from .. import display as xd

# A graph opens at the deepest scope depth that draws at most this many nodes.
READABLE_NODES = 30
# Above this many nodes, dot is not asked for a picture (slow, and unreadable anyway).
MAX_DRAWN_NODES = 400
# Nodes drawn around the matches in "only matches" views.
MAX_FOCUS = 120

HIGHLIGHT = "#f5b041"   # search matches (the core's highlight colour)
CHANGED = "#f5b041"     # diff: same op, different shape / arguments / inputs
ADDED = "#58d68d"       # diff: only in the new graph
REMOVED = "#ec7063"     # diff: only in the old graph
FOLLOWS = "#fdebd0"     # diff: changed only because an input changed
_STATUS_COLOUR = {"changed": CHANGED, "follows": FOLLOWS, "added": ADDED, "removed": REMOVED}

# Chart colours: one per kind of work, the same in every chart.
C_COMPILE, C_OPCOMPILE, C_EXECUTE = "#e74c3c", "#f39c12", "#3498db"
C_TO_DEV, C_FROM_DEV, C_HIT, C_FALLBACK = "#9b59b6", "#8e44ad", "#27ae60", "#7f8c8d"
C_MEMORY = "#16a085"

_MONO = "font-family: var(--jp-code-font-family, monospace); font-size: 12px;"
_BOX = "overflow:auto; max-height:620px; border:1px solid #ddd; padding:4px; background:white;"
_STATIC_BOX = "overflow:auto; border:1px solid #ddd; padding:4px; background:white;"


# =========================================================================== graph data

def _esc(text) -> str:
    return html.escape(str(text), quote=True)


def _resolver() -> xd.SourceResolver:
    """Source labels like ``In[5]:3 forward``: cells are named by the labeler that
    ``%load_ext xlanb`` installs."""
    return xd.DEFAULT_RESOLVER


def _pattern(text: str | None) -> re.Pattern | None:
    """A case-insensitive regex from a search box; a bad regex is searched literally."""
    if not text or not text.strip():
        return None
    try:
        return re.compile(text.strip(), re.IGNORECASE)
    except re.error:
        return re.compile(re.escape(text.strip()), re.IGNORECASE)


# =========================================================================== snapshots

class Snapshot:
    """A static HTML copy of a widget's current view (SVG inline, no JavaScript)."""

    def __init__(self, html_text: str, text: str) -> None:
        self.html, self.text = html_text, text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


def _pre(text: str, note: str = "") -> str:
    n = f"<div style='color:#666; margin-bottom:4px'>{note}</div>" if note else ""
    return f"{n}<pre style='{_MONO} {_BOX} line-height:1.3'>{text}</pre>"


def _fmt_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


_HLO_LIMIT = 400_000  # characters of HLO shown (highlighting megabytes freezes the page)


def _hlo_html(text: str, title: str) -> str:
    text = xd.tidy_hlo(text)
    note = _esc(title)
    if len(text) > _HLO_LIMIT:
        note += f" (first {_HLO_LIMIT:,} of {len(text):,} characters)"
        text = text[:_HLO_LIMIT]
    return _pre(xd.highlight_hlo(text), note)


def _graph_where(g, resolver) -> str:
    return xd.graph_where(g, resolver) or "?"
