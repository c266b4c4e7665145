"""Errors CPU torch raises where XLA returns a value: integer division by zero, and
indices out of range (``index_select``, ``gather``, embedding, losses' targets...).

XLA's integer division by zero gives a value (-1, or the dividend), where CPU torch
raises ``RuntimeError: ZeroDivisionError``. When an op runs on its own (eager mode,
op-by-op syncs, peeks), its divisor is checked first, so those modes raise as CPU torch
does. A lazy graph fuses the division with everything around it and cannot stop in the
middle: there the result is XLA's (docs/DESIGN.md, "Semantics").
"""
from __future__ import annotations

import math
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..base.caches import cache
from ..base.frames import format_loc
from ..ir.nodes import OpSignature, TensorMeta
from ..ir.templates import _In

_INTEGER_DIVISION = frozenset(("aten::div", "aten::floor_divide", "aten::remainder",
                               "aten::fmod"))
_any_zero = jax.jit(lambda d: jnp.any(d == 0))


def integer_division(info: OpSignature) -> bool:
    """Whether ``info`` divides integers (true division of ints gives floats: no error)."""
    if info.name not in _INTEGER_DIVISION or info.multi or info.template is None:
        return False
    dtype = info.out.dtype
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def checked(exe, info: OpSignature):
    """``info``'s single-op executable as it runs: with the divisor check where the op
    divides integers (``DivisorChecked``), else as it is."""
    return DivisorChecked(exe, info) if integer_division(info) else exe


class DivisorChecked:
    """A single-op executable that raises as CPU torch does when its divisor has a zero."""

    _call = None  # no C++ shortcut past the check (single_op.direct_call)

    def __init__(self, exe, info: OpSignature):
        self.exe = exe
        divisor = info.template[0][1] if len(info.template[0]) > 1 else None
        self._input = divisor.i if isinstance(divisor, _In) else None
        self._static_zero = self._input is None and divisor == 0

    def __call__(self, *args):
        if self._static_zero or (self._input is not None and bool(_any_zero(args[self._input]))):
            raise RuntimeError("ZeroDivisionError")
        return self.exe(*args)

    def __getattr__(self, name):  # as_text(), cost_analysis(), ...: the executable's
        return getattr(self.exe, name)


# ---------------------------------------------------------------------------------------
# Index bounds: XLA clamps (gather, take) or drops (scatter) an out-of-range index where
# CPU torch raises. Index values the host has are checked before the op runs
# (dispatch/dispatcher.py); an index computed in a pending graph (lazy, opbyop, a traced
# ``xlanb.compile`` call and its replays) is checked inside the graph itself, as JAX's
# checkify does: one extra output of the graph holds the smallest and largest value of
# every checked index (one fused reduction each, one small read back), and the host
# compares them with the bounds after the run, before any result is swapped in. A
# violation raises torch's error with the op and its line; the op's result (the check's
# guard) is then marked failed: it, and every tensor computed from it, raise that error
# on each read until they are dropped, and syncs leave them pending.
# ``config.check_device_indices`` (XLANB_CHECK_DEVICE_INDICES=0) turns this part off.

class IndexCheck:
    """One index operand of one op call: valid values lie in ``[lo, hi)`` or equal
    ``ignore``; ``error(v)`` is the exception CPU torch raises for the bad value ``v``.
    ``measure`` (a function of the index array, numpy, torch or jax alike) gives the
    values to check where they are not the index's own (masked_scatter: the count of
    its mask's ones)."""

    __slots__ = ("index", "lo", "hi", "ignore", "measure", "error", "op", "src", "scope",
                 "looked", "guards")

    def __init__(self, index, lo: int, hi: int, error, ignore=None, measure=None):
        self.index = index   # the index tensor (dispatch), then a weakref to its value's Node
        self.lo = lo
        self.hi = hi
        self.ignore = ignore
        self.measure = measure
        self.error = error
        self.op = ""
        self.src = None
        self.scope = ""
        self.looked = False  # a look computed its index, in range (check_looked)
        self.guards = []     # weakrefs to the results of the op calls that use the index

    def guard(self, node) -> None:
        """``node``, the op's result, is what a failure of this check marks failed."""
        self.guards.append(weakref.ref(node))

    def guarded(self) -> bool:
        """Whether a result of the op is still held (a check of nothing is not run)."""
        return any(g() is not None for g in self.guards)

    def bad_value(self, mn: int, mx: int):
        """The value to report when the index's range ``[mn, mx]`` leaves the bounds."""
        if mx >= self.hi:
            return mx
        if mn < self.lo:
            return mn
        return None


def _arg(args, kwargs, pos: int, name: str, default=None):
    if pos < len(args):
        return args[pos]
    return kwargs.get(name, default)


def _dim_size(t, dim: int) -> tuple[int, int]:
    """(dim wrapped, size of ``t`` along it); a 0-d tensor counts as one element."""
    nd = t.dim()
    if nd == 0:
        return 0, 1
    d = dim + nd if dim < 0 else dim
    return d, t.shape[d] if 0 <= d < nd else 1


def _bounds_error(cls, fmt: str):
    return lambda d, n: (lambda v: cls(fmt.format(v=v, d=d, n=n)))


_OUT_OF_BOUNDS = "index {v} is out of bounds for dimension {d} with size {n}"


def _along_dim(error, negative=False):
    """Ops taking ``(self, dim, index, ...)``: the index addresses ``self``'s ``dim``."""
    def rule(args, kwargs):
        self, index = args[0], _arg(args, kwargs, 2, "index")
        d, n = _dim_size(self, _arg(args, kwargs, 1, "dim"))
        return [IndexCheck(index, -n if negative else 0, n, error(d, n))]
    return rule


def _index_select_rule(args, kwargs):
    self, index = args[0], _arg(args, kwargs, 2, "index")
    d, n = _dim_size(self, _arg(args, kwargs, 1, "dim"))
    if d == 1 and self.dim() > 1:  # CPU torch's dim-1 kernel has its own message
        err = (lambda v: RuntimeError(f"INDICES element is out of DATA bounds, id={v} "
                                      f"axis_dim={n}"))
    else:
        err = (lambda v: IndexError("index out of range in self"))
    return [IndexCheck(index, 0, n, err)]


def _embedding_rule(args, kwargs):
    weight, index = args[0], _arg(args, kwargs, 1, "indices")
    n = weight.shape[0] if weight.dim() else 1
    return [IndexCheck(index, 0, n, lambda v: IndexError("index out of range in self"))]


def _embedding_renorm_rule(args, kwargs):
    """``embedding(max_norm=...)`` renormalizes the rows it reads first: CPU torch's
    kernel selects each row, and a bad id fails there, with select's message."""
    weight, index = args[0], _arg(args, kwargs, 1, "indices")
    size = list(weight.shape)
    n = size[0] if size else 1
    return [IndexCheck(index, -n, n, lambda v: IndexError(
        f"select(): index {v} out of range for tensor of size {size} at dimension 0"))]


def _embedding_bag_rule(args, kwargs):
    weight, index = args[0], _arg(args, kwargs, 1, "indices")
    n = weight.shape[0] if weight.dim() else 1
    # CPU torch names the position too ("Index 1 of input takes value ..."): a range
    # found on the device has no position
    return [IndexCheck(index, 0, n, lambda v: RuntimeError(
        f"Index of input takes value {v} which is not in the valid range [0, {n})"))]


def _nll_rule(args, kwargs):
    self, target = args[0], _arg(args, kwargs, 1, "target")
    n = self.shape[0 if self.dim() == 1 else 1] if self.dim() else 1
    ignore = _arg(args, kwargs, 4, "ignore_index", -100)
    return [IndexCheck(target, 0, n, lambda v: IndexError(f"Target {v} is out of bounds."),
                       ignore)]


def _margin_rule(args, kwargs):
    self, target = args[0], _arg(args, kwargs, 1, "target")
    n = self.shape[-1] if self.dim() else 1
    return [IndexCheck(target, 0, n, lambda v: RuntimeError("target out of range"))]


def _flat_rule(args, kwargs):
    """take/put: the index addresses ``self`` flattened; negative values count back."""
    self, index = args[0], _arg(args, kwargs, 1, "index")
    n = self.numel()
    return [IndexCheck(index, -n, n, lambda v: IndexError(
        f"out of range: tried to access index {v} on a tensor of {n} elements."))]


def _multilabel_rule(args, kwargs):
    self, target = args[0], _arg(args, kwargs, 1, "target")
    n = self.shape[-1] if self.dim() else 1
    # -1 ends a sample's targets
    return [IndexCheck(target, -1, n, lambda v: RuntimeError(
        "argument #2 'target' is out of range"))]


def _unpool_rule(args, kwargs):
    """max_unpool2d/3d: the indices address each output plane, flattened."""
    index, size = _arg(args, kwargs, 1, "indices"), list(_arg(args, kwargs, 2, "output_size"))
    dims = "x".join(map(str, size))
    return [IndexCheck(index, 0, math.prod(size), lambda v: RuntimeError(
        f"Found an invalid max index: {v} (output volumes are of size {dims})"))]


def _sorter_rule(args, kwargs):
    seq, sorter = args[0], _arg(args, kwargs, 5, "sorter")
    if sorter is None:
        return []
    n = seq.shape[-1] if seq.dim() else 1
    return [IndexCheck(sorter, 0, n, lambda v: RuntimeError(
        "torch.searchsorted(): sorter index out of range"))]


def _select_scatter_rule(args, kwargs):
    self, index = args[0], _arg(args, kwargs, 3, "index")  # a Python int
    d, n = _dim_size(self, _arg(args, kwargs, 2, "dim"))
    size = list(self.shape)
    return [IndexCheck(index, -n, n, lambda v: IndexError(
        f"select(): index {v} out of range for tensor of size {size} at dimension {d}"))]


class _LowFirst(IndexCheck):
    """A check whose op, as CPU torch runs it, tests the smallest value first."""
    __slots__ = ()

    def bad_value(self, mn: int, mx: int):
        return mn if mn < self.lo else super().bad_value(mn, mx)


def _one_hot_rule(args, kwargs):
    # num_classes=-1 was replaced by max + 1 already (dispatch._one_hot)
    index, n = args[0], _arg(args, kwargs, 1, "num_classes")
    return [_LowFirst(index, 0, n, lambda v: RuntimeError(
        "Class values must be non-negative." if v < 0
        else "Class values must be smaller than num_classes."))]


def _count_ones(mask):
    """The number of ones of a mask (numpy, torch or jax)."""
    return (mask != 0).sum()


def _masked_scatter_rule(args, kwargs):
    self, mask, source = args[0], _arg(args, kwargs, 1, "mask"), _arg(args, kwargs, 2, "source")
    # each one of the mask, broadcast with self, takes an element of the source
    per_one = math.prod(torch.broadcast_shapes(self.shape, mask.shape)) // max(mask.numel(), 1)
    if not per_one:
        return []
    return [IndexCheck(mask, 0, source.numel() // per_one + 1, lambda v: RuntimeError(
        "Number of elements of source < number of ones in mask"), measure=_count_ones)]


_gather_error = _bounds_error(RuntimeError, _OUT_OF_BOUNDS)
_scatter_rule = _along_dim(_gather_error)

# aten op name (in-place and functional alike) -> rule(args, kwargs) -> [IndexCheck]
INDEX_RULES = {
    "aten::gather": _along_dim(_gather_error),
    "aten::scatter": _scatter_rule, "aten::scatter_": _scatter_rule,
    "aten::scatter_add": _scatter_rule, "aten::scatter_add_": _scatter_rule,
    "aten::scatter_reduce": _scatter_rule, "aten::scatter_reduce_": _scatter_rule,
    "aten::index_add": _scatter_rule, "aten::index_add_": _scatter_rule,
    "aten::index_copy": _along_dim(_bounds_error(IndexError, "index_copy_(): " + _OUT_OF_BOUNDS)),
    "aten::index_copy_": _along_dim(_bounds_error(IndexError, "index_copy_(): " + _OUT_OF_BOUNDS)),
    "aten::index_fill": _along_dim(_bounds_error(IndexError, _OUT_OF_BOUNDS), negative=True),
    "aten::index_fill_": _along_dim(_bounds_error(IndexError, _OUT_OF_BOUNDS), negative=True),
    "aten::index_reduce": _along_dim(_bounds_error(IndexError, "index out of range in self")),
    "aten::index_reduce_": _along_dim(_bounds_error(IndexError, "index out of range in self")),
    "aten::index_select": _index_select_rule,
    "aten::embedding": _embedding_rule,
    "aten::embedding_renorm": _embedding_renorm_rule,
    "aten::embedding_renorm_": _embedding_renorm_rule,
    "aten::_embedding_bag": _embedding_bag_rule,
    "aten::_embedding_bag_forward_only": _embedding_bag_rule,
    "aten::nll_loss_forward": _nll_rule, "aten::nll_loss2d_forward": _nll_rule,
    "aten::multi_margin_loss": _margin_rule,
    "aten::multilabel_margin_loss_forward": _multilabel_rule,
    "aten::max_unpool2d": _unpool_rule, "aten::max_unpool3d": _unpool_rule,
    "aten::searchsorted": _sorter_rule,
    "aten::select_scatter": _select_scatter_rule,
    "aten::one_hot": _one_hot_rule,
    "aten::masked_scatter": _masked_scatter_rule, "aten::masked_scatter_": _masked_scatter_rule,
    "aten::take": _flat_rule, "aten::put": _flat_rule, "aten::put_": _flat_rule,
}


def host_range(values, ignore=None, measure=None):
    """(min, max) of a CPU index tensor or array (or of its ``measure``), leaving out
    ``ignore``; None if none is left."""
    v = np.asarray(values if measure is None else measure(values)).reshape(-1)
    if ignore is not None:
        v = v[v != ignore]
    if not v.size:
        return None
    return int(v.min()), int(v.max())


def _int_range(x, ignore, measure=None):
    if measure is not None:
        x = measure(x)
    v = x.reshape(-1).astype(jnp.int64)
    big, small = jnp.iinfo(jnp.int64).max, jnp.iinfo(jnp.int64).min
    if ignore is None:
        return jnp.min(v, initial=big), jnp.max(v, initial=small)
    keep = v != ignore
    return (jnp.min(jnp.where(keep, v, big), initial=big),
            jnp.max(jnp.where(keep, v, small), initial=small))


_device_range = jax.jit(lambda x, ignore, measure: jnp.stack(_int_range(x, ignore, measure)),
                        static_argnums=(1, 2))


def device_range(array, ignore=None, measure=None):
    """(min, max) of an index array already on the device: one fused reduction and a
    read of two numbers (an eager index too big to read back whole); None if empty."""
    with jax.enable_x64(True):
        mn, mx = (int(v) for v in jax.device_get(_device_range(array, ignore, measure)))
    return None if mn > mx else (mn, mx)


# Index checks recorded with pending indices, waiting for the next sync to run them:
# (id of the index's node, lo, hi, ignore, measure) -> IndexCheck (each holds its node).
pending_index_checks: dict = {}

_bounds_infos = cache({}, "index-bounds checks' OpInfos, by (metas, specs, device)", compiled=True)
BOUNDS_OP = "xlanb::index_bounds"


def bounds_info(metas: tuple, specs: tuple, device: int) -> OpSignature:
    """The op a sync adds to its graph: the (min, max) of each checked index, as one
    int64 vector ``[min0, max0, min1, max1, ...]``. Keyed by the indices' shapes and
    dtypes and each check's ``(ignore, measure)`` only: the bounds are compared on the
    host, so they never enter the graph's key."""
    key = (BOUNDS_OP, metas, specs, device)
    info = _bounds_infos.get(key)
    if info is None:
        def fn(ins, scs):
            out = []
            for x, (ignore, measure) in zip(ins, specs):
                out.extend(_int_range(x, ignore, measure))
            return jnp.stack(out)
        out = TensorMeta((2 * len(metas),), (1,), torch.int64)
        info = _bounds_infos[key] = OpSignature(BOUNDS_OP, key, fn, out, n_in=len(metas),
                                           device=device, in_metas=metas)
    return info


def add_pending_check(c: IndexCheck, node) -> IndexCheck:
    """Leave ``c`` to the next sync (or the end of a traced ``xlanb.compile`` call), which
    checks the value of ``node`` in its graph. Returns the check that waits: one already
    there for the same index and bounds, else ``c``. The check holds the node weakly:
    pending work nobody holds is never run, nor checked."""
    key = (id(node), c.lo, c.hi, c.ignore, c.measure)
    got = pending_index_checks.get(key)
    if got is None:
        c.index = weakref.ref(node, lambda _, key=key: pending_index_checks.pop(key, None))
        got = pending_index_checks[key] = c
    return got


def take_index_checks(device: int) -> list:
    """``(check, index node)`` for each pending index check on ``device`` whose op's
    result is still held and whose index can be computed (they stay pending until
    ``settle_index_checks``)."""
    out = []
    for c in list(pending_index_checks.values()):
        node = c.index()
        if node is not None and node.info.device == device and c.guarded():
            out.append((c, node))
    if failed_nodes:  # an index computed from a failed result has no value to check
        keep = {id(n) for n in without_failed([n for _, n in out])}
        out = [(c, n) for c, n in out if id(n) in keep]
    return out


def pending_devices() -> set:
    """The devices with pending index checks."""
    return {n.info.device for n in (c.index() for c in list(pending_index_checks.values()))
            if n is not None}


def bad_indices(checks: list, ranges) -> list:
    """``(check, bad value)`` for each of ``checks`` whose index left its bounds
    (``ranges``: the bounds op's output)."""
    values = np.asarray(ranges).reshape(-1, 2).tolist()
    found = ((c, c.bad_value(mn, mx)) for c, (mn, mx) in zip(checks, values))
    return [(c, v) for c, v in found if v is not None]


def settle_index_checks(checks: list, ranges, how: str) -> None:
    """After a sync's run computed ``checks``' ranges, before anything is swapped in:
    drop them from the pending ones, mark the results of those whose index left its
    bounds failed, and raise torch's error for the first (``how``: where it was found)."""
    bad = bad_indices(checks, ranges)
    ran = {id(c) for c in checks}
    for k, c in list(pending_index_checks.items()):
        if id(c) in ran:
            del pending_index_checks[k]
    for c, v in bad:
        mark_failed(c, v)
    if bad:
        raise index_error(*bad[0], how)


# Results of op calls whose index check failed: id(node) -> (weakref(node), check, bad
# value). Each, and every node computed from it, raises the check's error when read.
failed_nodes: dict = {}

FAILED_NOTE = ("the op's result, and every tensor computed from it, raise this error on "
               "each read until they are dropped")


def mark_failed(c: IndexCheck, v: int) -> None:
    """Mark the pending results ``c`` guards failed, with the bad value ``v``."""
    for g in c.guards:
        node = g()
        if node is not None and node.data is None:
            key = id(node)
            failed_nodes[key] = (weakref.ref(node, lambda _, key=key: failed_nodes.pop(key, None)),
                                 c, v)


def check_not_failed(nodes) -> None:
    """Raise the error of the first of ``nodes`` (a plan's op nodes) that is a failed
    result: computing it, or anything from it, would give XLA's values for a bad index."""
    for n in nodes:
        got = failed_nodes.get(id(n))
        if got is not None and got[0]() is n:
            raise index_error(got[1], got[2], "its index check failed before: " + FAILED_NOTE)


def without_failed(roots: list) -> list:
    """``roots`` (pending nodes) less those computed from a failed result: what a sync
    can still run (the others stay pending, and raise when read)."""
    if not failed_nodes:
        return roots
    return without_nodes(roots, failed_nodes)


def without_nodes(roots: list, bad) -> list:
    """``roots`` (pending nodes) less those computed from a node whose id is in ``bad``."""
    tainted: dict[int, bool] = {}
    for root in roots:
        stack = [root]
        while stack:
            n = stack[-1]
            if id(n) in tainted:
                stack.pop()
                continue
            todo = [i for i in n.inputs if id(i) not in tainted]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            tainted[id(n)] = id(n) in bad or any(tainted[id(i)] for i in n.inputs)
    return [r for r in roots if not tainted[id(r)]]


def index_error(c: IndexCheck, v: int, how: str) -> Exception:
    """CPU torch's error for the bad index value ``v``, with a note naming the op, its
    line and scope."""
    err = c.error(v)
    where = f" at {format_loc(c.src)}" if c.src is not None else ""
    scope = f" [{c.scope}]" if c.scope else ""
    err.add_note(f"xlanb: in {c.op}{where}{scope}; {how}.")
    return err


def check_looked(values) -> None:
    """After a look (a peek) computed pending values op by op (``values``: node id ->
    array): raise for a pending index check whose index it computed and that leaves its
    bounds, so that a look never shows the values XLA made from a bad index; the op's
    result is marked failed, as a sync's check does. A check that passes here is not
    looked at again (the sync still runs it in its graph)."""
    for key, c in list(pending_index_checks.items()):
        node = c.index()
        if c.looked or node is None:
            continue
        arr = values.get(id(node))
        if arr is None:
            continue
        found = host_range(arr, c.ignore, c.measure)
        bad = c.bad_value(*found) if found is not None else None
        c.looked = True
        if bad is not None:
            pending_index_checks.pop(key, None)
            mark_failed(c, bad)
            raise index_error(c, bad, "found when a look (peek, print, pdb) computed its "
                              "index; " + FAILED_NOTE)
