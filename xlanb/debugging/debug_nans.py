"""``xlanb.debug_nans``: turn the first-non-finite-op finder on and off.

Syncs check their results while ``config.debug_nans`` is on (``execute/nans.py``).
While on, a torch dispatch mode also sees every op (nothing is added when off):

- eager mode: each op's result is checked as it is made, and the op that made the first
  NaN/Inf raises ``NonFiniteError`` at once, naming the user's line;
- forward ops note their autograd node's sequence number with their aten op, line and
  module scope; an op recorded during backward (``torch._C._current_autograd_node()``
  is the node running) is labelled with the forward op, line and scope it differentiates,
  so a NaN in a gradient points at the line in ``forward`` that made it. (Cheaper than
  torch's anomaly mode, which formats a traceback for every forward op.)
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode, _push_mode
from torch.utils._pytree import tree_leaves

from ..base.config import config
from ..base.frames import backward_caller, forward_op, note_forward_op, user_frame
from ..base.scopes import current_scope
from ..base.session import mode_state, session
from ..execute.nans import NonFiniteError, all_finite, deferred, make_error, origins, raise_deferred
from ..modes.record import value_node
from ..ir.tensor import XlaTensor

_current_node = torch._C._current_autograd_node


def note_forward(func) -> None:
    """Note the forward op ``func`` that autograd just made a node for (its aten op,
    the user's line, the module scope), for ``backward_origin``; in frames' one table."""
    note_forward_op(func._schema.name, current_scope())


def backward_origin(anode) -> tuple:
    """(autograd node name, forward aten op, forward SourceLoc, forward scope) of the
    backward node ``anode`` running now. A node with no forward op noted (autograd's own
    AccumulateGrad: the ``detach`` and ``+=`` of a gradient) has forward op None and the
    line that called ``.backward()``."""
    fwd = forward_op(anode._sequence_nr())
    if fwd is None or fwd.op is None:
        return (anode.name(), None, backward_caller(), "")
    return (anode.name(), fwd.op, fwd.loc, fwd.scope)


class _NanMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if session.direct or not config.debug_nans or XlaTensor not in types:
            return func(*args, **kwargs)
        anode = _current_node()
        origin = None
        if anode is None:
            raise_deferred()
            if torch.is_grad_enabled():
                note_forward(func)
        else:
            origin = backward_origin(anode)
        eager = not mode_state().recording
        # nodes the op's inputs already hold: a result that shares one (detach, alias of a
        # saved forward value) was not made by this op and keeps its own origin
        before = {id(value_node(a)) for a in tree_leaves((args, kwargs))
                  if type(a) is XlaTensor} if origin is not None else ()
        out = func(*args, **kwargs)
        if origin is None and not eager:
            return out
        results = []
        for t in tree_leaves(out):
            if type(t) is not XlaTensor:
                continue
            node = value_node(t) if t._view else t._storage.node
            if origin is not None and node.data is None and id(node) not in before:
                origins[node] = origin
            if eager and node.data is not None:
                results.append((t, node.data))
        if results and not all_finite([d for _, d in results]):  # one check per op
            _raise_eager(func, results, args, kwargs, origin)
        return out


class _EagerOp:
    """What the error names for an eager op: its aten op, input and output layouts."""

    def __init__(self, func, ins, outs):
        self.name = func._schema.name
        self.in_metas = tuple(t._meta for t in ins)
        self.out = tuple(t._meta for t in outs) if len(outs) > 1 else outs[0]._meta
        self.multi = len(outs) > 1


def _raise_eager(func, results, args, kwargs, origin) -> None:
    ins, arrays, scalars = [], [], []
    for a in tree_leaves((args, kwargs)):
        if type(a) is XlaTensor:
            n = value_node(a)
            if n.data is not None:
                ins.append(a)
                arrays.append(n.data)
        elif isinstance(a, (int, float)) and not isinstance(a, bool):
            scalars.append(a)
    how = "eager op, checked as it ran"
    if origin is not None:
        how += "; found during backward, raised at the next sync or op"
    info = _EagerOp(func, ins, [t for t, _ in results])
    data = tuple(d for _, d in results)
    err = make_error(info, user_frame(), current_scope(), arrays, scalars,
                     data if info.multi else data[0], origin, how, "eager")
    if origin is not None:
        # autograd's engine thread loses an exception raised from a dispatch mode: keep
        # the first one for the main thread's next sync or op
        if not deferred:
            deferred.append(err)
        return
    raise err


_active: list = []  # the pushed _NanMode, while on
_saved_background: list = []  # config.background_compile, while on


def _set(on: bool) -> None:
    config.debug_nans = on
    if on and not _active:
        m = _NanMode()
        _push_mode(m)
        _active.append(m)
        # eager: every op runs (and is checked) as it is called, none waits on a
        # background compile to run later unchecked
        _saved_background.append(config.background_compile)
        config.background_compile = False
    elif not on and _active:
        _pop_mode()
        _active.clear()
        if _saved_background:
            config.background_compile = _saved_background.pop()
    if not on:
        deferred.clear()


class debug_nans:
    """Find the first op that makes a NaN or Inf.

    ``xlanb.debug_nans(True)`` / ``(False)`` turns it on or off; ``with
    xlanb.debug_nans():`` turns it on for a block. While on, each sync checks its
    results (one fused check) and, on a NaN/Inf, replays its graph op by op from the
    same inputs and raises ``FloatingPointError`` (``xlanb.NonFiniteError``) naming the
    first op whose output is non-finite: aten op, shapes, module scope, source line, the
    inputs' min/max/non-finite counts, and for a backward op the forward line. Pending
    tensors keep their work. Eager mode checks each op as it runs."""

    def __init__(self, on: bool = True):
        self._prev = config.debug_nans
        _set(bool(on))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        err = deferred[0] if deferred else None
        _set(self._prev)
        deferred.clear()
        if exc_type is None and err is not None:
            raise err  # a NaN an eager backward made in the block, not raised yet
        return False

    def __bool__(self) -> bool:
        return config.debug_nans

    def __repr__(self) -> str:
        return f"xlanb.debug_nans: {'on' if config.debug_nans else 'off'}"


def where_made(t: XlaTensor) -> tuple:
    """(SourceLoc | None, scope) of the op that made ``t``'s current value: the line and
    module recorded with it (None for data that came in whole, or eager results); for an
    op recorded during backward with debug_nans on, the forward line and scope."""
    if not isinstance(t, XlaTensor):
        raise TypeError(f"xlanb.where_made expects an xla tensor, got {type(t).__name__}")
    node = value_node(t)
    origin = origins.get(node)
    if origin is not None and origin[2] is not None:
        return origin[2], origin[3]
    return node.src, node.scope


__all__ = ["debug_nans", "NonFiniteError", "where_made"]
