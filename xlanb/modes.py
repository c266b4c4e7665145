"""The execution mode: lazy (record, compile whole graphs), eager (run each op now through
the single-op cache) or opbyop (record, then run node by node through that cache)."""
from __future__ import annotations

import contextlib

from .base.config import MODES, check_mode
from .base.session import session
from .realize import sync

__all__ = ["MODES", "get_mode", "set_mode", "mode"]


def get_mode() -> str:
    """The current execution mode."""
    return session.mode


def set_mode(name: str) -> None:
    """Switch modes. Leaving a recording mode for eager syncs the pending work first, so
    that eager ops only ever see device data (the sync's cause is "mode switch"); so does
    leaving eager while ops wait on background compiles, so that no lazy graph depends
    on how fast those compiles were."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    check_mode(name)
    if name == session.mode:
        return
    if (session.recording and name == "eager") or session.deferred:
        sync(cause="mode switch")  # in eager, this also ends the waiting state
    session.mode = name
    session.recording = name != "eager"


@contextlib.contextmanager
def mode(name: str):
    """``with xlanb.mode("eager"): ...`` switches for the block, then back."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    previous = session.mode
    set_mode(name)
    try:
        yield
    finally:
        set_mode(previous)
