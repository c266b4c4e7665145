"""Leaves: the infos of nodes without inputs (device data, uninitialized memory), and new
xla tensors made from host values."""
from __future__ import annotations

import weakref

import jax
import torch

from ..base.dtypes import to_jax_dtype, to_torch_dtype
from ..base.caches import cache
from ..base.frames import user_frame
from ..base.scopes import current_scope
from ..ir.nodes import Node, OpSignature, TensorMeta, contiguous_strides
from ..runtime.transfer import host_to_device
from ..ir.tensor import XlaTensor, new_tensor

def _leaf_info(cache: dict, name: str, tag: str, meta: TensorMeta, device: int,
               make_fn=None) -> OpSignature:
    """The one info of a leaf (a node without inputs) of this kind, shape, dtype and
    device, kept in ``cache``; ``make_fn(meta)`` gives its function, if it has one."""
    key = (meta.shape, meta.dtype, device)
    info = cache.get(key)
    if info is None:
        fn = make_fn(meta) if make_fn is not None else None
        info = cache[key] = OpSignature(name, (tag,) + key, fn, meta, device=device)
    return info


# small integer tensors moved from the host (index lists): their host values, so
# indexing can check bounds with no transfer back (dispatch/dispatcher.py)
host_values = cache(weakref.WeakKeyDictionary(), "Node -> its CPU tensor (small host integers)")
_data_infos = cache({}, "leaf infos of device data, by (shape, dtype, device)")
_empty_infos = cache({}, "leaf infos of uninitialized memory")


def data_info(meta: TensorMeta, device: int) -> OpSignature:
    """The info of device data (a leaf) with this shape and dtype."""
    return _leaf_info(_data_infos, "device_data", "data", meta, device)


def _zeros_fn(meta: TensorMeta):
    shape, dt = meta.shape, to_jax_dtype(meta.dtype)
    return lambda ins, scs: jax.numpy.zeros(shape, dt)


def empty_info(meta: TensorMeta, device: int) -> OpSignature:
    """Uninitialized memory: zeros if ever read, usually overwritten first."""
    return _leaf_info(_empty_infos, "aten::empty", "empty", meta, device, _zeros_fn)


_placed_infos = cache({}, "leaf infos of data mark_sharding laid out")


def placed_info(meta: TensorMeta, device: int) -> OpSignature:
    """The info of device data that ``xlanb.spmd.mark_sharding`` laid out on a mesh: its
    node's line is where it was marked (a recompile it causes names that line)."""
    return _leaf_info(_placed_infos, "device_data", "placed", meta, device)


def is_placed(node: Node) -> bool:
    """Whether ``node`` is device data that ``mark_sharding`` laid out."""
    sig = node.info.sig
    return type(sig) is tuple and sig[:1] == ("placed",)


def from_host(cpu: torch.Tensor, device: int) -> XlaTensor:
    """A new xla tensor holding a copy of the CPU tensor ``cpu``, remembering the user's
    line that moved it (``xlanb.memory_by_line``): a copy costs more than finding it."""
    data = host_to_device(cpu, device)
    shape = tuple(cpu.shape)
    meta = TensorMeta(shape, contiguous_strides(shape), cpu.dtype)
    node = Node(data_info(meta, device), data=data, src=user_frame(), scope=current_scope())
    if cpu.dtype in _INDEX_DTYPES and cpu.numel() <= _HOST_VALUES_MAX:
        # an index list's values: bounds checks read them here, with no transfer
        host_values[node] = cpu.clone()
    return new_tensor(node, meta, device)


_INDEX_DTYPES = frozenset((torch.int64, torch.int32))
_HOST_VALUES_MAX = 4096


def from_array(array, device: int = 0) -> XlaTensor:
    """A new xla tensor over the JAX array ``array`` (no copy)."""
    shape = tuple(array.shape)
    meta = TensorMeta(shape, contiguous_strides(shape), to_torch_dtype(array.dtype))
    return new_tensor(Node(data_info(meta, device), data=array), meta, device)
