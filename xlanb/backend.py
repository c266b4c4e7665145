"""Registers the ``xla`` device with torch, in pure Python (torch >= 2.13).

torch's PrivateUse1 backend is renamed to ``xla``; a Python device guard and hooks make
``.to("xla")`` and ``device="xla"`` legal; kernels for the few ops that create tensors on
the device (``empty``, ``empty_strided``, ``_copy_from``...) return ``XlaTensor``s, after
which every op reaches ``XlaTensor.__torch_dispatch__``.
"""
from __future__ import annotations

import types

import torch

from .base import rng
from .dispatch import dispatch
from .ir import Node, TensorMeta, contiguous_strides
from .ops.leaves import empty_info
from .runtime import devices
from .runtime.devices import device_index
from .tensor import new_tensor

aten = torch.ops.aten

_registered = False
_lib = None


def _check_torch():
    if not hasattr(torch._C, "_acc"):
        raise ImportError(f"xlanb needs torch >= 2.13 (torch._C._acc); found torch {torch.__version__}")


class _Guard(torch._C._acc.DeviceGuard if hasattr(torch._C, "_acc") else object):
    def type_(self):
        __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
        return torch._C._autograd.DeviceType.PrivateUse1


class _Hooks(torch._C._acc.PrivateUse1Hooks if hasattr(torch._C, "_acc") else object):
    def is_available(self):
        __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
        return True

    def has_primary_context(self, device_index):
        __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
        return True

    def is_built(self):
        __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
        return True


def _device_module() -> types.ModuleType:
    """``torch.xla``: what torch asks a device module for (seeding, counts)."""
    m = types.ModuleType("torch.xla")
    m.is_available = lambda: True
    m.is_initialized = lambda: True  # FakeTensor asks (torch.compile traces on device xla)
    m.device_count = devices.device_count
    m.current_device = lambda: 0
    m._is_in_bad_fork = lambda: False
    m.manual_seed = rng.manual_seed
    m.manual_seed_all = rng.manual_seed
    m.seed = lambda: rng.manual_seed(torch.initial_seed())
    m.seed_all = m.seed
    m.initial_seed = rng.initial_seed
    m.get_rng_state = lambda device=None: rng.get_rng_state()
    m.set_rng_state = lambda state, device=None: rng.set_rng_state(state)
    m.synchronize = lambda device=None: None
    return m


def _empty(size, dtype, device, stride=None):
    shape = tuple(int(s) for s in size)
    dtype = dtype or torch.get_default_dtype()
    idx = device_index(device)
    meta = TensorMeta(shape, tuple(stride) if stride is not None else contiguous_strides(shape), dtype)
    return new_tensor(Node(empty_info(meta, idx)), meta, idx)


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None,
                         memory_format=None):
    return _empty(size, dtype, device)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return _empty(size, dtype, device, stride)


def _copy_from(self, dst, non_blocking=False):
    return dispatch(aten.copy_.default, (dst, self), {})


def _copy_from_and_resize(self, dst):
    return _copy_from(self, dst)


# Factories whose composite kernels make an empty tensor and then resize it through an
# out= op: wrapper tensors cannot be resized, so these go straight to dispatch.
_FACTORIES = ("arange", "arange.start", "arange.start_step", "linspace", "logspace", "eye",
              "eye.m", "randperm", "scalar_tensor", "triu_indices", "tril_indices",
              "_efficientzerotensor")


def _factory_kernel(op):
    def kernel(*args, **kwargs):
        return dispatch(op, args, kwargs)
    return kernel


def register() -> None:
    """Make ``torch.device("xla")`` real. Idempotent."""
    global _registered, _lib
    if _registered:
        return
    _check_torch()
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch.utils.rename_privateuse1_backend("xla")
    torch._register_device_module("xla", _device_module())
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    _lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    _lib.impl("_copy_from", _copy_from, "PrivateUse1")
    _lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
    for name in _FACTORIES:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        _lib.impl(name, _factory_kernel(op), "PrivateUse1")
    # The MHA / TransformerEncoderLayer fast paths call fused CUDA-style kernels when they
    # see a PrivateUse1 backend; the composite path lowers cleanly.
    torch.backends.mha.set_fastpath_enabled(False)
    _registered = True
