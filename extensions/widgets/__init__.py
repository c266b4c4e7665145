"""Notebook widgets (ipywidgets 8) for exploring xlanb's graphs and metrics.

    from xlanb.widgets import GraphView, GraphDiff, MetricsDashboard
    GraphView()              # the pending graph, or any compiled one: SVG, IR, StableHLO,
                             # optimized HLO, cost and memory; scope depth, search, tooltips
    GraphView([loss])        # the pending graph of some tensors (``%xla_pending --widget``)
    GraphDiff()              # the last recompile: two compiled graphs side by side, with the
                             # nodes that differ coloured
    MetricsDashboard()       # compiles, cache hits, times and transfers, as charts, refreshed
                             # after every cell

A front end: it uses only xlanb's public API (``pending_summary``, ``hlo``, ``graphs``,
``metrics``, ``render_dot`` / ``render_text`` / ``render_svg``, ``diff_summaries``), and the
core never imports it. Every widget has ``snapshot()``: a static HTML copy of what it shows
now (the SVG inline), for readers without a kernel (exported HTML, GitHub), where widgets
do not run.

The pure functions (``graph_dot``, ``diff_summaries``, the SVG charts) take plain data, so
they are tested without a browser. Pictures are drawn by the core's one renderer
(``xlanb.render_dot``, given marks, tooltips and the nodes to draw), and differences are
found by the core's one differ (``xlanb.diff_summaries``, which the recompile explanation
is built on).
"""
from __future__ import annotations

import collections
import html
import re
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

import ipywidgets as W
import torch

import xlanb
from xlanb import GraphSummary, SummaryDiff, render_text

from . import display as xd

__all__ = ["GraphView", "GraphDiff", "MetricsDashboard", "Snapshot", "graph_dot",
           "diff_summaries", "SummaryDiff", "find_matches", "scope_levels", "drawn_nodes",
           "readable_depth", "bar_chart_svg", "stacked_bar_svg", "column_chart_svg"]

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
    """Source labels like ``In[5] line 3`` when an IPython shell is running."""
    def cell_names() -> dict:
        try:
            from IPython import get_ipython
        except ImportError:
            return {}
        ip = get_ipython()
        comp = getattr(ip, "compile", None)
        return getattr(comp, "_filename_map", None) or {}
    return xd.SourceResolver(cell_names)


def _pattern(text: str | None) -> re.Pattern | None:
    """A case-insensitive regex from a search box; a bad regex is searched literally."""
    if not text or not text.strip():
        return None
    try:
        return re.compile(text.strip(), re.IGNORECASE)
    except re.error:
        return re.compile(re.escape(text.strip()), re.IGNORECASE)


def _node_text(s: GraphSummary, p: int, label=None) -> str:
    """``%12 aten::addmm f32[8,16] In[3] line 4 (f.py:4 fwd) [Net.l1]``: what search sees."""
    n_in = len(s.inputs)
    sharding = dict(s.shardings).get(p)  # SPMD: searchable ("model", "annotated", ...)
    shard = f" sharding={sharding}" if sharding else ""
    if p < n_in:
        return f"%{p} data {s.inputs[p]}{shard}"
    op = s.ops[p - n_in]
    short = op.src.short if op.src else ""
    where = label(op.src) if label and op.src else short
    if where != short:
        where += f" ({short})"
    return f"%{p} {op.name} {op.aval} {where} [{op.scope}]{shard}"


def find_matches(s: GraphSummary, search: str | None,
                 resolver: xd.SourceResolver | None = None) -> list[int]:
    """Positions whose op name, result type, ``file:line`` (or notebook ``In[5] line 3``
    with a resolver), module scope or ``%N`` match ``search`` (a case-insensitive regex;
    searched literally when it is not one)."""
    pat = _pattern(search)
    if pat is None:
        return []
    label = resolver.label if resolver is not None else None
    n = len(s.inputs) + len(s.ops)
    return [p for p in range(n) if pat.search(_node_text(s, p, label) + " ")]


def _scope_key(scope: str, depth: int | None) -> str | None:
    """The collapsed-scope box an op at ``scope`` is drawn in at ``depth`` (None: drawn
    as itself), as ``xlanb.render_dot`` collapses them."""
    if depth is None or not scope:
        return None
    clipped = ".".join(scope.split(".")[:depth]) if depth > 0 else ""
    return None if clipped == scope else (clipped or "<top>")


def scope_levels(s: GraphSummary) -> int:
    """How deep the module scopes go (``Model.encoder.layer.0`` is 4 levels)."""
    return max((len(op.scope.split(".")) for op in s.ops if op.scope), default=0)


def drawn_nodes(s: GraphSummary, depth: int | None) -> int:
    """How many nodes ``render_dot(s, scope_depth=depth)`` draws."""
    n_in = len(s.inputs)
    if depth is None:
        return n_in + len(s.ops)
    boxes, shown, open_inputs = set(), 0, set()
    for op in s.ops:
        key = _scope_key(op.scope, depth)
        if key is None:
            shown += 1
            open_inputs.update(q for q in op.ins if q < n_in)
        else:
            boxes.add(key)
    consumed = {q for op in s.ops for q in op.ins if q < n_in}
    inputs = sum(1 for i in range(n_in) if i not in consumed or i in open_inputs)
    return shown + len(boxes) + inputs


def readable_depth(s: GraphSummary, limit: int = READABLE_NODES) -> int | None:
    """The deepest scope depth that draws at most ``limit`` nodes (None: no collapsing
    needed). 0 when even that is too many."""
    if drawn_nodes(s, None) <= limit:
        return None
    for d in range(scope_levels(s) - 1, -1, -1):
        if drawn_nodes(s, d) <= limit:
            return d
    return 0


def neighbourhood(s: GraphSummary, focus: Iterable[int], hops: int = 1) -> set[int]:
    """``focus`` plus the nodes at most ``hops`` edges away (inputs and consumers)."""
    n_in = len(s.inputs)
    consumers: dict[int, list[int]] = collections.defaultdict(list)
    for j, op in enumerate(s.ops):
        for q in op.ins:
            consumers[q].append(n_in + j)
    keep = set(focus)
    frontier = set(keep)
    for _ in range(hops):
        nxt = set()
        for p in frontier:
            if p >= n_in:
                nxt.update(s.ops[p - n_in].ins)
            nxt.update(consumers.get(p, ()))
        frontier = nxt - keep
        keep |= nxt
    return keep


def _near_outputs(s: GraphSummary, limit: int) -> set[int]:
    """The outputs and the nodes just before them, at most about ``limit`` of them."""
    keep = set(s.outputs)
    n_in = len(s.inputs)
    frontier = set(keep)
    while frontier and len(keep) < limit:
        nxt = set()
        for p in frontier:
            if p >= n_in:
                nxt.update(s.ops[p - n_in].ins)
        nxt -= keep
        if len(keep) + len(nxt) > limit:
            nxt = set(sorted(nxt, reverse=True)[:limit - len(keep)])
        keep |= nxt
        frontier = nxt
    return keep


def _split_aval(aval: str) -> tuple[str, str]:
    m = re.fullmatch(r"(\w+)\[([\d,]*)\]", aval)
    if not m:
        return aval, ""
    return m[1], "[" + ", ".join(m[2].split(",")) + "]" if m[2] else "[] (scalar)"


def _split_aval(aval: str) -> tuple[str, str]:
    m = re.fullmatch(r"(\w+)\[([\d,]*)\]", aval)
    if not m:
        return aval, ""
    return m[1], "[" + ", ".join(m[2].split(",")) + "]" if m[2] else "[] (scalar)"


def node_tooltip(s: GraphSummary, p: int, resolver: xd.SourceResolver | None = None) -> str:
    """Hover text of node ``p``: op, shape, dtype, source line, module, arguments."""
    n_in = len(s.inputs)
    if p < n_in:
        dtype, shape = _split_aval(s.inputs[p])
        return f"%{p} device data (a graph input)\ndtype {dtype} · shape {shape}"
    op = s.ops[p - n_in]
    dtype, shape = _split_aval(op.aval)
    lines = [f"%{p} {op.name} -> {op.aval}"]
    if shape:
        lines.append(f"dtype {dtype} · shape {shape}")
    if op.src:
        label = (resolver or xd.DEFAULT_RESOLVER).label(op.src)
        lines.append(f"source: {label}" + (f"  ({op.src.short})" if label != op.src.short else ""))
    if op.scope:
        lines.append(f"module: {op.scope}")
    if op.call:
        lines.append(f"args: {op.call[:200]}")
    if p in s.outputs:
        lines.append("an output of the graph")
    return "\n".join(lines)


def _scope_tooltip(key: str, ops: list, resolver) -> str:
    kinds = collections.Counter(o.name.removeprefix("aten::") for o in ops)
    top = ", ".join(f"{k} ×{n}" for k, n in kinds.most_common(6))
    srcs = sorted({(resolver or xd.DEFAULT_RESOLVER).label(o.src) for o in ops if o.src})
    lines = [f"{key}: {len(ops)} ops (collapsed; raise the scope depth to open it)", top]
    if srcs:
        lines.append("source: " + "; ".join(srcs[:4]) + (" ..." if len(srcs) > 4 else ""))
    return "\n".join(lines)


def graph_dot(s: GraphSummary, depth: int | None = None, *, marks: dict[int, str] | None = None,
              only: Iterable[int] | None = None, hops: int = 1,
              resolver: xd.SourceResolver | None = None) -> str:
    """DOT for one view of a graph, drawn by ``xlanb.render_dot``.

    ``depth`` collapses module scopes deeper than that (``render_dot``'s ``scope_depth``);
    ``marks`` fills nodes (position -> colour) and the collapsed scopes that hold them;
    ``only`` draws just those positions and their neighbours ``hops`` edges away. Every
    node gets a tooltip with its shape, dtype, source line and module.
    """
    keep = None
    if only is not None:
        focus = list(only)[:MAX_FOCUS]
        keep = neighbourhood(s, focus, hops)
        if len(keep) > MAX_DRAWN_NODES:
            keep = set(focus) | set(sorted(keep - set(focus))[:MAX_DRAWN_NODES - len(focus)])
    res = resolver or xd.DEFAULT_RESOLVER
    return xlanb.render_dot(s, scope_depth=depth, marks=marks, only=keep, label=res.label,
                            tooltip=lambda p: node_tooltip(s, p, resolver),
                            box_tooltip=lambda key, ops: _scope_tooltip(key, ops, resolver))


def inline_svg(svg: str, zoom: float | str = 1.0) -> str:
    """Graphviz's SVG ready to sit inside HTML: no XML prolog, scaled by ``zoom`` (a
    factor, or "fit" for the width of the page)."""
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    m = re.match(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"', svg)
    if not m:
        return svg
    w, h = float(m[1]), float(m[2])
    if zoom == "fit":  # natural size, shrunk to the page's width when wider
        size = f'width="{w:.0f}pt" height="{h:.0f}pt" style="max-width:100%; height:auto"'
    else:
        z = float(zoom)
        size = f'width="{w * z:.0f}pt" height="{h * z:.0f}pt"'
    return f"<svg {size}" + svg[m.end():]


def _svg_or_message(dot: str, zoom) -> tuple[str, str]:
    """(html, raw svg) for ``dot``; an explanation instead when dot is missing or fails."""
    try:
        svg = xlanb.render_svg(dot)
    except RuntimeError as e:  # Graphviz missing, or dot failed
        return f"<div style='color:#a15c00'>{_esc(e)}</div>", ""
    return inline_svg(svg, zoom), svg


# =========================================================================== graph diff

def diff_summaries(a: GraphSummary, b: GraphSummary,
                   resolver: xd.SourceResolver | None = None) -> SummaryDiff:
    """Match the nodes of two graphs and say which differ: ``xlanb.diff_summaries`` (the
    differ behind recompile explanations), with source lines named by ``resolver``."""
    return xlanb.diff_summaries(a, b, label=(resolver or xd.DEFAULT_RESOLVER).label)


# =========================================================================== SVG charts

def _svg(width: int, height: int, body: list[str], title: str = "") -> str:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" '
            f'font-size="11">')
    t = (f'<text x="0" y="13" font-size="13" font-weight="bold" fill="#333">{_esc(title)}</text>'
         if title else "")
    return head + t + "".join(body) + "</svg>"


def bar_chart_svg(rows: list[tuple], title: str = "", width: int = 460,
                  label_width: int = 170) -> str:
    """Horizontal bars: ``rows`` of (label, value, colour, value text[, hover text])."""
    top = 22 if title else 4
    bar_h, gap = 16, 6
    height = top + len(rows) * (bar_h + gap) + 4
    vmax = max((r[1] for r in rows), default=0) or 1
    area = width - label_width - 110
    body = []
    for k, row in enumerate(rows):
        label, value, colour, text = row[:4]
        hover = row[4] if len(row) > 4 else f"{label}: {text}"
        y = top + k * (bar_h + gap)
        w = max(value / vmax * area, 1.5 if value else 0)
        body.append(f'<g><title>{_esc(hover)}</title>'
                    f'<text x="{label_width - 6}" y="{y + 12}" text-anchor="end" fill="#333">'
                    f'{_esc(label[:32])}</text>'
                    f'<rect x="{label_width}" y="{y}" width="{area}" height="{bar_h}" '
                    f'fill="#f4f6f7" rx="2"/>'
                    f'<rect x="{label_width}" y="{y}" width="{w:.1f}" height="{bar_h}" '
                    f'fill="{colour}" rx="2"/>'
                    f'<text x="{label_width + w + 5:.1f}" y="{y + 12}" fill="#333">'
                    f'{_esc(text)}</text></g>')
    return _svg(width, height, body, title)


def stacked_bar_svg(parts: list[tuple], title: str = "", width: int = 460,
                    empty: str = "nothing yet") -> str:
    """One bar split into ``parts`` of (label, value, colour), with a legend."""
    top = 22 if title else 4
    total = sum(p[1] for p in parts)
    body = []
    x = 0.0
    if total <= 0:
        body.append(f'<rect x="0" y="{top}" width="{width}" height="22" fill="#f4f6f7" rx="3"/>'
                    f'<text x="8" y="{top + 15}" fill="#888">{_esc(empty)}</text>')
    for label, value, colour in parts:
        if total <= 0 or value <= 0:
            continue
        w = value / total * width
        body.append(f'<rect x="{x:.1f}" y="{top}" width="{w:.1f}" height="22" fill="{colour}">'
                    f'<title>{_esc(label)}: {value / total:.0%}</title></rect>')
        if w > 34:
            body.append(f'<text x="{x + w / 2:.1f}" y="{top + 15}" text-anchor="middle" '
                        f'fill="white" font-weight="bold">{value / total:.0%}</text>')
        x += w
    lx, ly = 0, top + 38
    for label, value, colour in parts:
        body.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>'
                    f'<text x="{lx + 14}" y="{ly}" fill="#333">{_esc(label)}</text>')
        lx += 22 + 6.5 * len(label)
    return _svg(width, ly + 6, body, title)


def column_chart_svg(columns: list[tuple], legend: list[tuple], title: str = "",
                     width: int = 460, height: int = 170) -> str:
    """Stacked columns: ``columns`` of (label, [(value, colour)], text above, hover text);
    ``legend`` of (label, colour)."""
    top = 22 if title else 4
    base = height - 34
    vmax = max((sum(v for v, _ in c[1]) for c in columns), default=0) or 1
    n = max(len(columns), 1)
    slot = width / n
    cw = min(34.0, slot * 0.7)
    body = [f'<line x1="0" y1="{base}" x2="{width}" y2="{base}" stroke="#bbb"/>']
    for k, (label, stack, text, hover) in enumerate(columns):
        x = k * slot + (slot - cw) / 2
        y = float(base)
        parts = [f"<g><title>{_esc(hover)}</title>"]
        for value, colour in stack:
            h = value / vmax * (base - top - 14)
            if h <= 0:
                continue
            y -= h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{cw:.1f}" height="{h:.1f}" '
                         f'fill="{colour}"/>')
        parts.append(f'<text x="{x + cw / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
                     f'font-size="10" fill="#333">{_esc(text)}</text>')
        parts.append(f'<text x="{x + cw / 2:.1f}" y="{base + 13}" text-anchor="middle" '
                     f'font-size="10" fill="#555">{_esc(label)}</text></g>')
        body.append("".join(parts))
    if not columns:
        body.append(f'<text x="8" y="{base - 10}" fill="#888">no cells with xla work yet</text>')
    lx = 0
    for label, colour in legend:
        body.append(f'<rect x="{lx}" y="{height - 11}" width="10" height="10" fill="{colour}"/>'
                    f'<text x="{lx + 14}" y="{height - 2}" fill="#333">{_esc(label)}</text>')
        lx += 24 + 6.5 * len(label)
    return _svg(width, height, body, title)


# =========================================================================== snapshots

class Snapshot:
    """A static HTML copy of a widget's current view (SVG inline, no JavaScript)."""

    def __init__(self, html_text: str, text: str) -> None:
        self.html, self.text = html_text, text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


# =========================================================================== GraphView

@dataclass
class _Graph:
    """One graph GraphView can show: the pending roots, or a compiled graph."""
    key: object                 # "pending" or an index into xlanb.graphs()
    title: str
    summary: GraphSummary
    compiled: object = None     # CompiledGraph
    tensors: list = field(default_factory=list)


def _structure(s: GraphSummary) -> tuple:
    """What the compile cache keys on (the ``call`` text also holds lifted float values)."""
    return (s.inputs, tuple((o.name, o.aval, o.static, o.ins) for o in s.ops), s.outputs)


def _compiled_twin(s: GraphSummary):
    """The compiled graph with the same structure as ``s`` (the one its sync would hit)."""
    want = _structure(s)
    for i, g in reversed(list(enumerate(xlanb.graphs()))):
        if g.summary is not None and _structure(g.summary) == want:
            return i, g
    return None, None


def _as_tensors(tensors) -> list:
    if tensors is None:
        return []
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    elif isinstance(tensors, dict):
        tensors = list(tensors.values())
    out = list(tensors)
    for t in out:
        if not (isinstance(t, torch.Tensor) and t.device.type == "xla"):
            where = f" on {t.device}" if isinstance(t, torch.Tensor) else ""
            raise TypeError(f"GraphView shows xla tensors' pending graphs; got a "
                            f"{type(t).__name__}{where}")
    return out


def _graph_where(g, resolver) -> str:
    return xd.graph_where(g, resolver) or "?"


def _pre(text: str, note: str = "") -> str:
    n = f"<div style='color:#666; margin-bottom:4px'>{note}</div>" if note else ""
    return f"{n}<pre style='{_MONO} {_BOX} line-height:1.3'>{text}</pre>"


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


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


class GraphView(W.VBox):
    """Explore one graph: pick the pending roots or a compiled graph, then read it as a
    picture (collapsible module scopes, search, tooltips), IR text, StableHLO, optimized
    HLO, or XLA's cost and memory analysis.

    ``tensors``: the roots of the pending graph (one tensor, a list, or None for every
    live tensor). ``graph``: open a compiled graph instead (a ``CompiledGraph`` or its
    index in ``xlanb.graphs()``). Controls are plain ipywidgets (``source``, ``depth``,
    ``search``, ``only_matches``, ``zoom``, ``tabs``), so code can drive them by ``.value``.
    """

    TAB_TITLES = ("Graph", "IR text", "StableHLO", "Optimized HLO", "Cost & memory")

    def __init__(self, tensors=None, graph=None, *, readable: int = READABLE_NODES) -> None:
        self._tensors = _as_tensors(tensors)
        self._explicit = graph
        self._readable = readable
        self._resolver = _resolver()
        self._busy = False
        self._graph: _Graph | None = None
        self._svg = ""
        self._svg_cache: dict = {}
        self._filled: set[int] = set()
        self._match_cache: tuple = (None, [])

        self.source = W.Dropdown(description="graph", layout=W.Layout(width="640px"),
                                 style={"description_width": "initial"})
        self.refresh_button = W.Button(description="refresh", icon="refresh",
                                       tooltip="re-read the pending graph and the compiled graphs",
                                       layout=W.Layout(width="100px"))
        self.depth = W.IntSlider(description="scope depth", min=0, max=0, value=0,
                                 continuous_update=False, style={"description_width": "initial"},
                                 tooltip="module scopes deeper than this are collapsed into one box")
        self.search = W.Text(description="find", continuous_update=False,
                             placeholder="op, shape, file:line, module or %N (regex)",
                             layout=W.Layout(width="360px"))
        self.only_matches = W.Checkbox(description="only matches and their neighbours",
                                       value=False, indent=False, layout=W.Layout(width="auto"))
        self.zoom = W.Dropdown(description="zoom", value=1.0, layout=W.Layout(width="150px"),
                               options=[("fit width", "fit"), ("50%", 0.5), ("75%", 0.75),
                                        ("100%", 1.0), ("150%", 1.5), ("200%", 2.0)])
        self.info = W.HTML()
        self.graph_html = W.HTML()
        self.ir_html = W.HTML()
        self.stablehlo_html = W.HTML()
        self.hlo_html = W.HTML()
        self.cost_html = W.HTML()
        self.compile_button = W.Button(description="compile it", icon="cogs",
                                       tooltip="compile the pending graph now; the next sync "
                                               "reuses the executable",
                                       layout=W.Layout(display="none"))
        controls = W.HBox([self.depth, self.search, self.only_matches, self.zoom],
                          layout=W.Layout(flex_flow="row wrap", align_items="center"))
        self.tabs = W.Tab(children=[W.VBox([controls, self.info, self.graph_html]),
                                    self.ir_html, self.stablehlo_html,
                                    W.VBox([self.hlo_html]), W.VBox([self.cost_html])],
                          titles=self.TAB_TITLES)
        super().__init__([W.HBox([self.source, self.refresh_button]), self.compile_button,
                          self.tabs])

        self.refresh()
        self.source.observe(self._on_source, names="value")
        for w in (self.depth, self.search, self.only_matches, self.zoom):
            w.observe(self._on_view, names="value")
        self.tabs.observe(self._on_tab, names="selected_index")
        self.refresh_button.on_click(lambda _: self.refresh())
        self.compile_button.on_click(lambda _: self._compile_pending())

    # ---------------------------------------------------------------- sources

    def _options(self) -> list[tuple[str, object]]:
        n = xlanb.pending_count(*self._tensors)
        roots = "the given tensors" if self._tensors else "all live tensors"
        opts = [(f"pending: {xd.plural(n, 'op')} ({roots}, mode {xlanb.get_mode()})",
                 "pending")]
        for i, g in enumerate(xlanb.graphs()):
            why = " · recompile" if g.explanation else ""
            opts.append((f"#{i} {g.hash[:8]} · {xd.plural(g.n_nodes, 'op')} · "
                         f"{_graph_where(g, self._resolver)} · {g.cause}{why}"[:110], i))
        return opts

    def refresh(self) -> None:
        """Re-read the pending graph and the list of compiled graphs."""
        opts = self._options()
        keys = [k for _, k in opts]
        cur = self.source.value if self.source.options else None
        if cur is None:  # first time: what was asked for, else what is most useful
            if isinstance(self._explicit, int):
                n = len(keys) - 1
                if not -n <= self._explicit < n:
                    raise IndexError(f"no compiled graph #{self._explicit}: "
                                     f"xlanb.graphs() has {n}")
                cur = self._explicit % n
            elif self._explicit is not None:
                cur = next(
                    (i for i, g in enumerate(xlanb.graphs()) if g is self._explicit), None)
                if cur is None:  # a graph no longer in the log (cleared): show it anyway
                    opts.append((f"{self._explicit.hash[:8]} (not in xlanb.graphs())",
                                 "explicit"))
                    keys.append(cur := "explicit")
            elif self._tensors or xlanb.pending_count() or len(keys) == 1:
                cur = "pending"
            else:
                cur = keys[-1]
        if cur not in keys:
            raise IndexError(f"no compiled graph #{cur}: xlanb.graphs() has {len(keys) - 1}")
        self._busy = True
        try:
            self.source.options = opts
            self.source.value = cur
        finally:
            self._busy = False
        self._load(cur)

    def _make_graph(self, key) -> _Graph:
        if key == "pending":
            s = xlanb.pending_summary(*self._tensors)
            return _Graph(key, "pending graph", s, None, self._tensors)
        g = self._explicit if key == "explicit" else xlanb.graphs()[key]
        name = f"graph {g.hash[:8]}" if key == "explicit" else f"graph #{key} ({g.hash[:8]})"
        return _Graph(key, name, g.summary, g)

    def _on_source(self, change) -> None:
        if not self._busy:
            self._load(change["new"])

    def _load(self, key) -> None:
        self._graph = self._make_graph(key)
        self._svg_cache.clear()
        self._match_cache = (None, [])
        self._filled.clear()
        s = self._graph.summary
        levels = scope_levels(s)
        start = readable_depth(s, self._readable)
        self._busy = True
        try:
            self.depth.max = levels
            self.depth.value = levels if start is None else start
            self.depth.disabled = levels == 0
        finally:
            self._busy = False
        pending = self._graph.compiled is None
        self.compile_button.layout.display = "none"
        self.compile_button.description = "compile it"
        self.compile_button.disabled = False
        if pending and s.ops and _compiled_twin(s)[1] is None:
            self.compile_button.layout.display = None  # shown on the HLO / cost tabs
        self._render_graph()
        self._fill_tab(self.tabs.selected_index or 0)

    # ---------------------------------------------------------------- graph tab

    @property
    def graph(self) -> _Graph:
        """The graph shown: key, title, summary, and the CompiledGraph (None if pending)."""
        return self._graph

    @property
    def svg(self) -> str:
        """The SVG Graphviz drew for the current view ("" when none was drawn)."""
        return self._svg

    @property
    def scope_depth(self) -> int | None:
        """The depth slider as ``render_dot`` takes it: None when nothing is collapsed."""
        return None if self.depth.value >= self.depth.max else self.depth.value

    @property
    def matches(self) -> list[int]:
        """Positions matching the search box."""
        if self._graph is None:
            return []
        key = (self._graph.key, self.search.value)
        if self._match_cache[0] != key:
            self._match_cache = (key, find_matches(self._graph.summary, self.search.value,
                                                   self._resolver))
        return self._match_cache[1]

    def _on_view(self, change) -> None:
        if not self._busy:
            self._render_graph()
            if 1 in self._filled:  # the IR text highlights the matches too
                self._filled.discard(1)
                if self.tabs.selected_index == 1:
                    self._fill_tab(1)

    def _view(self) -> tuple[str, str, str]:
        """(dot or "", note, what is drawn) for the current controls."""
        s = self._graph.summary
        matches = self.matches
        marks = dict.fromkeys(matches, HIGHLIGHT)
        depth = self.scope_depth
        if self.only_matches.value and matches:
            dot = graph_dot(s, only=matches, marks=marks, resolver=self._resolver)
            return dot, "", f"only the {xd.plural(len(matches), 'match', 'matches')} and their neighbours"
        n = drawn_nodes(s, depth)
        if n > MAX_DRAWN_NODES:
            near = _near_outputs(s, self._readable)
            dot = graph_dot(s, only=near, hops=0, marks=marks, resolver=self._resolver)
            note = (f"{n} nodes at this depth are too many to draw; showing the "
                    f"{len(near)} nodes nearest the outputs. Lower the scope depth, or "
                    f"search and tick 'only matches'.")
            return dot, note, "nodes nearest the outputs"
        dot = graph_dot(s, depth, marks=marks, resolver=self._resolver)
        what = (f"{n} nodes, scopes deeper than {depth} level{'s' * (depth != 1)} collapsed"
                if depth is not None else f"{n} nodes, every scope open")
        return dot, "", what

    def _render_graph(self) -> None:
        g = self._graph
        s = g.summary
        if not s.ops:
            self._svg = ""
            self.info.value = f"<i>{_esc(g.title)}: no ops</i>"
            self.graph_html.value = ""
            return
        key = (self.depth.value, self.search.value, self.only_matches.value)
        if key not in self._svg_cache:
            dot, note, what = self._view()
            body, svg = _svg_or_message(dot, 1.0)
            self._svg_cache[key] = (dot, note, what, svg, body)
        dot, note, what, svg, body = self._svg_cache[key]
        self._svg = svg
        self.graph_html.value = (f"<div style='{_BOX}'>{inline_svg(svg, self.zoom.value)}</div>"
                                 if svg else body + _pre(_esc(render_text(s, label=self._resolver.label))))
        self.info.value = self._info_html(what, note)

    def _short(self, p: int) -> str:
        """``%35 aten::gelu f32[8,64] In[2] line 11``."""
        s = self._graph.summary
        n_in = len(s.inputs)
        if p < n_in:
            return f"%{p} data {s.inputs[p]}"
        op = s.ops[p - n_in]
        return f"%{p} {op.name} {op.aval} {self._resolver.label(op.src)}".rstrip()

    def _info_html(self, what: str, note: str) -> str:
        g = self._graph
        s = g.summary
        head = (f"<b>{_esc(g.title)}</b>: {xd.plural(len(s.ops), 'op')}, "
                f"{xd.plural(len(s.inputs), 'input')}, {xd.plural(len(s.outputs), 'output')}"
                f" · drawn: {_esc(what)}")
        if g.compiled is not None:
            c = g.compiled
            head += (f"<br>compiled in {xd.fmt_time(c.compile_time)} at "
                     f"{_esc(_graph_where(c, self._resolver))} ({_esc(c.cause)}); "
                     f"{xd.plural(c.hits, 'cache hit')}")
            if c.explanation:
                head += f"<br>recompiled: {_esc(xd.recompile_reason(c, self._resolver))}"
        parts = [head]
        if note:
            parts.append(f"<span style='color:#a15c00'>{_esc(note)}</span>")
        if self.search.value.strip():
            m = self.matches
            if m:
                items = "; ".join(_esc(self._short(p)) for p in m[:8])
                more = f" and {len(m) - 8} more" if len(m) > 8 else ""
                parts.append(f"<span style='background:{HIGHLIGHT}; padding:0 3px'>"
                             f"{xd.plural(len(m), 'match', 'matches')}</span> {items}{more}")
            else:
                parts.append(f"no node matches {_esc(self.search.value)!s}")
        parts.append("<span style='color:#888'>hover a node for its shape, dtype, source "
                     "line and module; collapsed boxes list the ops inside</span>")
        return "<div style='line-height:1.5'>" + "<br>".join(parts) + "</div>"

    # ---------------------------------------------------------------- other tabs

    def _on_tab(self, change) -> None:
        if change["new"] is not None:
            self._fill_tab(change["new"])

    def show_tab(self, name: str) -> None:
        """Select a tab by title ("Graph", "IR text", "StableHLO", ...)."""
        self.tabs.selected_index = self.TAB_TITLES.index(name)

    def _fill_tab(self, i: int) -> None:
        if i == 0 or i in self._filled:
            return
        self._filled.add(i)
        try:
            if i == 1:
                self.ir_html.value = self._ir_html()
            elif i == 2:
                self.stablehlo_html.value = self._hlo_tab("stablehlo")
            elif i == 3:
                self.hlo_html.value = self._hlo_tab("optimized")
            elif i == 4:
                self.cost_html.value = self._cost_html()
        except Exception as e:  # show it where the user looked, keep the widget alive
            self._filled.discard(i)
            target = (self.ir_html, self.stablehlo_html, self.hlo_html, self.cost_html)[i - 1]
            target.value = f"<pre style='color:#c0392b'>{_esc(type(e).__name__)}: {_esc(e)}</pre>"

    def _ir_html(self) -> str:
        s = self._graph.summary
        text = render_text(s, label=self._resolver.label)
        hits = set(self.matches)
        lines = []
        for line in text.splitlines():
            m = re.match(r"%(\d+) = ", line)
            esc = _esc(line)
            if m and int(m[1]) in hits:
                esc = f"<span style='background:{HIGHLIGHT}'>{esc}</span>"
            lines.append(esc)
        note = f"{xd.plural(len(s.ops), 'op')}; search matches are highlighted" if hits else \
            f"{xd.plural(len(s.ops), 'op')}: %N = type op(args)  # source line  [module]"
        return _pre("\n".join(lines), note)

    def _hlo_tab(self, which: str) -> str:
        g = self._graph
        if not g.summary.ops:
            return "<i>no ops</i>"
        if g.compiled is not None:
            if which == "stablehlo":
                return _hlo_html(g.compiled.hlo("stablehlo"), "StableHLO the graph compiled from")
            return _hlo_html(g.compiled.hlo(optimized=True), "XLA's optimized HLO")
        if which == "stablehlo":
            return _hlo_html(xlanb.hlo(*g.tensors), "StableHLO the next sync would compile")
        _, twin = _compiled_twin(g.summary)
        if twin is None:
            return ("<i>The pending graph is not compiled yet. 'compile it' (above) compiles "
                    "it now; the next sync then reuses the executable.</i>")
        return _hlo_html(twin.hlo(optimized=True), "XLA's optimized HLO (already compiled: "
                                                  "the next sync reuses it)")

    def _compile_pending(self) -> None:
        g = self._graph
        if g is None or g.compiled is not None:
            return
        self.compile_button.description = "compiling..."
        self.compile_button.disabled = True
        xlanb.hlo(*g.tensors, optimized=True)
        self.compile_button.layout.display = "none"
        self._filled -= {3, 4}
        self._fill_tab(3)
        self._fill_tab(4)

    def _cost_html(self) -> str:
        g = self._graph
        s = g.summary
        parts = []
        comp = g.compiled
        if comp is None and s.ops:
            _, comp = _compiled_twin(s)
            if comp is None:
                parts.append("<p><i>XLA's cost and memory analysis needs the compiled graph: "
                             "'compile it' (above) compiles it now, and the next sync reuses "
                             "the executable.</i></p>")
        if comp is not None:
            cost = comp.cost_analysis()
            mem = comp.memory_analysis()
            rows = []
            flops = cost.get("flops")
            nbytes = cost.get("bytes accessed")
            if flops is not None:
                rows.append(("flops", _fmt_count(flops)))
            if cost.get("transcendentals"):
                rows.append(("transcendentals", _fmt_count(cost["transcendentals"])))
            if nbytes is not None:
                rows.append(("bytes accessed", _fmt_bytes(nbytes)))
            if flops and nbytes:
                rows.append(("flops per byte", f"{flops / nbytes:.2f}"))
            rows.append(("compile time", xd.fmt_time(comp.compile_time)))
            rows.append(("cache hits / run time", f"{comp.hits} / {xd.fmt_time(comp.run_time)}"))
            table = "".join(f"<tr><td style='padding-right:12px'>{_esc(k)}</td>"
                            f"<td style='text-align:right'><b>{_esc(v)}</b></td></tr>"
                            for k, v in rows)
            parts.append(f"<b>XLA cost analysis</b><table>{table}</table>")
            if mem is not None:
                fields = (("arguments", "argument_size_in_bytes", C_TO_DEV),
                          ("outputs", "output_size_in_bytes", C_EXECUTE),
                          ("temporaries", "temp_size_in_bytes", C_OPCOMPILE),
                          ("aliased", "alias_size_in_bytes", C_HIT),
                          ("generated code", "generated_code_size_in_bytes", C_FALLBACK))
                mrows = [(label, float(getattr(mem, attr, 0) or 0), colour,
                          _fmt_bytes(float(getattr(mem, attr, 0) or 0)))
                         for label, attr, colour in fields]
                parts.append(bar_chart_svg(mrows, "Device memory of the executable"))
        kinds = collections.Counter(o.name.removeprefix("aten::") for o in s.ops)
        if kinds:
            rows = [(k, n, "#5dade2", str(n)) for k, n in kinds.most_common(12)]
            rest = len(kinds) - 12
            title = f"Ops by kind ({len(s.ops)} ops" + (f", {rest} more kinds)" if rest > 0 else ")")
            parts.append(bar_chart_svg(rows, title))
        return "<div style='display:flex; flex-wrap:wrap; gap:24px'>" + "".join(
            f"<div>{p}</div>" for p in parts) + "</div>"

    # ---------------------------------------------------------------- static copy

    def snapshot(self) -> Snapshot:
        """What the Graph tab shows now, as static HTML (SVG inline)."""
        g = self._graph
        svg = inline_svg(self._svg, "fit") if self._svg else _pre(_esc(render_text(g.summary, label=self._resolver.label)))
        controls = f"scope depth {self.depth.value} of {self.depth.max}"
        if self.search.value.strip():
            controls += f" · find {self.search.value!r}"
        html_text = (f"<div class='xlanb-graphview'>{self.info.value}"
                     f"<div style='color:#666'>{_esc(controls)}</div>"
                     f"<div style='{_STATIC_BOX}'>{svg}</div></div>")
        return Snapshot(html_text, f"GraphView snapshot: {g.title}, {len(g.summary.ops)} ops")


# =========================================================================== GraphDiff

def _resolve_graph(x, which: str):
    """(title, summary, CompiledGraph or None) for a graph given as an index, a
    CompiledGraph or a GraphSummary."""
    if isinstance(x, GraphSummary):
        return which, x, None
    if isinstance(x, int):
        gs = xlanb.graphs()
        if not -len(gs) <= x < len(gs):
            raise IndexError(f"no compiled graph #{x}: xlanb.graphs() has {len(gs)}")
        i = x % len(gs)
        return f"#{i} ({gs[i].hash[:8]})", gs[i].summary, gs[i]
    if getattr(x, "summary", None) is not None:
        i = next((k for k, g in enumerate(xlanb.graphs()) if g is x), None)
        return (f"#{i} ({x.hash[:8]})" if i is not None else x.hash[:8]), x.summary, x
    raise TypeError(f"GraphDiff takes compiled graphs (xlanb.graphs()[i]), their indices or "
                    f"GraphSummary objects; got {type(x).__name__}")


def _last_recompile() -> tuple[int, int]:
    """Indices of the newest graph that recompiled and the graph before it from the same
    line (or the last two graphs when nothing recompiled)."""
    gs = xlanb.graphs()
    if len(gs) < 2:
        raise ValueError(f"GraphDiff needs two compiled graphs; xlanb.graphs() has {len(gs)}")
    for j in range(len(gs) - 1, 0, -1):
        if gs[j].explanation:
            prev = xd.previous_graph(gs[j], gs)
            if prev is not None:
                return next(i for i, g in enumerate(gs) if g is prev), j
    return len(gs) - 2, len(gs) - 1


class GraphDiff(W.VBox):
    """Two graphs side by side with the nodes that differ coloured: orange where the op
    is the same but its shape, arguments or inputs changed, red where it is only in the
    old graph, green where it is only in the new one. The visual form of the recompile
    explanation. With no arguments: the last recompile and the graph before it."""

    def __init__(self, a=None, b=None, *, readable: int = READABLE_NODES) -> None:
        if a is None and b is None:
            a, b = _last_recompile()
        elif a is None or b is None:
            raise TypeError("GraphDiff takes two graphs (or none, for the last recompile)")
        self._resolver = _resolver()
        self.a_title, self.a, self.a_graph = _resolve_graph(a, "old")
        self.b_title, self.b, self.b_graph = _resolve_graph(b, "new")
        self.diff = diff_summaries(self.a, self.b, self._resolver)
        self._busy = False
        self.left_svg = self.right_svg = ""

        levels = max(scope_levels(self.a), scope_levels(self.b))
        start = readable_depth(self.b, readable)
        start_a = readable_depth(self.a, readable)
        if start is None or (start_a is not None and start_a < start):
            start = start_a
        # A graph too big to draw whole opens on its differences and their neighbours.
        big = max(drawn_nodes(self.a, None), drawn_nodes(self.b, None)) > readable
        self.depth = W.IntSlider(description="scope depth", min=0, max=levels,
                                 value=levels if start is None else start,
                                 disabled=levels == 0, continuous_update=False,
                                 style={"description_width": "initial"})
        self.only_changes = W.Checkbox(description="only the differences and their neighbours",
                                       value=bool(big and (self.diff.a or self.diff.b)),
                                       indent=False, layout=W.Layout(width="auto"))
        self.zoom = W.Dropdown(description="zoom", value="fit", layout=W.Layout(width="150px"),
                               options=[("fit width", "fit"), ("50%", 0.5), ("75%", 0.75),
                                        ("100%", 1.0), ("150%", 1.5)])
        self.info = W.HTML()
        self.left_html = W.HTML(layout=W.Layout(width="50%"))
        self.right_html = W.HTML(layout=W.Layout(width="50%"))
        super().__init__([W.HBox([self.depth, self.only_changes, self.zoom],
                                 layout=W.Layout(flex_flow="row wrap", align_items="center")),
                          self.info, W.HBox([self.left_html, self.right_html])])
        for w in (self.depth, self.only_changes, self.zoom):
            w.observe(lambda _: self._render(), names="value")
        self._render()

    @property
    def scope_depth(self) -> int | None:
        return None if self.depth.value >= self.depth.max else self.depth.value

    def _side(self, s: GraphSummary, status: dict) -> tuple[str, str]:
        marks = {p: _STATUS_COLOUR[v] for p, v in status.items()}
        if self.only_changes.value and status:
            dot = graph_dot(s, only=sorted(status), marks=marks, resolver=self._resolver)
        else:
            depth = self.scope_depth
            if drawn_nodes(s, depth) > MAX_DRAWN_NODES:
                focus = sorted(status) or sorted(_near_outputs(s, READABLE_NODES))
                dot = graph_dot(s, only=focus, marks=marks, resolver=self._resolver)
            else:
                dot = graph_dot(s, depth, marks=marks, resolver=self._resolver)
        body, svg = _svg_or_message(dot, self.zoom.value)
        return body, svg

    def _title(self, title: str, s: GraphSummary, g) -> str:
        where = f" · {_esc(_graph_where(g, self._resolver))}" if g is not None else ""
        return (f"<div style='font-weight:bold; margin:4px 0'>{_esc(title)} · "
                f"{xd.plural(len(s.ops), 'op')}{where}</div>")

    def _render(self) -> None:
        left, self.left_svg = self._side(self.a, self.diff.a)
        right, self.right_svg = self._side(self.b, self.diff.b)
        self.left_html.value = (self._title(f"old {self.a_title}", self.a, self.a_graph)
                                + f"<div style='{_BOX}'>{left}</div>")
        self.right_html.value = (self._title(f"new {self.b_title}", self.b, self.b_graph)
                                 + f"<div style='{_BOX}'>{right}</div>")
        self.info.value = self._info_html()

    def _info_html(self) -> str:
        d = self.diff
        expl = xd.recompile_reason(self.b_graph, self._resolver) if self.b_graph else ""
        parts = []
        if expl:
            parts.append(f"<b>why it recompiled:</b> {_esc(expl)}")
        if not (d.a or d.b or d.lines):
            parts.append("<b>the two graphs have the same structure</b>")
        legend = "".join(
            f"<span style='background:{c}; padding:0 4px; margin-right:6px'>{_esc(t)}</span>"
            for t, c in (("changed", CHANGED), ("changed because an input did", FOLLOWS),
                         ("only in old", REMOVED), ("only in new", ADDED)))
        parts.append(f"{legend} <span style='color:#888'>hover a node for its shape and "
                     f"source line</span>")
        if d.lines:
            items = "".join(f"<li>{_esc(line)}</li>" for line in d.lines[:12])
            more = f"<li>... {len(d.lines) - 12} more</li>" if len(d.lines) > 12 else ""
            parts.append(f"<ul style='margin:2px 0'>{items}{more}</ul>")
        return "<div style='line-height:1.5'>" + "<br>".join(parts) + "</div>"

    def snapshot(self) -> Snapshot:
        """The two pictures and the differences, as static HTML."""
        sides = "".join(f"<div style='flex:1; min-width:0'>{self._title(t, s, g)}"
                        f"<div style='{_STATIC_BOX}'>{inline_svg(svg, 'fit') if svg else ''}</div></div>"
                        for t, s, g, svg in (("old " + self.a_title, self.a, self.a_graph, self.left_svg),
                                             ("new " + self.b_title, self.b, self.b_graph, self.right_svg)))
        html_text = (f"<div class='xlanb-graphdiff'>{self.info.value}"
                     f"<div style='display:flex; gap:8px'>{sides}</div></div>")
        return Snapshot(html_text, f"GraphDiff snapshot: {len(self.diff.lines)} differences")


# =========================================================================== metrics

def _num(d: dict, name: str) -> int:
    return max(int(d.get("counters", {}).get(name, 0)), 0)


def _met(d: dict, name: str) -> tuple[int, float]:
    m = d.get("metrics", {}).get(name, {})
    return max(int(m.get("count", 0)), 0), max(float(m.get("total", 0.0)), 0.0)


class _Cell(NamedTuple):
    label: str
    data: dict      # metrics.diff over the cell
    new_graphs: int


class MetricsDashboard(W.VBox):
    """Compile and execute counts and times, cache hit rates and transfers, as charts.

    Refreshed after every cell when an IPython shell is running (``post_run_cell``); the
    per-cell chart shows what each recent cell compiled and where its time went. The
    numbers are totals since ``xlanb.metrics.clear()``, or since "zero" was pressed
    (which does not clear xlanb's metrics). ``close()`` stops the refreshing.
    """

    def __init__(self, shell=None, *, history: int = 24, auto: bool = True) -> None:
        self._baseline: dict | None = None
        self._first_graph = 0  # slowest-compiles chart: graphs from this index on
        self._last = xlanb.metrics.snapshot()
        self._n_graphs = len(xlanb.graphs())
        self._history: collections.deque[_Cell] = collections.deque(maxlen=history)
        self._cells = 0
        self.cards = W.HTML()
        self.charts = W.HTML()
        self.refresh_button = W.Button(description="refresh", icon="refresh",
                                       layout=W.Layout(width="100px"))
        self.zero_button = W.Button(description="zero", icon="undo",
                                    tooltip="count from now on (xlanb's own metrics are kept)",
                                    layout=W.Layout(width="100px"))
        self.status = W.HTML()
        super().__init__([W.HBox([self.refresh_button, self.zero_button, self.status]),
                          self.cards, self.charts])
        self.refresh_button.on_click(lambda _: self.refresh())
        self.zero_button.on_click(lambda _: self.zero())
        self._shell = None
        if auto:
            if shell is None:
                try:
                    from IPython import get_ipython
                    shell = get_ipython()
                except ImportError:
                    shell = None
            events = getattr(shell, "events", None)
            if events is not None:
                events.register("post_run_cell", self._post_run_cell)
                self._shell = shell
        self.refresh()

    # ---------------------------------------------------------------- data

    def data(self) -> dict:
        """The numbers shown: ``metrics.diff`` since the baseline, or the totals."""
        now = xlanb.metrics.snapshot()
        if self._baseline is None:
            return now
        d = xlanb.metrics.diff(self._baseline, now)
        if any(v < 0 for v in d["counters"].values()):  # metrics.clear() since "zero"
            self._baseline, self._first_graph = None, 0
            return now
        return d

    def zero(self) -> None:
        """Count from now on (xlanb's metrics themselves are not cleared)."""
        self._baseline = xlanb.metrics.snapshot()
        self._first_graph = len(xlanb.graphs())
        self._history.clear()
        self.refresh()

    def _post_run_cell(self, result=None) -> None:
        """After a cell: note what it did, then redraw."""
        now = xlanb.metrics.snapshot()
        d = xlanb.metrics.diff(self._last, now)
        self._last = now
        self._cells += 1
        n_graphs = len(xlanb.graphs())
        new = max(n_graphs - self._n_graphs, 0)
        self._n_graphs = n_graphs
        count = getattr(result, "execution_count", None)
        label = f"In[{count}]" if count is not None else f"#{self._cells}"
        busy = any(v > 0 for v in d["counters"].values()) or any(
            m["count"] > 0 for m in d["metrics"].values())
        if busy:
            self._history.append(_Cell(label, d, new))
        try:
            self.refresh()
        except Exception:  # a dashboard must never break the user's cell
            pass

    def close(self) -> None:
        if self._shell is not None:
            try:
                self._shell.events.unregister("post_run_cell", self._post_run_cell)
            except ValueError:
                pass
            self._shell = None
        super().close()

    # ---------------------------------------------------------------- drawing

    def refresh(self) -> None:
        """Redraw from the current metrics."""
        d = self.data()
        self.cards.value = self._cards(d)
        self.charts.value = self._charts(d)
        since = "since 'zero'" if self._baseline is not None else "since metrics.clear()"
        auto = "refreshed after each cell" if self._shell is not None else "press refresh"
        self.status.value = f"<span style='color:#888'>totals {since} · {auto}</span>"

    @staticmethod
    def _card(title: str, value: str, sub: str, colour: str) -> str:
        return (f"<div style='border-left:4px solid {colour}; padding:4px 10px; "
                f"min-width:130px; background:#fafafa'>"
                f"<div style='color:#666; font-size:11px'>{_esc(title)}</div>"
                f"<div style='font-size:22px; font-weight:bold; color:#222'>{_esc(value)}</div>"
                f"<div style='color:#666; font-size:11px'>{_esc(sub)}</div></div>")

    def _cards(self, d: dict) -> str:
        compiles, hits = _num(d, "UncachedCompile"), _num(d, "CachedCompile")
        op_c, op_h = _num(d, "OpCompile"), _num(d, "OpCacheHit")
        _, t_compile = _met(d, "CompileTime")
        _, t_opc = _met(d, "OpCompileTime")
        n_exec, t_exec = _met(d, "ExecuteTime")
        n_to, t_to = _met(d, "TransferToDeviceTime")
        n_from, t_from = _met(d, "TransferFromDeviceTime")
        fallbacks = sum(v for k, v in d.get("counters", {}).items() if k.startswith("aten::"))
        rate = f"{hits / (hits + compiles):.0%}" if hits + compiles else "-"
        op_rate = f"{op_h / (op_h + op_c):.0%}" if op_h + op_c else "-"
        cards = [
            self._card("graph compiles", str(compiles), f"{xd.fmt_time(t_compile)} compiling",
                       C_COMPILE),
            self._card("graph cache hit rate", rate, f"{xd.plural(hits, 'hit')} of {xd.plural(hits + compiles, 'sync')}",
                       C_HIT),
            self._card("single-op compiles", str(op_c),
                       f"{op_rate} reused · {xd.fmt_time(t_opc)}", C_OPCOMPILE),
            self._card("executions", str(n_exec), f"{xd.fmt_time(t_exec)} running", C_EXECUTE),
            self._card("transfers", f"↑{n_to} ↓{n_from}",
                       f"{xd.fmt_time(t_to)} to, {xd.fmt_time(t_from)} from device", C_TO_DEV),
            self._card("CPU fallbacks", str(fallbacks), "ops with no lowering", C_FALLBACK),
        ]
        self._memory = self._memory_walk()
        mem = self._memory.stats if self._memory is not None else None
        if mem is not None:
            limit = mem["limit_bytes"]
            cards.append(self._card(
                "device memory", xd.fmt_bytes(mem["device_bytes.current"]),
                f"peak {xd.fmt_bytes(mem['device_bytes.peak'])}"
                + (f" · limit {xd.fmt_bytes(limit)}" if limit else "")
                + f" · tensors {xd.fmt_bytes(mem['allocated_bytes.current'])}", C_MEMORY))
        p_hit, p_miss = _num(d, "PersistentCacheHit"), _num(d, "PersistentCacheMiss")
        if p_hit or p_miss:
            cards.append(self._card("disk cache", f"{p_hit}/{p_hit + p_miss}",
                                    "persistent cache hits", C_HIT))
        return "<div style='display:flex; flex-wrap:wrap; gap:10px; margin:6px 0'>" + \
            "".join(cards) + "</div>"

    def _charts(self, d: dict) -> str:
        compiles, hits = _num(d, "UncachedCompile"), _num(d, "CachedCompile")
        op_c, op_h = _num(d, "OpCompile"), _num(d, "OpCacheHit")
        times = [("graph compile", _met(d, "CompileTime"), C_COMPILE),
                 ("single-op compile", _met(d, "OpCompileTime"), C_OPCOMPILE),
                 ("execute", _met(d, "ExecuteTime"), C_EXECUTE),
                 ("to device", _met(d, "TransferToDeviceTime"), C_TO_DEV),
                 ("from device", _met(d, "TransferFromDeviceTime"), C_FROM_DEV)]
        time_rows = [(label, t, colour, f"{xd.fmt_time(t)} · {n}×",
                      f"{label}: {n} times, {xd.fmt_time(t)} in all")
                     for label, (n, t), colour in times]
        charts = [bar_chart_svg(time_rows, "Where the time went"),
                  stacked_bar_svg([("graph cache hits", hits, C_HIT),
                                   ("graph compiles", compiles, C_COMPILE)],
                                  f"Whole graphs: {hits} reused, {compiles} compiled",
                                  empty="no syncs yet")
                  + stacked_bar_svg([("single-op reuses", op_h, C_HIT),
                                     ("single-op compiles", op_c, C_OPCOMPILE)],
                                    f"Single ops: {op_h} reused, {op_c} compiled",
                                    empty="no single-op executables yet"),
                  self._cells_chart()]
        slow = self._slowest_graphs()
        if slow:
            charts.append(slow)
        charts.extend(self._memory_charts())
        falls = sorted(((k, v) for k, v in d.get("counters", {}).items()
                        if k.startswith("aten::") and v > 0), key=lambda kv: -kv[1])
        if falls:
            charts.append(bar_chart_svg([(k, v, C_FALLBACK, str(v)) for k, v in falls[:10]],
                                        "CPU fallbacks (ops with no lowering)"))
        return "<div style='display:flex; flex-wrap:wrap; gap:24px'>" + "".join(
            f"<div>{c}</div>" for c in charts) + "</div>"

    @staticmethod
    def _memory_walk():
        """``memory_by_line()``, with ``.stats``: one walk of live objects per refresh."""
        try:
            return xlanb.memory_by_line()
        except Exception:  # a dashboard must never break the user's cell
            return None

    def _memory_charts(self) -> list[str]:
        """The memory panel: the lines holding the most device memory, and device bytes
        after each of the last syncs."""
        out = []
        if getattr(self, "_memory", None) is None:
            return out
        rows = self._memory[:8]
        timeline = xlanb.memory_timeline()[-self._history.maxlen:]
        res = _resolver()
        if rows:
            out.append(bar_chart_svg(
                [((res.label(r.loc) if r.loc is not None else r.source)
                  + (f" [{r.scope}]" if r.scope else ""), r.bytes, C_MEMORY,
                  xd.fmt_bytes(r.bytes), f"{r.count} tensors, {xd.fmt_bytes(r.bytes)}")
                 for r in rows], "Memory by line (live tensors)"))
        if timeline:
            cols = [(str(s.index), [(s.device.get(0, 0), C_MEMORY)], "",
                     f"sync {s.index} ({s.cause}): {xd.fmt_bytes(s.device.get(0, 0))}")
                    for s in timeline]
            out.append(column_chart_svg(cols, [("device bytes after the sync", C_MEMORY)],
                                        "Device memory after each sync"))
        return out

    def _cells_chart(self) -> str:
        cols = []
        for cell in self._history:
            d = cell.data
            parts = [(_met(d, "CompileTime")[1], C_COMPILE),
                     (_met(d, "OpCompileTime")[1], C_OPCOMPILE),
                     (_met(d, "ExecuteTime")[1], C_EXECUTE),
                     (_met(d, "TransferToDeviceTime")[1] + _met(d, "TransferFromDeviceTime")[1],
                      C_TO_DEV)]
            c = _num(d, "UncachedCompile")
            total = sum(v for v, _ in parts)
            hover = (f"{cell.label}: {xd.fmt_time(total)}; {c} graph compiles, "
                     f"{_num(d, 'CachedCompile')} cache hits, {_num(d, 'OpCompile')} op compiles")
            cols.append((cell.label, parts, f"{c}c" if c else "", hover))
        legend = [("graph compile", C_COMPILE), ("op compile", C_OPCOMPILE),
                  ("execute", C_EXECUTE), ("transfer", C_TO_DEV)]
        return column_chart_svg(cols, legend, "Time per cell (Nc: graphs compiled)")

    def _slowest_graphs(self) -> str:
        every = list(xlanb.graphs())
        gs = list(enumerate(every))[self._first_graph:]
        if not gs:
            return ""
        res = _resolver()
        top = sorted(gs, key=lambda ig: -ig[1].compile_time)[:8]
        rows = [(f"#{i} {_graph_where(g, res)}", g.compile_time,
                 C_OPCOMPILE if g.explanation else C_COMPILE,
                 f"{xd.fmt_time(g.compile_time)} · {g.n_nodes} ops",
                 f"#{i}: {g.n_nodes} ops, {g.cause}"
                 + (f"; recompiled: {xd.recompile_reason(g, res, every)}" if g.explanation else ""))
                for i, g in top]
        return bar_chart_svg(rows, "Slowest graph compiles (orange: recompiles)")

    def snapshot(self) -> Snapshot:
        """The cards and charts as they are now, as static HTML."""
        return Snapshot(f"<div class='xlanb-metrics'>{self.cards.value}{self.charts.value}</div>",
                        xlanb.metrics.short_report() or "no metrics yet")
