"""Rich display objects for xlanb's notebook and IPython front end.

Every object here carries ``_repr_mimebundle_`` with ``text/plain`` always present, plus
HTML or SVG where it helps; ``repr()`` is the plain text, so the same object reads well in
a terminal, a notebook and a log. Nothing here imports IPython, so the objects can be
built and tested anywhere; they use only xlanb's public API.

Also here: a ``Probe`` that measures what a stretch of code compiled and ran (metrics diff
plus the compiled-graph log), source locations as a reader names them, and HLO
highlighting. Pictures are drawn by the core's one renderer (``xlanb.render_dot`` and
``xlanb.render_svg``); source locations stay ``xlanb.SourceLoc`` data until they are
named here, so nothing parses ``file:line`` back out of text.
"""
from __future__ import annotations

import html
import linecache
import math
import os
import re
from dataclasses import dataclass, field

import torch

import xlanb

# Graphs with more ops than this are shown as text unless a --depth limits them: dot
# takes a long time on big graphs and the picture is unreadable anyway.
SVG_MAX_OPS = 1500

_CSS_MONO = "font-family: var(--jp-code-font-family, monospace); font-size: 12px;"


# --------------------------------------------------------------------------- small helpers

def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def pending_words(n_ops: int, mode: str) -> str:
    """``27 ops (mode lazy)``; in eager mode, what pending ops are there: an open run of
    ops with no executables yet (or, with runs off, ops that wait for their executables,
    still compiling in the background); eager mode records nothing else."""
    if mode == "eager" and n_ops and xlanb.config.eager_runs:
        return (f"{plural(n_ops, 'op')} in an open run (mode eager: they compile as one "
                "graph, and run, when a value is needed)")
    if mode == "eager" and n_ops:
        return (f"{plural(n_ops, 'op')} waiting for executables still compiling in the "
                "background (mode eager: they run, in order, once those are ready or a value "
                "is read)")
    return f"{plural(n_ops, 'op')} (mode {mode})"


def is_xla_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "xla"


def pending_count(*tensors) -> int:
    """Ops a sync of ``tensors`` (all live tensors when none) would run now."""
    return xlanb.pending_count(*tensors)


def escape(text: str) -> str:
    return html.escape(text, quote=False)


# --------------------------------------------------------------------------- source lines

class SourceResolver:
    """Names an ``xlanb.SourceLoc`` as a reader can find it, and finds its line of code.

    A notebook cell is named by the labeler the IPython extension installs
    (``xlanb.set_location_labeler``: ``SourceLoc.short`` reads ``In[5]:3 forward``), a file
    as ``model.py:42 forward``; a line inside one of our magics reads ``%xla_sync``.
    ``label`` is what the core's renderer and differ take as ``label=``.
    """

    def resolve(self, loc: xlanb.SourceLoc | None) -> tuple[str, str]:
        """(label, code) for ``loc``; code is "" when the line cannot be found."""
        if loc is None:
            return "", ""
        if _our_magic(loc):
            return f"%{loc.function}", ""  # synced by one of our magics
        code = linecache.getline(loc.file, loc.line).strip()
        code = re.sub(r"\s+#[^'\"]*$", "", code)  # a trailing comment
        return loc.short, code

    def label(self, loc: xlanb.SourceLoc | None) -> str:
        """``In[5]:3 forward``, ``model.py:42 forward`` or ``%xla_sync``; "" for None."""
        if loc is None:
            return ""
        return f"%{loc.function}" if _our_magic(loc) else loc.short

    def label_text(self, where: str) -> str:
        """A ``file:line`` string (as a ``TargetReport``'s padding rows hold it) named
        like ``label``: ``In[5]:3`` for a cell, ``model.py:42`` for a file."""
        if not where:
            return ""
        file, _, line = where.rpartition(":")
        if not file or not line.isdigit():
            return os.path.basename(where)
        return xlanb.format_location(xlanb.file_label(file, short=True), line)


def _our_magic(loc: xlanb.SourceLoc) -> bool:
    """A location inside one of our magics (extensions/ipython.py's ``xla_*``)."""
    return os.path.basename(loc.file) == "ipython.py" and loc.function.startswith("xla_")


def synced_in_magic(loc: xlanb.SourceLoc | None) -> bool:
    """Was a graph synced from inside a magic? xlanb then records IPython's frame (or
    ours), not a line of the user's; the graph's cause ("%xla_sync") says more."""
    return loc is not None and (loc.function in ("run_line_magic", "run_cell_magic")
                                or loc.file.startswith("<decorator-gen")
                                or _our_magic(loc))


DEFAULT_RESOLVER = SourceResolver()


# --------------------------------------------------------------------------- base object

class Rich:
    """Base: ``text()`` always, ``html()`` / ``svg()`` optionally."""

    def text(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def html(self) -> str | None:
        return None

    def svg(self) -> str | None:
        return None

    def _repr_mimebundle_(self, include=None, exclude=None):
        def wanted(mime: str) -> bool:
            return (include is None or mime in include) and not (exclude and mime in exclude)
        bundle = {"text/plain": self.text()}
        if wanted("image/svg+xml"):
            svg = self.svg()
            if svg:
                bundle["image/svg+xml"] = svg
        if wanted("text/html"):
            h = self.html()
            if h:
                bundle["text/html"] = h
        return bundle

    def __repr__(self) -> str:
        return self.text()

    __str__ = __repr__


def _table_text(header: tuple, rows: list[tuple], right: set[int] = frozenset()) -> str:
    """``xlanb.format_table`` with a rule of dashes under the header."""
    rows = [tuple(str(c) for c in r) for r in rows]
    rule = tuple("-" * max(len(r[i]) for r in [tuple(header)] + rows) for i in range(len(header)))
    return xlanb.format_table(header, [rule] + rows, right=tuple(right))


def _table_html(header: tuple, rows: list[tuple], right: set[int] = frozenset(),
                cls: str = "xlanb-table") -> str:
    return xlanb.format_table_html(header, rows, right=tuple(right), cls=cls)


# --------------------------------------------------------------------------- what ran

@dataclass
class Activity:
    """What ran between a ``Probe``'s start and ``finish()``."""
    new_graphs: list = field(default_factory=list)      # CompiledGraph, compiled just now
    hit_graphs: list = field(default_factory=list)      # (CompiledGraph, times reused)
    counters: dict = field(default_factory=dict)        # counter deltas
    metrics: dict = field(default_factory=dict)         # name -> {"count", "total"} deltas

    def count(self, name: str) -> int:
        return max(self.counters.get(name, 0), 0)

    def total(self, name: str) -> float:
        return max(self.metrics.get(name, {}).get("total", 0.0), 0.0)

    def samples(self, name: str) -> int:
        return max(self.metrics.get(name, {}).get("count", 0), 0)

    @property
    def compiles(self) -> int:
        return self.count("UncachedCompile")

    @property
    def cache_hits(self) -> int:
        return self.count("CachedCompile")

    @property
    def op_compiles(self) -> int:
        return self.count("OpCompile")

    @property
    def op_hits(self) -> int:
        return self.count("OpCacheHit")

    @property
    def run_compiles(self) -> int:
        """Eager runs of ops compiled as one graph."""
        return self.count("EagerRunCompile")

    @property
    def run_hits(self) -> int:
        return self.count("EagerRunCacheHit")

    @property
    def fallbacks(self) -> dict:
        return {k: v for k, v in self.counters.items() if k.startswith("aten::") and v > 0}

    @property
    def transfers_from_device(self) -> int:
        return self.samples("TransferFromDeviceTime")

    @property
    def idle(self) -> bool:
        return not (self.compiles or self.cache_hits or self.op_compiles or self.op_hits
                    or self.run_compiles or self.run_hits or self.fallbacks or self.samples("ExecuteTime"))


class Probe:
    """Measure what some code compiles and runs: ``p = Probe(); ...; p.finish()``."""

    def __init__(self) -> None:
        self.snapshot = xlanb.metrics.snapshot()
        gs = list(xlanb.graphs())
        self.n_graphs = len(gs)
        self.hits = {id(g): g.hits for g in gs}

    def finish(self) -> Activity:
        d = xlanb.metrics.diff(self.snapshot)
        gs = list(xlanb.graphs())
        new = gs[self.n_graphs:] if len(gs) >= self.n_graphs else gs
        hit = [(g, g.hits - self.hits[id(g)]) for g in gs[:self.n_graphs]
               if id(g) in self.hits and g.hits > self.hits[id(g)]]
        return Activity(new, hit, d.get("counters", {}), d.get("metrics", {}))


def graph_where(g, resolver: SourceResolver = DEFAULT_RESOLVER) -> str:
    """Where graph ``g`` was synced, as a reader would name it (a graph synced inside a
    magic is named by its cause, ``%xla_sync``)."""
    if synced_in_magic(g.src):
        cause = g.cause or ""
        return cause if cause.startswith("%") else f"a magic ({cause})" if cause else "a magic"
    return resolver.label(g.src)


def previous_graph(g, gs: list | None = None):
    """The graph ``g``'s recompile explanation compares it with: the last one before it in
    ``gs`` (default ``xlanb.graphs()``) synced from the same place on the same device, as
    the core chooses it. None when there is none (or ``g`` is not in ``gs``)."""
    if getattr(g, "previous", None) is not None:  # the core's own choice
        return g.previous
    gs = list(xlanb.graphs()) if gs is None else gs
    i = next((k for k, x in enumerate(gs) if x is g), None)
    if i is None:
        return None
    return next((p for p in reversed(gs[:i]) if p.src == g.src and p.device == g.device), None)


def recompile_reason(g, resolver: SourceResolver = DEFAULT_RESOLVER, gs: list | None = None) -> str:
    """``g.explanation`` with source lines named by ``resolver`` (``In[5] line 3``): the
    core's differ run again on the two graphs' summaries. "" for a first graph."""
    expl = getattr(g, "explanation", "") or ""
    if not expl:
        return ""
    prev = previous_graph(g, gs)
    if prev is None or prev.summary is None or g.summary is None:
        return expl  # the log was cleared since: the core's own wording
    growth = getattr(g, "growth", "")  # what grows, and its fix (a graph whose shapes change)
    return "; ".join(t for t in (xlanb.explain(prev.summary, g.summary, label=resolver.label),
                                 growth) if t)


def graph_why(g, resolver: SourceResolver = DEFAULT_RESOLVER, gs: list | None = None) -> str:
    """Why ``g`` compiled: its recompile explanation, or that it is the first graph seen
    from its source line."""
    expl = recompile_reason(g, resolver, gs)
    if expl:
        return "recompile: " + expl
    where = graph_where(g, resolver)
    return f"new graph at {where}" if where else "new graph"


# --------------------------------------------------------------------------- %xla_pending

def graph_svg(dot: str) -> tuple[str | None, str]:
    """(SVG, "") for DOT source drawn by Graphviz, or (None, why not): the core's
    ``xlanb.render_svg`` says how to install ``dot`` when it is missing."""
    try:
        return xlanb.render_svg(dot), ""
    except Exception as e:  # no dot, or dot failed: text plus the reason
        return None, str(e)


class PendingGraph(Rich):
    """The pending IR: text, DOT source, or an SVG picture (with the text as plain)."""

    def __init__(self, text: str, n_ops: int, *, dot: str | None = None,
                 svg: str | None = None, show_dot: bool = False, note: str = "",
                 title: str = "", compiled: bool = False) -> None:
        self.ir_text, self.n_ops, self.dot, self._svg = text, n_ops, dot, svg
        self.show_dot, self.note, self.title, self.compiled = show_dot, note, title, compiled

    def _header(self) -> str:
        if self.compiled:
            return f"{self.title}: {plural(self.n_ops, 'op')}"
        mode = xlanb.get_mode()
        what = f" of {self.title}" if self.title else ""
        return f"pending{what}: {pending_words(self.n_ops, mode)}"

    def text(self) -> str:
        if self.n_ops == 0 and not self.show_dot:
            return (f"no pending ops{' for ' + self.title if self.title else ''} "
                    f"(mode {xlanb.get_mode()})")
        body = self.dot if self.show_dot and self.dot else self.ir_text
        parts = [self._header(), body]
        if self.note:
            parts.append(self.note)
        return "\n".join(parts)

    def svg(self) -> str | None:
        return self._svg

    def html(self) -> str | None:
        if self._svg:
            return None  # the SVG says it all
        note = f"<div style='color:#a15c00'>{escape(self.note)}</div>" if self.note else ""
        body = self.dot if self.show_dot and self.dot else self.ir_text
        if self.n_ops == 0 and not self.show_dot:
            return f"<i>{escape(self.text())}</i>"
        return (f"<div class='xlanb-pending'><b>{escape(self._header())}</b>{note}"
                f"<pre style='{_CSS_MONO}'>{escape(body)}</pre></div>")


# --------------------------------------------------------------------------- %xla_hlo

_HLO_TOKENS = re.compile(r"""
    (?P<comment>//[^\n]*|\#loc[^\n]*|loc\([^\n)]*\))
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<keyword>\b(?:HloModule|ENTRY|ROOT|module|func\.func|func\.return|return|public|private|attributes)\b)
  | (?P<op>\b(?:stablehlo|mhlo|chlo|sdy|func|tensor|arith)\.[\w.]+)
  | (?P<type>tensor<[^>\n]*>|\b(?:pred|[fsuc]\d+|bf16)(?:\[[\d,]*\](?:\{[\d,]*\})?)?(?=[\s,)\]>]))
  | (?P<value>%[\w.\-#]+|@[\w.\-]+)
  | (?P<number>\b-?\d+(?:\.\d+)?(?:e[+-]?\d+)?\b)
""", re.VERBOSE)

_HLO_COLORS = {"comment": "#8a8a8a", "string": "#a31515", "keyword": "#0000c0;font-weight:bold",
               "op": "#7a3e9d;font-weight:bold", "type": "#267f99", "value": "#001080",
               "number": "#098658"}


def highlight_hlo(text: str) -> str:
    """HLO / StableHLO text as HTML with inline colours (no CSS needed)."""
    out, pos = [], 0
    for m in _HLO_TOKENS.finditer(text):
        out.append(escape(text[pos:m.start()]))
        kind = m.lastgroup
        out.append(f"<span style='color:{_HLO_COLORS[kind]}'>{escape(m.group(0))}</span>")
        pos = m.end()
    out.append(escape(text[pos:]))
    return "".join(out)


_HLO_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_HLO_NOISE = (
    re.compile(r", metadata=\{[^{}\n]*\}"),                                  # op_name, stack frame
    re.compile(r", frontend_attributes=\{xla\.sdy\.sharding=\"[^\"\n]*\"\}"),  # 1-device sharding
    re.compile(r" \{sdy\.sharding = #sdy\.sharding<@empty_mesh, [^>\n]*>\}"),
)


def _drop_attribute(line: str, key: str) -> str:
    """``line`` without ``, key={...}`` (braces balanced, strings skipped)."""
    start = line.find(f", {key}={{")
    while start >= 0:
        i, depth, quoted = start + len(key) + 4, 0, False  # after ", key={"
        while i < len(line):
            c = line[i]
            if quoted:
                if c == "\\":
                    i += 1
                elif c == '"':
                    quoted = False
            elif c == '"':
                quoted = True
            elif c == "{":
                depth += 1
            elif c == "}":
                if depth == 0:
                    break
                depth -= 1
            i += 1
        if i >= len(line):  # unbalanced: leave the line as it is
            return line
        line = line[:start] + line[i + 1:]
        start = line.find(f", {key}={{")
    return line


def tidy_hlo(text: str) -> str:
    """Drop what says nothing about the computation on one device: JAX's stack-frame
    tables and per-op ``metadata`` (they point into xlanb's lowering code, not yours),
    single-device sharding annotations, and the TPU compiler's per-instruction
    ``backend_config`` (tiling windows, cycle estimates, scoped memory)."""
    out, skipping = [], False
    for line in text.splitlines():
        if line.strip() in _HLO_TABLES:
            skipping = True
            continue
        if skipping:
            if not line.strip():
                skipping = False
            continue
        for pat in _HLO_NOISE:
            line = pat.sub("", line)
        if "backend_config={" in line:
            line = _drop_attribute(line, "backend_config")
        out.append(line)
    tidy = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", tidy).strip("\n") + "\n"


class HloView(Rich):
    """HLO or StableHLO text, highlighted in notebooks."""

    def __init__(self, text: str, dialect: str, optimized: bool, n_ops: int,
                 note: str = "") -> None:
        self.hlo, self.dialect, self.optimized, self.n_ops = text, dialect, optimized, n_ops
        self.note = note

    def _title(self) -> str:
        kind = "optimized HLO (compiled; the next sync reuses it)" if self.optimized else self.dialect
        return f"{kind} of {plural(self.n_ops, 'pending op')}" + (f"; {self.note}" if self.note else "")

    def text(self) -> str:
        return f"// {self._title()}\n{self.hlo}"

    def html(self) -> str:
        return (f"<div class='xlanb-hlo'><b>{escape(self._title())}</b>"
                f"<pre style='{_CSS_MONO} line-height:1.3'>{highlight_hlo(self.hlo)}</pre></div>")


# --------------------------------------------------------------------------- %xla_metrics

# Compiles first, then execution, transfers, caches; fallbacks follow, then anything else.
# What each one means: the core's xlanb.metrics.describe (one description everywhere).
KNOWN_NAMES = (
    ("UncachedCompile", "counter"),
    ("CachedCompile", "counter"),
    ("CompileTime", "metric"),
    ("LowerTime", "metric"),
    ("OpCompile", "counter"),
    ("OpCacheHit", "counter"),
    ("OpCompileTime", "metric"),
    ("OpLowerTime", "metric"),
    ("ExecuteTime", "metric"),
    ("TransferToDeviceTime", "metric"),
    ("TransferFromDeviceTime", "metric"),
    ("PersistentCacheHit", "counter"),
    ("PersistentCacheMiss", "counter"),
)


def _metric_names() -> list[str]:
    fn = getattr(xlanb.metrics, "metric_names", None)
    if fn is not None:
        return list(fn())
    return sorted(xlanb.metrics.snapshot().get("metrics", {}))


class MetricsTable(Rich):
    """Counters and timing metrics as one table: compiles first."""

    HEADER = ("name", "count", "total", "mean", "p50", "max", "what")
    RIGHT = {1, 2, 3, 4, 5}

    def __init__(self, show_all: bool = False, note: str = "") -> None:
        self.note = note
        known = {n for n, _ in KNOWN_NAMES}
        what = xlanb.metrics.describe
        counters = set(xlanb.metrics.counter_names())
        mets = set(_metric_names())
        rows = []
        for name, kind in KNOWN_NAMES:
            present = name in (counters if kind == "counter" else mets)
            if present or show_all:
                rows.append(self._row(name, kind, what(name)))
        fallbacks = sorted(n for n in counters if n.startswith("aten::"))
        for name in fallbacks:
            rows.append(self._row(name, "counter", what(name)))
        if show_all:
            for name in sorted(counters - known - set(fallbacks)):
                rows.append(self._row(name, "counter", what(name)))
            for name in sorted(mets - known):
                rows.append(self._row(name, "metric", what(name)))
        self.rows = rows
        self.summary = self._summary()

    @staticmethod
    def _row(name: str, kind: str, what: str) -> tuple:
        if kind == "counter":
            v = xlanb.metrics.counter_value(name) or 0
            return (name, str(v), "", "", "", "", what)
        d = xlanb.metrics.metric_data(name)
        if d is None or not d.count:
            return (name, "0", "", "", "", "", what)
        return (name, str(d.count), xlanb.format_duration(d.total), xlanb.format_duration(d.mean),
                xlanb.format_duration(d.percentile(50)), xlanb.format_duration(d.max), what)

    @staticmethod
    def _summary() -> str:
        m = xlanb.metrics
        c = m.counter_value
        compile_t = m.metric_data("CompileTime")
        exe = m.metric_data("ExecuteTime")
        parts = [f"{plural(c('UncachedCompile') or 0, 'graph compile')}"
                 + (f" ({xlanb.format_duration(compile_t.total)})" if compile_t and compile_t.count else ""),
                 f"{plural(c('CachedCompile') or 0, 'cache hit')}",
                 f"{plural(c('OpCompile') or 0, 'op compile')}"]
        if c("EagerRunCompile") or c("EagerRunCacheHit"):  # eager: runs of ops
            parts.append(f"{plural(c('EagerRunCompile') or 0, 'run compile')}, "
                         f"{plural(c('EagerRunCacheHit') or 0, 'cached run')}")
        if exe and exe.count:
            parts.append(f"{plural(exe.count, 'execution')} ({xlanb.format_duration(exe.total)})")
        fb = sum(c(n) or 0 for n in m.counter_names() if n.startswith("aten::"))
        if fb:
            parts.append(f"{plural(fb, 'CPU fallback')}")
        return " · ".join(parts)

    def text(self) -> str:
        if not self.rows:
            body = "no counters or metrics recorded yet"
        else:
            body = _table_text(self.HEADER, self.rows, self.RIGHT)
        return "\n".join(x for x in (f"xla metrics: {self.summary}", body, self.note) if x)

    def html(self) -> str:
        note = f"<div><i>{escape(self.note)}</i></div>" if self.note else ""
        table = (_table_html(self.HEADER, self.rows, self.RIGHT, "xlanb-metrics") if self.rows
                 else "<i>no counters or metrics recorded yet</i>")
        return f"<div><b>xla metrics</b>: {escape(self.summary)}{table}{note}</div>"


# --------------------------------------------------------------------------- %xla_graphs

class GraphsTable(Rich):
    """Compiled graphs, oldest first, with their causes and recompile explanations.

    The cells come from the core's columns (``xlanb.graph_columns``: the same ones
    ``str(xlanb.graphs())`` prints, with a target's per-chip HBM peak, fits, estimated
    time and TPU compile time once a graph was compiled for one); the source is named by
    ``resolver`` (``In[5] line 3``) and a last column says why each compiled."""

    def __init__(self, graphs: list, resolver: SourceResolver = DEFAULT_RESOLVER,
                 first_index: int = 0) -> None:
        self.graphs = graphs
        all_graphs = list(xlanb.graphs())
        cols = xlanb.graph_columns(graphs)
        self.HEADER = ("#",) + tuple(c.header for c in cols) + ("why",)
        self.RIGHT = {0} | {i for i, c in enumerate(cols, 1) if c.right}
        base = {c.header for c in xlanb.graph_columns([])}
        extra = [i for i, c in enumerate(cols) if c.header not in base]  # a target's
        self.rows = []
        self.target_notes: list[str] = []  # a target's compile that failed, per graph
        self.target_waiting = 0            # TPU compiles still running
        for i, g in enumerate(graphs, first_index):
            expl = getattr(g, "explanation", "") or ""
            cells = tuple(graph_where(g, resolver) if c.header == "source" else c.get(g)
                          for c in cols)
            self.rows.append((str(i),) + cells
                             + (recompile_reason(g, resolver, all_graphs) if expl
                                else "first from this line",))
            mine = {cells[k] for k in extra}
            if "compiling" in mine:
                self.target_waiting += 1
            elif "error" in mine:
                r = g.target  # done: no wait
                self.target_notes.append(f"#{i} on {r.target.name}: {r.error}")
        by_src: dict[str, int] = {}
        self._example: dict[str, object] = {}
        for g in graphs:
            by_src[g.src] = by_src.get(g.src, 0) + 1
            self._example.setdefault(g.src, g)
        self.hot = {s: n for s, n in by_src.items() if n > 1}
        self.resolver = resolver

    def _notes(self) -> list[str]:
        notes = list(self.target_notes)
        if self.target_waiting:
            notes.append(f"{plural(self.target_waiting, 'TPU compile')} still running in the "
                         "background: run %xla_graphs again for their figures")
        return notes

    def _footer(self) -> str:
        if not self.hot:
            return ""
        worst = max(self.hot, key=self.hot.get)
        g = self._example[worst]
        if synced_in_magic(worst):
            label, code = graph_where(g, self.resolver), ""
        else:
            label, code = self.resolver.resolve(worst)
        return (f"{self.hot[worst]} graphs were compiled from {label}"
                + (f"  ({code})" if code else "")
                + ": a graph that changes from step to step recompiles every step.")

    def text(self) -> str:
        if not self.graphs:
            return "no compiled graphs yet"
        main = _table_text(self.HEADER[:-1], [r[:-1] for r in self.rows], self.RIGHT)
        why = [f"  #{r[0]}: {r[-1]}" for r in self.rows]
        return "\n".join([main, "why each compiled:"] + why + self._notes()
                         + ([self._footer()] if self.hot else []))

    def html(self) -> str:
        if not self.graphs:
            return "<i>no compiled graphs yet</i>"
        foot = "".join(f"<div style='color:#a15c00'>{escape(n)}</div>"
                       for n in self._notes() + ([self._footer()] if self.hot else []))
        return _table_html(self.HEADER, self.rows, self.RIGHT, "xlanb-graphs") + foot


# --------------------------------------------------------------------------- %xla_sync

class SyncSummary(Rich):
    """What one ``%xla_sync`` did."""

    def __init__(self, activity: Activity, n_ops: int, mode: str,
                 resolver: SourceResolver = DEFAULT_RESOLVER) -> None:
        self.a, self.n_ops, self.mode, self.resolver = activity, n_ops, mode, resolver

    def lines(self) -> list[str]:
        a = self.a
        if self.n_ops == 0 and a.idle:
            return [f"xla sync ({self.mode}): nothing was pending"]
        run = xlanb.format_duration(a.total("ExecuteTime"))
        out = []
        if a.new_graphs or a.hit_graphs:
            for g in a.new_graphs:  # in eager: a run of ops, compiled as one graph
                out.append(f"xla sync ({self.mode}): {'a run of ' if self.mode == 'eager' else ''}"
                           f"{plural(g.n_nodes, 'op')} -> graph {xlanb.format_hash(g.hash)} · new "
                           f"compile {xlanb.format_duration(g.compile_time)}"
                           f"{' (quick tier)' if g.quick else ''}")
                out.append(f"  why: {graph_why(g, self.resolver)}")
            for g, n in a.hit_graphs:
                out.append(f"xla sync ({self.mode}): {plural(g.n_nodes, 'op')} -> graph "
                           f"{xlanb.format_hash(g.hash)} · cache hit (no compile; reused "
                           f"{plural(g.hits, 'time')} so far)")
                out.append(f"  compiled earlier at {graph_where(g, self.resolver) or '?'} "
                           f"in {xlanb.format_duration(g.compile_time)}")
            out.append(f"  run: {run}")
        else:
            ran = (f"{plural(self.n_ops, 'op')} that waited for background compiles ran"
                   if self.mode == "eager" else f"{plural(self.n_ops, 'op')} run one by one")
            wait = a.total("OpCompileWaitTime")
            if self.mode == "eager" and wait:
                ran = f"waited {xlanb.format_duration(wait)} for background compiles; {ran}"
            out.append(f"xla sync ({self.mode}): {ran} · "
                       f"{plural(a.op_compiles, 'op compile')} "
                       f"({xlanb.format_duration(a.total('OpCompileTime'))}), "
                       f"{plural(a.op_hits, 'op cache hit')} · run {run}")
        if a.fallbacks:
            out.append("  CPU fallbacks: " + ", ".join(f"{k} ×{v}" for k, v in a.fallbacks.items()))
        return out

    def text(self) -> str:
        return "\n".join(self.lines())

    def html(self) -> str:
        ls = self.lines()
        return (f"<div class='xlanb-sync'><b>{escape(ls[0])}</b>"
                + "".join(f"<br>&nbsp;&nbsp;{escape(x.strip())}" for x in ls[1:]) + "</div>")


# --------------------------------------------------------------------------- %%xla_explain

class ExplainReport(Rich):
    """What a cell compiled and executed, and why, with source lines."""

    def __init__(self, activity: Activity, pending_after: int, mode: str,
                 resolver: SourceResolver = DEFAULT_RESOLVER, wall: float | None = None,
                 memory: tuple | None = None, target=None, reports: list | None = None) -> None:
        self.a, self.pending, self.mode, self.resolver, self.wall = (
            activity, pending_after, mode, resolver, wall)
        # %%xla_explain --target: the xlanb.Target, and (graph, TargetReport) for each
        # graph the cell compiled or reused
        self.target, self.reports = target, list(reports or ())
        # device bytes before and after the cell
        self.memory_before, self.memory_after = memory if memory else (None, None)

    def _where(self, loc) -> str:
        label, code = self.resolver.resolve(loc)
        return f"{label}: {code}" if code else (label or "?")

    def _where_graph(self, g) -> str:
        if synced_in_magic(g.src):
            return graph_where(g, self.resolver)
        return self._where(g.src)

    def sections(self) -> list[tuple[str, list[str]]]:
        a = self.a
        secs: list[tuple[str, list[str]]] = []
        if a.new_graphs:
            items = []
            by_src: dict[str, int] = {}
            for g in a.new_graphs:
                by_src[g.src] = by_src.get(g.src, 0) + 1
                items.append(f"graph {xlanb.format_hash(g.hash)}: {plural(g.n_nodes, 'op')}, "
                             f"compiled in {xlanb.format_duration(g.compile_time)}, cause: {g.cause}")
                items.append(f"    synced at  {self._where_graph(g)}")
                items.append(f"    why        {graph_why(g, self.resolver)}")
                for line in getattr(g, "repeats", ()):  # layers compiled once (a loop)
                    items.append(f"    layers     {line}")
                if g.memory is not None:
                    items.append(f"    memory     {g.memory}")
            secs.append((f"{plural(len(a.new_graphs), 'graph')} compiled "
                         f"({xlanb.format_duration(a.total('CompileTime'))})", items))
            hot = {s: n for s, n in by_src.items() if n > 1}
            if hot:
                s = max(hot, key=hot.get)
                example = next(g for g in a.new_graphs if g.src == s)
                secs.append(("recompiles", [
                    f"{hot[s]} different graphs were compiled from {self._where_graph(example)}.",
                    "The graph changes between syncs (a shape that grows, an op that depends "
                    "on data, a Python value baked in), so every step compiles again.",
                    "The 'why' lines above name the first difference."]))
        if a.hit_graphs:
            items = [f"graph {xlanb.format_hash(g.hash)} ×{n} ({plural(g.n_nodes, 'op')}, first compiled at "
                     f"{graph_where(g, self.resolver) or '?'})" for g, n in a.hit_graphs[:8]]
            if len(a.hit_graphs) > 8:
                items.append(f"... and {len(a.hit_graphs) - 8} more")
            secs.append((f"{plural(a.cache_hits, 'graph')} reused from the cache", items))
        if a.op_compiles or a.op_hits:
            secs.append(("single-op executables", [
                f"{a.op_compiles} compiled ({xlanb.format_duration(a.total('OpCompileTime'))}), "
                f"{a.op_hits} reused from the op cache"]))
        n_exec = a.samples("ExecuteTime")
        if n_exec:
            secs.append(("executed", [f"{plural(n_exec, 'run')}, {xlanb.format_duration(a.total('ExecuteTime'))} "
                                      "on the device"]))
        xfer = [f"{a.samples(n)} {w} ({xlanb.format_duration(a.total(n))})"
                for n, w in (("TransferToDeviceTime", "host -> device"),
                             ("TransferFromDeviceTime", "device -> host")) if a.samples(n)]
        if xfer:
            secs.append(("transfers", [", ".join(xfer)]))
        if self.memory_before is not None and self.memory_after is not None:
            items = [f"{xlanb.format_bytes(self.memory_before)} before the cell, "
                     f"{xlanb.format_bytes(self.memory_after)} after"]
            ran = [g for g in a.new_graphs if g.memory] + [g for g, _ in a.hit_graphs if g.memory]
            if ran:
                g = max(ran, key=lambda g: g.memory.peak_bytes)
                items.append(f"the largest graph run needs {xlanb.format_bytes(g.memory.peak_bytes)} at its "
                             f"peak (graph {xlanb.format_hash(g.hash)}: {g.memory})")
            secs.append(("device memory (all buffers xlanb holds)", items))
        if self.target is not None:
            secs.append(self._target_section())
        if a.fallbacks:
            secs.append(("CPU fallbacks (no lowering; each one cuts the graph)",
                         [f"{k} ×{v}" for k, v in a.fallbacks.items()]))
        tail = [f"{plural(self.pending, 'op')} still pending (mode {self.mode})"]
        if self.pending and self.mode != "eager":
            tail.append("they compile at the next sync (xlanb.sync(), %xla_sync, or a value "
                        "that is needed on the host)")
        elif self.pending and xlanb.config.eager_runs:  # eager records its open run
            tail.append("they are an open run: it compiles as one graph, and runs, when a "
                        "value is needed (a read, xlanb.sync(), %xla_sync, a mode switch)")
        elif self.pending:  # runs off: eager records only the ops that wait on a compile
            tail.append("they wait on background compiles and run, in order, when those "
                        "finish or a value is needed")
        secs.append(("after the cell", tail))
        return secs

    def _target_section(self) -> tuple[str, list[str]]:
        t = self.target
        title = (f"on {t.name} ({t.num_devices} x {t.chip}, {xlanb.format_bytes(t.hbm_bytes)} HBM per "
                 "chip), compiled by the TPU compiler, not run")
        if not self.reports:
            why = ("eager mode runs op by op: no graph to compile" if self.mode == "eager"
                   else "the cell ran no graph")
            return title, [f"no graph to compile for it ({why}); %xla_target {t.name} --now "
                           "compiles the pending graph"]
        items = []
        for g, r in self.reports:
            items.append(f"graph {xlanb.format_hash(g.hash)}: {r.verdict()}")
            if r.error and r.memory is not None:
                items.append(f"    compiler   {r.error}")
            if r.cost is not None:
                items.append(f"    roofline   {r.roofline}")
            for note in r.notes:
                items.append(f"    note       {note}")
        return title, items

    def headline(self) -> str:
        a = self.a
        if a.idle:
            head = "nothing compiled or executed"
        else:
            head = (f"{plural(a.compiles, 'compile')}, {plural(a.cache_hits, 'cache hit')}, "
                    f"{plural(a.op_compiles, 'op compile')}")
            if a.run_compiles or a.run_hits:  # eager: runs of ops, one graph each
                head += (f", {plural(a.run_compiles, 'run compile')}, "
                         f"{plural(a.run_hits, 'cached run')}")
        wall = f" in {xlanb.format_duration(self.wall)}" if self.wall is not None else ""
        return f"xla explain ({self.mode}){wall}: {head}"

    def text(self) -> str:
        out = [self.headline()]
        for title, items in self.sections():
            out.append(f"- {title}")
            out.extend(f"    {x}" for x in items)
        return "\n".join(out)

    def html(self) -> str:
        parts = [f"<div class='xlanb-explain'><b>{escape(self.headline())}</b><ul>"]
        for title, items in self.sections():
            parts.append(f"<li>{escape(title)}<pre style='{_CSS_MONO} margin:2px 0'>"
                         + escape("\n".join(items)) + "</pre></li>")
        parts.append("</ul></div>")
        return "".join(parts)


# --------------------------------------------------------------------------- status line

def status_line(activity: Activity | None, resolver: SourceResolver = DEFAULT_RESOLVER) -> str:
    """``xla: lazy · 214 pending ops · 1 compile (2.1 s, new graph: ...)``."""
    mode = xlanb.get_mode()
    parts = [f"xla: {mode}"]
    try:
        n = pending_count()
        # eager records only the ops of its open run (or, with runs off, those that wait
        # on a background compile)
        parts.append(plural(n, "pending op") + (
            ("" if not n or mode != "eager" else " (an open run)" if xlanb.config.eager_runs
             else " (waiting on compiles)")))
    except Exception:  # a broken graph must not break the prompt
        parts.append("? pending ops")
    a = activity
    if a is not None:
        if a.compiles:
            detail = [xlanb.format_duration(a.total("CompileTime"))]
            if a.new_graphs:
                detail.append(graph_why(a.new_graphs[-1], resolver))
            parts.append(f"{plural(a.compiles, 'compile')} ({', '.join(detail)})")
        if a.cache_hits:
            parts.append(plural(a.cache_hits, "cached graph run", "cached graph runs"))
        if a.run_compiles:
            quick = a.count("QuickCompile")
            parts.append(f"{plural(a.run_compiles, 'run compile')} "
                         f"({xlanb.format_duration(a.total('EagerRunCompileTime'))}"
                         + (f", {quick} quick" if quick else "") + ")")
        if a.run_hits:
            parts.append(plural(a.run_hits, "cached run"))
        if a.count("GraphTierUp") or a.count("OpTierUp"):
            parts.append(plural(a.count("GraphTierUp") + a.count("OpTierUp"), "tier-up"))
        if a.op_compiles:
            parts.append(f"{plural(a.op_compiles, 'op compile')} "
                         f"({xlanb.format_duration(a.total('OpCompileTime'))})")
        if a.samples("ExecuteTime"):
            parts.append(f"run {xlanb.format_duration(a.total('ExecuteTime'))}")
        if a.fallbacks:
            parts.append("CPU fallback: " + ", ".join(a.fallbacks))
    target = xlanb.get_target()
    if target is not None:  # every new graph compiles for it too (%xla_target)
        parts.append(f"target {target.name}")
    return " · ".join(parts)


# --------------------------------------------------------------------------- tensors

def tensor_html(t: torch.Tensor) -> str:
    """A notebook repr for an xla tensor: a one-line header, then the values as
    ``repr`` shows them (by peek unless ``xlanb.config.inspect`` says otherwise), so
    displaying a tensor never cuts the pending graph."""
    how = getattr(xlanb.config, "inspect", "peek")
    try:
        n = pending_count(t)
    except Exception:
        n = None
    dtype = str(t.dtype).replace("torch.", "")
    head = [f"{t.device}", f"{dtype}{list(t.shape)}"]
    if n is not None:
        head.append(plural(n, "pending op") if n else "on device")
    head.append(f"mode {xlanb.get_mode()}")
    head.append({"peek": "values by peek (the graph is not cut)",
                 "sync": "values by sync (config.inspect='sync')",
                 "meta": "values hidden (config.inspect='meta')"}.get(how, how))
    return (f"<div class='xlanb-tensor'><div style='color:#666;font-size:85%'>"
            f"{escape(' · '.join(head))}</div><pre style='{_CSS_MONO} margin:0'>"
            f"{escape(repr(t))}</pre></div>")


# --------------------------------------------------------------------------- %xla_memory

class MemoryText(Rich):
    """A core memory report (``memory_summary``, ``memory_by_line``): its text, and its
    HTML where it has one."""

    def __init__(self, obj, title: str = "") -> None:
        self.obj, self.title = obj, title

    def text(self) -> str:
        return (self.title + "\n" if self.title else "") + str(self.obj)

    def html(self) -> str:
        inner = (self.obj._repr_html_() if hasattr(self.obj, "_repr_html_")
                 else f"<pre style='{_CSS_MONO}'>{escape(str(self.obj))}</pre>")
        return (f"<b>{escape(self.title)}</b>" if self.title else "") + inner


class GraphMemoryReport(Rich):
    """One compiled graph's memory: XLA's analysis and its largest buffers by op and line."""

    def __init__(self, g, index: int, resolver: SourceResolver = DEFAULT_RESOLVER, n: int = 10):
        self.g, self.index, self.resolver = g, index, resolver
        try:
            self.buffers = g.largest_buffers(n)
        except Exception:  # an executable that prints no HLO
            self.buffers = []

    def _rows(self) -> list[tuple]:
        return [(xlanb.format_bytes(b.bytes), b.opcode, b.op or "?", b.scope,
                 (self.resolver.label(b.loc) or "") if b.loc is not None else "",
                 b.shape if b.shape.count(",") < 6 else b.shape.split(", ")[0] + ", ...")
                for b in self.buffers]

    def text(self) -> str:
        g = self.g
        head = f"graph #{self.index} {xlanb.format_hash(g.hash)} ({plural(g.n_nodes, 'op')}, synced at " \
               f"{graph_where(g, self.resolver) or '?'})"
        mem = g.memory
        out = [head, f"  {mem}" if mem else "  XLA gives no memory analysis for it"]
        if self.buffers:
            out.append("largest buffers it allocates while it runs (XLA may reuse one for several):")
            out.append(_table_text(("bytes", "hlo", "aten op", "scope", "source", "shape"),
                                   self._rows(), {0}))
        return "\n".join(out)


# --------------------------------------------------------------------------- %xla_target

# a topology of each generation, as an example of the names (JAX's spelling)
EXAMPLE_TOPOLOGIES = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2"}


def target_text(t) -> str:
    """``v5e:2x2 (4 x TPU v5 lite, 16.0 GiB HBM per chip)``."""
    return f"{t.name} ({t.num_devices} x {t.chip}, {xlanb.format_bytes(t.hbm_bytes)} HBM per chip)"


class TargetStatus(Rich):
    """The session's TPU target (``xlanb.get_target()``) and the generations xlanb knows
    (``xlanb.CHIPS``: HBM, peak bf16 FLOP/s, HBM bandwidth per chip, and where each
    figure is published)."""

    HEADER = ("generation", "chip", "HBM per chip", "peak bf16", "HBM bandwidth", "e.g.")
    RIGHT = {2, 3, 4}

    def __init__(self, target, headline: str) -> None:
        self.current = target
        self.headline = headline  # the shell's words (extensions/commands.target_headline)
        self.rows = [(gen, c.device_kind, xlanb.format_bytes(c.hbm_bytes), f"{c.peak_flops / 1e12:.0f} TFLOP/s",
                      f"{c.hbm_bytes_per_s / 1e9:,.0f} GB/s", EXAMPLE_TOPOLOGIES.get(gen, gen + ":1x1"))
                     for gen, c in xlanb.CHIPS.items()]
        self.sources = [c.source for c in xlanb.CHIPS.values()]

    def lines(self) -> list[str]:
        return [self.headline]

    def text(self) -> str:
        return "\n".join(self.lines() + [
            "known generations (a target is generation:chips per dimension):",
            _table_text(self.HEADER, self.rows, self.RIGHT)])

    def html(self) -> str:
        head = "".join(f"<div>{escape(x)}</div>" for x in self.lines())
        table = _table_html(self.HEADER, self.rows, self.RIGHT, "xlanb-chips")
        src = "; ".join(self.sources)
        return (f"<div class='xlanb-target-status'>{head}<div>known generations (a target "
                f"is generation:chips per dimension):</div>{table}"
                f"<div style='color:#666;font-size:85%'>{escape(src)}</div></div>")


PADDING_HEADER = xlanb.PaddingList.HEADER


def padding_rows(report, resolver: SourceResolver = DEFAULT_RESOLVER, n: int = 12) -> list[tuple]:
    """A ``TargetReport``'s padding rows (most padding first) as table cells, each
    source line named by ``resolver`` (``In[5] line 3`` for a cell)."""
    return report.padding.rows(resolver.label_text)[:n]


class TargetView(Rich):
    """A ``TargetReport`` under a line that says what was compiled: text in a terminal,
    HTML (HBM bar, padding, collectives, roofline) in a notebook. Both are laid out from
    the report's sections (``TargetReport.sections``), its lines named by the resolver
    (``In[5] line 3``)."""

    def __init__(self, report, what: str, resolver: SourceResolver = DEFAULT_RESOLVER) -> None:
        self.report, self.what, self.resolver = report, what, resolver
        self.sections = report.sections(source=resolver.label_text)

    def title(self) -> str:
        how = "refused by the TPU compiler" if self.report.error else "compiled"
        return f"{self.what}, {how} for {target_text(self.report.target)} (nothing ran)"

    def text(self) -> str:
        out = [self.title(), self.report.headline()]
        for sec in self.sections:
            out += [f"  {line}" for line in sec.lines]
            if sec.title:
                out.append(f"  {sec.title}:" + (f" {sec.summary}" if sec.summary else ""))
            if sec.rows:
                out.append(xlanb.format_table(sec.header, list(sec.rows), right=sec.right,
                                              indent="    "))
        return "\n".join(out)

    def html(self) -> str:
        r = self.report
        parts = [f"<div><b>{escape(self.title())}</b></div>",
                 f"<div class='xlanb-target'>{escape(r.headline())}</div>"]
        if r.memory is not None:
            parts.append(r.memory_bar_html())
        for sec in self.sections:
            parts += [f"<div>{escape(line)}</div>" for line in sec.lines]
            if sec.title:
                parts.append(f"<div>{escape(sec.title)}"
                             + (f": {escape(sec.summary)}" if sec.summary else "") + "</div>")
            if sec.rows:
                parts.append(_table_html(sec.header, sec.rows, set(sec.right), f"xlanb-{sec.kind}"))
        return "".join(parts)


class TargetMemory(Rich):
    """What one graph needs on each chip of a TPU target: peak against HBM, whether it
    fits, arguments / outputs / temporaries, and what the TPU's tiled layouts pad."""

    HEADER = PADDING_HEADER
    RIGHT = set(xlanb.PaddingList.RIGHT)

    def __init__(self, report, what: str, resolver: SourceResolver = DEFAULT_RESOLVER,
                 n: int = 12) -> None:
        self.report, self.what, self.resolver = report, what, resolver
        self.rows = padding_rows(report, resolver, n)

    def lines(self) -> list[str]:
        r, t = self.report, self.report.target
        out = [f"{self.what} on {target_text(t)}, per chip (compiled, nothing ran):"]
        m = r.memory
        if m is None:
            out.append(f"  not compiled: {r.error}")
            return out
        verdict = xlanb.format_fits(r.fits)
        out.append(f"  peak {xlanb.format_bytes(m.peak_bytes)} of {xlanb.format_bytes(t.hbm_bytes)} HBM: {verdict} "
                   f"({100 * m.peak_bytes / t.hbm_bytes:.3g}% of HBM)")
        if not r.error:
            out.append(f"  arguments {xlanb.format_bytes(m.argument_bytes)}, outputs {xlanb.format_bytes(m.output_bytes)}"
                       f", temporaries {xlanb.format_bytes(m.temp_bytes)}, aliased {xlanb.format_bytes(m.alias_bytes)}")
        # the compiler's refusal, the TPU layouts' totals and the notes, in the report's words
        out.extend(f"  {line}" for sec in r.sections(source=self.resolver.label_text)
                   if sec.kind in ("compiler", "layouts", "notes") for line in sec.lines)
        return out

    def text(self) -> str:
        out = self.lines()
        if self.rows:
            out.append("what the TPU layouts pad (most first):")
            out.append(_table_text(self.HEADER, self.rows, self.RIGHT))
        return "\n".join(out)

    def html(self) -> str:
        ls = self.lines()
        r = self.report
        bar = r.memory_bar_html()
        body = "".join(f"<div>{escape(x.strip())}</div>" for x in ls[1:])
        table = _table_html(self.HEADER, self.rows, self.RIGHT, "xlanb-padding") if self.rows else ""
        return (f"<div class='xlanb-target-memory'><b>{escape(ls[0])}</b>{bar}{body}"
                f"{table}</div>")


def memory_timeline_figure(timeline, device: int = 0, title: str | None = None):
    """A matplotlib figure of device bytes after each sync (``xlanb.memory_timeline()``),
    with the memory limit as a line when one is set."""
    import matplotlib
    from matplotlib.figure import Figure
    fig = Figure(figsize=(7, 3.2), dpi=100)
    ax = fig.add_subplot()
    xs = [s.index for s in timeline]
    ys = [b / 2**20 for b in timeline.bytes(device)]
    peaks = [b / 2**20 for b in timeline.peaks(device)]
    marker = "o" if len(xs) <= 60 else None
    if any(p > y for p, y in zip(peaks, ys)):
        ax.fill_between(xs, ys, peaks, step="pre", color="#ee854a", alpha=0.25, linewidth=0)
        ax.step(xs, peaks, where="pre", color="#ee854a",
                label="peak while the step ran (graph temporaries)")
    ax.plot(xs, ys, marker=marker, markersize=3, color="#4878d0",
            label="device bytes after the sync")
    limit = xlanb.config.memory_limit
    if limit and ys and limit / 2**20 < 4 * max(peaks):
        ax.axhline(limit / 2**20, color="#d65f5f", linestyle="--", label="memory limit")
    ax.set_xlabel("sync")
    ax.set_ylabel("MiB on xla:%d" % device)
    ax.set_title(title or "Device memory after each sync")
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    del matplotlib
    return fig


def figure_png(fig) -> bytes:
    """A matplotlib figure as PNG bytes (no pyplot, no backend state)."""
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
