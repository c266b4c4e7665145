"""The lazy IR: nodes, op signatures and structural hashing.

A ``Node`` is one op application. Its ``info`` (an ``OpSignature``) is shared by every node and
every eager call with the same signature -- op, input shapes/dtypes, static args -- so
the structural hash of a graph is a tuple of small ints, and the single-op executable of
a signature is compiled once for eager mode, op-by-op mode and peeks alike.

A node with ``data`` set is materialized: graphs treat it as an input (a leaf).
"""
from __future__ import annotations

import hashlib
import itertools
from typing import Callable, NamedTuple

import torch

from ..base.config import config
from ..base.caches import cache
from ..base.frames import SourceLoc


class TensorMeta(NamedTuple):
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    offset: int = 0


def contiguous_strides(shape) -> tuple:
    """torch's strides for a contiguous tensor of ``shape``."""
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def result_metas(out) -> list:
    """The TensorMetas of an op's result(s): a TensorMeta, or tuples holding some."""
    if isinstance(out, TensorMeta):
        return [out]
    if isinstance(out, tuple):
        return [m for o in out for m in result_metas(o)]
    return []


def result_bytes(out) -> int:
    """The bytes of an op's result(s): a TensorMeta or a tuple holding some."""
    if isinstance(out, TensorMeta):
        n = out.dtype.itemsize
        for d in out.shape:
            n *= d
        return n
    if isinstance(out, tuple):
        return sum(result_bytes(o) for o in out)
    return 0


# Never reset: a uid names an OpSignature for the life of the process (graph keys hold them).
_uids = itertools.count(1)
GETITEM = "getitem"  # the name of the info that picks one output of a multi-output node


class OpSignature:
    """One op at one signature (op, input shapes, dtypes, layouts, Python arguments):
    its result metadata, its JAX evaluator ``fn(inputs, scalars)``, and its single-op
    executable once compiled. (Not torch's ``OpInfo``, the test database.)"""

    __slots__ = ("uid", "name", "op", "sig", "fn", "out", "multi", "n_in", "scalar_specs",
                 "device", "plan", "in_metas", "template", "view",
                 "exe", "call", "compiling", "tiering", "quick_uses", "aval_uid", "layout",
                 "sharding", "sharded", "nbytes", "lines", "seen", "opens_run", "__weakref__")

    def __init__(self, name: str, sig, fn: Callable, out, *, op=None, n_in: int = 0,
                 scalar_specs: tuple = (), device: int = 0, plan=None, in_metas: tuple = (),
                 template=None, view=None):
        self.uid = next(_uids)
        self.name = name          # "aten::addmm", for people
        self.op = op              # the torch OpOverload, when there is one
        self.sig = sig            # the cache key this info was made for
        self.fn = fn
        self.out = out            # TensorMeta, or a tuple of them for multi-output ops
        self.multi = isinstance(out, tuple) and not isinstance(out, TensorMeta)
        self.n_in = n_in
        self.scalar_specs = scalar_specs  # "f" (float64) | "f32" | "key" per lifted scalar
        self.device = device
        self.plan = plan          # the OpPlan it was made from (None for xlanb's own infos)
        self.in_metas = in_metas  # TensorMeta per input, as the executable takes them
        self.template = template  # (args, kwargs) with input/scalar slots (ir/templates.py)
        self.view = view          # a ViewRecord for view ops (ops/views.py), else None
        # Its single-op executable (execute/): compiled on first use, its quickest call
        # once it has run, and its Future while a background thread compiles it.
        self.exe = None
        self.call = None
        self.compiling = None
        # while ``exe`` is a quick one: the Future of its optimized compile, and how many
        # times the quick one was handed out (executables/single_op.op_executable)
        self.tiering = None
        self.quick_uses = 0
        self.seen = 0             # eager: runs it was in without an executable of its own
        # eager: it opened a run, and opens one again even with an executable of its own
        # (modes/policy.Eager._run_later)
        self.opens_run = False
        self.aval_uid = None      # interned (shape, dtype) when used as a leaf
        self.layout = None        # the result's BaseLayout (single-output ops), made on first use
        self.sharding = None      # xlanb::mark_sharding: the NamedSharding it constrains to
        self.sharded = None       # input shardings -> its executable for sharded inputs (spmd)
        self.nbytes = result_bytes(out)
        # eager: whether its results remember the user's line (xlanb.memory_by_line).
        # Only results big enough to matter pay for finding the line.
        self.lines = self.nbytes >= config.memory_line_bytes

    def __repr__(self) -> str:
        return f"<OpSignature {self.uid} {self.name}>"


_aval_ids = cache({}, "(shape, dtype) -> negative uid of a leaf type")


def aval_uid(meta: TensorMeta) -> int:
    key = (meta.shape, meta.dtype)
    uid = _aval_ids.get(key)
    if uid is None:
        uid = _aval_ids[key] = -len(_aval_ids) - 1  # negative: never clashes with OpSignature uids
    return uid


class Node:
    """One op application (or a leaf of device data when ``data`` is set)."""

    __slots__ = ("info", "inputs", "scalars", "data", "src", "scope", "__weakref__")

    def __init__(self, info: OpSignature, inputs: tuple = (), scalars: tuple = (), data=None,
                 src: SourceLoc | None = None, scope: str = ""):
        self.info = info
        self.inputs = inputs      # Nodes, in the order the op takes its tensors
        self.scalars = scalars    # lifted Python scalars (values never enter the hash)
        self.data = data          # a jax.Array (tuple for multi-output) once materialized
        self.src = src            # SourceLoc of the user's line that recorded it
        self.scope = scope        # nn.Module path active when recorded

    @property
    def pending(self) -> bool:
        return self.data is None

    def materialize(self, value) -> None:
        """Swap the IR for device data and let go of the inputs."""
        self.data = value
        self.inputs = ()
        self.scalars = ()

    def __repr__(self) -> str:
        state = "data" if self.data is not None else "pending"
        return f"<Node {self.info.name} {state}>"


# ---------------------------------------------------------------------------------------
# Graphs: topological order and structural key

class GraphPlan(NamedTuple):
    """A pending graph: what to compile (``key``/``steps``) and what to feed it."""
    key: tuple                # structural hash: ops, shapes, dtypes, static args, wiring
    leaves: list              # Nodes whose data are the graph's array inputs
    scalars: list             # lifted scalar values, in step order
    steps: list               # (OpSignature, input positions) per op node, topological
    op_nodes: list            # the Nodes of ``steps``, same order
    roots: list               # Nodes to materialize
    root_pos: tuple           # their positions in the value list


def plan_graph(roots: list[Node], known: dict | None = None) -> GraphPlan:
    """Walk back from ``roots`` to materialized leaves, in topological order.

    Nodes whose id is in ``known`` (values computed by a peek) count as leaves too."""
    # Nodes hash by identity (no __eq__), so they key the dicts themselves: every sync and
    # eager run plans its graph, and id() per lookup was a third of this walk's time
    leaf_pos: dict[Node, int] = {}
    op_pos: dict[Node, int] = {}
    leaves: list[Node] = []
    op_nodes: list[Node] = []
    add_leaf, add_op = leaves.append, op_nodes.append
    for root in roots:
        if root in leaf_pos or root in op_pos:
            continue
        stack = [(root, False)]
        pop, push = stack.pop, stack.append
        while stack:
            node, expanded = pop()
            if expanded:  # its inputs are placed
                op_pos[node] = len(op_nodes)
                add_op(node)
                continue
            if node in op_pos or node in leaf_pos:
                continue
            if node.data is not None or (known is not None and id(node) in known):
                leaf_pos[node] = len(leaves)
                add_leaf(node)
                continue
            push((node, True))
            for inp in reversed(node.inputs):
                if inp not in op_pos and inp not in leaf_pos:
                    push((inp, False))
    # Leaves take positions 0..L-1, op nodes L..
    n_leaves = len(leaves)
    pos = {node: p + n_leaves for node, p in op_pos.items()}
    pos.update(leaf_pos)
    at = pos.__getitem__
    key_parts: list = [tuple([leaf_key(n) for n in leaves])]
    steps = []
    scalars: list = []
    for node in op_nodes:
        info = node.info
        ins = tuple(map(at, node.inputs))
        steps.append((info, ins))
        key_parts.append((info.uid, ins))
        if node.scalars:
            scalars.extend(node.scalars)
    root_pos = tuple(map(at, roots))
    key_parts.append(root_pos)
    return GraphPlan(tuple(key_parts), leaves, scalars, steps, op_nodes, roots, root_pos)


def reachable(roots: list[Node]) -> set[int]:
    """The ids of the pending nodes ``roots`` depend on, themselves included."""
    seen: set[int] = set()
    stack = [r for r in roots if r.data is None]
    while stack:
        node = stack.pop()
        nid = id(node)
        if nid in seen:
            continue
        seen.add(nid)
        for inp in node.inputs:
            if inp.data is None and id(inp) not in seen:
                stack.append(inp)
    return seen


def frontier(roots: list[Node], inside: set[int]) -> list[Node]:
    """The nodes in ``inside`` (ids) that the pending work of ``roots`` (none of them
    inside) reads directly: where that work would cut into a graph of ``inside``. A
    multi-output node is never one (its value is a tuple, not a tensor's): the getitems
    outside that pick from it are, instead, every one of them."""
    seen: set[int] = set()
    found: dict[int, Node] = {}
    stack = list(roots)
    while stack:
        node = stack.pop()
        for inp in node.inputs:
            iid = id(inp)
            if inp.data is not None:
                continue
            if inp.info.multi and iid in inside:
                # not only the first getitem the walk meets: work left reading the
                # pending node (LayerNorm's bias gradient) would compute it again
                if node.info.name == GETITEM:
                    found[id(node)] = node
                continue
            if iid in seen:
                continue
            seen.add(iid)
            if iid in inside:
                found[iid] = inp
            else:
                stack.append(inp)
    return list(found.values())


_digests = cache({}, "OpSignature uid -> its process-independent digest")


def info_digest(info: OpSignature) -> bytes:
    """What ``info`` computes, as bytes that are the same in every process (uids are
    not): its signature (op, input layouts, static arguments), result layouts and lifted
    scalars. The executable store keys single-op executables by it."""
    d = _digests.get(info.uid)
    if d is None:
        desc = repr((info.sig, info.out, info.scalar_specs)).encode()
        d = _digests[info.uid] = hashlib.blake2b(desc, digest_size=16).digest()
    return d


def stable_hash(plan: GraphPlan, device: int) -> str:
    """A graph hash that is the same in every process: every op's ``info_digest``, the
    wiring, the leaves' shapes and dtypes, the outputs. The executable store keys whole
    graphs by it, so it must say everything that decides the compiled graph."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((device, [(leaf_meta(n).shape, str(leaf_meta(n).dtype)) for n in plan.leaves],
                   plan.root_pos)).encode())
    for info, ins in plan.steps:
        h.update(info_digest(info))
        h.update(repr(ins).encode())
    return h.hexdigest()


def leaf_meta(node: Node) -> TensorMeta:
    info = node.info
    return info.out if not info.multi else info.out[0]


def leaf_key(node: Node) -> int:
    """A leaf's part of a graph's structural key: its interned (shape, dtype)."""
    info = node.info
    u = info.aval_uid
    if u is None:
        out = info.out
        u = info.aval_uid = aval_uid(out if not info.multi else out[0])
    return u
