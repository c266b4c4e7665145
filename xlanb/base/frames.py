"""Where things happen in the user's program: source locations, and whether a debugger is
stopped at its prompt.

A ``SourceLoc`` is captured once per recorded op (interned per file and line) and travels
as data from the IR to the text, DOT, SVG and widget views and the HLO metadata; it is
formatted only at the edge, so no front end ever parses ``file:line`` back out of text.
"""
from __future__ import annotations

import bdb
import contextlib
import os
import sys
from typing import NamedTuple

import torch

from .session import session


class SourceLoc(NamedTuple):
    """One line of the user's program."""
    file: str       # the full path, as Python knows it
    line: int
    function: str

    @property
    def short(self) -> str:
        """``model.py:42 forward``: how xlanb shows a location (``In[5]:3 forward`` for a
        notebook cell, once the IPython extension has installed its labeler)."""
        for labeler in _labelers:
            try:
                label = labeler(self)
            except Exception:  # a front end's bug must not hide the message it is in
                label = None
            if label:
                return label
        return f"{os.path.basename(self.file)}:{self.line} {self.function}"

    def __str__(self) -> str:
        return self.short


# A front end's namer for locations it knows better (a notebook's cells): SourceLoc -> str,
# or None to keep the file name. Installed by set_location_labeler, read only at formatting.
_labelers: list = []


def set_location_labeler(fn) -> None:
    """Name source locations in every message, graph and table with ``fn(loc)`` when it
    returns a string (the IPython extension names notebook cells ``In[5]:3 forward``);
    ``None`` removes it."""
    _labelers[:] = [fn] if fn is not None else []


def format_loc(loc: SourceLoc | None) -> str:
    """``loc.short``, or "" for no location."""
    return "" if loc is None else loc.short


_torch_dir = os.path.dirname(torch.__file__) + os.sep
_xlanb_dir = os.path.dirname(os.path.dirname(__file__)) + os.sep
_stdlib_dir = os.path.dirname(contextlib.__file__) + os.sep
# Frames that are never "the user's line": torch, xlanb and its front ends (extensions/
# may live outside xlanb/ in an editable install), and the debugger/REPL machinery that
# runs a command typed at a prompt (so a sync from pdb is credited to where it stopped).
_SKIP_PREFIXES = (
    _torch_dir, _xlanb_dir,
    os.path.join(os.path.dirname(os.path.dirname(_xlanb_dir)), "extensions") + os.sep,
    contextlib.__file__,
    *(os.path.join(_stdlib_dir, m) for m in ("bdb.py", "pdb.py", "cmd.py", "code.py")),
    "<decorator-gen-",  # IPython's magic wrappers
    "<eval_with_key>",  # torch.fx's generated forward (a torch.compile graph): its caller
)
# IPython's own frames between a cell or magic and xlanb are not the user's line either.
_SKIP_SUFFIXES = tuple(os.sep + os.path.join("IPython", "core", f)
                       for f in ("debugger.py", "interactiveshell.py", "magic.py"))

_skip_file = session.skip_file
_locations = session.locations


def user_frame(depth: int = 2) -> SourceLoc | None:
    """The innermost frame outside torch and xlanb, as a SourceLoc, or None. The walk
    starts ``depth`` frames up (the caller of user_frame's caller by default)."""
    try:
        f = sys._getframe(depth)
    except ValueError:  # fewer frames: autograd's engine thread calls ops from C++
        return None
    skips = _skip_file
    while f is not None:
        code = f.f_code
        name = code.co_filename
        skip = skips.get(name)
        if skip is None:  # once per file: this runs on every recorded op
            skip = skips[name] = name.startswith(_SKIP_PREFIXES) or name.endswith(_SKIP_SUFFIXES)
        if not skip:
            key = (name, f.f_lineno)
            loc = _locations.get(key)
            if loc is None:  # interned: one object per line, made once
                loc = _locations[key] = SourceLoc(name, key[1], code.co_name)
            return loc
        f = f.f_back
    return None


def debugger_active() -> bool:
    """True when called (indirectly) from a debugger's interactive prompt: pdb, ipdb,
    IPython's debugger, post-mortem included (all stop in ``bdb.Bdb.interaction``-style
    entry points). While one is, ``.cpu()``, ``.item()`` and ``.tolist()`` peek instead
    of syncing, so inspecting a value from a breakpoint never changes what the program
    compiles. Tracing being on is not enough: with a breakpoint set further down, the
    program's own ``.item()`` calls keep their normal meaning until the debugger stops."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "interaction" and isinstance(f.f_locals.get("self"), bdb.Bdb):
            return True
        f = f.f_back
    return False
