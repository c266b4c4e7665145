"""Host <-> device copies of arrays, with torch's dtypes, timed into the metrics."""
from __future__ import annotations

import threading
import time
import warnings

import jax
import numpy as np
import torch

from ..base import metrics
from ..base.dtypes import numpy_to_tensor, tensor_to_numpy
from ..base.session import session
from .devices import jax_device


# numpy holds at most 64 dimensions, torch and XLA more: a tensor of higher rank crosses
# flattened, and takes its shape on the device (or on the host, going back).
_NUMPY_MAX_DIMS = 64
_reshaped = jax.jit(lambda a, shape: a.reshape(shape), static_argnums=1)


def host_to_device(cpu: torch.Tensor, device: int):
    """A device array holding a copy of the CPU tensor ``cpu``."""
    if cpu.dim() > _NUMPY_MAX_DIMS:
        flat = host_to_device(cpu.reshape(-1), device)
        with jax.enable_x64(True):
            return _reshaped(flat, tuple(cpu.shape))
    t0 = time.perf_counter()
    arr = tensor_to_numpy(cpu)
    dev = jax_device(device)
    if dev.platform == "cpu":
        # JAX's CPU client adopts an aligned numpy buffer without copying (may_alias=False
        # does not stop it), so a later in-place op on ``cpu`` would change the device value.
        arr = arr.copy()
    data = put(arr, dev)
    metrics.record("TransferToDeviceTime", time.perf_counter() - t0)
    return data


def put(arr: np.ndarray, dev):
    """A host array copied onto ``dev``, keeping its dtype (x64 on: int64 stays int64):
    by the one-array call of ``jax_compat.single_device_put`` where JAX has it, else by
    ``jax.device_put``.

    CI twice had an int64 index come back int32 from here, inside this very x64 block,
    on the main thread (a later graph then refused it); never reproduced alone, with the
    same tests before it, or under forced garbage collection. One way it can happen: a
    generator suspended inside another ``jax.enable_x64`` block, finalized here by the
    garbage collector, restores the setting it saw when it began. So the dtype is
    checked, and a lost setting is said once, counted (``X64Lost``), and the copy done
    again rather than handed on with the wrong dtype."""
    for attempt in (1, 2):
        data = _put_once(arr, dev)
        if data.dtype == arr.dtype:
            return data
        if attempt == 1:
            metrics.counter("X64Lost")
            if metrics.counter_value("X64Lost") == 1:
                warnings.warn(f"xlanb: a {arr.dtype} host array reached the device as "
                              f"{data.dtype} on thread {threading.current_thread().name!r}: "
                              "JAX's 64-bit setting was off inside xlanb's x64 block; copied "
                              "again (metrics: X64Lost)", RuntimeWarning, stacklevel=3)
    raise RuntimeError(f"xlanb: a {arr.dtype} host array reached the device as "
                       f"{data.dtype} twice: JAX's 64-bit setting is off on this thread")


_fast: list = []  # [the single-array put of jax_compat, or None]; made at first use


def _put_once(arr: np.ndarray, dev):
    if not _fast:
        from .jax_compat import single_device_put
        _fast.append(single_device_put())
    if _fast[0] is not None:
        try:
            return _fast[0](arr, dev)
        except (TypeError, AttributeError):  # JAX changed the call: jax.device_put from now on
            _fast[0] = None
    with jax.enable_x64(True):
        return jax.device_put(arr, dev)


def array_to_host(arr) -> torch.Tensor:
    """A CPU tensor holding a copy of the device array ``arr``. An array spread over
    several processes (``xlanb.distributed``) is read from this process's replica if it
    is replicated, else gathered from every process (a collective: each process must
    read it, as SPMD programs do)."""
    if arr.ndim > _NUMPY_MAX_DIMS:
        with jax.enable_x64(True):
            flat = _reshaped(arr, (-1,))
        return array_to_host(flat).reshape(tuple(arr.shape))
    t0 = time.perf_counter()
    if not getattr(arr, "is_fully_addressable", True):
        if arr.is_fully_replicated:
            arr = arr.addressable_data(0)
        else:
            if session.agree is not None:  # a collective: every process must read it too
                session.agree(arr)
            from jax.experimental import multihost_utils
            arr = multihost_utils.process_allgather(arr, tiled=True)
    host = numpy_to_tensor(np.asarray(arr))
    metrics.record("TransferFromDeviceTime", time.perf_counter() - t0)
    return host
