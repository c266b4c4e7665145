"""``GraphView``: one graph (pending or compiled) as SVG, IR, StableHLO, optimized HLO,
cost and memory, with scope depth, search and tooltips."""
from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

import ipywidgets as W
import torch

import xlanb
from xlanb import GraphSummary, render_text

from .. import display as xd
from ._style import (C_EXECUTE, C_FALLBACK, C_HIT, C_OPCOMPILE, C_TO_DEV, HIGHLIGHT,
                     MAX_DRAWN_NODES, READABLE_NODES, Snapshot, _BOX, _STATIC_BOX, _esc,
                     _fmt_count, _hlo_html, _pre, _resolver,
                     _graph_where)
from .charts import bar_chart_svg
from .drawing import (_near_outputs, _svg_or_message, drawn_nodes, find_matches, graph_dot,
                      inline_svg, readable_depth, scope_levels)


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
            opts.append((f"#{i} {xlanb.format_hash(g.hash)} · {xd.plural(g.n_nodes, 'op')} · "
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
                    opts.append((f"{xlanb.format_hash(self._explicit.hash)} (not in xlanb.graphs())",
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
        name = f"graph {xlanb.format_hash(g.hash)}" if key == "explicit" else f"graph #{key} ({xlanb.format_hash(g.hash)})"
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
            head += (f"<br>compiled in {xlanb.format_duration(c.compile_time)} at "
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
                rows.append(("bytes accessed", xlanb.format_bytes(int(nbytes))))
            if flops and nbytes:
                rows.append(("flops per byte", f"{flops / nbytes:.2f}"))
            rows.append(("compile time", xlanb.format_duration(comp.compile_time)))
            rows.append(("cache hits / run time", f"{comp.hits} / {xlanb.format_duration(comp.run_time)}"))
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
                          xlanb.format_bytes(int(getattr(mem, attr, 0) or 0)))
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
