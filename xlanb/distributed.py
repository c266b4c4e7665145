"""``xlanb.distributed``: several processes, one program (SPMD), through
``jax.distributed``.

    xlanb.distributed.initialize()      # in each process, before anything else runs
    mesh = xlanb.spmd.Mesh(range(xlanb.distributed.global_device_count()), ...)

After ``initialize``, ``xla:N`` is this process's N-th device, a mesh's device ids index
every process's devices (JAX's global order), and a sharded tensor is one global array
whose shards live in several processes. ``python -m xlanb.launch --nproc N script.py``
starts N local processes with the environment ``initialize()`` reads.
"""
from __future__ import annotations

import os

import jax
import numpy as np
import torch

from .base.session import session
from .ops.leaves import from_array
from .runtime import devices as _devices
from .runtime.mesh import as_mesh, named_sharding
from .tensor import XlaTensor

__all__ = ["initialize", "is_initialized", "process_index", "process_count",
           "global_device_count", "local_device_count", "from_process_local", "is_main"]

ENV_COORDINATOR = "XLANB_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "XLANB_NUM_PROCESSES"
ENV_PROCESS_ID = "XLANB_PROCESS_ID"

_state = {"initialized": False}


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids=None) -> None:
    """``jax.distributed.initialize``, with xlanb's defaults: arguments not given come
    from ``XLANB_COORDINATOR_ADDRESS`` / ``XLANB_NUM_PROCESSES`` / ``XLANB_PROCESS_ID``
    (which ``python -m xlanb.launch`` sets), and on the CPU, collectives between
    processes use gloo (``jax_cpu_collectives_implementation``). Call it before any
    tensor is made on the xla device."""
    if _state["initialized"]:
        return
    env = os.environ
    coordinator_address = coordinator_address or env.get(ENV_COORDINATOR)
    if num_processes is None and env.get(ENV_NUM_PROCESSES):
        num_processes = int(env[ENV_NUM_PROCESSES])
    if process_id is None and env.get(ENV_PROCESS_ID):
        process_id = int(env[ENV_PROCESS_ID])
    if _devices.jax_devices.cache_info().currsize:
        raise RuntimeError("xlanb.distributed.initialize must run before xlanb uses a device "
                           "(call it first thing in the program)")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               local_device_ids=local_device_ids)
    _state["initialized"] = True


def is_initialized() -> bool:
    return _state["initialized"]


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def is_main() -> bool:
    """Whether this is process 0: the one that prints what every process holds alike."""
    return jax.process_index() == 0


def global_device_count() -> int:
    return len(_devices.global_devices())


def local_device_count() -> int:
    return len(_devices.jax_devices())


def from_process_local(local: torch.Tensor, mesh, partition_spec) -> XlaTensor:
    """A global tensor sharded over ``mesh`` from each process's own piece of it
    (``jax.make_array_from_process_local_data``): ``local`` is this process's part of
    the global tensor along the sharded dimensions (a data loader's local batch)."""
    from .base.dtypes import tensor_to_numpy
    mesh = as_mesh(mesh)
    arr = tensor_to_numpy(local.detach().cpu())
    # the global shape: local pieces stacked along each dimension the processes split
    probe = named_sharding(mesh, partition_spec, _global_shape(arr.shape, mesh, partition_spec))
    with jax.enable_x64(True):
        data = jax.make_array_from_process_local_data(probe, np.ascontiguousarray(arr))
    session.spmd = True
    return from_array(data, 0)


def _global_shape(local_shape, mesh, spec) -> tuple:
    """How many processes split each dimension, from which processes hold which devices."""
    shape = list(local_shape)
    jm = mesh.jax_mesh
    for dim, entry in enumerate(tuple(spec)):
        if entry is None:
            continue
        axes = entry if isinstance(entry, tuple) else (entry,)
        axes = [mesh.axis_names[a] if isinstance(a, int) else a for a in axes]
        # processes along these axes: distinct process ids over the sub-mesh they span
        others = [a for a in jm.axis_names if a not in axes]
        devs = jm.devices.transpose([jm.axis_names.index(a) for a in axes + others])
        line = devs.reshape(int(np.prod([jm.shape[a] for a in axes])), -1)[:, 0]
        procs = len({d.process_index for d in line})
        shape[dim] *= procs
    return tuple(shape)
