"""Recording or running one op, and reading and writing tensor values through storages.

``apply_op`` records or runs one op as the thread's mode says (modes/policy.py: lazy and
opbyop record a node; eager runs the op's single-op executable now, or records it while
that executable compiles in the background); inside a decomposition ("direct" mode) it
evaluates on JAX values. ``run_op_executable`` is eager's run of a known executable.
``value_node`` and ``write`` are how every tensor, view or base, is read and written.
"""
from __future__ import annotations

import functools

import jax
import numpy as np
import torch

from ..base import metrics
from ..base.caches import cache
from ..base.frames import user_frame
from ..base.scopes import current_scope
from ..base.session import mode_state, session
from ..values.memory import device_oom, is_device_oom
from ..ir.nodes import Node, OpSignature, TensorMeta
from ..pending.live import track, track_view
from ..ops.infos import getitem_info, set_decomposition_runner
from ..ops.leaves import from_array
from ..ops.views import view_scatter_info
from ..pending.realize import node_array
from ..runtime.devices import jax_device
from ..ir.templates import fill_call
from ..ir.tensor import XlaTensor, dispatch_op, new_tensor

_x64 = functools.partial(jax.enable_x64, True)
_F32 = np.float32
aten = torch.ops.aten
_count = metrics.counter


def unwrap_direct(res):
    if isinstance(res, XlaTensor):
        return value_node(res).data
    if isinstance(res, (tuple, list)):
        return tuple(unwrap_direct(r) for r in res)
    return res


def evaluate_decomposition(decomp, template, arrays, scalars):
    """Run torch's decomposition ``decomp`` on tensors holding JAX values, op by op, right
    now ("direct" mode): the whole decomposition becomes one JAX function."""
    tensors = [from_array(a) for a in arrays]
    args, kwargs = fill_call(template, tensors, scalars)
    session.direct += 1
    try:
        res = decomp(*args, **kwargs)
    finally:
        session.direct -= 1
    return unwrap_direct(res)


set_decomposition_runner(evaluate_decomposition)


def apply_op(info: OpSignature, inputs: tuple, scalars: tuple) -> Node:
    """Record or run one op, as the calling thread's mode does (``state.policy``,
    modes/policy.py); inside a decomposition ("direct"), evaluate it on JAX values now."""
    if session.direct:
        return Node(info, (), (), info.fn([n.data for n in inputs], scalars))
    state = session.default if not session.scoped else mode_state()
    return state.policy.op(state, info, inputs, scalars)


def run_op_executable(info: OpSignature, call, inputs, scalars) -> Node:
    """Run one op now through its compiled single-op executable ``call``: eager's hot
    path (dispatch calls it directly once the op's executable is known, and counts the
    cache hit)."""
    arrays = []
    for n in inputs:  # a loop: a comprehension is a function call more
        d = n.data
        arrays.append(d if d is not None else node_array(n))
    if scalars:
        scalars = _scalar_arrays(scalars, info.device)
    # No x64 switch around the call: every argument is a device array already (lifted
    # floats made float64 once, under x64), and JAX's C++ call path does not depend on
    # the setting for device arrays; switching it per op cost 0.3-0.8 µs.
    try:
        data = call(*arrays, *scalars)
    except Exception as e:
        if is_device_oom(e):
            raise device_oom(e, info.device, info.name) from e
        raise
    if info.lines:  # big enough to matter: its line, for xlanb.memory_by_line
        return Node(info, (), (), data, user_frame(), current_scope())
    return Node(info, (), (), data)


_scalar_tables = cache({}, "device -> {float or its bits: the float as a device array}")


def _scalar_arrays(scalars, device: int) -> list:
    """Lifted Python floats as device arrays (float64, or float32 where the op computes
    in float32: ops/infos.py, ``float_kind``), each made once per value and
    device: JAX would convert and copy a Python float to the device on every call. A
    float is its own key, except zeros and NaNs, keyed by their bits (``hex``) so that
    -0.0 and each NaN are their own entries. Other scalars (a random key) pass as they are."""
    table = _scalar_tables.get(device)
    if table is None:
        table = _scalar_tables[device] = {}
    out = []
    for v in scalars:
        tv = type(v)
        if tv is float or tv is _F32:
            key = v if v and v == v else float(v).hex()
            if tv is _F32:  # its own entry: float32(0.5) == 0.5, but another array
                key = (key,)
            a = table.get(key)
            if a is None:
                if len(table) >= 4096:  # a loop over many values: start over
                    table.clear()
                with _x64():
                    a = table[key] = jax.device_put(v, jax_device(device))
            v = a
        out.append(v)
    return out


def output_node(parent: Node, info: OpSignature, i: int) -> Node:
    gi = getitem_info(info, i)
    if parent.data is not None:
        return Node(gi, data=parent.data[i], src=parent.src, scope=parent.scope)
    return Node(gi, (parent,), src=parent.src, scope=parent.scope)


def value_node(t: XlaTensor) -> Node:
    """The node holding ``t``'s current value."""
    view = t._view
    s = t._storage
    if not view:
        return s.node
    if t._ver != s.version:
        node = s.node
        for info, idx in view:
            node = apply_op(info, (node,), ())
            if idx is not None:
                node = output_node(node, info, idx)
        t._node = node
        t._ver = s.version
        if node.data is None and mode_state().deferred:
            track_view(t)
    return t._node


def write(t: XlaTensor, node: Node) -> None:
    """Make ``node`` the new value of ``t``, writing through to its base if it is a view."""
    s = t._storage
    if not s.version:  # its first write: remember what made it (xlanb.memory_by_line)
        n = s.node if s.node.src is not None else node  # empty_like + copy_: the copy's line
        s.born = (n.src, n.scope, n.info.name)
    if session.spmd:  # remember where the value being replaced lay (execute/graphs.py)
        old = s.node.data
        if old is not None and not isinstance(old, tuple):
            s.placed = old.sharding
    if t._view:
        sinfo = view_scatter_info(s.meta, t._meta, t._view, s.device)
        s.node = apply_op(sinfo, (s.node, node), ())
        s.version += 1
        t._node = node
        t._ver = s.version
    else:
        s.node = node
        s.version += 1
    if s.node.data is None:  # recorded (lazy, opbyop, or eager waiting on a compile)
        track(s)


def become(t: XlaTensor, v: XlaTensor) -> XlaTensor:
    """``t`` takes ``v``'s place, in place: torch's sizes, strides and offset (through
    ``set_data``, the one Python-level way to change a wrapper tensor's sizes; the tensor
    object, its autograd identity and its version counter stay) and xlanb's storage and
    view chain."""
    with torch._C._DisableTorchDispatch():  # set_data asks the dispatcher about types
        t.data = v
    for name in ("_view", "_node", "_ver"):  # back to the class defaults (a base) ...
        t.__dict__.pop(name, None)
    t._storage, t._meta, t._key = v._storage, v._meta, v._key
    if v._view:  # ... or v's view chain
        t._view, t._node, t._ver = v._view, v._node, v._ver
    return t


def rebase(t: XlaTensor, node: Node, meta: TensorMeta) -> None:
    """Make ``t`` a fresh base tensor of another layout whose value is ``node``: how an
    out= tensor is resized, and ``resize_``."""
    become(t, new_tensor(node, meta, t._storage.device))
    if node.data is None and not session.direct:
        track(t._storage)


def wrap_results(node: Node, info: OpSignature, device: int):
    """New base tensors for an op's result(s)."""
    out = info.out
    if not info.multi:
        t = new_tensor(node, out, device)
        if node.data is None and not session.direct:
            track(t._storage)
        return t
    res = []
    for i, m in enumerate(out):
        if isinstance(m, TensorMeta):
            res.append(wrap_results(output_node(node, info, i), getitem_info(info, i), device))
        else:
            res.append(m)
    return tuple(res)


def cast_node(node: Node, src_meta: TensorMeta, dtype: torch.dtype, device: int) -> Node:
    """``node`` converted to ``dtype`` (for writes into a tensor of another dtype)."""
    if src_meta.dtype == dtype:
        return node
    tmp = new_tensor(node, src_meta, device)
    return value_node(dispatch_op(aten._to_copy.default, (tmp,), {"dtype": dtype}))
