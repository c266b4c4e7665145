"""``GraphDiff``: two graphs side by side, the nodes that differ coloured."""
from __future__ import annotations

import ipywidgets as W

import xlanb
from xlanb import GraphSummary

from .. import display as xd
from ._style import (ADDED, CHANGED, FOLLOWS, MAX_DRAWN_NODES, READABLE_NODES, REMOVED,
                     Snapshot, _BOX, _STATIC_BOX, _STATUS_COLOUR, _esc, _graph_where,
                     _resolver)
from .drawing import (_near_outputs, _svg_or_message, diff_summaries, drawn_nodes, graph_dot,
                      inline_svg, readable_depth, scope_levels)


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
        return f"#{i} ({xlanb.format_hash(gs[i].hash)})", gs[i].summary, gs[i]
    if getattr(x, "summary", None) is not None:
        i = next((k for k, g in enumerate(xlanb.graphs()) if g is x), None)
        return (f"#{i} ({xlanb.format_hash(x.hash)})" if i is not None else xlanb.format_hash(x.hash)), x.summary, x
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
