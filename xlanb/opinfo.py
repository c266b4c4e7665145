"""What an aten op is (its ``OpPlan``) and how one signature of it evaluates (its ``OpInfo``).

A plan classifies the op from its schema (functional, view, in-place, out=, mutating),
finds the functional variant that nodes record, and picks how to lower it: a JAX lowering
from the registry, or torch's decomposition traced on JAX values. An ``OpInfo`` is built
once per signature: torch's meta kernels give the result shapes and dtypes, and its
``fn(inputs, scalars)`` evaluates the op on JAX values, cast to torch's dtypes. The
special infos (device data, uninitialized memory, picking one output, writing through a
view) live here too.
"""
from __future__ import annotations

import functools

import jax
import numpy as np
import torch

from .dtypes import to_jax_dtype
from .ir import GETITEM, OpInfo, TensorMeta
from .lowering import registry
from .signature import fill_call, meta_tensor, metas_of, template_of

aten = torch.ops.aten


class OpPlan:
    __slots__ = ("op", "kind", "fop", "lowering", "decomp", "mutated", "lift", "random", "name",
                 "special", "fast")

    def __init__(self, op, kind, fop, mutated):
        self.op = op
        self.special = None       # a handler that replaces the generic path (see _SPECIAL)
        self.fast = None          # functional ops: positional-args signature -> OpInfo
        self.kind = kind          # functional | view | inplace | out | mutating
        self.fop = fop            # the functional op that nodes record
        self.mutated = mutated    # positions (int) or kwarg names (str) written to
        self.name = f"aten::{op.__name__.split('.')[0]}" if hasattr(op, "__name__") else str(op)
        low = registry.lookup(fop) if fop is not None else None
        self.lowering = low
        self.decomp = None
        if low is None and fop is not None:
            self.decomp = decomposition(fop)
        # Floats are lifted into inputs only for JAX lowerings that accept traced floats.
        self.lift = low is not None and not low.static_floats
        self.random = low is not None and low.random


@functools.cache
def _decomposition_table():
    from torch._decomp import core_aten_decompositions, decomposition_table
    table = dict(decomposition_table)
    table.update(core_aten_decompositions())
    return table


def decomposition(op):
    return _decomposition_table().get(op)


def functional_variant(op, kind, schema):
    packet = op.overloadpacket
    name = packet.__name__
    overload = op._overloadname
    if kind == "inplace":
        # The functional overload must take the same arguments: pow_.Scalar is
        # pow_(Tensor self, Scalar exponent), but pow.Scalar is pow(Scalar self, Tensor).
        want = _arg_types(schema)
        fallback = None
        for pname in (name[:-1], name[:-1] + "_functional"):
            p = getattr(aten, pname, None)
            if p is None:
                continue
            names = p.overloads()
            for oname in ([overload] if overload in names else []) + sorted(names):
                f = getattr(p, oname)
                if any(_is_written(a) for a in f._schema.arguments):
                    continue
                if _arg_types(f._schema) == want:
                    return f
                if fallback is None and oname in (overload, "default"):
                    fallback = f
        return fallback
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


def _arg_types(schema) -> list:
    return [(a.name, str(a.type)) for a in schema.arguments]


def _is_written(arg) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def make_plan(op) -> OpPlan:
    """Classify ``op`` from its schema and find what its nodes record."""
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
    return OpPlan(op, kind, functional_variant(op, kind, schema), mutated)


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
            args, kwargs = fill_call(template, ins, scs)
            kwargs["rng"] = jax.random.wrap_key_data(scs[-1])
            return _conform(low(*args, **kwargs), out, name)
    else:
        def fn(ins, scs):
            args, kwargs = fill_call(template, ins, scs)
            return _conform(low(*args, **kwargs), out, name)
    return fn


def _decomposed_fn(plan: OpPlan, template, out):
    decomp = plan.decomp
    name = plan.name

    def fn(ins, scs):
        # Run torch's decomposition on tensors that hold JAX values, op by op, right now.
        from .dispatch import unwrap_direct, direct_mode, direct_tensor
        tensors = [direct_tensor(a) for a in ins]
        args, kwargs = fill_call(template, tensors, scs)
        with direct_mode():
            res = decomp(*args, **kwargs)
        return _conform(unwrap_direct(res), out, name)
    return fn


def _view_raw_fn(plan: OpPlan, template):
    """A view op without the dtype cast: view chains also run on index arrays."""
    low = plan.lowering.fn if plan.lowering is not None else None
    if low is None:
        return None

    def raw(x):
        args, kwargs = fill_call(template, [x], ())
        return low(*args, **kwargs)
    return raw


def check_traceable(fn, tensors, scalars, random) -> None:
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


def new_info(plan: OpPlan, op, sig, args, kwargs, tensors, scalars, device, outs=()) -> OpInfo:
    """Build the OpInfo of one signature. For out= ops, ``kwargs`` and ``tensors`` exclude
    the out tensors, which are passed as ``outs`` (in ``plan.mutated`` order)."""
    lift = plan.lift
    counters = [0, 0]
    targs = [template_of(a, counters, lift) for a in args]
    tkwargs = {k: template_of(v, counters, lift) for k, v in kwargs.items()}
    # torch's own meta kernel checks the call as made (in-place, out= included)...
    margs, mkwargs = fill_call((targs, tkwargs), [meta_tensor(t) for t in tensors], scalars)
    if "device" in mkwargs:
        mkwargs["device"] = "meta"
    for name, o in zip(plan.mutated if plan.kind == "out" else (), outs):
        mkwargs[name] = meta_tensor(o)
    tkwargs = {k: v for k, v in tkwargs.items() if k not in ("device", "pin_memory")}
    template = (targs, tkwargs)
    try:
        with torch._C._DisableTorchDispatch():
            meta_res = op(*margs, **mkwargs)
            # ...and the functional op that nodes record gives the result shapes and dtypes.
            if plan.fop is not op:
                fargs, fkwargs = fill_call(template, [meta_tensor(t) for t in tensors], scalars)
                meta_res = plan.fop(*fargs, **fkwargs)
        out = metas_of(meta_res)
    except NotImplementedError:
        if plan.lowering is None or plan.kind in ("view", "out"):
            raise
        # No meta kernel (geqrf, histogram, some backwards): the lowering gives the shapes.
        out = _metas_from_lowering(plan, template, tensors, scalars)
    if plan.lowering is not None:
        fn = _lowered_fn(plan, template, out)
        if plan.lowering.may_refuse:
            check_traceable(fn, tensors, scalars, plan.random)
    else:
        fn = _decomposed_fn(plan, template, out)
        check_traceable(fn, tensors, scalars, False)
    specs = ("f",) * len(scalars) if lift else ()
    if plan.random:
        specs = specs + ("key",)
    info = OpInfo(plan.name, sig, fn, out, op=plan.fop, n_in=len(tensors),
                  scalar_specs=specs, device=device)
    view_raw = _view_raw_fn(plan, template) if plan.kind == "view" else None
    info.extra = _InfoExtra(plan, tuple(t._meta for t in tensors), view_raw, template)
    return info


def _metas_from_lowering(plan: OpPlan, template, tensors, scalars):
    from .dtypes import to_torch_dtype
    from .signature import contiguous_strides
    fn = _lowered_fn(plan, template, None)
    specs = [jax.ShapeDtypeStruct(t._meta.shape, to_jax_dtype(t._meta.dtype)) for t in tensors]
    scs = list(scalars) + ([np.zeros(2, np.uint32)] if plan.random else [])
    try:
        with jax.enable_x64(True):
            res = jax.eval_shape(lambda *a: fn(a, scs), *specs)
    except Exception as e:
        raise NotImplementedError(f"{plan.name}: no meta kernel, and the lowering "
                                  f"does not trace: {e}") from e

    def meta(r):
        if isinstance(r, (tuple, list)):
            return tuple(meta(x) for x in r)
        shape = tuple(r.shape)
        return TensorMeta(shape, contiguous_strides(shape), to_torch_dtype(r.dtype))
    return meta(res)


def getitem_info(info: OpInfo, i: int) -> OpInfo:
    key = (info.uid, i)
    gi = _getitem_infos.get(key)
    if gi is None:
        gi = OpInfo(GETITEM, (GETITEM, info.sig, i), lambda ins, scs: ins[0][i], info.out[i], n_in=1,
                    device=info.device)
        gi.extra = _InfoExtra(None, (None,))
        _getitem_infos[key] = gi
    return gi


def _leaf_info(cache: dict, name: str, tag: str, meta: TensorMeta, device: int,
               make_fn=None) -> OpInfo:
    """The one info of a leaf (a node without inputs) of this kind, shape, dtype and
    device, kept in ``cache``; ``make_fn(meta)`` gives its function, if it has one."""
    key = (meta.shape, meta.dtype, device)
    info = cache.get(key)
    if info is None:
        fn = make_fn(meta) if make_fn is not None else None
        info = OpInfo(name, (tag,) + key, fn, meta, device=device)
        info.extra = _InfoExtra(None, ())
        cache[key] = info
    return info


_data_infos: dict = {}


def data_info(meta: TensorMeta, device: int) -> OpInfo:
    """The info of device data (a leaf) with this shape and dtype."""
    return _leaf_info(_data_infos, "device_data", "data", meta, device)


_empty_infos: dict = {}


def _zeros_fn(meta: TensorMeta):
    shape, dt = meta.shape, to_jax_dtype(meta.dtype)
    return lambda ins, scs: jax.numpy.zeros(shape, dt)


def empty_info(meta: TensorMeta, device: int) -> OpInfo:
    """Uninitialized memory: zeros if ever read, usually overwritten first."""
    return _leaf_info(_empty_infos, "aten::empty", "empty", meta, device, _zeros_fn)


_scatter_infos: dict = {}


def view_scatter_info(base_meta: TensorMeta, view_meta: TensorMeta, chain, device) -> OpInfo:
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
