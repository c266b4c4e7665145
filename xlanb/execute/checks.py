"""Errors CPU torch raises where XLA returns a value: integer division by zero.

XLA's integer division by zero gives a value (-1, or the dividend), where CPU torch
raises ``RuntimeError: ZeroDivisionError``. When an op runs on its own (eager mode,
op-by-op syncs, peeks), its divisor is checked first, so those modes raise as CPU torch
does. A lazy graph fuses the division with everything around it and cannot stop in the
middle: there the result is XLA's (docs/DESIGN.md, "Semantics").
"""
from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..base.caches import cache
from ..base.frames import format_loc
from ..ir import OpInfo, TensorMeta
from ..templates import _In

_INTEGER_DIVISION = frozenset(("aten::div", "aten::floor_divide", "aten::remainder",
                               "aten::fmod"))
_any_zero = jax.jit(lambda d: jnp.any(d == 0))


def integer_division(info: OpInfo) -> bool:
    """Whether ``info`` divides integers (true division of ints gives floats: no error)."""
    if info.name not in _INTEGER_DIVISION or info.multi or info.template is None:
        return False
    dtype = info.out.dtype
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def checked(exe, info: OpInfo):
    """``info``'s single-op executable as it runs: with the divisor check where the op
    divides integers (``DivisorChecked``), else as it is."""
    return DivisorChecked(exe, info) if integer_division(info) else exe


class DivisorChecked:
    """A single-op executable that raises as CPU torch does when its divisor has a zero."""

    _call = None  # no C++ shortcut past the check (single_op.direct_call)

    def __init__(self, exe, info: OpInfo):
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
# (dispatch.py); an index computed in a pending graph (lazy, opbyop) is checked inside
# the graph itself, as JAX's checkify does: at each sync, one extra output of the graph
# holds the smallest and largest value of every pending checked index (one fused
# reduction each, one small read back), and the host compares them with the bounds
# after the run, before any result is swapped in. A violation raises torch's error with
# the op and its line, once (the check is dropped: the next sync runs as XLA computes).
# ``config.check_device_indices`` (XLANB_CHECK_DEVICE_INDICES=0) turns this part off.

class IndexCheck:
    """One index operand of one op call: valid values lie in ``[lo, hi)`` or equal
    ``ignore``; ``error(v)`` is the exception CPU torch raises for the bad value ``v``."""

    __slots__ = ("index", "lo", "hi", "ignore", "error", "op", "src", "scope", "looked")

    def __init__(self, index, lo: int, hi: int, error, ignore=None):
        self.index = index   # the index tensor (dispatch), then a weakref to its value's Node
        self.lo = lo
        self.hi = hi
        self.ignore = ignore
        self.error = error
        self.op = ""
        self.src = None
        self.scope = ""
        self.looked = False  # a look computed its index, in range (check_looked)

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
    "aten::_embedding_bag": _embedding_bag_rule,
    "aten::_embedding_bag_forward_only": _embedding_bag_rule,
    "aten::nll_loss_forward": _nll_rule, "aten::nll_loss2d_forward": _nll_rule,
    "aten::multi_margin_loss": _margin_rule,
    "aten::take": _flat_rule, "aten::put": _flat_rule, "aten::put_": _flat_rule,
}


def host_range(values, ignore=None):
    """(min, max) of a CPU index tensor, leaving out ``ignore``; None if none is left."""
    v = values.reshape(-1)
    if ignore is not None:
        v = v[v != ignore]
    if not v.numel():
        return None
    return int(v.min()), int(v.max())


def _int_range(x, ignore):
    v = x.reshape(-1).astype(jnp.int64)
    big, small = jnp.iinfo(jnp.int64).max, jnp.iinfo(jnp.int64).min
    if ignore is None:
        return jnp.min(v, initial=big), jnp.max(v, initial=small)
    keep = v != ignore
    return (jnp.min(jnp.where(keep, v, big), initial=big),
            jnp.max(jnp.where(keep, v, small), initial=small))


_device_range = jax.jit(lambda x, ignore: jnp.stack(_int_range(x, ignore)), static_argnums=1)


def device_range(array, ignore=None):
    """(min, max) of an index array already on the device: one fused reduction and a
    read of two numbers (an eager index too big to read back whole); None if empty."""
    with jax.enable_x64(True):
        mn, mx = (int(v) for v in jax.device_get(_device_range(array, ignore)))
    return None if mn > mx else (mn, mx)


# Index checks recorded with pending indices, waiting for the next sync to run them:
# (id of the index's node, lo, hi, ignore) -> IndexCheck (each holds its node).
pending_index_checks: dict = {}

_bounds_infos = cache({}, "index-bounds checks' OpInfos, by (metas, ignores, device)", compiled=True)
BOUNDS_OP = "xlanb::index_bounds"


def bounds_info(metas: tuple, ignores: tuple, device: int) -> OpInfo:
    """The op a sync adds to its graph: the (min, max) of each checked index, as one
    int64 vector ``[min0, max0, min1, max1, ...]``. Keyed by the indices' shapes, dtypes
    and ignored values only: the bounds are compared on the host, so they never enter
    the graph's key."""
    key = (BOUNDS_OP, metas, ignores, device)
    info = _bounds_infos.get(key)
    if info is None:
        def fn(ins, scs):
            out = []
            for x, ig in zip(ins, ignores):
                out.extend(_int_range(x, ig))
            return jnp.stack(out)
        out = TensorMeta((2 * len(metas),), (1,), torch.int64)
        info = _bounds_infos[key] = OpInfo(BOUNDS_OP, key, fn, out, n_in=len(metas),
                                           device=device, in_metas=metas)
    return info


def add_pending_check(c: IndexCheck, node) -> None:
    """Leave ``c`` to the next sync, which checks the value of ``node`` in its graph. The
    check holds the node weakly: pending work nobody holds is never run, nor checked."""
    key = (id(node), c.lo, c.hi, c.ignore)
    if key not in pending_index_checks:
        c.index = weakref.ref(node, lambda _, key=key: pending_index_checks.pop(key, None))
        pending_index_checks[key] = c


def take_index_checks(device: int) -> list:
    """``(check, index node)`` for each pending index check on ``device`` (they stay
    pending until ``settle_index_checks``)."""
    out = []
    for c in list(pending_index_checks.values()):
        node = c.index()
        if node is not None and node.info.device == device:
            out.append((c, node))
    return out


def pending_devices() -> set:
    """The devices with pending index checks."""
    return {n.info.device for n in (c.index() for c in list(pending_index_checks.values()))
            if n is not None}


def settle_index_checks(checks: list, ranges, sync_what: str) -> None:
    """After a run: drop ``checks`` and raise torch's error for the first whose index left
    its bounds (``ranges``: the bounds op's output). Each is reported once: the one
    raised is dropped with those that passed; any later failing one stays pending."""
    values = np.asarray(ranges).reshape(-1, 2).tolist()
    first = None
    keep = set()
    for c, (mn, mx) in zip(checks, values):
        v = c.bad_value(mn, mx)
        if v is None:
            continue
        if first is None:
            first = (c, v)
        else:
            keep.add(id(c))
    ran = {id(c) for c in checks}
    for k, c in list(pending_index_checks.items()):
        if id(c) in ran and id(c) not in keep:
            del pending_index_checks[k]
    if first is not None:
        c, v = first
        raise index_error(c, v, f"found by the index check compiled into {sync_what}. The "
                          "pending tensors are unchanged (no result was swapped in); this "
                          "index is reported once: a later sync gives XLA's values (clamped "
                          "or dropped indices). XLANB_CHECK_DEVICE_INDICES=0 turns this "
                          "check off")


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
    bounds, so that a look never shows the values XLA made from a bad index. Reported
    once: a check that raises, or passes, here is not looked at again (the sync still
    runs it in its graph, unless it raised)."""
    for key, c in list(pending_index_checks.items()):
        node = c.index()
        if c.looked or node is None:
            continue
        arr = values.get(id(node))
        if arr is None:
            continue
        v = np.asarray(arr).reshape(-1)
        if c.ignore is not None:
            v = v[v != c.ignore]
        bad = c.bad_value(int(v.min()), int(v.max())) if v.size else None
        c.looked = True
        if bad is not None:
            pending_index_checks.pop(key, None)
            raise index_error(c, bad, "found when a look (peek, print, pdb) computed its "
                              "index; the pending tensors are unchanged, and the next sync "
                              "gives XLA's values for it (reported once)")
