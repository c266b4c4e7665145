"""The device map: ``xla:N`` is the N-th JAX device of the chosen platform that this
process drives (all of them in one process; with ``xlanb.distributed``, the process's
own). A mesh (``runtime/mesh.py``) indexes the global list, ``global_devices()``."""
from __future__ import annotations

import functools

import jax
import torch

from ..base.config import config
from . import libtpu

libtpu.prepare()  # before JAX first loads libtpu (runtime/libtpu.py)


@functools.cache
def jax_devices() -> tuple:
    """This process's devices (``xla:0..N-1``)."""
    platform = config.platform
    try:
        with libtpu.quiet():  # the first call may load libtpu: its no-TPU warnings
            return tuple(jax.local_devices(backend=platform) if platform else jax.local_devices())
    except RuntimeError as e:
        raise RuntimeError(f"xlanb: no JAX devices for platform {platform!r} "
                           f"(set by XLANB_PLATFORM): {e}") from None


@functools.cache
def global_devices() -> tuple:
    """Every process's devices, in JAX's global order: what mesh device ids index."""
    platform = config.platform
    with libtpu.quiet():
        return tuple(jax.devices(platform) if platform else jax.devices())


def jax_device(index: int | None):
    devs = jax_devices()
    i = 0 if index is None else index
    if not 0 <= i < len(devs):
        listing = ", ".join(f"xla:{k} = {d}" for k, d in enumerate(devs))
        raise RuntimeError(f"xlanb: device xla:{i} does not exist; available: {listing}")
    return devs[i]


def device_count() -> int:
    return len(jax_devices())


def platform_name() -> str:
    return jax_devices()[0].platform


def device_index(device) -> int:
    """The index of a torch device (``"xla"``, ``"xla:1"``, ``torch.device``); raises a
    clear error for an ``xla:N`` that does not exist."""
    if device is None:
        return 0
    idx = torch.device(device).index
    idx = 0 if idx is None else idx
    jax_device(idx)
    return idx
