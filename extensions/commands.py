"""The commands the two shells share (issue 44): IPython's ``%xla_*`` magics and pdb's
``x*`` commands parse their own syntax, then call these, so a command behaves and speaks
the same in both. Each takes parsed arguments, does the work through xlanb's public API,
and returns what to show; bad input is a ``CommandError`` (one line), which each shell
shows as its own usage error. The words that differ are the shells' command names
(``Shell``)."""
from __future__ import annotations

from dataclasses import dataclass

import xlanb

from . import display as xd


class CommandError(ValueError):
    """Bad input to a command: one line, shown the way the shell shows usage errors."""


@dataclass(frozen=True)
class Shell:
    """How a shell names things in the commands' messages."""
    label: str    # what a status line starts with: "xla " in IPython, "" in pdb
    graphs: str   # the graph table's command
    target: str   # the target command


IPYTHON = Shell("xla ", "%xla_graphs", "%xla_target")
PDB = Shell("", "xgraphs", "xtarget")


def _one_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0]


# ---------------------------------------------------------------------------- mode

def mode_status(shell: Shell) -> str:
    return f"{shell.label}mode: {xlanb.get_mode()}  (choices: {', '.join(xlanb.MODES)})"


def switch_mode(shell: Shell, name: str) -> str:
    """Switch to mode ``name``; says what the switch synced (``xlanb.switch_mode``)."""
    try:
        xlanb.check_mode(name)
    except ValueError as e:  # the core's one message, listing the modes
        raise CommandError(str(e)) from None
    old = xlanb.get_mode()
    synced = xlanb.switch_mode(name)
    if old == name:
        return f"{shell.label}mode: {old} (unchanged)"
    note = f" (synced {xd.plural(synced, 'pending op')} first)" if synced else ""
    return f"{shell.label}mode: {old} -> {name}{note}"


# ---------------------------------------------------------------------------- target

def topology(name: str):
    """The ``xlanb.Target`` named ``name`` (an unknown name, or no libtpu: one line)."""
    try:
        return xlanb.Target(name)
    except (ValueError, ImportError) as e:  # TargetError lists the known generations
        raise CommandError(_one_line(e)) from None


def set_target(shell: Shell, name: str) -> str:
    """Set the session's target to topology ``name``, or ``off``."""
    prev = xlanb.get_target()
    if name.lower() == "off":
        xlanb.set_target(None)
        return (f"{shell.label}target: {prev.name} -> off" if prev
                else f"{shell.label}target: off (unchanged)")
    target = topology(name)
    xlanb.set_target(target)
    was = prev.name if prev is not None else "off"
    return (f"{shell.label}target: {was} -> {xd.target_text(target)}: every new graph is "
            f"also compiled for it, in the background ({shell.graphs} shows its figures; "
            f"{shell.target} --now compiles the pending graph now)")


def target_headline(shell: Shell, target) -> str:
    if target is None:
        return (f"{shell.label}target: off ({shell.target} v5e:2x2 compiles every new graph "
                "for a TPU topology too, in the background; nothing runs on it)")
    return (f"{shell.label}target: {xd.target_text(target)}: every new graph is also "
            f"compiled for it, in the background ({shell.graphs} shows its figures; "
            f"{shell.target} --now compiles the pending graph now)")


def pending_or_graph(shell: Shell, tensors: list, index: int | None,
                     named: str = "") -> tuple[list, str]:
    """What a compile-for-a-target command compiles: graph #``index``; else the pending
    graph of ``tensors`` (all pending work when there are none); else, with nothing
    pending, the latest compiled graph. Returns ``xlanb.compile_for``'s arguments and
    what they are, in words. ``named``: how the user named the tensors."""
    gs = list(xlanb.graphs())
    head = "graph"
    if index is None:
        n = xlanb.pending_count(*tensors)
        if n:
            return tensors, f"the pending graph ({xd.plural(n, 'op')})"
        if tensors:
            raise CommandError(f"nothing is pending for {named or 'these tensors'}: "
                               "no graph to compile")
        if not gs:
            raise CommandError("nothing is pending and no graph was compiled yet: record "
                               "some ops first")
        index, head = -1, "nothing pending: the latest compiled graph"
    if not -len(gs) <= index < len(gs):
        raise CommandError(f"there is no graph #{index}: {len(gs)} graphs were compiled "
                           f"(see {shell.graphs})")
    g = gs[index]
    return [g], f"{head} #{index % len(gs)} {xlanb.format_hash(g.hash)} ({xd.plural(g.n_nodes, 'op')})"


def compile_for(target, what: list):
    """``xlanb.compile_for``; a mesh that does not fit the topology is one line."""
    try:
        return xlanb.compile_for(target, *what)
    except (ValueError, ImportError) as e:
        raise CommandError(_one_line(e)) from None
