"""The session's state that is not a cache: the execution mode (one object per mode,
read by the dispatcher on every op), ``xlanb.mode()`` blocks per thread, the recorder of an
``xlanb.compile`` trace, the decomposition depth, the TPU target, the multi-process check.

The caches and records a reset forgets live beside the code that fills them, each
registered in base/caches.py; ``Session.clear`` empties them all. What outlives a reset,
on purpose: process resources (the compile thread pool, JAX's device list, the executable
store's once-per-process warnings) and metrics, an observer with its own ``clear``.
"""
from __future__ import annotations

import threading

from .caches import clear_all
from .config import config


# mode name -> its ModePolicy (modes/policy.py installs them at import: set_policies)
_policies: dict = {}


class ModeState:
    """An execution mode as the dispatcher reads it on every op: ``policy`` is the mode's
    object (modes/policy.py), bound when the mode is set."""
    __slots__ = ("mode", "policy", "recording", "deferred")

    def __init__(self, mode: str):
        self.set(mode)
        # eager: some ops were recorded while their executables compile (modes/policy.py)
        self.deferred = 0  # eager: ops recorded in the open run (mode_policy.Eager)

    def set(self, mode: str) -> None:
        self.mode = mode
        self.policy = policy = _policies.get(mode)  # None only before they are installed
        self.recording = policy.recording if policy is not None else True


def set_policies(policies: dict) -> None:
    """The hook modes/policy.py installs the modes through (it lives layers above)."""
    _policies.update(policies)
    session.default.set(session.default.mode)


class Session:
    """Everything a reset forgets. One instance per process: ``session``."""

    def __init__(self, mode: str):
        # -- the execution mode. ``default`` is the process's (``set_mode``); a thread
        # inside ``with xlanb.mode(...)`` runs that block's own state (``mode_state``),
        # as torch's grad mode is per thread. ``scoped`` counts such blocks in all
        # threads: while it is 0, the per-op path reads ``default`` without a
        # thread-local lookup.
        self.default = ModeState(mode)
        self.scoped = 0
        # >0 while a decomposition traces on JAX values: ops run at once (modes/record.py)
        self.direct = 0
        # the recorder of the xlanb.compile call being traced, if any (capture/)
        self.recorder = None
        # True once any tensor was sharded over a mesh (xlanb.spmd): from then on eager
        # ops look at their inputs' shardings (single-device runs never pay for it)
        self.spmd = False
        # the TPU topology every new graph also compiles for (xlanb.target), or None
        self.target = None
        # several processes (xlanb.distributed): called before every run over more than
        # one process, to check that all of them run the same; None in one process
        self.agree = None

    def clear(self, mode: str) -> None:
        """Forget every cache and record (each one registered beside its owner, emptied in
        place: base/caches.py) and return to ``mode``."""
        clear_all()
        self.default.set(mode)
        self.default.deferred = 0
        self.direct = 0
        self.recorder = None
        # spmd stays: tensors sharded before a reset still are


def starting_mode() -> str:
    """The mode a session starts and ``xlanb.reset()`` returns to (``XLANB_MODE``)."""
    return config.start_mode


session = Session(starting_mode())
_thread = threading.local()


def mode_state() -> ModeState:
    """This thread's mode: its innermost ``xlanb.mode()`` block's, else the default."""
    if session.scoped:
        state = getattr(_thread, "state", None)
        if state is not None:
            return state
    return session.default


def enter_block(state: ModeState):
    """Make ``state`` this thread's mode until ``leave_block``; returns what to restore."""
    outer = getattr(_thread, "state", None)
    _thread.state = state
    session.scoped += 1
    return outer


def leave_block(outer) -> None:
    _thread.state = outer
    session.scoped -= 1
