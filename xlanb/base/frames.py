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
import warnings
from typing import NamedTuple

import torch

from .caches import cache
from .formats import format_location


class SourceLoc(NamedTuple):
    """One line of the user's program."""
    file: str       # the full path, as Python knows it
    line: int
    function: str

    @property
    def short(self) -> str:
        """``model.py:42 forward``: how xlanb shows a location (``In[5]:3 forward`` for a
        notebook cell, once the IPython extension has installed its labeler)."""
        return (_first_label(_labelers, self)
                or format_location(file_label(self.file, short=True), self.line, self.function))

    @property
    def where(self) -> str:
        """``/path/to/model.py:42``: the full ``file:line``, as HLO metadata holds it
        (``source_text`` names it for people)."""
        return format_location(self.file, self.line)

    def __str__(self) -> str:
        return self.short


# A front end's namers for what it knows better (a notebook's cells): SourceLoc -> str and
# file name -> str, or None to keep the file name. Installed by set_location_labeler, read
# only at formatting.
_labelers: list = []
_file_labelers: list = []


def set_location_labeler(fn=None, *, files=None) -> None:
    """Name source locations in every message, graph and table with ``fn(loc)`` when it
    returns a string, and files with ``files(path)`` (the IPython extension names a
    notebook cell's code, a kernel's temp file, ``In[5]``: so a location reads
    ``In[5]:3 forward`` and a warning's header ``In[5]:3:``); ``None`` removes them."""
    _labelers[:] = [fn] if fn is not None else []
    _file_labelers[:] = [files] if files is not None else []


def file_label(file: str, short: bool = False) -> str:
    """How messages name ``file``: the front end's name (``In[5]`` for a notebook cell;
    never a kernel's temp file), else the path (its base name with ``short``)."""
    return _first_label(_file_labelers, file) or (os.path.basename(file) if short else file)


def _first_label(labelers: list, what) -> str | None:
    for labeler in labelers:
        try:
            label = labeler(what)
        except Exception:  # a front end's bug must not hide the message it is in
            label = None
        if label:
            return label
    return None


def source_text(where: str) -> str:
    """A ``file:line`` string (as HLO metadata holds it) named as ``file_label`` names
    files: ``In[5]:3`` for a cell, ``train.py:12`` for a file."""
    file, sep, line = where.rpartition(":")
    if not sep or not line.isdigit():
        return file_label(where, short=True) if where else ""
    return format_location(file_label(file, short=True), line)


def warn_at(loc: SourceLoc, message: str, category: type) -> None:
    """``warnings.warn`` with ``loc`` as where it happened, its header naming the file as
    messages do (``In[5]:3: RecompileWarning: ...``, not a kernel's temp file)."""
    name = file_label(loc.file)
    if name == loc.file:  # a real file: Python shows its line of code under the header
        warnings.warn_explicit(message, category, loc.file, loc.line)
    else:
        warnings.warn_explicit(message, category, name, loc.line)


def format_loc(loc: SourceLoc | None) -> str:
    """``loc.short``, or "" for no location."""
    return "" if loc is None else loc.short


# The xlanb package's folder: the one place it is computed (the store hashes sources under
# it, dynamo skips modules under it, messages tell its frames from the user's).
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_torch_dir = os.path.dirname(torch.__file__) + os.sep
_stdlib_dir = os.path.dirname(contextlib.__file__) + os.sep
# Frames that are never "the user's line": torch, xlanb (and its front ends, which
# register their folder: extensions/ may live outside xlanb/ in an editable install), and
# the debugger/REPL machinery that runs a command typed at a prompt (so a sync from pdb is
# credited to where it stopped). The one answer to "is this frame xlanb's?".
_SKIP_PREFIXES = (
    _torch_dir, PACKAGE_DIR + os.sep,
    contextlib.__file__,
    *(os.path.join(_stdlib_dir, m) for m in ("bdb.py", "pdb.py", "cmd.py", "code.py")),
    "<decorator-gen-",  # IPython's magic wrappers
    "<eval_with_key>",  # torch.fx's generated forward (a torch.compile graph): its caller
)
# IPython's own frames between a cell or magic and xlanb are not the user's line either.
_SKIP_SUFFIXES = tuple(os.sep + os.path.join("IPython", "core", f)
                       for f in ("debugger.py", "interactiveshell.py", "magic.py"))

_skip_file = cache({}, "file name -> never the user's line?")
_locations = cache({}, "(file, line) -> SourceLoc, interned")


class ForwardOp(NamedTuple):
    """A forward op autograd made a node for: its user's line and, where a dispatch mode
    noted them (``debug_nans``, the profiler), its aten op and module scope."""
    loc: SourceLoc | None
    op: str | None = None
    scope: str = ""


# The one table of autograd's sequence number of a forward op's node -> that op: an op
# recorded while backward runs (on autograd's thread, with no user frame) is credited to
# the forward line it differentiates, in every view that shows a line (graphs, HLO
# metadata, memory, profiles, NaN reports). Noted by the frame walk of the forward op
# itself, and with its op and scope by note_forward_op.
_forward_ops: dict[int, ForwardOp] = {}
_FORWARD_MAX = 1 << 18
_current_node = torch._C._current_autograd_node
_next_seq = torch._C._autograd._get_sequence_nr
_grad_enabled = torch.is_grad_enabled


def register_internal(path: str) -> None:
    """Frames from ``path`` (a file, or a folder and everything under it) are never the
    user's line: a front end that lives outside the package registers its folder once."""
    global _SKIP_PREFIXES
    path = os.path.abspath(path)
    prefix = path + os.sep if os.path.isdir(path) else path
    if prefix not in _SKIP_PREFIXES:
        _SKIP_PREFIXES = _SKIP_PREFIXES + (prefix,)
        _skip_file.clear()  # answers given before now may change


def is_internal_file(name: str) -> bool:
    """Is the file ``name`` never the user's (torch, xlanb, the REPL machinery)?"""
    return name.startswith(_SKIP_PREFIXES) or name.endswith(_SKIP_SUFFIXES)


def is_xlanb_module(name, front_ends: bool = True) -> bool:
    """Is the module called ``name`` xlanb's? With ``front_ends=False`` only its core
    counts, not the IPython extension, the debugger or the kernel, below which user code
    runs."""
    if not isinstance(name, str) or not (name == "xlanb" or name.startswith("xlanb.")):
        return False
    return front_ends or not name.startswith(("xlanb.extensions", "xlanb.kernel"))


def is_internal_frame(f) -> bool:
    """Is ``f``'s code never the user's line (torch, xlanb, the REPL machinery)?"""
    # by module name too: xlanb's front ends may be installed anywhere
    return is_internal_file(f.f_code.co_filename) or is_xlanb_module(f.f_globals.get("__name__"))


_seen_seq = -1  # autograd's sequence number when user_frame last looked


def _note_forward(loc: SourceLoc) -> None:
    """The node autograd made for this op, just before dispatching it: its forward line.
    (An op recorded while backward runs has a current node, and is not a forward op.)"""
    global _seen_seq
    nxt = _next_seq()
    _seen_seq = nxt
    if not _grad_enabled() or _current_node() is not None:
        return
    seq = nxt - 1
    if seq >= 0 and seq not in _forward_ops:
        _remember_forward(seq, ForwardOp(loc))


def _remember_forward(seq: int, entry: ForwardOp) -> None:
    _forward_ops[seq] = entry
    if len(_forward_ops) > _FORWARD_MAX:  # bounded: the oldest half goes
        for k in list(_forward_ops)[:_FORWARD_MAX // 2]:
            del _forward_ops[k]


def note_forward_op(op: str, scope: str = "") -> None:
    """Note the forward op ``op`` that autograd just made a node for, with its user's
    line and module ``scope`` (a dispatch mode calls this before the op dispatches), for
    ``forward_op``."""
    seq = _next_seq() - 1
    if seq < 0:
        return
    known = _forward_ops.get(seq)
    if known is None or known.op is None:
        loc = known.loc if known is not None else user_frame(3)
        _remember_forward(seq, ForwardOp(loc, op, scope))


def forward_op(seq: int) -> ForwardOp | None:
    """The forward op of autograd's node number ``seq``, if one was noted."""
    return _forward_ops.get(seq)


def user_frame(depth: int = 2) -> SourceLoc | None:
    """The innermost frame outside torch and xlanb, as a SourceLoc, or None. The walk
    starts ``depth`` frames up (the caller of user_frame's caller by default). An op
    recorded by autograd's backward gets the line of the forward op it differentiates."""
    try:
        f = sys._getframe(depth)
    except ValueError:  # fewer frames: autograd's engine thread calls ops from C++
        f = None
    skips = _skip_file
    while f is not None:
        code = f.f_code
        name = code.co_filename
        skip = skips.get(name)
        if skip is None:  # once per file: this runs on every recorded op
            skip = skips[name] = is_internal_frame(f)
        if not skip:
            key = (name, f.f_lineno)
            loc = _locations.get(key)
            if loc is None:  # interned: one object per line, made once
                loc = _locations[key] = SourceLoc(name, key[1], code.co_name)
            if _next_seq() != _seen_seq:  # autograd made a node since the last op
                _note_forward(loc)
            return loc
        if code.co_name == "_engine_run_backward" and name.startswith(_autograd_dir):
            # autograd's nodes run below here when backward runs on the thread that called
            # it (dispatch/backend.py, issue 58): the line above only started the backward
            break
        f = f.f_back
    node = _current_node()
    if node is None:
        return None
    # autograd's own steps (AccumulateGrad's detach and ``+=`` of a gradient) have no
    # forward op: they belong to the line that called .backward()
    fwd = _forward_ops.get(node._sequence_nr())
    return (fwd.loc if fwd is not None else None) or backward_caller()


# torch.autograd's Python entries into the engine: the thread that called .backward() (or
# autograd.grad) waits in one of these while autograd's device thread runs the backward,
# or runs its nodes itself (dispatch/backend.py, issue 58)
_ENGINE_ENTRIES = {("graph.py", "_engine_run_backward"), ("__init__.py", "backward"),
                   ("__init__.py", "grad")}
_autograd_dir = os.path.join(_torch_dir, "autograd") + os.sep


def _engine_entry(f) -> bool:
    name = f.f_code.co_filename
    return (name.startswith(_autograd_dir)
            and (name[len(_autograd_dir):], f.f_code.co_name) in _ENGINE_ENTRIES)


def backward_caller() -> SourceLoc | None:
    """The user's line that started the backward running now (``loss.backward()``), for
    an op autograd runs with no forward op to credit it to; None when no thread waits in
    autograd's engine, or several threads at different lines do."""
    found = None
    # this thread too: autograd's nodes may run on the thread that called backward
    for f in sys._current_frames().values():
        depth = 0
        while f is not None and depth < 64 and not _engine_entry(f):
            f, depth = f.f_back, depth + 1
        if f is None or depth >= 64:
            continue
        while f is not None:
            skip = _skip_file.get(f.f_code.co_filename)
            if skip is None:
                skip = _skip_file[f.f_code.co_filename] = is_internal_frame(f)
            if not skip:
                break
            f = f.f_back
        if f is None:
            continue
        key = (f.f_code.co_filename, f.f_lineno)
        loc = _locations.get(key)
        if loc is None:
            loc = _locations[key] = SourceLoc(key[0], key[1], f.f_code.co_name)
        if found is not None and found != loc:
            return None
        found = loc
    return found


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
