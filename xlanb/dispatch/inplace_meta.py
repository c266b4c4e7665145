"""Ops that change a tensor's own layout or storage in place: an out= tensor of another
shape resized, ``resize_`` / ``resize_as_``, and ``set_`` to another tensor's storage.

XLA arrays never change shape, so each of these makes the tensor a fresh base, or a view
of another storage, through ``record.become`` (torch's sizes move with ``set_data``).
The dispatcher (dispatch/dispatcher.py) calls them; they run their own ops through ``dispatch_op``.
"""
from __future__ import annotations

import math
import warnings

import torch

from ..ir.nodes import Node, TensorMeta, contiguous_strides
from ..modes.record import become, rebase, value_node
from ..ir.tensor import XlaTensor, dispatch_op

aten = torch.ops.aten


def resize_out(o: XlaTensor, node: Node, m: TensorMeta) -> None:
    """An out= tensor of another shape takes the result's (``node``, laid out as
    ``m``), as torch's ``resize_output`` does: silently when it was empty, with torch's
    deprecation warning otherwise."""
    if o.numel():
        warnings.warn(f"An output with one or more elements was resized since it had shape "
                      f"{list(o.shape)}, which does not match the required output shape "
                      f"{list(m.shape)}. This behavior is deprecated, and in a future PyTorch "
                      "release outputs will not be resized unless they have zero elements. "
                      "You can explicitly reuse an out tensor t by resizing it, inplace, to "
                      "zero elements with t.resize_(0).", UserWarning, stacklevel=5)
    rebase(o, node, TensorMeta(m.shape, m.stride, o.dtype))


def resize_(func, args, kwargs):
    """``resize_`` / ``resize_as_``: the tensor keeps its storage's first elements, read in
    storage order, and takes the new layout; elements beyond the old ones are zeros (torch
    leaves them undefined). The tensor stops being a view: XLA arrays do not grow."""
    t = args[0]
    fmt = kwargs.get("memory_format", args[2] if len(args) > 2 else None)
    if func is aten.resize_as_.default:
        size = tuple(args[1].shape)
        if fmt is torch.preserve_format:
            fmt = torch._prims_common.suggest_memory_format(args[1])
    else:
        size = tuple(int(s) for s in args[1])
    if any(s < 0 for s in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(size)}: "
                           f"{list(size)}")
    last = fmt is torch.channels_last or fmt is torch.channels_last_3d
    stride = tuple(torch._prims_common.make_channels_last_strides_for(size) if last
                   else contiguous_strides(size))
    if size == tuple(t.shape) and stride == tuple(t.stride()):
        return t
    n = math.prod(size)
    flat = t.reshape(-1) if t.is_contiguous() else _storage_order(t)
    if n > flat.numel():
        flat = torch.cat([flat, torch.zeros(n - flat.numel(), dtype=t.dtype, device=t.device)])
    else:
        flat = flat[:n]
    if last:  # storage order is N, spatial..., C
        phys = (size[0],) + size[2:] + (size[1],)
        new = flat.reshape(phys).permute(0, len(size) - 1, *range(1, len(size) - 1))
    else:
        new = flat.reshape(size)
    rebase(t, value_node(new), TensorMeta(size, stride, t.dtype))
    return t


def _storage_order(t: XlaTensor):
    """``t``'s elements in the order its strides lay them out (channels_last: N, H, W, C)."""
    dims = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    return t.permute(*dims).reshape(-1)


def set_(func, args, kwargs):
    """``t.set_(source, ...)``: ``t`` becomes a view of another xla tensor's storage, with
    the geometry given or the source tensor's, and writes through to it as torch's
    tensors that share a storage do."""
    t, source = args[0], args[1]
    if isinstance(source, XlaTensor):
        if len(args) == 2 and not kwargs:  # set_(tensor): an alias of it
            return become(t, dispatch_op(aten.alias.default, (source,), {}))
        source = source.untyped_storage()
    st = getattr(source, "_untyped_storage", source)  # a TypedStorage wraps one
    xs = getattr(st, "_xlanb_storage", None)  # tensor.XlaTensor.untyped_storage sets it
    if xs is None:
        raise RuntimeError("xlanb: set_ to a storage that is not an xla tensor's: xla tensors "
                           "can share only each other's storages")
    if xs.meta.dtype != t.dtype:
        raise RuntimeError(f"xlanb: set_ of a {t.dtype} tensor to a storage of "
                           f"{xs.meta.dtype}: reading its bytes as another type is not supported")
    if len(args) == 2 and not kwargs:  # the whole storage, flat
        offset, size, stride = 0, (math.prod(xs.meta.shape),), (1,)
    else:
        rest = list(args[2:]) + [None] * 3
        offset = kwargs.get("storage_offset", rest[0])
        size = tuple(kwargs.get("size", rest[1]))
        stride = kwargs.get("stride", rest[2])
        stride = tuple(stride) if stride else contiguous_strides(size)
    base = XlaTensor(xs.meta, xs)
    return become(t, dispatch_op(aten.as_strided.default, (base, size, stride, offset), {}))
