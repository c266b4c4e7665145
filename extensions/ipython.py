"""``%load_ext xlanb``: xlanb's IPython magics, rich display and per-cell status line.

Line magics (``%xla_mode?`` and friends give help)::

    %xla_mode [lazy|eager|opbyop]        show or switch the execution mode
    %xla_pending [names] [--text|--dot|--svg] [--depth N] [--collapse N]
                                         the pending IR graph (SVG in notebooks)
    %xla_sync                            sync, then say what compiled or was reused, and why
    %xla_hlo [names] [--dialect stablehlo|hlo] [--optimized] [--raw] [--target T]
                                         the module the next sync would compile (--target:
                                         as the TPU compiler optimizes it for topology T)
    %xla_peek expr                       the value of an xla tensor, without cutting the graph
    %xla_metrics [--reset] [--all]       counters and timings as a table
    %xla_graphs [--last N] [--show I [--text]]
                                         compiled graphs with causes and recompile reasons
    %xla_status [on|off]                 a status line after each cell
    %xla_compat [on|off] [--shadow]      import torch_xla gives xlanb's modules
    %xla_sharding expr                   which device holds which block of a tensor
    %xla_collectives [names] [--graph I] the collectives of a graph, with their source
    %xla_nans [on|off]                   name the first op that makes a NaN/Inf
    %xla_memory [--by-line|--graph I|--timeline] [--target T]
                                         device memory; --target: what the pending graph
                                         (or graph #I) needs on each chip of TPU topology T
    %xla_target [T|off] [--now [names]] [--graph I]
                                         compile every new graph for a TPU topology too
                                         (v5e:2x2, v5p:2x2x1, v4:2x2x1, v6e:1x1; libtpu, no
                                         TPU); --now: the TPU compiler's report of the
                                         pending graph; alone: the target and the chips

Objects shown carry ``_repr_mimebundle_``: text/plain always, HTML or SVG for notebooks.
In a terminal (text/plain only) nothing is rendered that cannot be shown. An xla tensor
gets a notebook repr (header + values by peek) that never cuts the pending graph.

Cell magic::

    %%xla_explain [--target T]           run the cell, then report what it compiled and
                                         executed, and why, with source lines (--target:
                                         and what each graph needs on TPU topology T)
    %%xla_profile [--export PATH] [--device] [--replay]
                                         where the cell's time went: phases, by scope
                                         (icicle chart), by line, by op; a Perfetto trace
    %%xla_compare [inputs] [--rtol R] [--atol A] [--dtype bfloat16]
                                         run the cell on CPU and on xla op by op; the
                                         first op that diverges, with its line

Built like IPython's own extensions: a ``Magics`` class, ``magic_arguments`` for parsing
and help, ``UsageError`` for bad input. Bad input never touches the pending graph.
"""
from __future__ import annotations

import ast
import contextlib
import os
import re
import sys
import time
import warnings

import torch
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import Image, display

import xlanb

from . import commands as cmd
from . import display as xd


@contextlib.contextmanager
def _usage():
    """A shared command's bad input (``commands.CommandError``) as IPython's UsageError."""
    try:
        yield
    except cmd.CommandError as e:
        raise UsageError(str(e)) from None

_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _flatten_tensors(value, name: str) -> list:
    """The xla tensors in ``value`` (a tensor, or a list/tuple/dict of them)."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "xla":
            raise UsageError(f"{name} is a tensor on {value.device}, not on the xla device")
        return [value]
    if isinstance(value, (list, tuple)) or isinstance(value, dict):
        items = value.values() if isinstance(value, dict) else value
        ts = [v for v in items if isinstance(v, torch.Tensor) and v.device.type == "xla"]
        if ts:
            return ts
    raise UsageError(f"{name} is a {type(value).__name__}, not a tensor on the xla device")


@magics_class
class XlaMagics(Magics):
    """The ``%xla_*`` magics. One instance per shell, registered by ``%load_ext xlanb``."""

    def __init__(self, shell) -> None:
        super().__init__(shell)
        self.resolver = xd.DEFAULT_RESOLVER  # cells named by this shell's labeler (cell_label)
        self.status_on = False
        self._probe: xd.Probe | None = None

    # ------------------------------------------------------------------ helpers

    def _cell_names(self) -> dict:
        """The shell's map of cell code names (``co_filename``) to execution counts
        (read, never changed)."""
        comp = getattr(self.shell, "compile", None)
        return getattr(comp, "_filename_map", None) or {}

    def cell_label(self, loc) -> str | None:
        """``In[5]:3 forward`` for a line of a cell; None for a file."""
        number = self._cell_names().get(loc.file)
        if number is None:
            return None
        return xlanb.format_cell_loc(number, loc.line, loc.function)

    def file_label(self, file: str) -> str | None:
        """``In[5]`` for a cell's code name (a kernel's temp file included); None for a
        file."""
        number = self._cell_names().get(file)
        return f"In[{number}]" if number is not None else None

    def cell_number(self) -> int:
        """The number of the cell running now (``In[N]``). IPython 9 advances
        ``execution_count`` before a cell runs and IPython 8 after, so the number is the
        one the running cell's code was compiled under: the outermost frame of a cell's
        code. Outside any cell (a magic called from Python): ``execution_count``."""
        names = self._cell_names()
        number = None
        f = sys._getframe(1)
        while f is not None:
            n = names.get(f.f_code.co_filename)
            if n is not None:
                number = n
            f = f.f_back
        return number if number is not None else self.shell.execution_count

    def _cache_cell(self, cell: str) -> tuple[str, str]:
        """Compile ``cell`` (a cell magic's body) under the running cell's number, so its
        lines read ``In[N]``: returns (source, code name). A leading blank line stands
        for the magic's own line, so line numbers match the cell as the user sees it."""
        shell = self.shell
        source = "\n" + shell.transform_cell(cell)
        return source, shell.compile.cache(source, self.cell_number(), raw_code="\n" + cell)

    def _rich(self) -> set:
        """Mime types this frontend shows (a terminal: text/plain only)."""
        fmt = getattr(self.shell, "display_formatter", None)
        return set(getattr(fmt, "active_types", None) or ["text/plain"])

    def _show(self, obj) -> None:
        display(obj, include=sorted(self._rich()))

    @staticmethod
    def _target(name: str):
        with _usage():
            return cmd.topology(name)

    @staticmethod
    def _compile_for(target, *what):
        with _usage():
            return cmd.compile_for(target, list(what))

    def _pending_or_graph(self, tensors: list, index: int | None) -> tuple[list, str]:
        with _usage():
            return cmd.pending_or_graph(cmd.IPYTHON, tensors, index)

    def _lookup(self, names: list[str]) -> list:
        tensors = []
        for name in names:
            if not _NAME.fullmatch(name):
                raise UsageError(f"{name!r} is not a name: give the names of tensors in the "
                                 "notebook, e.g. %xla_pending loss logits")
            first, *rest = name.split(".")
            if first not in self.shell.user_ns:
                raise UsageError(f"name {first!r} is not defined")
            value = self.shell.user_ns[first]
            for attr in rest:
                try:
                    value = getattr(value, attr)
                except AttributeError:
                    raise UsageError(f"{name}: {type(value).__name__} has no attribute "
                                     f"{attr!r}") from None
            tensors.extend(_flatten_tensors(value, name))
        return tensors

    # ------------------------------------------------------------------ %xla_mode

    @magic_arguments()
    @argument("mode", nargs="?", help="lazy, eager or opbyop; without it, show the mode")
    @line_magic
    def xla_mode(self, line: str = ""):
        """Show the execution mode, or switch it.

        lazy records a graph and compiles it once per structure; eager runs each op at
        once through a cache of single-op executables; opbyop records, then runs node by
        node through that cache. Leaving lazy or opbyop for eager syncs pending work first.
        """
        args = parse_argstring(self.xla_mode, line)
        with _usage():
            print(cmd.mode_status(cmd.IPYTHON) if args.mode is None
                  else cmd.switch_mode(cmd.IPYTHON, args.mode))

    # ------------------------------------------------------------------ %xla_pending

    @magic_arguments()
    @argument("names", nargs="*", help="tensors in the notebook's namespace (a dotted name, "
              "or a list/tuple/dict of tensors, works too); default: every live tensor")
    @argument("--text", dest="fmt", action="store_const", const="text",
              help="the IR as text (the default in a terminal)")
    @argument("--dot", dest="fmt", action="store_const", const="dot",
              help="the Graphviz DOT source")
    @argument("--svg", dest="fmt", action="store_const", const="svg",
              help="an SVG picture drawn by Graphviz (the default in a notebook)")
    @argument("--depth", type=int, default=None, metavar="N",
              help="only the ops fewer than N steps before the outputs")
    @argument("--collapse", type=int, default=None, metavar="N",
              help="picture/DOT only: fold the ops of module scopes nested deeper than N "
                   "levels into one box per level-N scope")
    @argument("--fold", action="store_true",
              help="text: each run of identical layers once (the first layer's ops, one "
                   "line for the rest)")
    @line_magic
    def xla_pending(self, line: str = ""):
        """Show the pending IR graph: what the next sync would compile.

        Each op shows its result type and the source line that recorded it. Nothing is run
        and the graph is left as it was.
        """
        args = parse_argstring(self.xla_pending, line)
        for opt in ("depth", "collapse"):
            v = getattr(args, opt)
            if v is not None and v < 1:
                raise UsageError(f"--{opt} must be a positive integer, got {v}")
        tensors = self._lookup(args.names)
        title = " ".join(args.names)
        fmt = args.fmt
        if fmt is None:
            fmt = "svg" if "image/svg+xml" in self._rich() else "text"
        try:
            summary = xlanb.pending_summary(*tensors, fold=args.fold)
        except (TypeError, ValueError) as e:
            raise UsageError(str(e)) from None
        label = self.resolver.label
        n_ops = len(summary.ops)
        text = xlanb.render_text(summary, args.depth, label=label)
        dot = svg = None
        note = ""
        if fmt in ("dot", "svg") and n_ops:
            dot = xlanb.render_dot(summary, scope_depth=args.collapse, depth=args.depth,
                                   label=label)
        if fmt == "svg" and n_ops:
            if n_ops > xd.SVG_MAX_OPS and args.depth is None and args.collapse is None:
                note = (f"{n_ops} ops is too many to draw: showing text. Use --depth N to draw "
                        "the last N levels.")
            else:
                svg, note = xd.graph_svg(dot)
        self._show(xd.PendingGraph(text, n_ops, dot=dot, svg=svg, show_dot=fmt == "dot",
                                   note=note, title=title))

    # ------------------------------------------------------------------ %xla_sync

    @magic_arguments()
    @line_magic
    def xla_sync(self, line: str = ""):
        """Run all pending work now, then say what happened: the graph's hash, whether it
        was a new compile or a cache hit, compile and run times, and why it compiled."""
        parse_argstring(self.xla_sync, line)
        mode = xlanb.get_mode()
        n_ops = xd.pending_count()
        probe = xd.Probe()
        try:
            xlanb.sync(cause="%xla_sync")
        except TypeError:  # a sync() without cause=
            xlanb.sync()
        self._show(xd.SyncSummary(probe.finish(), n_ops, mode, self.resolver))

    # ------------------------------------------------------------------ %xla_hlo

    @magic_arguments()
    @argument("names", nargs="*", help="tensors in the notebook's namespace; default: every "
              "live tensor")
    @argument("--dialect", default=None, help="stablehlo (default) or hlo")
    @argument("--optimized", action="store_true",
              help="compile (through the graph cache) and show XLA's optimized HLO")
    @argument("--raw", action="store_true",
              help="the text exactly as JAX gives it (with stack-frame tables, op metadata "
                   "and sharding annotations)")
    @argument("--target", default=None, metavar="TOPOLOGY",
              help="the module as the TPU compiler optimizes it for this topology "
                   "(e.g. v5e:1x1, v5e:2x2): compiled with libtpu, no TPU, nothing run")
    @line_magic
    def xla_hlo(self, line: str = ""):
        """Show the module the next sync would compile, highlighted. Nothing runs; with
        --optimized the graph is compiled and cached, so the next sync reuses it. With
        --target the TPU compiler compiles it for that topology (``xlanb.compile_for``)
        and the optimized TPU module is shown, with its tiled layouts; the graph and the
        CPU's compile cache are left as they were."""
        args = parse_argstring(self.xla_hlo, line)
        if args.target is not None:
            return self._target_hlo(args)
        args.dialect = args.dialect or "stablehlo"
        if args.dialect not in ("stablehlo", "hlo"):
            raise UsageError(f"unknown dialect {args.dialect!r}; use stablehlo or hlo")
        tensors, n_ops = self._pending(args.names)
        try:
            text = xlanb.hlo(*tensors, dialect=args.dialect, optimized=args.optimized)
        except (TypeError, ValueError) as e:
            raise UsageError(str(e)) from None
        if not args.raw:
            text = xd.tidy_hlo(text)
        self._show(xd.HloView(text, "optimized HLO" if args.optimized else args.dialect,
                              args.optimized, n_ops))

    def _pending(self, names) -> tuple:
        """The tensors ``names`` give and how many ops are pending for them (a
        UsageError if none)."""
        tensors = self._lookup(names)
        n_ops = xd.pending_count(*tensors)
        if not n_ops:
            what = " ".join(names) or "any live tensor"
            raise UsageError(f"nothing is pending for {what}, so there is no graph to show "
                             f"(mode {xlanb.get_mode()}); record some ops first")
        return tensors, n_ops

    def _target_hlo(self, args) -> None:
        if args.dialect is not None or args.optimized:
            raise UsageError("--target shows the TPU compiler's optimized HLO: it takes no "
                             "--dialect or --optimized")
        target = self._target(args.target)
        tensors, n_ops = self._pending(args.names)
        report = self._compile_for(target, *tensors)
        text = report.hlo()
        if not text:  # the compiler refused (out of HBM...): its answer is the report
            self._show(xd.TargetView(report, f"No TPU module: the pending graph "
                                     f"({xd.plural(n_ops, 'op')})", self.resolver))
            return
        if not args.raw:
            text = xd.tidy_hlo(text)
        self._show(xd.HloView(text, f"TPU-optimized HLO for {xd.target_text(report.target)}",
                              False, n_ops, note=f"compiled by libtpu in "
                              f"{report.compile_seconds:.2f}s, nothing ran"))

    # ------------------------------------------------------------------ %xla_peek

    @line_magic
    def xla_peek(self, line: str = ""):
        """%xla_peek expr -- the CPU value of an xla tensor expression, computed op by op
        without cutting (or changing) the pending graph. Lists/tuples of tensors work."""
        expr = line.strip()
        if not expr:
            raise UsageError("%xla_peek needs an expression, e.g. %xla_peek logits[0]")
        try:
            value = self.shell.ev(expr)
        except NameError as e:
            raise UsageError(f"{expr}: {e}") from None
        except SyntaxError as e:
            raise UsageError(f"{expr!r} is not a Python expression: {e.msg}") from None
        except Exception as e:  # the expression's own error, in one line, as other magics
            raise UsageError(f"{expr}: {type(e).__name__}: {e}") from None
        return self._peek(value, expr)

    def _peek(self, value, expr: str):
        if isinstance(value, torch.Tensor):
            return xlanb.peek(value) if value.device.type == "xla" else value
        if isinstance(value, (list, tuple)) and value and all(
                isinstance(v, torch.Tensor) for v in value):
            return type(value)(self._peek(v, expr) for v in value)
        raise UsageError(f"{expr} is a {type(value).__name__}, not a tensor")

    # ------------------------------------------------------------------ %xla_sharding

    @line_magic
    def xla_sharding(self, line: str = ""):
        """%xla_sharding expr -- which device holds which block of an xla tensor
        (``xlanb.spmd.visualize_sharding``): a coloured grid in a notebook, text in a
        terminal. Shows the annotation of a pending tensor, the propagated sharding
        of a computed one."""
        expr = line.strip()
        if not expr:
            raise UsageError("%xla_sharding needs a tensor expression, e.g. %xla_sharding model.fc.weight")
        try:
            value = self.shell.ev(expr)
        except Exception as e:
            raise UsageError(f"{expr}: {type(e).__name__}: {e}") from None
        if not isinstance(value, torch.Tensor) or value.device.type != "xla":
            raise UsageError(f"{expr} is not a tensor on the xla device")
        return xlanb.spmd.visualize_sharding(value)

    # ------------------------------------------------------------------ %xla_collectives

    @magic_arguments()
    @argument("names", nargs="*", help="tensors in the notebook's namespace; default: the "
              "pending graph of every live tensor, or the last compiled graph")
    @argument("--graph", type=int, default=None, metavar="I",
              help="the I-th graph of %%xla_graphs (negative counts from the end)")
    @line_magic
    def xla_collectives(self, line: str = ""):
        """The collectives XLA's partitioner put in a graph (all-reduce, all-gather,
        reduce-scatter, all-to-all, collective-permute): bytes per device, replica
        groups, and the aten op, module scope and source line each came from."""
        args = parse_argstring(self.xla_collectives, line)
        if args.graph is not None:
            gs = xlanb.graphs()
            try:
                return xlanb.collectives(gs[args.graph])
            except IndexError:
                raise UsageError(f"no graph {args.graph}: {len(gs)} compiled") from None
        return xlanb.collectives(*self._lookup(args.names))

    # ------------------------------------------------------------------ %xla_metrics

    @magic_arguments()
    @argument("--reset", action="store_true",
              help="clear all counters and metrics after showing them")
    @argument("--all", action="store_true",
              help="every counter and metric, including zeros and internal ones")
    @line_magic
    def xla_metrics(self, line: str = ""):
        """Counters and timings as a table, compiles first (HTML in a notebook, text in a
        terminal). Names match torch_xla's metrics report."""
        args = parse_argstring(self.xla_metrics, line)
        table = xd.MetricsTable(show_all=args.all,
                                note="(counters and metrics cleared)" if args.reset else "")
        self._show(table)
        if args.reset:
            xlanb.metrics.clear()

    # ------------------------------------------------------------------ %xla_graphs

    @magic_arguments()
    @argument("--last", type=int, default=None, metavar="N", help="only the last N graphs")
    @argument("--show", type=int, default=None, metavar="I",
              help="draw graph #I (SVG in a notebook, its IR as text in a terminal)")
    @argument("--text", action="store_true", help="with --show: the IR as text")
    @line_magic
    def xla_graphs(self, line: str = ""):
        """Every compiled graph: hash, size, compile time, cache hits, cause, source line,
        and why it compiled (how it differs from the previous graph from that line)."""
        args = parse_argstring(self.xla_graphs, line)
        gs = list(xlanb.graphs())
        if args.show is not None:
            self._show_graph(gs, args.show, text_only=args.text)
            return
        first = 0
        if args.last is not None:
            if args.last < 1:
                raise UsageError(f"--last must be a positive integer, got {args.last}")
            first = max(len(gs) - args.last, 0)
            gs = gs[first:]
        self._show(xd.GraphsTable(gs, self.resolver, first))

    def _show_graph(self, gs: list, index: int, text_only: bool) -> None:
        if not -len(gs) <= index < len(gs):
            raise UsageError(f"there is no graph #{index}: {len(gs)} graphs were compiled "
                             "(see %xla_graphs)")
        g = gs[index]
        if g.summary is None:
            raise UsageError(f"graph #{index} keeps no IR")
        label = self.resolver.label
        text = xlanb.render_text(g.summary, label=label)
        svg, note = None, ""
        if not text_only and "image/svg+xml" in self._rich() and g.n_nodes <= xd.SVG_MAX_OPS:
            svg, note = xd.graph_svg(xlanb.render_dot(g.summary, label=label))
        why = xd.graph_why(g, self.resolver, gs)
        self._show(xd.PendingGraph(text, g.n_nodes, svg=svg, note=note,
                                   title=f"graph #{index % len(gs)} {xlanb.format_hash(g.hash)} ({why})",
                                   compiled=True))

    # ------------------------------------------------------------------ %xla_compile_time

    @magic_arguments()
    @argument("graph", nargs="?", type=int, default=-1,
              help="graph #I of %%xla_graphs (default: the latest; negative counts from the end)")
    @argument("--target", default=None, metavar="TOPOLOGY",
              help="compile that graph for this TPU topology now (e.g. v5e:1x1) and show "
                   "where libtpu's compile time went")
    @argument("--last", type=int, default=None, metavar="N",
              help="the last N graphs summed (an eager cell's runs, a loop's recompiles)")
    @argument("--all", action="store_true", help="every graph compiled so far, summed")
    @line_magic
    def xla_compile_time(self, line: str = ""):
        """Where a graph's compile time went: by compiler phase (xlanb's lowering, XLA's
        HLO passes, the backend, loading; each measured by the compiler's own spans or
        logs), by source line and by module scope (a repeated layer stack as one row),
        and what its findings suggest (an unrolled stack or loop, a large constant).
        --last N / --all: several graphs summed by phase, line and scope."""
        args = parse_argstring(self.xla_compile_time, line)
        gs = list(xlanb.graphs())
        if not gs:
            raise UsageError("no graph was compiled yet (see %xla_graphs)")
        if args.last is not None or args.all:
            if args.target is not None:
                raise UsageError("--target takes one graph, not --last or --all")
            if args.last is not None and args.last < 1:
                raise UsageError(f"--last must be a positive integer, got {args.last}")
            self._show(xlanb.compile_summary(gs if args.all else gs[-args.last:]))
            return
        if not -len(gs) <= args.graph < len(gs):
            raise UsageError(f"there is no graph #{args.graph}: {len(gs)} graphs were compiled "
                             "(see %xla_graphs)")
        g = gs[args.graph]
        if args.target is not None:
            self._show(self._compile_for(self._target(args.target), g).compile_profile)
            return
        self._show(g.compile_profile)

    # ------------------------------------------------------------------ %xla_memory

    @magic_arguments()
    @argument("--by-line", dest="by_line", action="store_true",
              help="one row per source line (and module scope) holding live tensors")
    @argument("--graph", type=int, default=None, metavar="I",
              help="compiled graph #I's memory: XLA's analysis and its largest buffers")
    @argument("--timeline", action="store_true",
              help="plot device bytes after each sync")
    @argument("--device", type=int, default=0, metavar="N", help="xla:N (default 0)")
    @argument("--target", default=None, metavar="TOPOLOGY",
              help="what the pending graph (or graph #I) needs on each chip of this TPU "
                   "topology (e.g. v5e:1x1): peak against HBM, fits, padding by the TPU's "
                   "tiled layouts; compiled with libtpu, nothing run")
    @line_magic
    def xla_memory(self, line: str = ""):
        """Device memory: a summary (live tensors, every buffer xlanb holds, the peak, the
        limit, the platform's own figures), the largest lines, one graph's analysis, or a
        plot of bytes after each sync. With --target, what the TPU compiler says the
        pending graph needs on each chip of a TPU topology, and whether it fits."""
        args = parse_argstring(self.xla_memory, line)
        if args.target is not None:
            if args.by_line or args.timeline:
                raise UsageError("--target takes no --by-line or --timeline (it shows one "
                                 "graph: the pending one, or --graph I)")
            target = self._target(args.target)
            what, words = self._pending_or_graph([], args.graph)
            report = self._compile_for(target, *what)
            self._show(xd.TargetMemory(report, words[0].upper() + words[1:], self.resolver))
            return
        if args.graph is not None:
            gs = list(xlanb.graphs())
            if not -len(gs) <= args.graph < len(gs):
                raise UsageError(f"there is no graph #{args.graph}: {len(gs)} graphs were "
                                 "compiled (see %xla_graphs)")
            self._show(xd.GraphMemoryReport(gs[args.graph], args.graph % len(gs), self.resolver))
            return
        if args.timeline:
            tl = xlanb.memory_timeline()
            if not tl:
                print("no syncs yet: the timeline samples device memory after each sync")
                return
            if "image/png" in self._rich():
                display(Image(data=xd.figure_png(xd.memory_timeline_figure(tl, args.device))))
            else:
                print(tl)
            return
        if args.by_line:
            self._show(xd.MemoryText(xlanb.memory_by_line(args.device)))
            return
        self._show(xd.MemoryText(xlanb.memory_summary(args.device)))

    # ------------------------------------------------------------------ %%xla_explain

    @magic_arguments()
    @argument("--target", default=None, metavar="TOPOLOGY",
              help="also compile each graph the cell runs for this TPU topology (e.g. "
                   "v5e:1x1, v5e:2x2) and report its per-chip peak against HBM, whether it "
                   "fits, the estimated step time and the TPU compile time")
    @cell_magic
    def xla_explain(self, line: str, cell: str):
        """Run the cell, then report what it compiled and executed, and why: each new
        graph with the line that synced it and how it differs from the previous graph from
        that line; cache hits; single-op compiles; transfers; CPU fallbacks. The magic for
        hunting recompiles. The cell's last expression is returned, as usual.

        With --target, the graphs the cell compiles are also compiled for that TPU
        topology (in the background, as ``xlanb.target`` does; graphs it reused are
        compiled for it after the cell), and the report says what each needs there."""
        args = parse_argstring(self.xla_explain, line)
        target = self._target(args.target) if args.target is not None else None
        probe = xd.Probe()
        before = xlanb.memory_reserved()
        t0 = time.perf_counter()
        try:
            if target is None:
                return self._run_cell_body(cell)
            with xlanb.target(target):
                return self._run_cell_body(cell)
        finally:
            try:  # the report must never hide the cell's own error
                activity = probe.finish()
                try:
                    pending = xd.pending_count()
                except Exception:
                    pending = 0
                wall = time.perf_counter() - t0
                reports = self._target_reports(activity, target) if target is not None else None
                self._show(xd.ExplainReport(activity, pending, xlanb.get_mode(), self.resolver,
                                            wall=wall, memory=(before, xlanb.memory_reserved()),
                                            target=target, reports=reports))
            except Exception as e:
                print(f"xla explain: no report ({type(e).__name__}: {e})")

    @staticmethod
    def _target_reports(activity, target, most: int = 8) -> list:
        """(graph, TargetReport) for the graphs a cell ran: the report made while it
        compiled, else (a graph it reused) one compiled now."""
        out = []
        graphs = activity.new_graphs + [g for g, _ in activity.hit_graphs]
        for g in graphs[:most]:
            try:
                r = g.target  # waits for the background compile
                if r is None or r.target != target:
                    r = xlanb.compile_for(target, g)
            except Exception as e:  # noqa: BLE001 - one graph's failure is one line
                print(f"xla explain: graph {xlanb.format_hash(g.hash)} not compiled for {target.name}: "
                      f"{type(e).__name__}: {e}")
                continue
            out.append((g, r))
        return out

    def _run_cell_body(self, cell: str):
        """Run ``cell`` in the user namespace under the current cell's name (so source
        lines resolve to ``In[N]``); return the value of a final expression."""
        shell = self.shell
        source, name = self._cache_cell(cell)
        tree = shell.compile.ast_parse(source, filename=name)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        ns = shell.user_ns
        exec(shell.compile(tree, name, "exec"), shell.user_global_ns, ns)
        if last is not None:
            return eval(shell.compile(last, name, "eval"), shell.user_global_ns, ns)
        return None

    # ------------------------------------------------------------------ %%xla_profile

    @magic_arguments()
    @argument("--export", metavar="PATH", default=None,
              help="also write a Chrome/Perfetto trace (.json or .json.gz)")
    @argument("--device", action="store_true", help="merge jax.profiler's events")
    @argument("--replay", action="store_true",
              help="estimate per-op device time of lazy graphs by an op-by-op replay")
    @cell_magic
    def xla_profile(self, line: str, cell: str):
        """Run the cell under ``xlanb.profile()`` and show where its time went: phases
        per step, time by module scope (an icicle chart in a notebook), by line and by
        aten op. Returns the Profile."""
        args = parse_argstring(self.xla_profile, line)
        if args.export:  # a folder that is not there: said before the cell runs, not after
            args.export = os.path.expanduser(args.export)
            folder = os.path.dirname(os.path.abspath(args.export))
            if not os.path.isdir(folder):
                raise UsageError(f"--export {args.export}: the folder {folder} does not exist "
                                 "(create it, or give another path); the cell did not run")
        with xlanb.profile(device=args.device, replay=args.replay) as p:
            self._run_cell_body(cell)
        if args.export:
            try:
                p.export(args.export)
                print(f"xla profile: trace written to {args.export}")
            except OSError as e:  # the profile itself is kept: it is what this returns
                print(f"xla profile: cannot write the trace to {args.export}: "
                      f"{e.strerror or e}; p.export(PATH) on the returned profile writes it",
                      file=sys.stderr)
        return p

    # ------------------------------------------------------------------ %%xla_compare

    @magic_arguments()
    @argument("inputs", nargs="*",
              help="names of the cell's inputs (tensors, modules): CPU values; the xla side "
                   "gets copies on the device")
    @argument("--rtol", type=float, default=1e-5)
    @argument("--atol", type=float, default=1e-6)
    @argument("--dtype", default=None,
              help="the xla side's floating dtype (e.g. bfloat16), against the CPU's")
    @cell_magic
    def xla_compare(self, line: str, cell: str):
        """Run the cell on CPU torch and on the xla device (op by op) from the same inputs,
        and report each aten op's error, its scope and line: the first op beyond
        tolerance is where the two diverge (``xlanb.compare_cpu``). The cell is a function
        of the named inputs; what it assigns stays inside it. In a notebook the report
        is a table and the graph coloured by error."""
        args = parse_argstring(self.xla_compare, line)
        ns = self.shell.user_ns
        for name in args.inputs:
            if not name.isidentifier():
                raise UsageError(f"%%xla_compare inputs are names, got {name!r}")
            if name not in ns:
                raise UsageError(f"%%xla_compare: no variable named {name!r}")
        dtype = None
        if args.dtype is not None:
            dtype = getattr(torch, args.dtype, None)
            if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
                raise UsageError(f"%%xla_compare --dtype takes a floating torch dtype, "
                                 f"got {args.dtype!r}")
        fn = self._cell_function(cell, args.inputs)
        return xlanb.compare_cpu(fn, *(ns[n] for n in args.inputs), rtol=args.rtol,
                                 atol=args.atol, xla_dtype=dtype)

    def _cell_function(self, cell: str, params: list):
        """``cell`` as a function of ``params``, compiled under the current cell's name
        (source lines resolve to ``In[N]``); its last expression is returned."""
        shell = self.shell
        source, name = self._cache_cell(cell)
        tree = shell.compile.ast_parse(source, filename=name)
        body = tree.body or [ast.Pass()]
        if isinstance(body[-1], ast.Expr):
            body[-1] = ast.copy_location(ast.Return(body[-1].value), body[-1])
        fdef = ast.FunctionDef(
            name="xla_compare_cell", body=body, decorator_list=[], returns=None,
            type_params=[], args=ast.arguments(
                posonlyargs=[], args=[ast.arg(p) for p in params], kwonlyargs=[],
                kw_defaults=[], defaults=[]))
        module = ast.fix_missing_locations(ast.Module([fdef], type_ignores=[]))
        scope: dict = {}
        exec(shell.compile(module, name, "exec"), shell.user_global_ns, scope)
        return scope["xla_compare_cell"]

    # ------------------------------------------------------------------ %xla_target

    @magic_arguments()
    @argument("target", nargs="?", metavar="TOPOLOGY",
              help="a TPU topology (v5e:1x1, v5e:2x2, v5p:2x2x1, v4:2x2x1, v6e:1x1...) or "
                   "off; without it, show the target and the known generations")
    @argument("--now", nargs="*", default=None, metavar="NAME",
              help="compile the pending graph (of these tensors; default: all pending work, "
                   "else the latest compiled graph) for the topology now and show the TPU "
                   "compiler's report; the session's target is left as it was")
    @argument("--graph", type=int, default=None, metavar="I",
              help="like --now, for compiled graph #I of %%xla_graphs")
    @line_magic
    def xla_target(self, line: str = ""):
        """Compile for a TPU topology, with libtpu and no TPU (``xlanb.set_target``):
        every graph compiled from now on is also compiled for it on the compile threads
        (the CPU run never waits), and %xla_graphs shows each graph's per-chip HBM peak,
        whether it fits, the estimated step time and the TPU compile time. ``off`` stops.

        With --now (or --graph I), compile the pending graph (or graph #I) for the
        topology now, and show the TPU compiler's report: memory per chip against HBM,
        the padding of the TPU's tiled layouts, the collectives, the roofline. Nothing
        runs, and the pending graph is left as it was."""
        args = parse_argstring(self.xla_target, line)
        if args.target is None and args.now and ":" in args.now[0]:
            args.target = args.now.pop(0)  # %xla_target --now v5e:1x1
        if args.now is not None or args.graph is not None:
            if args.now and args.graph is not None:
                raise UsageError("give tensor names or --graph I, not both")
            if args.target is None and xlanb.get_target() is None:
                raise UsageError("no target: give one (e.g. %xla_target v5e:1x1 --now) or set "
                                 "one with %xla_target v5e:1x1")
            if args.target is not None and args.target.lower() == "off":
                raise UsageError("--now needs a topology, not off")
            target = (self._target(args.target) if args.target is not None
                      else xlanb.get_target())
            what, words = self._pending_or_graph(self._lookup(args.now or []), args.graph)
            report = self._compile_for(target, *what)
            self._show(xd.TargetView(report, words[0].upper() + words[1:], self.resolver))
            return
        if args.target is None:
            t = xlanb.get_target()
            self._show(xd.TargetStatus(t, cmd.target_headline(cmd.IPYTHON, t)))
            return
        with _usage():
            print(cmd.set_target(cmd.IPYTHON, args.target))

    # ------------------------------------------------------------------ %xla_nans

    @magic_arguments()
    @argument("state", nargs="?", help="on or off; without it, say whether it is on")
    @line_magic
    def xla_nans(self, line: str = ""):
        """Find the first op that makes a NaN or Inf (``xlanb.debug_nans``): each sync is
        checked, and on a NaN/Inf the error names the aten op, shapes, module scope,
        source line (the forward line for a backward op) and its inputs' ranges."""
        args = parse_argstring(self.xla_nans, line)
        if args.state is None:
            print(f"xla nans check {'on' if xlanb.config.debug_nans else 'off'}")
            return
        state = args.state.lower()
        if state not in ("on", "off"):
            raise UsageError(f"%xla_nans takes on or off, got {args.state!r}")
        xlanb.debug_nans(state == "on")
        print(f"xla nans check {state}")

    # ------------------------------------------------------------------ %xla_compat

    @magic_arguments()
    @argument("state", nargs="?", help="on or off; without it, say whether it is on")
    @argument("--shadow", action="store_true",
              help="use xlanb's modules even when the real torch_xla is installed")
    @line_magic
    def xla_compat(self, line: str = ""):
        """Run torch_xla code unchanged: with it on, ``import torch_xla`` (and
        ``torch_xla.core.xla_model``, ``torch_xla.debug.metrics``, ``torch_xla.runtime``,
        ``torch_xla.experimental``, ``torch_xla.distributed.parallel_loader``,
        ``torch_xla._XLAC``) gives xlanb's implementations, and every xla magic works on
        the tensors it makes. A real torch_xla, if installed, is used unless --shadow."""
        args = parse_argstring(self.xla_compat, line)
        compat = xlanb.compat
        if args.state is None:
            print(compat.status())
            return
        state = args.state.lower()
        if state not in ("on", "off"):
            raise UsageError(f"%xla_compat takes on or off, got {args.state!r}")
        if state == "off":
            compat.uninstall()
            print("torch_xla compatibility off (modules already imported keep working)")
            return
        try:
            with warnings.catch_warnings():  # said below, in the magic's own words
                warnings.simplefilter("ignore")
                on = compat.install(shadow=args.shadow)
        except RuntimeError as e:  # the real torch_xla is already imported
            raise UsageError(str(e)) from None
        if not on:
            print(f"torch_xla compatibility off: the real torch_xla is installed "
                  f"({compat.real_torch_xla()}); %xla_compat on --shadow to use xlanb's")
            return
        print(compat.status())

    # ------------------------------------------------------------------ %xla_status

    @magic_arguments()
    @argument("state", nargs="?", help="on or off; without it, print the status line now")
    @line_magic
    def xla_status(self, line: str = ""):
        """Print a short status line after each cell: mode, pending ops, and what the cell
        compiled (e.g. ``xla: lazy · 214 pending ops · 1 compile (2.1 s, recompile: ...)``)."""
        args = parse_argstring(self.xla_status, line)
        if args.state is None:
            print(xd.status_line(None, self.resolver)
                  + f"  [status line {'on' if self.status_on else 'off'}]")
            return
        state = args.state.lower()
        if state not in ("on", "off"):
            raise UsageError(f"%xla_status takes on or off, got {args.state!r}")
        self.set_status(state == "on")
        print(f"xla status line {state}")

    def set_status(self, on: bool) -> None:
        events = self.shell.events
        if on and not self.status_on:
            events.register("pre_run_cell", self._pre_run_cell)
            events.register("post_run_cell", self._post_run_cell)
            self._probe = xd.Probe()
        elif not on and self.status_on:
            for name, cb in (("pre_run_cell", self._pre_run_cell),
                             ("post_run_cell", self._post_run_cell)):
                try:
                    events.unregister(name, cb)
                except ValueError:
                    pass
            self._probe = None
        self.status_on = on

    def _pre_run_cell(self, info=None) -> None:
        try:
            self._probe = xd.Probe()
        except Exception:
            self._probe = None

    def _post_run_cell(self, result=None) -> None:
        try:
            activity = self._probe.finish() if self._probe is not None else None
            print(xd.status_line(activity, self.resolver))
        except Exception as e:  # the status line must never break a cell
            print(f"xla: status unavailable ({type(e).__name__}: {e})")


# ---------------------------------------------------------------------- load / unload

_loaded: dict[int, XlaMagics] = {}


def _tensor_html(t):
    return xd.tensor_html(t)


# Beyond xlanb's own answer (xlanb, torch, the REPL machinery): what an error passes
# through between a cell and xlanb (JAX, IPython itself, functools' wrappers).
_INTERNAL = ("jax", "jaxlib", "IPython", "ipykernel", "functools")


def _internal(frame) -> bool:
    name = frame.f_globals.get("__name__") or ""
    return xlanb.is_internal_frame(frame) or name.split(".")[0] in _INTERNAL


def _deliberate_errors() -> tuple:
    """The errors xlanb raises on purpose, each with a full message of its own."""
    return (xlanb.DeviceMemoryError, xlanb.NonFiniteError, xlanb.ExecutableLimitError,
            xlanb.TargetError, xlanb.spmd.ShardingError)


def _user_traceback(tb):
    """``tb`` ending at the user's last line: the frames of xlanb (and of torch or JAX
    below it) that raised a deliberate error say nothing the message does not."""
    import types
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    last = max((i for i, e in enumerate(entries) if not _internal(e.tb_frame)), default=None)
    if last is None:
        return entries[0] if entries else None
    out = None
    for e in reversed(entries[:last + 1]):  # a copy: %debug still sees every frame
        out = types.TracebackType(out, e.tb_frame, e.tb_lasti, e.tb_lineno)
    return out


def _show_deliberate(shell, etype, value, tb, tb_offset=None):
    """IPython's custom exception handler: the usual traceback (and ``%pdb``), less
    xlanb's frames; ``%debug`` can still walk every frame."""
    # XLA's own error under a DeviceMemoryError (raised ... from it) happened wholly
    # inside JAX: its first line is in the message, its traceback is noise
    cause, inner = value.__cause__, []
    t = getattr(value.__cause__, "__traceback__", None)
    while t is not None:
        inner.append(_internal(t.tb_frame))
        t = t.tb_next
    hide = cause is not None and all(inner)
    if hide:
        value.__cause__ = None
    try:
        shell.showtraceback((etype, value, _user_traceback(tb)), tb_offset=tb_offset)
    finally:
        if hide:
            value.__cause__ = cause
    sys.last_traceback = tb
    if getattr(shell.InteractiveTB, "tb", None) is not None:  # what %debug walks
        shell.InteractiveTB.tb = tb
    if hasattr(sys, "last_exc"):
        sys.last_exc = value


def _cell_warnings(show):
    """``warnings.showwarning`` naming a cell ``In[N]`` in the header, as tracebacks do,
    never the kernel's temp file for it: every warning (xlanb's, torch's, the user's)."""
    def showwarning(message, category, filename, lineno, file=None, line=None):
        name = xlanb.file_label(filename)
        if name != filename:
            if line is None:  # the cell's code, which IPython keeps under the real name
                import linecache
                line = linecache.getline(filename, lineno)
            filename = name
        return show(message, category, filename, lineno, file, line)
    showwarning.xlanb_wraps = show
    return showwarning


# ``%debug`` (and ``%pdb``) and ``breakpoint()`` open the shell's own debugger with the x*
# commands; what was there before, per shell, to put back on unload.
_debuggers: dict[int, type] = {}
_hook_before: list = []  # the breakpoint hook ours replaced


def _xla_debugger(base: type) -> type:
    """``base`` (the shell's debugger class) with XlaPdb's commands and stepping."""
    from .pdb import XlaPdb
    if issubclass(base, XlaPdb):
        return base
    return type(f"Xla{base.__name__}", (XlaPdb, base), {"__module__": __name__})


def _breakpointhook(*args, **kwargs):
    """``breakpoint()`` after ``%load_ext xlanb``: the shell's debugger with the x*
    commands; a PYTHONBREAKPOINT set since is the user's choice and wins."""
    if os.environ.get("PYTHONBREAKPOINT"):
        return sys.__breakpointhook__(*args, **kwargs)
    debugpy = sys.modules.get("debugpy")
    if _hook_before and debugpy is not None and debugpy.is_client_connected():
        return _hook_before[0](*args, **kwargs)  # a visual debugger (JupyterLab's) is on
    from IPython import get_ipython
    shell = get_ipython()
    tb = getattr(shell, "InteractiveTB", None)
    cls = getattr(tb, "debugger_cls", None)
    if cls is None:
        from .pdb import XlaPdb as cls
    cls().set_trace(sys._getframe(1))


def _install_debugger(ipython) -> None:
    if not hasattr(warnings.showwarning, "xlanb_wraps"):
        warnings.showwarning = _cell_warnings(warnings.showwarning)
    if not getattr(ipython, "custom_exceptions", ()):  # a handler of the user's stays
        ipython.set_custom_exc(_deliberate_errors(), _show_deliberate)
    tb = getattr(ipython, "InteractiveTB", None)
    if tb is not None and getattr(tb, "debugger_cls", None) is not None:
        _debuggers[id(ipython)] = tb.debugger_cls
        tb.debugger_cls = _xla_debugger(tb.debugger_cls)
        tb.pdb = None  # made again from the class on the next %debug
    # the user's own choice (PYTHONBREAKPOINT, or a hook of their own) is left alone;
    # ipykernel's (debugpy's, which does nothing unless a visual debugger is attached) is
    # kept for when one is
    hook = sys.breakpointhook
    if hook is _breakpointhook or os.environ.get("PYTHONBREAKPOINT"):
        return
    if hook is sys.__breakpointhook__ or \
            (getattr(hook, "__module__", None) or "").startswith(("debugpy", "pydevd")):
        _hook_before[:] = [hook]
        sys.breakpointhook = _breakpointhook


def _uninstall_debugger(ipython) -> None:
    if hasattr(warnings.showwarning, "xlanb_wraps") and len(_loaded) == 0:
        warnings.showwarning = warnings.showwarning.xlanb_wraps
    if getattr(getattr(ipython, "CustomTB", None), "__func__", None) is not None and \
            ipython.custom_exceptions == _deliberate_errors():
        ipython.set_custom_exc((), None)
    old = _debuggers.pop(id(ipython), None)
    tb = getattr(ipython, "InteractiveTB", None)
    if old is not None and tb is not None:
        tb.debugger_cls = old
        tb.pdb = None
    if sys.breakpointhook is _breakpointhook and not _debuggers:
        sys.breakpointhook = _hook_before[0] if _hook_before else sys.__breakpointhook__
        _hook_before.clear()


def load_ipython_extension(ipython) -> None:
    """Register the magics, the notebook repr of xla tensors and (off by default) the
    status line. Loading twice is harmless."""
    if id(ipython) in _loaded:
        return
    magics = XlaMagics(ipython)
    ipython.register_magics(magics)
    fmt = ipython.display_formatter.formatters.get("text/html")
    if fmt is not None:
        fmt.for_type(xlanb.XlaTensor, _tensor_html)
    _loaded[id(ipython)] = magics
    # messages from the core (errors, warnings) name a cell as In[N], as tracebacks do
    xlanb.set_location_labeler(magics.cell_label, files=magics.file_label)
    _install_debugger(ipython)
    ipython.events.register("post_run_cell", _cell_ended)


def _cell_ended(result=None) -> None:
    """A cell has ended: the user reads and thinks now, so the executables that ran
    again and again in it (a ``generate`` call's decode steps) start their optimized
    compiles in the background."""
    try:
        xlanb.optimize_hot_graphs()
    except Exception:  # noqa: BLE001 - never a cell's error; the quick code still runs
        pass


def unload_ipython_extension(ipython) -> None:
    """Remove everything ``load_ipython_extension`` added: magics, formatters, hooks."""
    magics = _loaded.pop(id(ipython), None)
    if magics is None:
        return
    magics.set_status(False)
    try:
        ipython.events.unregister("post_run_cell", _cell_ended)
    except ValueError:
        pass
    xlanb.set_location_labeler(None)
    _uninstall_debugger(ipython)
    mm = ipython.magics_manager
    for kind, names in magics.magics.items():  # every magic the class defines
        for name in names:
            mm.magics[kind].pop(name, None)
    mm.registry.pop(type(magics).__name__, None)
    fmt = ipython.display_formatter.formatters.get("text/html")
    if fmt is not None:
        try:
            fmt.pop(xlanb.XlaTensor)
        except KeyError:
            pass
