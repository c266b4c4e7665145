"""From an aten call on xla tensors to a recorded IR node or a run single-op executable.

Per call: find the op's plan (functional, view, in-place, out= or mutating; its lowering),
compute its signature (op, input shapes/strides/dtypes, static args), look up the
``OpInfo`` for that signature (built once, with torch's meta kernels giving the result
shapes and dtypes), then record a node (lazy, opbyop) or run the cached single-op
executable (eager). In-place ops, ``out=`` and views are all reduced to functional nodes
plus writes into storages.
"""
from __future__ import annotations

import functools
import warnings

import jax
import numpy as np
import torch

from . import metrics, rng
from .config import config
from .dtypes import to_jax_dtype
from .ir import GETITEM, Node, OpInfo, TensorMeta, current_scope, user_frame
from .lowering import registry
from .modes import state as mode_state
from .executor import node_array, op_executable
from .sync import track
from .tensor import Storage, XlaTensor, new_tensor, sig_key_meta

_x64 = functools.partial(jax.enable_x64, True)

aten = torch.ops.aten


# ---------------------------------------------------------------------------------------
# Templates: an op's arguments with tensors and lifted floats replaced by slots

class _In:
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


class _Sc:
    __slots__ = ("j",)

    def __init__(self, j):
        self.j = j


_FLOAT = "<float>"  # stands for a lifted float in a signature


def _sig_of(x, tensors, scalars, lift):
    """Signature element of one argument; collects tensors and lifted floats on the way."""
    tx = type(x)
    if tx is XlaTensor:
        tensors.append(x)
        return x._key
    if isinstance(x, torch.Tensor):
        if not isinstance(x, XlaTensor):
            x = _from_host_arg(x)
        tensors.append(x)
        return x._key
    if tx is float and lift:
        scalars.append(x)
        return _FLOAT
    if tx is list or tx is tuple:
        return tuple([_sig_of(e, tensors, scalars, lift) for e in x])
    return x


def _readable_sig(x, lift):
    """The signature with tensors spelled out: stable across processes (for hashes)."""
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), tuple(x.stride()), x.dtype)
    if type(x) is float and lift:
        return _FLOAT
    if type(x) in (list, tuple):
        return tuple(_readable_sig(e, lift) for e in x)
    return x


def _template_of(x, counters, lift):
    if isinstance(x, torch.Tensor):
        counters[0] += 1
        return _In(counters[0] - 1)
    tx = type(x)
    if tx is float and lift:
        counters[1] += 1
        return _Sc(counters[1] - 1)
    if tx is list or tx is tuple:
        return tx(_template_of(e, counters, lift) for e in x)
    return x


def _fill(x, ins, scs):
    tx = type(x)
    if tx is _In:
        return ins[x.i]
    if tx is _Sc:
        return scs[x.j]
    if tx is list or tx is tuple:
        return tx(_fill(e, ins, scs) for e in x)
    return x


def _fill_call(template, ins, scs):
    targs, tkwargs = template
    return [_fill(a, ins, scs) for a in targs], {k: _fill(v, ins, scs) for k, v in tkwargs.items()}


def _meta_tensor(t: XlaTensor) -> torch.Tensor:
    m = t._meta
    return torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta")


def _meta_of(x) -> TensorMeta:
    return TensorMeta(tuple(x.shape), tuple(x.stride()), x.dtype, x.storage_offset())


def _metas(out):
    if isinstance(out, torch.Tensor):
        return _meta_of(out)
    if isinstance(out, (tuple, list)):
        return tuple(_metas(o) for o in out)
    return out


# ---------------------------------------------------------------------------------------
# Op plans: what kind of op this is and how to lower it (one per OpOverload)

class OpPlan:
    __slots__ = ("op", "kind", "fop", "lowering", "decomp", "mutated", "lift", "random", "name",
                 "special")

    def __init__(self, op, kind, fop, mutated):
        self.op = op
        self.special = None       # a handler that replaces the generic path (see _SPECIAL)
        self.kind = kind          # functional | view | inplace | out | mutating
        self.fop = fop            # the functional op that nodes record
        self.mutated = mutated    # positions (int) or kwarg names (str) written to
        self.name = f"aten::{op.__name__.split('.')[0]}" if hasattr(op, "__name__") else str(op)
        low = registry.lookup(fop) if fop is not None else None
        self.lowering = low
        self.decomp = None
        if low is None and fop is not None:
            self.decomp = _decomposition(fop)
        # Floats are lifted into inputs only for JAX lowerings that accept traced floats.
        self.lift = low is not None and not low.static_floats
        self.random = low is not None and low.random


@functools.cache
def _decomposition_table():
    from torch._decomp import core_aten_decompositions, decomposition_table
    table = dict(decomposition_table)
    table.update(core_aten_decompositions())
    return table


def _decomposition(op):
    return _decomposition_table().get(op)


def _functional_variant(op, kind, schema):
    packet = op.overloadpacket
    name = packet.__name__
    overload = op._overloadname
    if kind == "inplace":
        candidates = [(name[:-1], overload), (name[:-1] + "_functional", overload),
                      (name[:-1], "default")]
        for pname, oname in candidates:
            p = getattr(aten, pname, None)
            if p is not None and oname in p.overloads():
                f = getattr(p, oname)
                if not any(a.alias_info is not None and a.alias_info.is_write
                           for a in f._schema.arguments):
                    return f
        return None
    if kind == "out":
        want = [a.name for a in schema.arguments if not _is_written(a)]
        for oname in packet.overloads():
            f = getattr(packet, oname)
            s = f._schema
            if any(_is_written(a) for a in s.arguments):
                continue
            if [a.name for a in s.arguments] == want:
                return f
        return None
    if kind == "mutating":
        # _foo_functional returns results then new values; foo_ (e.g. _foreach_mul_ with
        # a list argument) has the plain functional foo.
        for pname in (name + "_functional", name[:-1] if name.endswith("_") else None):
            p = getattr(aten, pname, None) if pname else None
            if p is not None and overload in p.overloads():
                return getattr(p, overload)
        return None
    return op


def _is_written(arg) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


_plans: dict = {}


def _plan(op) -> OpPlan:
    plan = _plans.get(id(op))  # id: OpOverload.__hash__ is Python code, called per op
    if plan is None:
        schema = op._schema
        written = [(i, a) for i, a in enumerate(schema.arguments) if _is_written(a)]
        if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
            kind, mutated = "view", ()
        elif not written:
            kind, mutated = "functional", ()
        elif all(a.kwarg_only for _, a in written):
            kind, mutated = "out", tuple(a.name for _, a in written)
        elif len(written) == 1 and written[0][0] == 0 and schema.returns and \
                schema.returns[0].alias_info is not None:
            kind, mutated = "inplace", (0,)
        else:
            kind, mutated = "mutating", tuple(i for i, _ in written)
        fop = _functional_variant(op, kind, schema)
        plan = _plans[id(op)] = OpPlan(op, kind, fop, mutated)
        plan.special = _SPECIAL.get(op)
    return plan


# ---------------------------------------------------------------------------------------
# OpInfos: one per signature, shared by eager calls and recorded nodes

_infos: dict = {}
_getitem_infos: dict = {}


def _conform(res, out, name):
    """Cast a lowering's result to torch's dtype and check its shape against torch's."""
    if isinstance(out, TensorMeta):
        if res.shape != out.shape:
            raise RuntimeError(f"xlanb: lowering of {name} gave shape {res.shape}, "
                               f"torch expects {out.shape}")
        want = to_jax_dtype(out.dtype)
        return res if res.dtype == want else res.astype(want)
    if isinstance(out, tuple):
        return tuple(_conform(r, o, name) if o is not None and r is not None else r
                     for r, o in zip(res, out))
    return res


def _lowered_fn(plan: OpPlan, template, out):
    low = plan.lowering.fn
    name = plan.name
    if plan.random:
        def fn(ins, scs):
            args, kwargs = _fill_call(template, ins, scs)
            kwargs["rng"] = jax.random.wrap_key_data(scs[-1])
            return _conform(low(*args, **kwargs), out, name)
    else:
        def fn(ins, scs):
            args, kwargs = _fill_call(template, ins, scs)
            return _conform(low(*args, **kwargs), out, name)
    return fn


def _decomposed_fn(plan: OpPlan, template, out):
    decomp = plan.decomp
    name = plan.name

    def fn(ins, scs):
        # Run torch's decomposition on tensors that hold JAX values, op by op, right now.
        tensors = [direct_tensor(a) for a in ins]
        args, kwargs = _fill_call(template, tensors, scs)
        with direct_mode():
            res = decomp(*args, **kwargs)
        return _conform(_unwrap_direct(res), out, name)
    return fn


def _view_raw_fn(plan: OpPlan, template):
    """A view op without the dtype cast: view chains also run on index arrays."""
    low = plan.lowering.fn if plan.lowering is not None else None
    if low is None:
        return None

    def raw(x):
        args, kwargs = _fill_call(template, [x], ())
        return low(*args, **kwargs)
    return raw


def _check_traceable(fn, tensors, scalars, random) -> None:
    """Trace ``fn`` once on abstract values; NotImplementedError if it cannot lower (an
    op inside a decomposition has no lowering, or a lowering refuses these inputs), so
    the caller falls back to CPU."""
    specs = [jax.ShapeDtypeStruct(t._meta.shape, to_jax_dtype(t._meta.dtype)) for t in tensors]
    scs = list(scalars) + ([np.zeros(2, np.uint32)] if random else [])
    try:
        with jax.enable_x64(True):
            jax.eval_shape(lambda *a: fn(a, scs), *specs)
    except NotImplementedError:
        raise
    except Exception as e:
        raise NotImplementedError(f"torch's decomposition does not lower: {e}") from e


class _InfoExtra:
    """Per-kind data an OpInfo carries besides its evaluator."""
    __slots__ = ("plan", "in_metas", "view_raw", "template")

    def __init__(self, plan, in_metas, view_raw=None, template=None):
        self.plan = plan
        self.in_metas = in_metas
        self.view_raw = view_raw
        self.template = template  # (args, kwargs) with _In/_Sc slots, for display


def format_call(info: OpInfo, input_names: list, scalars) -> str:
    """``info``'s arguments as text, tensors named by ``input_names``."""
    extra = info.extra
    template = extra.template if extra is not None else None
    if template is None:
        return ", ".join(input_names)
    args, kwargs = _fill_call(template, [_Name(n) for n in input_names], list(scalars))
    parts = [_fmt_arg(a) for a in args] + [f"{k}={_fmt_arg(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


class _Name(str):
    pass


def _fmt_arg(a) -> str:
    if isinstance(a, _Name):
        return str(a)
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_fmt_arg(e) for e in a) + "]"
    if isinstance(a, float):
        return f"{a:g}"
    if isinstance(a, np.ndarray):
        return "<rng key>"
    return repr(a) if not isinstance(a, torch.dtype) else str(a).replace("torch.", "")


def _new_info(plan: OpPlan, op, sig, args, kwargs, tensors, scalars, device, outs=()) -> OpInfo:
    """Build the OpInfo of one signature. For out= ops, ``kwargs`` and ``tensors`` exclude
    the out tensors, which are passed as ``outs`` (in ``plan.mutated`` order)."""
    lift = plan.lift
    counters = [0, 0]
    targs = [_template_of(a, counters, lift) for a in args]
    tkwargs = {k: _template_of(v, counters, lift) for k, v in kwargs.items()}
    # torch's own meta kernel checks the call as made (in-place, out= included)...
    margs, mkwargs = _fill_call((targs, tkwargs), [_meta_tensor(t) for t in tensors], scalars)
    if "device" in mkwargs:
        mkwargs["device"] = "meta"
    for name, o in zip(plan.mutated if plan.kind == "out" else (), outs):
        mkwargs[name] = _meta_tensor(o)
    tkwargs = {k: v for k, v in tkwargs.items() if k not in ("device", "pin_memory")}
    with torch._C._DisableTorchDispatch():
        meta_res = op(*margs, **mkwargs)
        # ...and the functional op that nodes record gives the result shapes and dtypes.
        if plan.fop is not op:
            fargs, fkwargs = _fill_call((targs, tkwargs), [_meta_tensor(t) for t in tensors], scalars)
            meta_res = plan.fop(*fargs, **fkwargs)
    out = _metas(meta_res)
    template = (targs, tkwargs)
    if plan.lowering is not None:
        fn = _lowered_fn(plan, template, out)
        if plan.lowering.may_refuse:
            _check_traceable(fn, tensors, scalars, plan.random)
    else:
        fn = _decomposed_fn(plan, template, out)
        _check_traceable(fn, tensors, scalars, False)
    specs = ("f",) * len(scalars) if lift else ()
    if plan.random:
        specs = specs + ("key",)
    info = OpInfo(plan.name, sig, fn, out, op=plan.fop, n_in=len(tensors),
                  scalar_specs=specs, device=device)
    view_raw = _view_raw_fn(plan, template) if plan.kind == "view" else None
    info.extra = _InfoExtra(plan, tuple(t._meta for t in tensors), view_raw, template)
    return info


def getitem_info(info: OpInfo, i: int) -> OpInfo:
    key = (info.uid, i)
    gi = _getitem_infos.get(key)
    if gi is None:
        gi = OpInfo(GETITEM, (GETITEM, info.sig, i), lambda ins, scs: ins[0][i], info.out[i], n_in=1,
                    device=info.device)
        gi.extra = _InfoExtra(None, (None,))
        _getitem_infos[key] = gi
    return gi


# ---------------------------------------------------------------------------------------
# Running or recording one op

_direct = [0]  # >0 while tracing a decomposition: ops run on JAX values immediately


class direct_mode:
    def __enter__(self):
        _direct[0] += 1

    def __exit__(self, *exc):
        _direct[0] -= 1


def direct_tensor(array) -> XlaTensor:
    from .dtypes import to_torch_dtype
    shape = tuple(array.shape)
    meta = TensorMeta(shape, _contiguous_strides(shape), to_torch_dtype(array.dtype))
    return new_tensor(Node(data_info(meta, 0), data=array), meta, 0)


def _unwrap_direct(res):
    if isinstance(res, XlaTensor):
        return value_node(res).data
    if isinstance(res, (tuple, list)):
        return tuple(_unwrap_direct(r) for r in res)
    return res


def _contiguous_strides(shape) -> tuple:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def run_node(info: OpInfo, inputs: tuple, scalars: tuple) -> Node:
    """Record (lazy/opbyop) or run now (eager, direct) one op; returns its node."""
    if mode_state.recording and not _direct[0]:
        return Node(info, inputs, scalars, None, user_frame(), current_scope())
    if _direct[0]:
        return Node(info, (), (), info.fn([n.data for n in inputs], scalars))
    exe = op_executable(info)
    arrays = [n.data if n.data is not None else node_array(n) for n in inputs]
    with _x64():
        data = exe(*arrays, *scalars)
    return Node(info, (), (), data)


def output_node(parent: Node, info: OpInfo, i: int) -> Node:
    gi = getitem_info(info, i)
    if parent.data is not None:
        return Node(gi, data=parent.data[i])
    return Node(gi, (parent,), src=parent.src, scope=parent.scope)


_data_infos: dict = {}


def data_info(meta: TensorMeta, device: int) -> OpInfo:
    """The info of device data (a leaf) with this shape and dtype."""
    key = (meta.shape, meta.dtype, device)
    info = _data_infos.get(key)
    if info is None:
        info = OpInfo("device_data", ("data",) + key, None, meta, device=device)
        info.extra = _InfoExtra(None, ())
        _data_infos[key] = info
    return info


_empty_infos: dict = {}


def empty_info(meta: TensorMeta, device: int) -> OpInfo:
    """Uninitialized memory: zeros if ever read, usually overwritten first."""
    key = (meta.shape, meta.dtype, device)
    info = _empty_infos.get(key)
    if info is None:
        shape, dt = meta.shape, to_jax_dtype(meta.dtype)
        info = OpInfo("aten::empty", ("empty",) + key,
                      lambda ins, scs: jax.numpy.zeros(shape, dt), meta, device=device)
        info.extra = _InfoExtra(None, ())
        _empty_infos[key] = info
    return info


# ---------------------------------------------------------------------------------------
# Reading and writing tensor values (views included)

def value_node(t: XlaTensor) -> Node:
    """The node holding ``t``'s current value."""
    view = t._view
    s = t._storage
    if not view:
        return s.node
    if t._ver != s.version:
        node = s.node
        for info, idx in view:
            node = run_node(info, (node,), ())
            if idx is not None:
                node = output_node(node, info, idx)
        t._node = node
        t._ver = s.version
    return t._node


_scatter_infos: dict = {}


def _view_scatter_info(base_meta: TensorMeta, view_meta: TensorMeta, chain, device) -> OpInfo:
    key = (base_meta.shape, base_meta.dtype, view_meta.shape, view_meta.dtype,
           tuple((info.uid, idx) for info, idx in chain), device)
    info = _scatter_infos.get(key)
    if info is None:
        raws = []
        for vinfo, idx in chain:
            raw = vinfo.extra.view_raw
            if raw is None:
                raise NotImplementedError(f"xlanb: writing through a {vinfo.name} view is not supported")
            raws.append((raw, idx))
        shape = base_meta.shape
        size = int(np.prod(shape, dtype=np.int64))

        def scatter(ins, scs):
            # Which base elements does the view see? Run the same view chain on an iota.
            base, value = ins
            jnp = jax.numpy
            idx_arr = jnp.arange(size, dtype=jnp.int64).reshape(shape)
            for raw, k in raws:
                idx_arr = raw(idx_arr)
                if k is not None:
                    idx_arr = idx_arr[k]
            flat = base.reshape(-1).at[idx_arr.reshape(-1)].set(
                jnp.broadcast_to(value.astype(base.dtype), idx_arr.shape).reshape(-1))
            return flat.reshape(shape)

        sig = ("view_scatter", base_meta, view_meta, tuple((i.sig, k) for i, k in chain), device)
        info = OpInfo("view_scatter", sig, scatter, base_meta, n_in=2,
                      device=device)
        info.extra = _InfoExtra(None, (base_meta, view_meta))
        _scatter_infos[key] = info
    return info


def write(t: XlaTensor, node: Node) -> None:
    """Make ``node`` the new value of ``t``, writing through to its base if it is a view."""
    s = t._storage
    if t._view:
        sinfo = _view_scatter_info(s.meta, t._meta, t._view, s.device)
        s.node = run_node(sinfo, (s.node, node), ())
        s.version += 1
        t._node = node
        t._ver = s.version
    else:
        s.node = node
        s.version += 1
    if mode_state.recording and s.node.data is None:
        track(s)


def _wrap(node: Node, info: OpInfo, device: int):
    """New base tensors for an op's result(s)."""
    out = info.out
    if not info.multi:
        t = new_tensor(node, out, device)
        if node.data is None and not _direct[0]:
            track(t._storage)
        return t
    res = []
    for i, m in enumerate(out):
        if isinstance(m, TensorMeta):
            res.append(_wrap(output_node(node, info, i), getitem_info(info, i), device))
        else:
            res.append(m)
    return tuple(res)


def _cast_node(node: Node, src_meta: TensorMeta, dtype: torch.dtype, device: int) -> Node:
    """``node`` converted to ``dtype`` (for writes into a tensor of another dtype)."""
    if src_meta.dtype == dtype:
        return node
    tmp = new_tensor(node, src_meta, device)
    return value_node(dispatch(aten._to_copy.default, (tmp,), {"dtype": dtype}))


# ---------------------------------------------------------------------------------------
# The dispatch entry

def dispatch(func, args, kwargs):
    plan = _plans.get(id(func)) or _plan(func)
    if plan.special is not None:
        res = plan.special(func, args, kwargs)
        if res is not NotImplemented:
            return res
    if plan.lowering is None and plan.decomp is None:
        if _direct[0] or plan.kind == "view":
            # A view computed on the host would stop aliasing its base: never fall back.
            raise NotImplementedError(f"xlanb: no lowering for {plan.name}")
        from .fallback import cpu_fallback
        return cpu_fallback(func, args, kwargs)
    lift = plan.lift
    kind = plan.kind
    outs = ()
    if kind == "out":
        outs = [kwargs[name] for name in plan.mutated]
        kwargs = {k: v for k, v in kwargs.items() if k not in plan.mutated}
    tensors: list = []
    scalars: list = []
    sig_args = tuple([_sig_of(a, tensors, scalars, lift) for a in args])
    sig_kwargs = tuple([(k, _sig_of(v, tensors, scalars, lift)) for k, v in kwargs.items()])
    sig = (plan, sig_args, sig_kwargs, tuple([o._key for o in outs])) if outs else (plan, sig_args, sig_kwargs)
    info = _infos.get(sig)
    device = tensors[0]._storage.device if tensors else (
        outs[0]._storage.device if outs else _factory_device(kwargs))
    if info is None:
        if any(t._storage.device != device for t in tensors):
            raise RuntimeError(f"xlanb: {plan.name} got tensors on different devices: "
                               + ", ".join(str(t.device) for t in tensors))
        try:
            readable = (func, _readable_sig(args, lift),
                        tuple((k, _readable_sig(v, lift)) for k, v in kwargs.items()),
                        _readable_sig(outs, lift))
            info = _new_info(plan, func, readable, args, kwargs, tensors, scalars, device, outs)
        except NotImplementedError:
            if _direct[0] or plan.kind == "view":
                raise
            from .fallback import cpu_fallback
            return cpu_fallback(func, args, kwargs)
        _infos[sig] = info
    if plan.random:
        scalars.append(rng.next_key())
    if kind == "view":
        return _view_result(func, info, tensors[0])
    node = run_node(info, tuple([value_node(t) for t in tensors]), tuple(scalars))
    if kind == "out":
        results = [node] if not info.multi else [output_node(node, info, i) for i in range(len(info.out))]
        metas = [info.out] if not info.multi else list(info.out)
        for o, n, m in zip(outs, results, metas):
            if tuple(o.shape) != m.shape:
                raise RuntimeError(f"xlanb: {plan.name} out= tensor has shape {tuple(o.shape)}, "
                                   f"result has {m.shape}; resizing out= tensors is not supported")
            write(o, _cast_node(n, m, o.dtype, device))
        return outs[0] if len(outs) == 1 else tuple(outs)
    if kind == "functional":
        return _wrap(node, info, device)
    if kind == "inplace":
        self_t = args[0]
        write(self_t, _cast_node(node, info.out, self_t.dtype, device))
        return self_t
    # mutating: the functional op returns the op's results, then the mutated args' new
    # values (a list argument, as in _foreach_add_, takes one value per element)
    schema = func._schema
    n_ret = len(schema.returns)
    outs = _wrap(node, info, device)
    outs = outs if isinstance(outs, tuple) else (outs,)
    k = n_ret
    for pos in plan.mutated:
        target = args[pos] if pos < len(args) else kwargs.get(schema.arguments[pos].name)
        for t in (target if isinstance(target, (list, tuple)) else (target,)):
            new = outs[k]
            k += 1
            if t is not None:
                write(t, _cast_node(value_node(new), new._meta, t.dtype, device))
    if n_ret == 0:
        return None
    res = outs[:n_ret]
    return res[0] if n_ret == 1 else res


def _factory_device(kwargs) -> int:
    d = kwargs.get("device")
    if d is None:
        return 0
    from .backend import _index
    return _index(d)


def _view_result(func, info: OpInfo, src: XlaTensor):
    storage = src._storage
    if func is aten.as_strided.default and src._view:
        raise NotImplementedError("xlanb: as_strided of a view")
    node = run_node(info, (value_node(src),), ())
    if not info.multi:
        return XlaTensor(info.out, storage, src._view + ((info, None),), node)
    res = []
    for i, m in enumerate(info.out):
        res.append(XlaTensor(m, storage, src._view + ((info, i),), output_node(node, info, i)))
    return res if func._schema.returns[0].type.kind() == "ListType" else tuple(res)


def _identity_view(func, args, kwargs):
    # detach/alias: a new tensor over the same storage and view chain, no node.
    src = args[0]
    t = XlaTensor(src._meta, src._storage, src._view, src._node)
    t._ver = src._ver
    return t


# ---------------------------------------------------------------------------------------
# Ops that move data between host and device, or need values

def _from_host_arg(x: torch.Tensor) -> XlaTensor:
    """A CPU tensor passed to an xla op (e.g. a 0-dim scalar tensor): move it over."""
    from .transfer import to_device
    if x.device.type not in ("cpu", "meta") or x.device.type == "meta":
        raise RuntimeError(f"xlanb: cannot use a tensor on {x.device} in an xla op")
    return to_device(x, 0)


def _copy_(func, args, kwargs):
    from .transfer import to_device, to_host
    dst, src = args[0], args[1]
    dst_x, src_x = isinstance(dst, XlaTensor), isinstance(src, XlaTensor)
    if dst_x and src_x and dst._storage.device == src._storage.device:
        return NotImplemented  # device to device: an ordinary op
    if dst_x:
        # Host (or other device) to this device: a fresh leaf, converted on the host.
        if src_x:
            src = to_host(src, cause="copy between xla devices")
        if src.dtype != dst.dtype or tuple(src.shape) != tuple(dst.shape):
            src = src.to(dst.dtype).expand(dst.shape)
        leaf = to_device(src, dst._storage.device)
        write(dst, value_node(leaf))
        return dst
    host = to_host(src, cause="copy to CPU")
    with torch._C._DisableTorchDispatch():
        dst.copy_(host)
    return dst


def _to_copy(func, args, kwargs):
    from .transfer import to_device, to_host
    src = args[0]
    device = kwargs.get("device")
    if device is None:
        return NotImplemented
    device = torch.device(device)
    kw = {k: v for k, v in kwargs.items() if k not in ("device", "pin_memory", "non_blocking")}
    if device.type == "cpu":
        host = to_host(src, cause="value needed by .cpu()/.to('cpu')")
        return host.to(dtype=kw["dtype"]) if kw.get("dtype") is not None else host
    if device.type == "xla" and (device.index or 0) != src._storage.device:
        host = to_host(src, cause="copy between xla devices")
        if kw.get("dtype"):
            host = host.to(kw["dtype"])
        return to_device(host, device.index or 0)
    kwargs = {k: v for k, v in kwargs.items() if k != "device"}
    if not kwargs:
        kwargs = {"dtype": src.dtype}
    return dispatch(aten._to_copy.default, args, kwargs)


def _local_scalar_dense(func, args, kwargs):
    from .transfer import to_host
    return to_host(args[0], cause="value needed by .item()").item()


def _is_same_size(func, args, kwargs):
    return tuple(args[0].shape) == tuple(args[1].shape)


def _native_batch_norm(func, args, kwargs):
    # The CPU kernel updates running stats in place although the schema does not say so;
    # the _legit op says so, and has a functional variant.
    if len(args) > 5 and args[5] and args[3] is not None:
        return dispatch(aten._native_batch_norm_legit.default, args, kwargs)
    return NotImplemented


_SPECIAL = {
    aten.detach.default: _identity_view,
    aten.alias.default: _identity_view,
    aten.native_batch_norm.default: _native_batch_norm,
    aten.copy_.default: _copy_,
    aten._to_copy.default: _to_copy,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.is_same_size.default: _is_same_size,
}
