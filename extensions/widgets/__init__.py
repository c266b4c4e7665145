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

One module per widget: ``graph_view``, ``diff``, ``dashboard``; ``drawing`` and ``charts``
hold the pure functions, ``_style`` what they all share.
"""
from __future__ import annotations

from xlanb import SummaryDiff

from ._style import (  # noqa: F401 (colours and limits, re-exported for tests and users)
    ADDED, C_COMPILE, C_EXECUTE, C_FALLBACK, C_FROM_DEV, C_HIT, C_MEMORY, C_OPCOMPILE,
    C_TO_DEV, CHANGED, FOLLOWS, HIGHLIGHT, MAX_DRAWN_NODES, MAX_FOCUS, READABLE_NODES,
    REMOVED, Snapshot)
from .charts import bar_chart_svg, column_chart_svg, stacked_bar_svg
from .dashboard import MetricsDashboard
from .diff import GraphDiff
from .drawing import (  # noqa: F401
    diff_summaries, drawn_nodes, find_matches, graph_dot, inline_svg,
    neighbourhood, node_tooltip, readable_depth, scope_levels)
from .graph_view import GraphView

__all__ = ["GraphView", "GraphDiff", "MetricsDashboard", "Snapshot", "graph_dot",
           "diff_summaries", "SummaryDiff", "find_matches", "scope_levels", "drawn_nodes",
           "readable_depth", "bar_chart_svg", "stacked_bar_svg", "column_chart_svg"]
