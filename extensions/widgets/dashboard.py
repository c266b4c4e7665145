"""``MetricsDashboard``: compiles, cache hits, times and transfers as charts, refreshed
after every cell."""
from __future__ import annotations

import collections
from typing import NamedTuple

import ipywidgets as W

import xlanb

from .. import display as xd
from ._style import (C_COMPILE, C_EXECUTE, C_FALLBACK, C_FROM_DEV, C_HIT, C_MEMORY,
                     C_OPCOMPILE, C_TO_DEV, Snapshot, _esc, _graph_where, _resolver)
from .charts import bar_chart_svg, column_chart_svg, stacked_bar_svg


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
            self._card("graph compiles", str(compiles), f"{xlanb.format_duration(t_compile)} compiling",
                       C_COMPILE),
            self._card("graph cache hit rate", rate, f"{xd.plural(hits, 'hit')} of {xd.plural(hits + compiles, 'sync')}",
                       C_HIT),
            self._card("single-op compiles", str(op_c),
                       f"{op_rate} reused · {xlanb.format_duration(t_opc)}", C_OPCOMPILE),
            self._card("executions", str(n_exec), f"{xlanb.format_duration(t_exec)} running", C_EXECUTE),
            self._card("transfers", f"↑{n_to} ↓{n_from}",
                       f"{xlanb.format_duration(t_to)} to, {xlanb.format_duration(t_from)} from device", C_TO_DEV),
            self._card("CPU fallbacks", str(fallbacks), "ops with no lowering", C_FALLBACK),
        ]
        self._memory = self._memory_walk()
        mem = self._memory.stats if self._memory is not None else None
        if mem is not None:
            limit = mem["limit_bytes"]
            cards.append(self._card(
                "device memory", xlanb.format_bytes(mem["device_bytes.current"]),
                f"peak {xlanb.format_bytes(mem['device_bytes.peak'])}"
                + (f" · limit {xlanb.format_bytes(limit)}" if limit else "")
                + f" · tensors {xlanb.format_bytes(mem['allocated_bytes.current'])}", C_MEMORY))
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
        time_rows = [(label, t, colour, f"{xlanb.format_duration(t)} · {n}×",
                      f"{label}: {n} times, {xlanb.format_duration(t)} in all")
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
                  xlanb.format_bytes(r.bytes), f"{r.count} tensors, {xlanb.format_bytes(r.bytes)}")
                 for r in rows], "Memory by line (live tensors)"))
        if timeline:
            cols = [(str(s.index), [(s.device.get(0, 0), C_MEMORY)], "",
                     f"sync {s.index} ({s.cause}): {xlanb.format_bytes(s.device.get(0, 0))}")
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
            hover = (f"{cell.label}: {xlanb.format_duration(total)}; {c} graph compiles, "
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
                 f"{xlanb.format_duration(g.compile_time)} · {g.n_nodes} ops",
                 f"#{i}: {g.n_nodes} ops, {g.cause}"
                 + (f"; recompiled: {xd.recompile_reason(g, res, every)}" if g.explanation else ""))
                for i, g in top]
        return bar_chart_svg(rows, "Slowest graph compiles (orange: recompiles)")

    def snapshot(self) -> Snapshot:
        """The cards and charts as they are now, as static HTML."""
        return Snapshot(f"<div class='xlanb-metrics'>{self.cards.value}{self.charts.value}</div>",
                        xlanb.metrics.short_report() or "no metrics yet")
