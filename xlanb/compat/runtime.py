"""``torch_xla.runtime`` (``xr``): xlanb's processes (one, or several under ``python -m
xlanb.launch``) and the JAX devices of its platform."""
from __future__ import annotations

import os
import sys

import xlanb
from xlanb import distributed
from xlanb.base.config import launch_settings
from xlanb.runtime.devices import global_devices, jax_device, platform_name

from .missing import module_getattr

NAME = "torch_xla.runtime"

# JAX platform -> torch_xla's PJRT device type.
_HW = {"cpu": "CPU", "tpu": "TPU", "gpu": "CUDA", "cuda": "CUDA", "rocm": "ROCM"}

__all__ = ["device_type", "world_size", "global_ordinal", "local_ordinal", "process_index",
           "process_count", "local_process_count", "global_device_count",
           "local_device_count", "addressable_device_count", "global_runtime_device_count",
           "addressable_runtime_device_count", "host_index", "is_spmd", "use_spmd",
           "is_bf16_supported", "using_pjrt", "global_runtime_device_attributes",
           "runtime_device_attributes", "initialize_cache", "set_device_type"]

__getattr__ = module_getattr(NAME, {
    "get_master_ip": "xlanb.distributed.initialize() reads the coordinator's address "
                     "(XLANB_COORDINATOR_ADDRESS, set by python -m xlanb.launch)",
})

_LOOPBACK = ("127.", "localhost", "[::1]", "::1")


def initialize_cache(path: str, readonly: bool = False) -> None:
    """Keep compiled executables in ``path``: xlanb's executable store
    (``xlanb.config.store_dir``, what ``XLANB_STORE_DIR`` sets; ``python -m xlanb.store``
    manages it) moves there. ``readonly=True``: this process loads what is there and
    writes nothing (``xlanb.config.store_readonly``), as torch_xla's non-writing
    processes do. Unlike torch_xla, it may be called after graphs have compiled."""
    path = os.fspath(path)
    if _paused:  # --xla_dump_to keeps the store off: the folder counts once that ends
        _paused[0] = path
    else:
        xlanb.config.store_dir = path
    xlanb.config.store_readonly = bool(readonly)


_paused: list = []  # [the store's folder to restore] while the store is paused


def pause_store() -> None:
    """Turn the executable store off until ``resume_store`` (``XLA_FLAGS=--xla_dump_to``:
    an executable loaded from the store is not compiled, so XLA would dump nothing)."""
    if not _paused:
        _paused.append(xlanb.config.store_dir)
        xlanb.config.store_dir = None


def resume_store() -> None:
    if _paused:
        xlanb.config.store_dir = _paused.pop()


def set_device_type(pjrt_device: str) -> None:
    """torch_xla's ``PJRT_DEVICE``: xlanb runs on JAX's platform, chosen when the process
    starts (``XLANB_PLATFORM``). Naming that platform is accepted; ``"TPU"`` elsewhere too,
    with a one-line note (a TPU program runs here unchanged; ``XLANB_TARGET`` also compiles
    each graph for a TPU); any other platform is an error."""
    want = str(pjrt_device).strip().upper()
    have = device_type()
    if names_this_platform(want):
        return
    if want == "TPU":
        print(f"xlanb: xr.set_device_type('TPU'): xlanb runs on JAX's platform, {have} here "
              "(XLANB_TARGET=v5e:2x2 also compiles each graph for a TPU)", file=sys.stderr)
        return
    known = sorted(set(_HW.values()))
    raise RuntimeError(f"{NAME}.set_device_type({pjrt_device!r}): xlanb runs on JAX's "
                       f"platform, {have} here, chosen when the process starts: set "
                       f"XLANB_PLATFORM (cpu, gpu, tpu) before it; torch_xla's device types "
                       f"are {', '.join(known)}")


def names_this_platform(kind) -> bool:
    """Whether torch_xla's device kind ``kind`` (``"TPU"``, ``"GPU"``, ``"CUDA"``,
    ``"CPU"``) is this platform's hardware (``device_type()``)."""
    want, have = str(kind).strip().upper(), device_type()
    return want == have or (want == "GPU" and have == "CUDA")


def device_type() -> str:
    """The hardware: ``"CPU"``, ``"TPU"``, ``"CUDA"`` (JAX's platform, in torch_xla's words)."""
    p = platform_name()
    return _HW.get(p, p.upper())


def world_size() -> int:
    """The processes of this program (``python -m xlanb.launch``, ``xlanb.distributed``);
    1 when it runs alone."""
    return distributed.process_count()


def global_ordinal() -> int:
    """This process's place among them (0 when it runs alone)."""
    return distributed.process_index()


def _launched_here() -> bool:
    """Whether this process's fellows all run on this host: ``python -m xlanb.launch``
    starts them, on one machine, around a coordinator on the loopback address."""
    launched = launch_settings()
    return (distributed.process_count() > 1
            and (launched.coordinator or "").startswith(_LOOPBACK)
            and launched.num_processes == distributed.process_count())


def local_ordinal() -> int:
    """This process's place among the processes of its host: under ``python -m
    xlanb.launch``, all of them (one host), so its global ordinal; 0 otherwise."""
    return distributed.process_index() if _launched_here() else 0


def process_index() -> int:
    return distributed.process_index()


def process_count() -> int:
    return distributed.process_count()


def local_process_count() -> int:
    """The processes on this host: every one under ``python -m xlanb.launch``; else 1."""
    return distributed.process_count() if _launched_here() else 1


def host_index() -> int:
    return 0


def global_device_count() -> int:
    """The devices of every process (``xlanb.distributed.global_device_count``)."""
    return distributed.global_device_count()


def local_device_count() -> int:
    """This process's devices."""
    return xlanb.device_count()


def addressable_device_count() -> int:
    """This process's devices."""
    return xlanb.device_count()


global_runtime_device_count = global_device_count
addressable_runtime_device_count = addressable_device_count


def is_bf16_supported() -> bool:
    return True


def is_spmd() -> bool:
    """Whether any tensor was sharded (xlanb needs no SPMD switch: ``mark_sharding``
    is enough)."""
    return xlanb.spmd.is_spmd()


def use_spmd(auto: bool | None = False):
    """Nothing to switch on: in xlanb a tensor is sharded by ``mark_sharding`` alone, and
    unsharded tensors join a mesh replicated when they meet a sharded one."""
    if auto:
        raise NotImplementedError(f"{NAME}.use_spmd(auto=True): xlanb has no automatic "
                                  "sharding; mark tensors with xs.mark_sharding")
    xlanb.spmd.use_spmd()


def using_pjrt() -> bool:
    """True: torch_xla's PJRT runtime is what xlanb's JAX runs on."""
    return True


def _attributes(d) -> dict:
    """A JAX device's attributes as torch_xla names them (what the platform reports)."""
    out = {"name": f"{device_type()}:{d.id}", "device_kind": d.device_kind,
           "process_index": d.process_index}
    for attr in ("coords", "core_on_chip", "num_cores"):
        v = getattr(d, attr, None)
        if v is not None:
            out[attr] = list(v) if isinstance(v, tuple) else v
    return out


def global_runtime_device_attributes() -> list[dict]:
    """One dict per device of every process: name, kind, process, and where the platform
    reports them (TPU) coordinates and core."""
    return [_attributes(d) for d in global_devices()]


def runtime_device_attributes(device) -> dict:
    """The attributes of one xla device (``"xla:0"``), as above."""
    import torch
    from xlanb.runtime.devices import device_index
    return _attributes(jax_device(device_index(torch.device(device) if isinstance(device, str)
                                               else device)))
