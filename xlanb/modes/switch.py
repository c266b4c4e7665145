"""The execution mode: lazy (record, compile whole graphs), eager (run each op now through
the single-op cache) or opbyop (record, then run node by node through that cache).
What each mode does is its object in modes/policy.py; this module only switches.

``set_mode`` sets the process's mode (or, inside a ``with xlanb.mode(...)`` block, that
block's). ``with xlanb.mode(...)`` is per thread, as torch's grad mode is: another thread
keeps running in its own mode meanwhile.
"""
from __future__ import annotations

import contextlib

from ..base.config import MODES, check_mode
from ..base.session import ModeState, enter_block, leave_block, mode_state
from ..ir.nodes import plan_graph
from ..pending.live import pending_roots
from ..pending.realize import sync

__all__ = ["MODES", "get_mode", "set_mode", "switch_mode", "mode"]


def get_mode() -> str:
    """This thread's execution mode."""
    return mode_state().mode


def _switch(state: ModeState, name: str) -> int:
    """Sync what the switch needs synced; how many pending ops that ran. Leaving a
    recording mode for eager syncs the pending work first, so that eager ops only ever
    see device data (cause "mode switch"); so does leaving eager with an open run (or ops
    waiting on background compiles), so that no lazy graph depends on what eager left."""
    if name != state.mode and state.policy.switch_syncs(state, name):
        n = len(plan_graph(pending_roots()).steps)
        sync(cause="mode switch")  # in eager, this also ends the waiting state
        return n
    return 0


def switch_mode(name: str) -> int:
    """``set_mode``, returning how many pending ops the switch synced first (0 when it
    synced nothing): what the front ends report."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    check_mode(name)
    state = mode_state()
    synced = _switch(state, name)
    state.set(name)
    return synced


def set_mode(name: str) -> None:
    """Switch modes: the process's, or the enclosing ``xlanb.mode()`` block's. (Returns
    nothing, so a notebook cell ending in it shows nothing; ``switch_mode`` says what
    the switch synced.)"""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    switch_mode(name)


@contextlib.contextmanager
def mode(name: str):
    """``with xlanb.mode("eager"): ...`` runs the block in that mode, in this thread only,
    then switches back."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    check_mode(name)
    outer_state = mode_state()
    _switch(outer_state, name)
    state = ModeState(name)
    outer = enter_block(state)
    try:
        yield
    finally:
        try:
            _switch(state, outer_state.mode)
        finally:
            leave_block(outer)
