"""Host <-> device transfers that keep torch's dtypes, timed into the metrics."""
from __future__ import annotations

import time

import jax
import numpy as np
import torch

from . import metrics
from .devices import jax_device
from .dtypes import numpy_to_tensor, tensor_to_numpy


def to_device(cpu: torch.Tensor, device: int):
    """A new xla tensor holding a copy of the CPU tensor ``cpu``."""
    from .opinfo import data_info
    from .signature import contiguous_strides
    from .ir import Node, TensorMeta
    from .tensor import new_tensor
    t0 = time.perf_counter()
    arr = tensor_to_numpy(cpu)
    dev = jax_device(device)
    if dev.platform == "cpu":
        # JAX's CPU client adopts an aligned numpy buffer without copying (may_alias=False
        # does not stop it), so a later in-place op on ``cpu`` would change the device value.
        arr = arr.copy()
    with jax.enable_x64(True):
        data = jax.device_put(arr, dev)
    metrics.record("TransferToDeviceTime", time.perf_counter() - t0)
    shape = tuple(cpu.shape)
    meta = TensorMeta(shape, contiguous_strides(shape), cpu.dtype)
    return new_tensor(Node(data_info(meta, device), data=data), meta, device)


def array_to_host(arr) -> torch.Tensor:
    t0 = time.perf_counter()
    host = numpy_to_tensor(np.asarray(arr))
    metrics.record("TransferFromDeviceTime", time.perf_counter() - t0)
    return host


def to_host(t, *, cause: str) -> torch.Tensor:
    """``t``'s value as a CPU tensor; computes pending work if it must (``cause`` says why)."""
    from .debugging import debugger_active
    from .dispatch import value_node
    from .executor import node_array
    from .sync import peek_node
    node = value_node(t)
    if node.data is None and debugger_active():
        host = array_to_host(peek_node(node))  # looking from a breakpoint never cuts the graph
    else:
        host = array_to_host(node_array(node, cause=cause))
    if host.dtype != t.dtype:  # e.g. 0-size or exotic arrays
        host = host.to(t.dtype)
    return host
