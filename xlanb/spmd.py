"""``xlanb.spmd``: SPMD sharding in torch_xla's vocabulary, on ``jax.sharding``.

    mesh = xlanb.spmd.Mesh(range(8), (2, 4), ("data", "model"))
    xlanb.spmd.mark_sharding(w, mesh, (None, "model"))   # or (None, 1), or a PartitionSpec
    xlanb.spmd.get_sharding(w)                            # readable; .to_jax() -> NamedSharding
    xlanb.spmd.visualize_sharding(w)                      # text; HTML in a notebook

A tensor that holds device data is laid out over the mesh at once (``jax.device_put``
with a ``NamedSharding``); a pending one in a recording mode gets a
``with_sharding_constraint`` node (``xlanb::mark_sharding``) in its graph, and XLA's
partitioner propagates the rest. Graphs and single-op executables are compiled for their
inputs' shardings (execute/graphs.py, executables/single_op.py).
"""
from __future__ import annotations

import html
from typing import NamedTuple

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec

from .base.frames import user_frame
from .base.session import mode_state, session
from .ir.nodes import Node, OpSignature
from .ops.infos import infos
from .ops.leaves import is_placed, placed_info
from .pending.realize import node_array, peek_node
from .modes.record import apply_op, value_node, write
from .runtime.mesh import (Mesh, ShardingError, as_mesh, global_index, is_sharded,
                           named_sharding, place, sharding_text)
from .runtime.targets import retarget
from .runtime.transfer import array_to_host
from .ir.templates import _In
from .ir.tensor import XlaTensor

__all__ = ["Mesh", "ShardingError", "mark_sharding", "clear_sharding", "get_sharding",
           "visualize_sharding", "Sharding", "get_1d_mesh", "shards", "Shard", "is_spmd",
           "use_spmd", "replica_mismatches", "ShardMismatch"]


def is_spmd() -> bool:
    """Whether any tensor was sharded in this session."""
    return session.spmd


def use_spmd() -> None:
    """torch_xla's switch, kept for its programs: nothing to do, xlanb shards a tensor
    when it is marked."""


def get_1d_mesh(axis_name: str = "data") -> Mesh:
    """Every device on one axis."""
    from .runtime.devices import device_count
    n = device_count()
    return Mesh(range(n), (n,), (axis_name,))


class _SpecText:
    """How a constraint's sharding prints among an op's arguments (summaries, diffs)."""
    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _spec_short(s: NamedSharding) -> str:
    return "{" + ", ".join(repr(e) for e in tuple(s.spec)) + "}" if any(
        e is not None for e in tuple(s.spec)) else "replicated"


def constraint_info(meta, device: int, sharding: NamedSharding) -> OpSignature:
    """The op that constrains a pending value to ``sharding``: one per (layout, sharding)."""
    sig = ("xlanb::mark_sharding", meta, device, sharding)
    info = infos.get(sig)
    if info is None:
        def fn(args, scalars, _s=sharding):
            # retarget: the same constraint on a TPU target's devices (xlanb.compile_for)
            return jax.lax.with_sharding_constraint(args[0], retarget(_s))
        info = OpSignature("xlanb::mark_sharding",
                      ("xlanb::mark_sharding", (meta.shape, meta.dtype), sharding_text(sharding)),
                      fn, meta, n_in=1, device=device, in_metas=(meta,),
                      template=((_In(0), _SpecText(_spec_short(sharding))), {}))
        info.sharding = sharding
        infos[sig] = info
    return info


def _check_tensor(t, what: str) -> None:
    if not isinstance(t, XlaTensor):
        raise TypeError(f"xlanb.spmd.{what} expects a tensor on the xla device, got "
                        f"{type(t).__name__}" + (f" on {t.device}" if isinstance(t, torch.Tensor) else ""))
    if t._view:
        raise ShardingError(f"xlanb.spmd.{what}: the tensor is a view of another tensor; "
                            "shard its base (the tensor it was sliced or reshaped from)")


def _place(t: XlaTensor, sharding: NamedSharding) -> None:
    """Lay ``t``'s value out as ``sharding``: a constraint node if it is pending in a
    recording mode, else its device data moved onto the mesh."""
    if len(sharding.device_set) > 1:  # a mesh of one device shards nothing
        session.spmd = True
    s = t._storage
    node = s.node
    src = user_frame()
    if node.data is None and mode_state().recording:
        write(t, apply_op(constraint_info(s.meta, s.device, sharding), (node,), ()))
        return
    arr = node.data if node.data is not None else node_array(node, cause="mark_sharding")
    new = place(arr, sharding)
    # a leaf that remembers where it was marked: a recompile it causes names that line
    s.node = Node(placed_info(s.meta, s.device), data=new, src=src)
    s.version += 1  # views re-derive from the sharded value


def mark_sharding(t: torch.Tensor, mesh, partition_spec) -> torch.Tensor:
    """Shard ``t`` over ``mesh`` (an ``xlanb.spmd.Mesh`` or a ``jax.sharding.Mesh``):
    one ``partition_spec`` entry per dimension, each an axis name, an axis index, a
    tuple of them, or None (or a ``jax.sharding.PartitionSpec``). Returns ``t``.
    A bad spec raises ``ShardingError`` before anything changes."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    _check_tensor(t, "mark_sharding")
    sharding = named_sharding(as_mesh(mesh), partition_spec, tuple(t.shape))
    _place(t, sharding)
    return t


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Drop ``t``'s sharding: it becomes replicated over its mesh (as in torch_xla).
    Nothing to do for a tensor that is not sharded."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    _check_tensor(t, "clear_sharding")
    cur = get_sharding(t)
    if cur is not None:
        _place(t, NamedSharding(cur.mesh, PartitionSpec()))
    return t


class Sharding(NamedTuple):
    """A tensor's sharding as xlanb knows it: ``state`` is "annotated" (a pending
    ``mark_sharding``), "placed" (its data was laid out by ``mark_sharding``) or
    "propagated" (its data came out of a sharded graph or op: the partitioner's choice)."""
    mesh: jax.sharding.Mesh
    spec: PartitionSpec
    state: str
    shape: tuple

    def to_jax(self) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec)

    @property
    def partition_spec(self) -> tuple:
        return tuple(self.spec) + (None,) * (len(self.shape) - len(tuple(self.spec)))

    def __str__(self) -> str:
        return f"{sharding_text(self.to_jax())} ({self.state})"

    def __repr__(self) -> str:
        return f"<Sharding {self}>"


def get_sharding(t: torch.Tensor) -> Sharding | None:
    """``t``'s sharding, or None if it is on one device (or pending with no annotation:
    the partitioner decides it when the graph compiles)."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    if not isinstance(t, XlaTensor):
        raise TypeError(f"xlanb.spmd.get_sharding expects a tensor on the xla device, got "
                        f"{type(t).__name__}")
    node = t._storage.node if not t._view else value_node(t)
    shape = tuple(t.shape)
    base = t._storage.node.data
    if t._view and node.data is None and base is not None and not isinstance(base, tuple) \
            and is_sharded(base):
        # a view of sharded device data (a weight's gradient is often a transpose): its
        # value, computed as peek computes it (nothing pending changes), says how it lies
        with torch._C._DisableTorchDispatch():
            data = peek_node(node)
        if isinstance(data.sharding, NamedSharding):
            return Sharding(data.sharding.mesh, data.sharding.spec, "propagated", shape)
        return None
    if node.data is None:
        s = node.info.sharding
        return Sharding(s.mesh, s.spec, "annotated", shape) if s is not None else None
    data = node.data
    if isinstance(data, tuple) or not is_sharded(data):
        return None
    if not isinstance(data.sharding, NamedSharding):  # another kind of sharding: not ours
        return None
    mesh, spec = data.sharding.mesh, data.sharding.spec
    placed = is_placed(node)
    return Sharding(mesh, spec, "placed" if placed else "propagated", shape)


# ---------------------------------------------------------------------------------------
# Shards of a value

class Shard(NamedTuple):
    """One device's piece of a value: the device, its index into the global tensor (one
    slice per dimension) and its value on the CPU."""
    device: str
    index: tuple
    value: torch.Tensor

    def __repr__(self) -> str:
        idx = ", ".join(f"{s.start or 0}:{s.stop if s.stop is not None else ''}" for s in self.index)
        return f"Shard({self.device}, [{idx}], {tuple(self.value.shape)})"


def shards(array) -> list[Shard]:
    """The shards of a device array this process holds, in device order."""
    out = []
    for sh in sorted(array.addressable_shards, key=lambda s: global_index(s.device)):
        out.append(Shard(f"xla:{global_index(sh.device)}", tuple(sh.index), array_to_host(sh.data)))
    return out


def peek_shards(t: XlaTensor) -> list[Shard]:
    """``xlanb.peek(t, shards=True)``: computed as ``peek`` computes (nothing pending
    changes), then split as the value lies on the devices."""
    with torch._C._DisableTorchDispatch():
        arr = peek_node(value_node(t))
    return shards(arr)


class ShardMismatch(NamedTuple):
    """Copies of one block of a tensor that disagree: the block, every device holding a
    copy, the devices whose copy differs from most of the others (on a tie, from the
    copy on the lowest device), and the largest difference between copies.
    ``odd_processes``: the processes holding the odd copies."""
    index: tuple
    devices: tuple
    odd: tuple
    max_abs_diff: float

    @property
    def odd_processes(self) -> tuple:
        return _processes_of(self.odd)

    @property
    def processes(self) -> tuple:
        return _processes_of(self.devices)


def _processes_of(devices) -> tuple:
    from .runtime.devices import global_devices
    every = global_devices()
    return tuple(sorted({every[int(d.split(":")[1])].process_index for d in devices}))


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if not a.numel():
        return 0.0
    if a.dtype.is_floating_point or a.dtype.is_complex:
        same_nan = torch.isnan(a) & torch.isnan(b)
        d = torch.where(same_nan, torch.zeros((), dtype=a.dtype), (a - b).abs())
        return float(d.max())
    return float((a.long() - b.long()).abs().max())


def replica_mismatches(t: torch.Tensor, atol: float = 0.0) -> list[ShardMismatch]:
    """Blocks of ``t`` whose copies on different devices differ by more than ``atol``
    (a value that differs on one shard: a non-deterministic op, a bad collective; with
    several processes, a parameter initialized from another seed on one host). Empty
    when every replica agrees. A tensor spread over several processes is compared over
    all of them (a collective: every process must call it); changes nothing."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    groups: dict = {}
    with torch._C._DisableTorchDispatch():
        arr = peek_node(value_node(t))
    copies = shards(arr) if getattr(arr, "is_fully_addressable", True) else _every_shard(arr)
    for sh in copies:
        key = tuple((s.start, s.stop, s.step) for s in sh.index)
        groups.setdefault(key, []).append(sh)
    out = []
    for copies in groups.values():
        if len(copies) < 2:
            continue
        d = [[_diff(a.value, b.value) for b in copies] for a in copies]
        worst = max(max(row) for row in d)
        if worst <= atol:
            continue
        agree = [sum(x <= atol for x in row) for row in d]  # copies each one agrees with
        ref = agree.index(max(agree))  # the majority; on a tie, the lowest device's copy
        odd = tuple(c.device for c, x in zip(copies, d[ref]) if x > atol)
        out.append(ShardMismatch(copies[0].index, tuple(c.device for c in copies), odd, worst))
    return out


def _every_shard(arr) -> list[Shard]:
    """Every device's shard of a global array, in every process: each process's own,
    stacked in device order, gathered from all of them (``process_allgather``)."""
    import numpy as np
    from jax.experimental import multihost_utils
    from .base.dtypes import numpy_to_tensor
    if session.agree is not None:  # a collective: checked as a host read that gathers
        session.agree(arr)
    mine = sorted(arr.addressable_shards, key=lambda s: global_index(s.device))
    local = np.stack([np.asarray(s.data) for s in mine])
    gathered = multihost_utils.process_allgather(local)  # (processes, local devices, ...)
    index = arr.sharding.devices_indices_map(tuple(arr.shape))
    out = []
    for p in range(gathered.shape[0]):
        devs = sorted((d for d in arr.sharding.device_set if d.process_index == p),
                      key=global_index)
        for k, dev in enumerate(devs):
            out.append(Shard(f"xla:{global_index(dev)}", tuple(index[dev]),
                             numpy_to_tensor(np.ascontiguousarray(gathered[p, k]))))
    return sorted(out, key=lambda s: int(s.device.split(":")[1]))


# ---------------------------------------------------------------------------------------
# visualize_sharding

_COLOURS = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69",
            "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f")


class ShardingView:
    """Which devices hold which block of a tensor: text (``str``), HTML (``_repr_html_``)
    and SVG (``svg()``), as ``jax.debug.visualize_sharding`` draws it."""

    def __init__(self, shape: tuple, sharding: Sharding | None, device: str):
        self.shape = shape
        self.sharding = sharding
        self.device = device
        self.rows, self.cols, self.cells = self._blocks()

    def _blocks(self):
        """Row and column boundaries over the first two dimensions (a 1-D tensor is one
        row) and, per block, the devices holding it."""
        if self.sharding is None:
            return [(0, self.shape[0] if self.shape else 1)], [(0, 1)], {(0, 0): [self.device]}
        shape = self.shape if self.shape else (1,)
        idx_map = self.sharding.to_jax().devices_indices_map(tuple(self.shape))
        rows, cols, cells = set(), set(), {}
        for dev, index in idx_map.items():
            r = _span(index[0] if index else slice(None), shape[0])
            c = _span(index[1], shape[1]) if len(shape) > 1 else (0, 1)
            rows.add(r)
            cols.add(c)
            cells.setdefault((r, c), []).append(global_index(dev))
        rows, cols = sorted(rows), sorted(cols)
        return rows, cols, {(rows.index(r), cols.index(c)): sorted(d) for (r, c), d in cells.items()}

    def _label(self, devs) -> str:
        if isinstance(devs[0], str):
            return devs[0]
        return "xla:" + ",".join(map(str, devs))

    def __str__(self) -> str:
        head = f"{tuple(self.shape)} " + (str(self.sharding) if self.sharding else f"on {self.device} (unsharded)")
        width = max(len(self._label(d)) for d in self.cells.values()) + 2
        sep = "+" + "+".join("-" * width for _ in self.cols) + "+"
        lines = [head, sep]
        for i, r in enumerate(self.rows):
            lines.append("|" + "|".join(self._label(self.cells.get((i, j), ["?"])).center(width)
                                        for j in range(len(self.cols))) + "|")
            lines.append(sep)
        return "\n".join(lines)

    __repr__ = __str__

    def _colour(self, devs) -> str:
        return _COLOURS[hash(tuple(devs)) % len(_COLOURS)]

    def _repr_html_(self) -> str:
        head = html.escape(str(self).split("\n")[0])
        body = "".join(
            "<tr>" + "".join(
                f"<td style='background:{self._colour(self.cells.get((i, j), ['?']))};"
                f"padding:6px 12px;text-align:center;border:1px solid #555'>"
                f"{html.escape(self._label(self.cells.get((i, j), ['?'])))}</td>"
                for j in range(len(self.cols))) + "</tr>"
            for i in range(len(self.rows)))
        return (f"<div class='xlanb-sharding'><div>{head}</div>"
                f"<table style='border-collapse:collapse'>{body}</table></div>")

    def svg(self, cell: int = 60) -> str:
        w, h = cell * 2 * len(self.cols), cell * len(self.rows)
        parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}'>"]
        for (i, j), devs in self.cells.items():
            parts.append(f"<rect x='{j * 2 * cell}' y='{i * cell}' width='{2 * cell}' height='{cell}' "
                         f"fill='{self._colour(devs)}' stroke='#555'/>"
                         f"<text x='{j * 2 * cell + cell}' y='{i * cell + cell // 2}' "
                         f"text-anchor='middle' font-size='11'>{html.escape(self._label(devs))}</text>")
        parts.append("</svg>")
        return "".join(parts)


def _span(s: slice, n: int) -> tuple:
    start, stop, _ = s.indices(n)
    return (start, stop)


def visualize_sharding(t: torch.Tensor) -> ShardingView:
    """Which device holds which block of ``t``'s first two dimensions. Prints as text;
    a notebook shows it as a coloured HTML grid (``.svg()`` for SVG)."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    s = get_sharding(t)
    return ShardingView(tuple(t.shape), s, str(t.device))
