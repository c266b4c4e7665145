"""Ops with no lowering run on CPU torch: fetch inputs, run, move results back.

Each fallback is counted as ``aten::<op>`` and warned about once, so a fallback is never
silent; results and mutated arguments come back to the device exactly.
"""
from __future__ import annotations

import warnings

import torch

from ..base import metrics
from ..base.caches import cache
from ..base.config import config
from ..base.frames import user_frame, warn_at
from ..ops.leaves import from_host
from ..ir.nodes import TensorMeta
from .reads import to_host
from ..modes.record import rebase, value_node
from ..ir.tensor import XlaTensor, dispatch_op

_warned = cache(set(), "ops warned about running on CPU torch (once each)")
aten = torch.ops.aten

# Layouts and dtypes that cannot work at all: a clear error naming the op, not a fallback.
_UNSUPPORTED_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc,
                        torch.sparse_bsr, torch.sparse_bsc)


def _op_name(func) -> str:
    return f"aten::{func.overloadpacket.__name__}" if hasattr(func, "overloadpacket") else str(func)


def _sparse_error(func, layout, dtype) -> RuntimeError:
    return RuntimeError(f"xlanb: {_op_name(func)} with layout {layout} and dtype {dtype} is not "
                        f"supported on the xla device: only strided (dense) tensors are")


def _check_supported(func, args, kwargs):
    values = list(args) + list(kwargs.values())
    dtype = kwargs.get("dtype") or next(
        (v.dtype for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()),
        next((v.dtype for v in values if isinstance(v, torch.Tensor)), torch.get_default_dtype()))
    for v in values:
        if isinstance(v, torch.layout) and v in _UNSUPPORTED_LAYOUTS:
            raise _sparse_error(func, v, dtype)
        if isinstance(v, torch.Tensor) and v.layout in _UNSUPPORTED_LAYOUTS:
            raise _sparse_error(func, v.layout, v.dtype)


def cpu_fallback(func, args, kwargs):
    _check_supported(func, args, kwargs)
    name = _op_name(func)
    metrics.counter(name)
    if config.warn_fallbacks and name not in _warned:
        _warned.add(name)
        msg = (f"xlanb: {name} has no lowering and runs on CPU torch "
               f"(inputs are fetched from the device; counted as {name!r})")
        src = user_frame()
        if src is not None:  # point at the user's line, not at xlanb's dispatch
            warn_at(src, msg, UserWarning)
        else:
            warnings.warn(msg, stacklevel=3)
    device = 0
    host_of: dict[int, torch.Tensor] = {}

    def to_cpu(x):
        nonlocal device
        if isinstance(x, XlaTensor):
            device = x._storage.device
            h = host_of.get(id(x))
            if h is None:
                h = host_of[id(x)] = to_host(x, cause=f"CPU fallback of {name}").clone()
            return h
        if isinstance(x, (list, tuple)):
            return type(x)(to_cpu(e) for e in x)
        if isinstance(x, torch.device) and x.type == "xla":
            return torch.device("cpu")
        return x

    cpu_args = [to_cpu(a) for a in args]
    cpu_kwargs = {k: to_cpu(v) for k, v in kwargs.items()}
    with torch._C._DisableTorchDispatch():
        out = func(*cpu_args, **cpu_kwargs)
    # Mutated arguments: copy their new CPU values back into the xla tensors.
    originals = {id(h): x for x, h in ((a, host_of.get(id(a))) for a in _tensors(args, kwargs))
                 if h is not None}
    schema = func._schema
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            x = args[i] if i < len(args) else kwargs.get(a.name)
            for t in (x if isinstance(x, (list, tuple)) else (x,)):
                if isinstance(t, XlaTensor):
                    host = host_of[id(t)]
                    if host.shape != t.shape:  # an out= tensor CPU torch resized: its layout too
                        rebase(t, value_node(from_host(host, t._storage.device)),
                               TensorMeta(tuple(host.shape), tuple(host.stride()), host.dtype))
                    else:
                        dispatch_op(aten.copy_.default, (t, host), {})

    def back(o):
        if isinstance(o, torch.Tensor) and o.layout in _UNSUPPORTED_LAYOUTS:
            raise _sparse_error(func, o.layout, o.dtype)
        if isinstance(o, torch.Tensor):
            orig = originals.get(id(o))
            return orig if orig is not None else from_host(o, device)
        if isinstance(o, (list, tuple)):
            return type(o)(back(e) for e in o)
        return o
    return back(out)


def _tensors(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, XlaTensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (e for e in v if isinstance(e, XlaTensor))
