"""A graph as data and as a picture: search, scope depth, neighbourhoods, tooltips and
the dot text the core's renderer draws. Plain functions, tested without a browser."""
from __future__ import annotations

import collections
import re
from typing import Iterable

import xlanb
from xlanb import GraphSummary, SummaryDiff

from .. import display as xd
from ._style import MAX_DRAWN_NODES, MAX_FOCUS, READABLE_NODES, _esc, _pattern

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
