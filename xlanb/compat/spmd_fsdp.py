"""``torch_xla.experimental.spmd_fully_sharded_data_parallel``: FSDPv2, FSDP re-expressed
in SPMD, on ``xlanb.spmd``.

``SpmdFullyShardedDataParallel(module, mesh=None, shard_output=None,
auto_wrap_policy=None, auto_wrapper_callable=None, extra_data_axis=None)`` does what
torch_xla's does: the mesh (else the global one, ``xs.set_global_mesh``) must have an
``fsdp`` axis; each parameter not sharded yet is sharded on ``fsdp`` along its largest
dimension; the forward's output is sharded on ``fsdp`` along dimension 0 (``(extra_data_axis,
"fsdp")`` with one), or by ``shard_output(output, mesh)``; a tuple output shards its first
tensor (with torch_xla's warning), any other output needs ``shard_output``. XLA's
partitioner then all-gathers each weight where it is used and reduce-scatters its
gradient, and ``xlanb.collectives()`` names the line of each.

Differences: a parameter whose largest dimension the ``fsdp`` axis does not divide stays
replicated (a JAX array's shards are equal; torch_xla pads them), with one warning naming
them. torch_xla's optimization barrier on each module's gradients (which keeps XLA from
fusing the whole backward on a TPU) is not applied: it changes no value.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.nn as nn

import xlanb.spmd as xs

from .fsdp_wrap import recursive_wrap
from .missing import module_getattr
from .spmd import get_global_mesh

NAME = "torch_xla.experimental.spmd_fully_sharded_data_parallel"

__all__ = ["SpmdFullyShardedDataParallel"]

__getattr__ = module_getattr(NAME)


def _spec(shape, extra_data_axis=None, shard_maximal: bool = False) -> tuple:
    """``fsdp`` (or ``(extra_data_axis, "fsdp")``) on dimension 0, or on the largest
    dimension with ``shard_maximal``; a scalar is replicated."""
    spec = [None] * len(shape)
    if not spec:
        return ()
    index = shape.index(max(shape)) if shard_maximal else 0
    spec[index] = (extra_data_axis, "fsdp") if extra_data_axis else "fsdp"
    return tuple(spec)


def _axis_size(mesh, spec) -> int:
    names = [a for e in spec if e is not None for a in (e if isinstance(e, tuple) else (e,))]
    size = 1
    for a in names:
        size *= mesh.shape()[a]
    return size


class SpmdFullyShardedDataParallel(nn.Module):
    """FSDP over SPMD: ``module``'s parameters sharded on the mesh's ``fsdp`` axis."""

    def __init__(self, module: nn.Module, *, mesh: xs.Mesh | None = None,
                 shard_output: Callable | None = None,
                 auto_wrap_policy: Callable | None = None,
                 auto_wrapper_callable: Callable | None = None,
                 extra_data_axis: str | None = None):
        if isinstance(module, SpmdFullyShardedDataParallel):
            raise RuntimeError("Cannot wrap a module that is already wrapped with FSDP. For "
                               "nested FSDP, first wrap the inner child modules before "
                               "wrapping the outer parent module.")
        forward = getattr(module, "forward", None)
        if getattr(forward, "__func__", nn.Module.forward) is nn.Module.forward:
            raise RuntimeError("The module wrapped by FSDP must define a `forward` method "
                               "and call it during the module's forward pass: do not wrap "
                               "nn.ModuleList or nn.ModuleDict (no forward), and call the "
                               "wrapped module itself.")
        if mesh is None:
            mesh = get_global_mesh()
            if mesh is None:
                raise ValueError("No mesh is provided and no global mesh is set. Please "
                                 "provide a mesh (or xs.set_global_mesh(mesh)).")
        if "fsdp" not in mesh.axis_names:
            raise ValueError(f"The mesh must have an axis named 'fsdp' (its axes: "
                             f"{tuple(mesh.axis_names)}).")
        if extra_data_axis and extra_data_axis not in mesh.axis_names:
            raise ValueError(f"The provided {extra_data_axis} axis is not in the mesh.")
        super().__init__()
        if auto_wrap_policy is not None:
            for name, sub in module.named_modules():
                if isinstance(sub, SpmdFullyShardedDataParallel):
                    raise ValueError(f"Expected {name} to NOT be SpmdFullyShardedDataParallel "
                                     "if using an `auto_wrap_policy`")
            recursive_wrap(module, auto_wrap_policy,
                           auto_wrapper_callable or SpmdFullyShardedDataParallel,
                           only_wrap_children=True,  # the root is this wrapper
                           mesh=mesh, shard_output=shard_output)
        self._orig_module = module.to("xla")
        self._mesh = mesh
        uneven = []
        for name, param in module.named_parameters():
            if xs.get_sharding(param) is not None:
                continue  # sharded already: by an inner wrapper, or by the program
            spec = _spec(tuple(param.shape), shard_maximal=True)
            if spec and max(param.shape) % _axis_size(mesh, spec):
                uneven.append(f"{name} {tuple(param.shape)}")
                continue
            xs.mark_sharding(param, mesh, spec)
        if uneven:
            warnings.warn(f"FSDPv2: {len(uneven)} parameter(s) kept replicated, their largest "
                          f"dimension not divisible by the fsdp axis ({mesh.shape()['fsdp']}): "
                          + ", ".join(uneven), stacklevel=2)
        self._shard_output = shard_output or self._default_shard_output
        self._extra_data_axis = extra_data_axis

    def _default_shard_output(self, output, mesh) -> None:
        """torch_xla's rule: a tensor output, or a tuple's first element, sharded on
        ``fsdp`` along dimension 0."""
        real = None
        if isinstance(output, torch.Tensor):
            real = output
        elif isinstance(output, tuple):
            real = output[0] if output and isinstance(output[0], torch.Tensor) else None
            warnings.warn("The output is a tuple, but only the first element is sharded. If "
                          "this is not intended, please provide your own shard_output "
                          "callable.", stacklevel=3)
        if real is None:
            raise RuntimeError(f"The output type is not supported: {type(output)}. Please "
                               "provide your own shard_output callable.")
        xs.mark_sharding(real, mesh, _spec(tuple(real.shape), self._extra_data_axis))

    @property
    def module(self) -> nn.Module:
        """The wrapped module, as ``model.module`` is for DDP."""
        return self._orig_module

    def forward(self, *args: Any, **kwargs: Any):
        output = self.module(*args, **kwargs)
        # the output's sharding is what makes the partitioner run the FSDP algorithm
        self._shard_output(output, self._mesh)
        return output

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

    def __getitem__(self, key):
        return self.module.__getitem__(key)
