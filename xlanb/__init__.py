"""xlanb: debug PyTorch programs on XLA devices from notebooks, IPython and pdb.

Tensors live on the torch device ``xla``; JAX compiles and runs them. Three execution
modes (lazy, eager, opbyop) can be switched at any time, and looking at a tensor never
changes what the next sync compiles.
"""
from __future__ import annotations

import torch

from . import backend as _backend

_backend.register()

from . import lowering as _lowering  # noqa: E402  (fills the lowering registry)
from . import metrics  # noqa: E402
from .capture import CompiledFunction, compile  # noqa: E402
from .config import config  # noqa: E402
from .devices import device_count  # noqa: E402
from .executor import CompiledGraph  # noqa: E402
from .executor import GraphList, RecompileWarning, graphs  # noqa: E402
from .inspection import hlo, pending_count, pending_ir, pending_summary, render_svg  # noqa: E402
from .scopes import install_scope_hooks as _install_scope_hooks  # noqa: E402
from .modes import MODES, get_mode, mode, set_mode  # noqa: E402
from .sync import sync  # noqa: E402
from .tensor import XlaTensor  # noqa: E402

_install_scope_hooks()

__all__ = ["device", "device_count", "set_mode", "get_mode", "mode", "MODES", "sync",
           "mark_step", "peek", "pending_ir", "pending_count", "pending_summary", "render_svg", "hlo", "graphs",
           "GraphList", "RecompileWarning", "metrics", "config", "XlaTensor", "CompiledGraph",
           "manual_seed", "set_trace", "compile", "CompiledFunction", "load_ipython_extension", "unload_ipython_extension"]

__version__ = "0.1.0"


def device(index: int = 0) -> torch.device:
    """``torch.device("xla", index)``; raises if JAX has no such device."""
    from .devices import jax_device
    jax_device(index)
    return torch.device("xla", index)


def mark_step() -> None:
    """torch_xla's name for ``sync()``."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    sync(cause="user sync (mark_step)")


def peek(t: torch.Tensor) -> torch.Tensor:
    """``t``'s value as a CPU tensor, computed op by op through the single-op cache.

    The pending graph is left exactly as it was: the next ``sync()`` compiles the same
    graph and hits the same cache entry as it would have without the peek.
    """
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    from .dispatch import value_node
    from .sync import peek_node
    from .transfer import array_to_host
    if not isinstance(t, XlaTensor):
        raise TypeError(f"xlanb.peek expects a tensor on the xla device, got {type(t).__name__}"
                        + (f" on {t.device}" if isinstance(t, torch.Tensor) else ""))
    with torch._C._DisableTorchDispatch():
        host = array_to_host(peek_node(value_node(t)))
    return host


def load_ipython_extension(ipython) -> None:
    """``%load_ext xlanb``: the magics, rich display and status line."""
    from .extensions.ipython import load_ipython_extension as load
    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .extensions.ipython import unload_ipython_extension as unload
    unload(ipython)


def set_trace() -> None:
    """A pdb with xla commands (xla, xpeek, xpending, xhlo, xsync, xmode, xgraphs), stopped
    in the caller's frame. ``PYTHONBREAKPOINT=xlanb.set_trace`` makes ``breakpoint()`` use it."""
    import sys
    from .extensions.pdb import XlaPdb
    XlaPdb().set_trace(sys._getframe(1))


def manual_seed(seed: int) -> None:
    """Seed the device's random ops (``torch.manual_seed`` does this too)."""
    from . import rng
    rng.manual_seed(seed)


def __getattr__(name: str):
    # ``xlanb.widgets`` imports ipywidgets only when asked for: the core never does.
    if name == "widgets":
        import importlib
        return importlib.import_module("xlanb.extensions.widgets")
    raise AttributeError(f"module 'xlanb' has no attribute {name!r}")
