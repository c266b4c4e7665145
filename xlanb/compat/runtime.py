"""``torch_xla.runtime`` (``xr``): xlanb's processes (one, or several under ``python -m
xlanb.launch``) and the JAX devices of its platform."""
from __future__ import annotations

import xlanb
from xlanb import distributed
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
           "runtime_device_attributes"]

__getattr__ = module_getattr(NAME, {
    "initialize_cache": "xlanb keeps compiled executables in its own store: see "
                        "`python -m xlanb.cache` and XLANB_CACHE_DIR",
    "get_master_ip": "xlanb.distributed.initialize() reads the coordinator's address "
                     "(XLANB_COORDINATOR_ADDRESS, set by python -m xlanb.launch)",
    "set_device_type": "choose the JAX platform with XLANB_PLATFORM=cpu|gpu|tpu",
})


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


def local_ordinal() -> int:
    return 0


def process_index() -> int:
    return distributed.process_index()


def process_count() -> int:
    return distributed.process_count()


def local_process_count() -> int:
    return 1


def host_index() -> int:
    return 0


def global_device_count() -> int:
    return xlanb.device_count()


def local_device_count() -> int:
    return xlanb.device_count()


def addressable_device_count() -> int:
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
