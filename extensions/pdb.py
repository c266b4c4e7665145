"""pdb with xla commands, whose stepping never lands inside xlanb.

    import xlanb; xlanb.set_trace()            # stop here
    PYTHONBREAKPOINT=xlanb.set_trace python train.py   # breakpoint() opens XlaPdb

``XlaPdb`` is ``pdb.Pdb`` plus these commands (``help <command>`` for each):

    xla                        mode, pending op count, compiles so far
    xpeek EXPR                 the value, computed op by op; the pending graph is untouched
    xpending [EXPR] [--depth N]   the pending IR as text
    xhlo [EXPR] [--hlo] [--optimized]   the module the next sync would compile
    xsync                      run the pending work now (mark_step)
    xmode [lazy|eager|opbyop]  show or switch the execution mode
    xgraphs                    every compiled graph: hash, size, cause, source, times
    xnans [EXPR]               the frame's (or EXPR's) xla tensors holding NaN/Inf, and where made
    xmem [--by-line | --graph I]   device memory: what holds it, from which line
    xcompile [I] [--target NAME]   where graph #I's compile time went: phase, line, scope
    xtarget [NAME|off] [--now [EXPR] | --graph I]
                               compile for a TPU topology (v5e:2x2...) too; --now: the
                               TPU compiler's report on the pending graph

Looking never cuts the lazy graph: ``p``/``pp``/a bare expression/``display``/``xpeek``
peek, and so do ``.cpu()``/``.item()``/``.tolist()`` while a debugger is stopped. Only
``xsync``, ``xmode eager`` (which syncs first) and ``xhlo --optimized`` compile anything
for this machine; ``xtarget --now`` compiles for a TPU with libtpu, and runs nothing.

Stepping (``s``, ``n``, ``r``, ``until``) skips xlanb's own frames, everything they call
(torch internals, JAX, the standard library), and the torch plumbing a tensor subclass
goes through (``nn.Module.__call__`` with its hooks, the Python dispatch registry). So
``s`` on ``y = layer(x)`` goes straight into ``layer.forward``, and ``s`` on a tensor op
or on ``xlanb.sync()`` moves to the next line of your code.

Only the public ``xlanb`` API is used here.
"""
from __future__ import annotations

import functools
import pdb
import re
import sys
import time

import torch

import xlanb

from . import commands as cmd
from . import display as xd

__all__ = ["XlaPdb", "set_trace", "DEFAULT_SKIP"]

# Modules pdb never stops in (fnmatch patterns on the frame's module name). xlanb and
# JAX are reached only through xlanb; the torch modules are the plumbing a Python tensor
# subclass passes through before and after each op (and nn.Module.__call__, slowed by
# xlanb's global module hooks). A user's own forward() is still stepped into.
DEFAULT_SKIP = (
    "xlanb", "xlanb.*",
    "jax", "jax.*", "jaxlib", "jaxlib.*",
    "torch._library.*", "torch._ops", "torch.utils._python_dispatch",
    "torch.nn.modules.module", "torch.compiler", "torch._jit_internal",
)

_COUNTERS = ("UncachedCompile", "CachedCompile", "OpCompile", "OpCacheHit")
_DEPTH = re.compile(r"(?:^|\s)--depth(?:=|\s+)(\S*)|(?:^|\s)--depth$")
_FLAG = re.compile(r"(?:^|\s)(--[\w-]+)(?=\s|$)")
_TOPOLOGY = re.compile(r"off|[A-Za-z]\w*:[\dx]+", re.I)  # v5e:2x2, v5p:2x2x1, off
_GRAPH = re.compile(r"(?:^|\s)--graph(?:=|\s+)(\S*)|(?:^|\s)--graph$")


def _is_core_module(name) -> bool:
    """xlanb's library modules; not its front ends (this debugger, the IPython extension,
    the kernel, whose ``launch`` frame is below every cell), which may run user code
    below them."""
    return xlanb.is_xlanb_module(name, front_ends=False)


def _called_from_core(frame) -> bool:
    """Is ``frame`` xlanb's, or called (however deep) from a frame of xlanb's?"""
    while frame is not None:
        if _is_core_module(frame.f_globals.get("__name__")):
            return True
        frame = frame.f_back
    return False


def _count(name: str) -> int:
    return xlanb.metrics.counter_value(name) or 0


def _counts() -> dict:
    return {name: _count(name) for name in _COUNTERS}


# Input a command cannot use; the message is shown as one line (the shared commands'
# CommandError, so what they raise shows the same way).
_BadInput = cmd.CommandError


def _command(fn):
    """Run an x* command so that nothing it raises ends the debugging session: bad input
    and failures are one ``***`` line, and the prompt comes back."""
    name = fn.__name__[3:]

    @functools.wraps(fn)
    def run(self, arg):
        try:
            fn(self, arg.strip())
        except _BadInput as e:
            self.error(f"{name}: {e}")
        except Exception as e:  # noqa: BLE001 - a debugger command must never kill the session
            first = (str(e).strip().splitlines() or [""])[0]
            self.error(f"{name}: {type(e).__name__}: {first}" if first else f"{name}: {type(e).__name__}")
    return run


class XlaPdb(pdb.Pdb):
    """``pdb.Pdb`` with xla commands and stepping that skips xlanb's internals.

    ``skip`` adds module patterns to ``DEFAULT_SKIP``; the other arguments are pdb's.
    """

    def __init__(self, *args, skip=None, **kwargs):
        super().__init__(*args, skip=tuple(DEFAULT_SKIP) + tuple(skip or ()), **kwargs)

    # ------------------------------------------------------------------------------
    # Stepping

    def stop_here(self, frame) -> bool:
        # pdb's skip patterns look at one frame's module; a frame xlanb called (torch's
        # decompositions, weakref, JAX...) is just as internal, so look at its callers
        # too. Only for a frame pdb would stop in, so it costs nothing while running.
        if not super().stop_here(frame):
            return False
        return not _called_from_core(frame)

    def _show_display(self) -> None:
        # pdb's ``display`` compares old and new values with ``!=``: on tensors that is
        # an elementwise op whose bool() raises (ending the session) or syncs. Here a
        # different tensor object is a change, and a tensor is never compared by value.
        # (Python >= 3.13 calls this from interaction(); older versions from preloop().)
        displaying = self.displaying.get(self.curframe)
        if not displaying:
            return
        for expr, old in list(displaying.items()):
            new = self._getval_except(expr)
            if new is old:
                continue
            if isinstance(new, torch.Tensor) or isinstance(old, torch.Tensor):
                changed = True
            else:
                try:
                    changed = bool(new != old)
                except Exception:  # noqa: BLE001 - an odd __ne__ is a change, not a crash
                    changed = True
            if changed:
                displaying[expr] = new
                self.message(f"display {expr}: {self._show(new, expr)}  [old: {self._show(old, expr)}]")

    if not hasattr(pdb.Pdb, "_show_display"):
        def preloop(self) -> None:
            self._show_display()

    def _show(self, obj, expr: str) -> str:
        safe = getattr(self, "_safe_repr", None)
        if safe is not None:
            return safe(obj, expr)
        try:
            return repr(obj)
        except Exception as e:  # noqa: BLE001
            return f"*** repr({expr}) failed: {e} ***"

    def setup(self, f, tb):
        ret = super().setup(f, tb)
        # post-mortem (%debug, %pdb): start at the user's last line, not inside xlanb
        # where a deliberate error was raised; `down` still reaches every frame
        i = self.curindex
        while tb is not None and i > 0 and \
                _is_core_module(self.stack[i][0].f_globals.get("__name__")):
            i -= 1
        if i != self.curindex and not _is_core_module(self.stack[i][0].f_globals.get("__name__")):
            self.curindex = i
            self.curframe = self.stack[i][0]
            self.curframe_locals = self.curframe.f_locals
        return ret

    def format_stack_entry(self, frame_lineno, *args, **kwargs):
        # The header names a notebook cell In[N], as messages do, never a kernel's
        # temp file.
        text = super().format_stack_entry(frame_lineno, *args, **kwargs)
        file = frame_lineno[0].f_code.co_filename
        name = xlanb.file_label(file)
        return text.replace(self.canonic(file), name, 1) if name != file else text

    # ------------------------------------------------------------------------------
    # Helpers

    def _locals(self):
        loc = getattr(self, "curframe_locals", None)
        return loc if loc is not None else self.curframe.f_locals

    def _eval(self, expr: str):
        """``expr`` in the current frame, as ``p`` evaluates it; errors become one line."""
        if self.curframe is None:
            raise _BadInput("no frame to evaluate in")
        try:
            return eval(expr, self.curframe.f_globals, self._locals())
        except SyntaxError as e:
            raise _BadInput(f"{expr!r} is not a valid expression ({e.msg})") from None
        except Exception as e:  # noqa: BLE001
            raise _BadInput(f"{expr!r}: {type(e).__name__}: {e}") from None

    def _tensors(self, expr: str, cmd: str) -> list:
        """The xla tensors ``expr`` names: one tensor, or a tuple/list of them."""
        value = self._eval(expr)
        items = list(value) if isinstance(value, (tuple, list)) else [value]
        if not items:
            raise _BadInput(f"{expr!r} is empty")
        for v in items:
            if isinstance(v, xlanb.XlaTensor):
                continue
            if isinstance(v, torch.Tensor):
                raise _BadInput(f"{expr!r} is a tensor on {v.device}, not on the xla device"
                                + (" (print it with p)" if cmd == "xpeek" else ""))
            raise _BadInput(f"{expr!r} is not a tensor on the xla device (it is {type(v).__name__})")
        return items

    @staticmethod
    def _flags(arg: str, allowed: tuple) -> tuple[str, set]:
        """Split ``--flags`` from the expression; unknown flags are bad input."""
        flags = set(_FLAG.findall(arg))
        unknown = sorted(flags - set(allowed))
        if unknown:
            raise _BadInput(f"unknown option {unknown[0]}; options: {', '.join(allowed)}")
        return _FLAG.sub(" ", arg).strip(), flags

    # ------------------------------------------------------------------------------
    # Commands

    @_command
    def do_xla(self, arg):
        """xla
        Show the execution mode, how many ops are pending, and the compiles so far:
        whole graphs (UncachedCompile / CachedCompile) and single-op executables
        (OpCompile / OpCacheHit; eager mode, opbyop mode and peeks use them).
        """
        if arg:
            raise _BadInput("takes no arguments (try: xpending EXPR)")
        c = _counts()
        self.message(f"mode     {xlanb.get_mode()}  (modes: {', '.join(xlanb.MODES)})\n"
                     f"pending  {xlanb.pending_count()} ops\n"
                     f"graphs   {c['UncachedCompile']} compiled, {c['CachedCompile']} cache hits\n"
                     f"ops      {c['OpCompile']} single-op compiles, {c['OpCacheHit']} cache hits")

    @_command
    def do_xpeek(self, arg):
        """xpeek EXPR
        Print the value of the xla tensor(s) EXPR evaluates to, computed op by op through
        the single-op cache. The pending graph is left exactly as it was, so the next sync
        compiles the same graph as if you had never looked. (p, pp and print peek too.)
        """
        if not arg:
            raise _BadInput("usage: xpeek EXPR  (an xla tensor, or a tuple/list of them)")
        for t in self._tensors(arg, "xpeek"):
            self.message(repr(xlanb.peek(t)))

    @_command
    def do_xpending(self, arg):
        """xpending [EXPR] [--depth N]
        Print the pending IR (text) that computes EXPR -- an xla tensor or a tuple/list of
        them -- or, without EXPR, every live tensor's pending work. Each op shows its
        result type, source line and module. --depth N shows only the ops at most N-1
        steps before the outputs (--depth 1: the outputs' own ops). Nothing runs or
        compiles.
        """
        depth = None
        m = _DEPTH.search(arg)
        if m:
            raw = m.group(1) or ""
            if not raw.isdigit() or int(raw) < 1:
                raise _BadInput(f"--depth needs a positive integer, got {raw!r}" if raw
                                else "--depth needs a positive integer")
            depth = int(raw)
            arg = (arg[:m.start()] + " " + arg[m.end():]).strip()
        expr, _ = self._flags(arg, ("--depth",))
        tensors = self._tensors(expr, "xpending") if expr else []
        n = xlanb.pending_count(*tensors)
        if n == 0:
            self.message("no pending ops" + (f": {expr} is device data" if expr else ""))
            return
        text = xlanb.pending_ir(*tensors, depth=depth) if depth else xlanb.pending_ir(*tensors)
        self.message(text)

    @_command
    def do_xhlo(self, arg):
        """xhlo [EXPR] [--hlo] [--optimized]
        Print the module the next sync of EXPR (an xla tensor or a tuple/list of them;
        default: every live tensor) would compile: StableHLO, or HLO with --hlo. Nothing
        runs. --optimized prints XLA's optimized HLO, which means compiling the graph: it
        counts as a graph compile, and unless EXPR covers all pending tensors it is not
        the graph the next sync compiles.
        """
        expr, flags = self._flags(arg, ("--hlo", "--stablehlo", "--optimized"))
        if {"--hlo", "--stablehlo"} <= flags:
            raise _BadInput("give one of --hlo and --stablehlo")
        tensors = self._tensors(expr, "xhlo") if expr else []
        if xlanb.pending_count(*tensors) == 0:
            self.message("no pending ops" + (f": {expr} is device data" if expr else ""))
            return
        dialect = "hlo" if "--hlo" in flags else "stablehlo"
        self.message(xlanb.hlo(*tensors, dialect=dialect, optimized="--optimized" in flags))

    @_command
    def do_xsync(self, arg):
        """xsync
        Run all pending work now, as xlanb.sync() / mark_step would: one graph per device
        in lazy mode, op by op in opbyop mode. Says what it compiled. Unlike looking at
        values, this cuts the graph where you stand.
        """
        if arg:
            raise _BadInput("takes no arguments")
        n = xlanb.pending_count()
        if n == 0:
            self.message("nothing pending")
            return
        before = _counts()
        t0 = time.perf_counter()
        xlanb.sync(cause="pdb xsync")
        dt = time.perf_counter() - t0
        d = {k: v - before[k] for k, v in _counts().items()}
        how = []
        if d["UncachedCompile"]:
            how.append(f"{d['UncachedCompile']} graph compiled")
        if d["CachedCompile"]:
            how.append(f"{d['CachedCompile']} graph from the cache")
        if d["OpCompile"] or d["OpCacheHit"]:
            how.append(f"{d['OpCompile']} single-op compiles, {d['OpCacheHit']} single-op cache hits")
        self.message(f"synced {n} ops in {xlanb.format_duration(dt)}"
                     + (f" ({'; '.join(how)})" if how else ""))

    @_command
    def do_xmode(self, arg):
        """xmode [lazy|eager|opbyop]
        Without an argument, show the execution mode. With one, switch to it. Pending
        work stays correct; leaving lazy/opbyop for eager syncs it first.
        """
        self.message(cmd.mode_status(cmd.PDB) if not arg else cmd.switch_mode(cmd.PDB, arg))

    @_command
    def do_xnans(self, arg):
        """xnans [EXPR]
        Peek every xla tensor in the current frame (locals, and tensors in their tuples,
        lists and dicts) -- or, with EXPR, the tensors EXPR evaluates to -- and list the
        ones holding NaN or Inf, with the line and module that made them. Peeking changes
        no pending graph.
        """
        import torch
        found = []
        seen = set()

        def visit(label, v, depth=0):
            if isinstance(v, xlanb.XlaTensor):
                if id(v) in seen or not (v.is_floating_point() or v.is_complex()):
                    return
                seen.add(id(v))
                c = xlanb.peek(v)
                bad = int((~torch.isfinite(c)).sum())
                if bad:
                    src, scope = xlanb.where_made(v)
                    where = f" made at {src.short}" if src is not None else ""
                    found.append(f"  {label}: {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}"
                                 f" {int(torch.isnan(c).sum())} nan, {bad - int(torch.isnan(c).sum())} inf"
                                 f"{where}" + (f" [{scope}]" if scope else ""))
            elif depth < 2 and isinstance(v, (tuple, list)):
                for i, x in enumerate(v[:64]):
                    visit(f"{label}[{i}]", x, depth + 1)
            elif depth < 2 and isinstance(v, dict):
                for k, x in list(v.items())[:64]:
                    visit(f"{label}[{k!r}]", x, depth + 1)

        if arg:  # an expression of the frame's: a name that is not there is an error
            visit(arg, self._eval(arg))
        else:
            for name, v in list(self.curframe_locals.items()):
                visit(name, v)
        if not seen:
            self.message(f"no xla tensors in {arg!r}" if arg else "no xla tensors in this frame")
        elif not found:
            self.message(f"{len(seen)} xla tensors, all finite")
        else:
            self.message(f"{len(found)} of {len(seen)} xla tensors hold NaN/Inf:")
            for line in found:
                self.message(line)

    @_command
    def do_xgraphs(self, arg):
        """xgraphs
        List every compiled graph, oldest first: hash, op count, inputs/outputs, compile
        time, cache hits, run time, the cause and the source line of its sync, and why it
        recompiled when a graph from the same line compiled before.
        """
        if arg:
            raise _BadInput("takes no arguments")
        gs = xlanb.graphs()
        self.message(str(gs) if gs else "no compiled graphs yet")

    @_command
    def do_xcompile(self, arg):
        """xcompile [I] [--target NAME]
        Where graph #I's compile time went (default: the latest graph): by compiler phase,
        by source line and by module scope. --target NAME compiles it for a TPU topology
        (v5e:1x1...) now and shows where libtpu's time went.
        """
        words = arg.split()
        target = None
        if "--target" in words:
            k = words.index("--target")
            if k + 1 >= len(words):
                raise _BadInput("--target takes a topology (e.g. v5e:1x1)")
            target = self._topology(words[k + 1])
            del words[k:k + 2]
        if len(words) > 1:
            raise _BadInput("usage: xcompile [I] [--target NAME]")
        try:
            i = int(words[0]) if words else -1
        except ValueError:
            raise _BadInput(f"xcompile takes a graph number, got {words[0]!r}") from None
        gs = list(xlanb.graphs())
        if not -len(gs) <= i < len(gs):
            raise _BadInput(f"there is no graph #{i}: {len(gs)} graphs were compiled")
        g = gs[i]
        if target is not None:
            try:
                profile = xlanb.compile_for(target, g).compile_profile
            except (ValueError, ImportError) as e:
                raise _BadInput(str(e).strip().splitlines()[0]) from None
        else:
            profile = g.compile_profile
        self.message(str(profile))

    @_command
    def do_xmem(self, arg):
        """xmem [--by-line] [--graph I]
        Device memory, without running anything: live tensors, every buffer xlanb holds,
        the sampled peak and the limit; --by-line: the lines holding the most; --graph I:
        compiled graph #I's memory analysis and its largest buffers.
        """
        words = arg.split()
        if not words:
            self.message(xlanb.memory_summary())
        elif words == ["--by-line"]:
            self.message(str(xlanb.memory_by_line()))
        elif len(words) == 2 and words[0] == "--graph":
            try:
                i = int(words[1])
            except ValueError:
                raise _BadInput(f"--graph takes a graph number, got {words[1]!r}") from None
            gs = list(xlanb.graphs())
            if not -len(gs) <= i < len(gs):
                raise _BadInput(f"there is no graph #{i}: {len(gs)} graphs were compiled")
            self.message(xd.GraphMemoryReport(gs[i], i % len(gs)).text())
        else:
            raise _BadInput("usage: xmem [--by-line | --graph I]")

    @_command
    def do_xtarget(self, arg):
        """xtarget [NAME|off] [--now [EXPR] | --graph I]
        Compile for a TPU topology with libtpu, no TPU needed (xlanb.set_target): NAME is
        a topology as JAX spells it (v5e:1x1, v5e:2x2, v5p:2x2x1, v4:2x2x1, v6e:1x1);
        every graph compiled from then on is also compiled for it in the background, and
        xgraphs shows its per-chip HBM peak, whether it fits, the estimated step time and
        the TPU compile time. off stops. Without arguments: the target, and the known
        chips with their HBM. --now compiles the pending graph of EXPR (default: all
        pending work, else the latest graph) for NAME (default: the target) and prints
        the TPU compiler's report; --graph I does so for compiled graph #I. Nothing runs
        and the pending graph is left as it was.
        """
        index = None
        m = _GRAPH.search(arg)
        if m:
            raw = m.group(1) or ""
            try:
                index = int(raw)
            except ValueError:
                raise _BadInput(f"--graph takes a graph number, got {raw!r}" if raw
                                else "--graph takes a graph number") from None
            arg = (arg[:m.start()] + " " + arg[m.end():]).strip()
        rest, flags = self._flags(arg, ("--now", "--graph"))
        now = "--now" in flags or index is not None
        first, _, expr = rest.partition(" ")
        name = first if first and _TOPOLOGY.fullmatch(first) else None
        if name is None:
            expr = rest
        expr = expr.strip()
        if expr and not now:
            if name is None and " " not in expr:  # the core says what a topology is
                cmd.topology(expr)
            raise _BadInput("usage: xtarget [NAME|off] [--now [EXPR] | --graph I]")
        if expr and index is not None:
            raise _BadInput("give EXPR or --graph I, not both")
        if name is not None and name.lower() == "off" and now:
            raise _BadInput("--now needs a topology, not off")
        if name is not None and not now:
            self.message(cmd.set_target(cmd.PDB, name))
            return
        target = cmd.topology(name) if name is not None else xlanb.get_target()
        if now:
            if target is None:
                raise _BadInput("no target: give one (xtarget v5e:1x1 --now) or set one "
                                "(xtarget v5e:1x1)")
            self._target_report(target, expr, index)
            return
        if name is None:
            self.message(xd.TargetStatus(target, cmd.target_headline(cmd.PDB, target)).text())
            return

    def _target_report(self, target, expr: str, index) -> None:
        tensors = self._tensors(expr, "xtarget") if expr and index is None else []
        what, words = cmd.pending_or_graph(cmd.PDB, tensors, index, expr)
        report = cmd.compile_for(target, what)
        self.message(xd.TargetView(report, words[0].upper() + words[1:]).text())

    # ------------------------------------------------------------------------------
    # Tab completion

    def _complete_with_flags(self, flags, text, line, begidx, endidx):
        if text.startswith("-"):
            # A flag is always followed by something: complete the space too.
            return [f + " " for f in flags if f.startswith(text)]
        return self._complete_expression(text, line, begidx, endidx)

    def complete_xmode(self, text, line, begidx, endidx):
        return [m for m in xlanb.MODES if m.startswith(text)]

    def complete_xpeek(self, text, line, begidx, endidx):
        return self._complete_expression(text, line, begidx, endidx)

    def complete_xpending(self, text, line, begidx, endidx):
        return self._complete_with_flags(("--depth",), text, line, begidx, endidx)

    def complete_xtarget(self, text, line, begidx, endidx):
        if text.startswith("-"):
            return [f + " " for f in ("--now", "--graph") if f.startswith(text)]
        if len(line[:begidx].split()) == 1:  # the first argument: a topology
            names = list(xd.EXAMPLE_TOPOLOGIES.values()) + ["v5e:1x1", "off"]
            return [n for n in names if n.startswith(text)]
        return self._complete_expression(text, line, begidx, endidx)

    def complete_xhlo(self, text, line, begidx, endidx):
        return self._complete_with_flags(("--hlo", "--stablehlo", "--optimized"),
                                         text, line, begidx, endidx)


def set_trace(frame=None) -> None:
    """Stop in ``frame`` (default: the caller's) with an ``XlaPdb``."""
    XlaPdb().set_trace(frame if frame is not None else sys._getframe(1))
