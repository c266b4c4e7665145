"""``torch_xla``: the top-level module (devices, sync, compile), with its submodules
loaded when first used, as ``import torch_xla; torch_xla.experimental.eager_mode(True)``
expects."""
from __future__ import annotations

import importlib

import torch

import xlanb

from . import experimental as _experimental
from . import xla_model as _xm
from . import xla_multiprocessing as _xmp
from .missing import not_provided

NAME = "torch_xla"

# PEP 440, lower than every torch_xla release: version checks see an old torch_xla.
__version__ = f"0+xlanb.{xlanb.__version__}"

# Submodules ``torch_xla.<name>`` resolves to on first use.
SUBMODULES = ("core", "debug", "runtime", "experimental", "distributed", "_XLAC", "backends")

_HINTS = {
    "real_devices": "torch_xla.runtime.device_type() for the hardware",
    "set_custom_compile_options": "not available: xlanb compiles with JAX's defaults",
}

__all__ = ["device", "devices", "device_count", "sync", "step", "compile", "manual_seed",
           "launch", "__version__"]


def __getattr__(name: str):
    if name in SUBMODULES:
        return importlib.import_module(f"{NAME}.{name}")
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(f"module {NAME!r} has no attribute {name!r}")
    raise not_provided(NAME, name, _HINTS)


def device(index: int | None = None) -> torch.device:
    """``xla:index`` (``xla:0`` by default)."""
    return xlanb.device(index or 0)


def devices() -> list[torch.device]:
    return [xlanb.device(i) for i in range(xlanb.device_count())]


def device_count() -> int:
    return xlanb.device_count()


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """Run all pending work as one graph (``xlanb.sync``), then the step closures."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    _xm._sync("user sync (torch_xla.sync)", wait)


def compile(f=None, full_graph: bool = False, name: str | None = None,
            max_different_graphs: int | None = None,
            custom_compile_options: dict | None = None):
    """Sync the pending work, trace the body in lazy mode, sync it as one graph (a
    context manager without ``f``)."""
    return _experimental.compile(f, full_graph=full_graph, name=name,
                                 max_different_graphs=max_different_graphs,
                                 custom_compile_options=custom_compile_options)


def step():
    """A block that is one graph: ``with torch_xla.step(): ...`` (torch_xla's
    ``compile()`` without a function)."""
    return compile()


def manual_seed(seed: int, device=None) -> None:
    xlanb.manual_seed(seed)


def launch(fn, args: tuple = (), start_method: str = "spawn",
           debug_single_process: bool = False):
    """``fn(0, *args)`` in this process (xlanb runs one)."""
    return _xmp.spawn(fn, args=args, nprocs=1)

