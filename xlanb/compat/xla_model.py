"""``torch_xla.core.xla_model`` (``xm``): devices, syncs and training helpers on xlanb.

Ordinals and the world size are xlanb's processes (one, or several under ``python -m
xlanb.launch``). There are no per-replica collectives: one SPMD program, whose gradient
reductions XLA inserts from the shardings, so ``reduce_gradients`` has nothing to do.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import jax
import torch

import xlanb
from xlanb.runtime.devices import device_index

from . import runtime as _xr
from . import xlac as _xlac
from .missing import ONE_PROCESS, SHARDING, module_getattr

NAME = "torch_xla.core.xla_model"

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"

__all__ = ["xla_device", "optimization_barrier_", "xla_device_hw", "get_xla_supported_devices", "is_xla_tensor",
           "get_ordinal", "get_local_ordinal", "is_master_ordinal", "xrt_world_size",
           "master_print", "mark_step", "wait_device_ops", "add_step_closure",
           "optimizer_step", "reduce_gradients", "save", "send_cpu_data_to_device",
           "rendezvous", "mesh_reduce", "set_rng_state", "get_memory_info", "xla_real_devices",
           "get_stablehlo"]

__getattr__ = module_getattr(NAME, {
    **{n: ONE_PROCESS for n in (
        "all_reduce", "all_gather", "all_to_all", "reduce_scatter", "collective_permute",
        "collective_broadcast", "send", "recv", "all_reduce_bucketized_gradients",
        "reduce_scatter_bucketized", "all_gather_bucketized", "broadcast_master_param",
        "set_replication", "xla_replication_devices", "do_on_ordinals")},
    "mark_sharding": SHARDING,
    "get_rng_state": "xlanb.manual_seed(seed) to set it; the state is not readable",
    "unlazy": "torch_xla.sync() / xlanb.sync()",
})

_step_closures: list[Callable[[], Any]] = []


def optimization_barrier_(tensors) -> None:
    """The tensors behind one optimization barrier, in place (``xlanb.optimization_barrier_``:
    XLA neither moves nor merges work across it)."""
    xlanb.optimization_barrier_(tensors)


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """``xla:n`` (``xla:0`` by default); ``devkind`` is ignored, as in torch_xla."""
    return xlanb.device(n or 0)


def xla_device_hw(device) -> str:
    """The hardware behind an xla device: ``"CPU"``, ``"TPU"``, ``"CUDA"``."""
    device_index(device)
    return _xr.device_type()


def get_xla_supported_devices(devkind=None, max_devices: int | None = None
                              ) -> list[str] | None:
    """``["xla:0", ...]``; with a ``devkind`` (``"TPU"``, ``"CPU"``, or a list of kinds)
    none of which is this platform's hardware (``xr.device_type()``), None, as torch_xla
    answers for a kind it has no device of."""
    if devkind is not None:
        kinds = [devkind] if isinstance(devkind, str) else list(devkind)
        if not any(_xr.names_this_platform(k) for k in kinds):
            return None
    n = xlanb.device_count()
    return [f"xla:{i}" for i in range(n if max_devices is None else min(n, max_devices))]


def is_xla_tensor(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "xla"


def get_ordinal(defval: int = 0) -> int:
    return _xr.process_index()


def get_local_ordinal(defval: int = 0) -> int:
    """This process's place among those of its host (``xr.local_ordinal``)."""
    return _xr.local_ordinal()


def is_master_ordinal(local: bool = True) -> bool:
    """Whether this is the first process of its host (``local``) or of all."""
    return (_xr.local_ordinal() if local else _xr.process_index()) == 0


def xrt_world_size(defval: int = 1) -> int:
    return _xr.process_count()


def master_print(*args: Any, fd=None, local: bool = False, flush: bool = False) -> None:
    """Print in process 0 only, as torch_xla does."""
    if is_master_ordinal(local):
        print(*args, file=sys.stdout if fd is None else fd, flush=flush)


def _run_step_closures() -> None:
    while _step_closures:
        todo = list(_step_closures)
        _step_closures.clear()
        for closure in todo:
            closure()


def _sync(cause: str, wait: bool = False) -> None:
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    xlanb.metrics.counter("MarkStep")
    xlanb.sync(cause=cause)
    if wait:
        wait_device_ops()
    _run_step_closures()


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """Run all pending work as one graph (``xlanb.sync``), then the step closures."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    _sync("user sync (xm.mark_step)", wait)


def wait_device_ops(devices: list | None = None) -> None:
    """Block until every computation already started has finished."""
    jax.effects_barrier()
    jax.block_until_ready(jax.live_arrays())


def add_step_closure(closure: Callable[..., Any], args: tuple = (),
                     run_async: bool = False) -> None:
    """Run ``closure(*args)`` after the next ``torch_xla.sync()`` / ``xm.mark_step()``
    (MpDeviceLoader syncs after each batch), in the order added. ``run_async`` closures
    run at the same point. Syncs made through xlanb's own API do not run them."""
    _step_closures.append(lambda a=args: closure(*a))


def reduce_gradients(optimizer, groups=None, pin_layout: bool = True) -> None:
    """Nothing to reduce: one replica."""


def optimizer_step(optimizer, barrier: bool = False, optimizer_args: dict | None = None,
                   groups=None, pin_layout: bool = True):
    """``optimizer.step(**optimizer_args)``; with ``barrier=True``, a sync after it.
    Returns what ``step`` returns."""
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**(optimizer_args or {}))
    if barrier:
        mark_step()
    return loss


def _map_tensors(data, fn):
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, dict):
        return type(data)((k, _map_tensors(v, fn)) for k, v in data.items())
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(_map_tensors(v, fn) for v in data))
    if isinstance(data, (list, tuple, set)):
        return type(data)(_map_tensors(v, fn) for v in data)
    return data


def send_cpu_data_to_device(datas, device, input_sharding=None):
    """Every tensor in ``datas`` (nested lists, tuples, dicts) moved to ``device``."""
    if input_sharding is not None:
        raise NotImplementedError(f"{NAME}.send_cpu_data_to_device(input_sharding=...): "
                                  f"{SHARDING}")
    device = torch.device(device)
    return _map_tensors(datas, lambda t: t.to(device))


def save(data: Any, file_or_path, master_only: bool = True,
         global_master: bool = False) -> None:
    """``torch.save`` with every xla tensor in ``data`` copied to the CPU first."""
    torch.save(_map_tensors(data, lambda t: t.cpu() if t.device.type == "xla" else t),
               file_or_path)


def rendezvous(tag: str, payload: bytes = b"", replicas: list | None = None) -> list[bytes]:
    """One replica: nothing to wait for; its own payload."""
    return [payload]


def mesh_reduce(tag: str, data, reduce_fn: Callable[[list], Any]):
    """One replica: ``reduce_fn([data])``."""
    return reduce_fn([data])


def set_rng_state(seed: int, device=None) -> None:
    xlanb.manual_seed(seed)


def get_memory_info(device=None) -> dict:
    """``{'bytes_used', 'bytes_limit', 'peak_bytes_used'}`` from xlanb's memory accounting
    (torch_xla's own CPU client answers UNIMPLEMENTED); see ``_XLAC._xla_memory_info``."""
    return _xlac._xla_memory_info(xlanb.device() if device is None else device)


def xla_real_devices(devices=None) -> list[str]:
    """The hardware device behind each xla device: ``["CPU:0"]``, ``["TPU:0", ...]``
    (every xla device when ``devices`` is None)."""
    if devices is None:
        devices = [f"xla:{i}" for i in range(xlanb.device_count())]
    elif isinstance(devices, (str, torch.device)):
        raise TypeError("xla_real_devices takes a list of devices")
    kind = _xr.device_type()
    return [f"{kind}:{device_index(torch.device(d) if isinstance(d, str) else d)}"
            for d in devices]


def get_stablehlo(tensors=None) -> str:
    """The StableHLO the next sync of ``tensors`` (every pending tensor when None) would
    compile; nothing runs."""
    return xlanb.hlo(*(tensors or ()))
