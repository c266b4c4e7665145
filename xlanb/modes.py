"""The execution mode: lazy (record, compile whole graphs), eager (run each op now through
the single-op cache) or opbyop (record, then run node by node through that cache)."""
from __future__ import annotations

import contextlib
import os

MODES = ("lazy", "eager", "opbyop")


def _check(name: str) -> str:
    if name not in MODES:
        raise ValueError(f"unknown xlanb mode {name!r}; valid modes are: {', '.join(MODES)}")
    return name


class _State:
    # ``recording`` is read on every op: keep it a plain attribute.
    __slots__ = ("mode", "recording", "deferred")

    def __init__(self, mode: str):
        self.mode = mode
        self.recording = mode != "eager"
        # eager: some ops were recorded while their executables compile (dispatch.py)
        self.deferred = False


state = _State(_check(os.environ.get("XLANB_MODE", "lazy") or "lazy"))


def get_mode() -> str:
    """The current execution mode."""
    return state.mode


def set_mode(name: str) -> None:
    """Switch modes. Leaving a recording mode for eager syncs the pending work first, so
    that eager ops only ever see device data (the sync's cause is "mode switch"); so does
    leaving eager while ops wait on background compiles, so that no lazy graph depends
    on how fast those compiles were."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    _check(name)
    if name == state.mode:
        return
    if (state.recording and name == "eager") or state.deferred:
        from .sync import sync
        sync(cause="mode switch")  # in eager, this also ends the waiting state
    state.mode = name
    state.recording = name != "eager"


@contextlib.contextmanager
def mode(name: str):
    """``with xlanb.mode("eager"): ...`` switches for the block, then back."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    previous = state.mode
    set_mode(name)
    try:
        yield
    finally:
        set_mode(previous)
