"""``torch_xla.distributed.spmd`` (``xs``) on ``xlanb.spmd``: ``xs.Mesh``,
``xs.mark_sharding``, ``xs.clear_sharding``, ``xs.get_1d_mesh``, and
``torch_xla.distributed.spmd.debugging.visualize_tensor_sharding``.

One difference: ``mark_sharding`` returns the tensor itself (torch_xla wraps it in an
``XLAShardedTensor``); ``xlanb.spmd.get_sharding`` says how it is laid out.
"""
from __future__ import annotations

import xlanb
from xlanb.spmd import Mesh, ShardingError, clear_sharding, get_1d_mesh, get_sharding, \
    mark_sharding

from .missing import module_getattr

NAME = "torch_xla.distributed.spmd"

__all__ = ["Mesh", "mark_sharding", "clear_sharding", "get_1d_mesh", "get_sharding",
           "visualize_tensor_sharding", "ShardingError", "set_global_mesh", "get_global_mesh"]

_global_mesh: list = [None]


def set_global_mesh(mesh: Mesh) -> None:
    """Remember ``mesh`` for the program (and the libraries it calls) to find with
    ``get_global_mesh``; as in torch_xla, ``mark_sharding`` still takes its mesh."""
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"{NAME}.set_global_mesh takes an xs.Mesh, not {type(mesh).__name__}")
    _global_mesh[0] = mesh


def get_global_mesh() -> Mesh | None:
    """The mesh ``set_global_mesh`` set (None before)."""
    return _global_mesh[0]


def visualize_tensor_sharding(t, use_color: bool = True, **_kw):
    """Print which device holds which block of ``t`` (and return the view)."""
    view = xlanb.spmd.visualize_sharding(t)
    print(view)
    return view


__getattr__ = module_getattr(NAME, {
    "HybridMesh": "xlanb.spmd.Mesh over the devices in the order you want",
    "XLAShardedTensor": "the tensor itself: mark_sharding returns it; xlanb.spmd.get_sharding(t)",
})
