"""Run torch_xla programs unchanged on xlanb: ``import torch_xla`` and its common
submodules resolve to xlanb's implementations.

    import xlanb.compat; xlanb.compat.install()   # in a notebook (or %xla_compat on)
    python -m xlanb.run train.py --lr 0.1         # a script, as __main__

How: a meta-path finder, first on ``sys.meta_path``, answers every ``torch_xla`` and
``torch_xla.*`` import. A finder rather than ``sys.modules`` entries made up front because
(1) only the modules a program imports are loaded; (2) a torch_xla module xlanb does not
provide fails at its import with a ``NotImplementedError`` that names it and what to use
instead (also a ``ModuleNotFoundError``, so ``try: import ... except ImportError`` guards
still work), where a pre-filled ``sys.modules`` can only give Python's bare "No module
named"; (3) ``uninstall()`` is exact: remove the finder and the modules it made.

Each torch_xla module is one module of this package (``torch_xla.core.xla_model`` is
``xlanb.compat.xla_model``, the same object), written on xlanb's public API. A name a
module does not provide raises ``NotImplementedError`` naming it and what to use instead,
never a bare ``AttributeError`` (the error is also an ``AttributeError``, so ``hasattr``
probes answer False). ``torch_xla.distributed.spmd`` is ``xlanb.spmd``.

If the real torch_xla is installed, ``install()`` says so and leaves it in place unless
``shadow=True`` (``python -m xlanb.run --shadow``).

``install()`` also reads torch_xla's debugging variables (``PT_XLA_DEBUG_LEVEL``,
``XLA_SAVE_TENSORS_FILE``, ``XLA_METRICS_FILE``, ...): see ``debug_env``.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

from . import debug_env, dynamo_bridge
from .missing import FSDP_V1, SHARDING, CompatImportError, CompatNotImplementedError, \
    module_not_provided, not_provided

__all__ = ["install", "uninstall", "installed", "real_torch_xla", "status", "MODULES",
           "CompatNotImplementedError", "CompatImportError"]

# torch_xla module -> the xlanb module that is it.
MODULES = {
    "torch_xla": "xlanb.compat.toplevel",
    "torch_xla.core.xla_model": "xlanb.compat.xla_model",
    "torch_xla.debug.metrics": "xlanb.compat.metrics",
    "torch_xla.debug.profiler": "xlanb.compat.profiler",
    "torch_xla.debug.graph_saver": "xlanb.compat.graph_saver",
    "torch_xla.core.dynamo_bridge": "xlanb.compat.dynamo_bridge",
    "torch_xla.backends": "xlanb.compat.backends",
    "torch_xla.runtime": "xlanb.compat.runtime",
    "torch_xla.experimental": "xlanb.compat.experimental",
    "torch_xla.distributed.parallel_loader": "xlanb.compat.parallel_loader",
    "torch_xla.distributed.xla_multiprocessing": "xlanb.compat.xla_multiprocessing",
    "torch_xla._XLAC": "xlanb.compat.xlac",
    "torch_xla.distributed.spmd": "xlanb.compat.spmd",
    "torch_xla.distributed.spmd.debugging": "xlanb.compat.spmd",
    "torch_xla.experimental.xla_sharding": "xlanb.compat.spmd",
    "torch_xla.experimental.spmd_fully_sharded_data_parallel": "xlanb.compat.spmd_fsdp",
    "torch_xla.experimental.scan": "xlanb.compat.scan",
    "torch_xla.experimental.scan_layers": "xlanb.compat.scan_layers",
    "torch_xla.distributed.fsdp": "xlanb.compat.fsdp",
    "torch_xla.distributed.fsdp.utils": "xlanb.compat.fsdp",
    "torch_xla.distributed.fsdp.wrap": "xlanb.compat.fsdp_wrap",
    "torch_xla.utils.checkpoint": "xlanb.compat.checkpoint",
}
# Folders of torch_xla with nothing of their own that programs use: empty modules whose
# attributes are their submodules.
NAMESPACES = ("torch_xla.core", "torch_xla.debug", "torch_xla.distributed", "torch_xla.utils")
PACKAGES = {"torch_xla", "torch_xla.experimental", "torch_xla.distributed.spmd",
            "torch_xla.distributed.fsdp", "torch_xla.backends", *NAMESPACES}
# Modules refused with a reason of their own (and everything under them).
REFUSED = {
    "torch_xla.distributed.xla_backend": "no torch.distributed 'xla' backend: xlanb's "
                                         "processes (python -m xlanb.launch) join with "
                                         "xlanb.distributed.initialize(); drop "
                                         "dist.init_process_group('xla')",
    # FSDP v1 itself (its package gives FSDPv2's helpers; compat/fsdp.py says why)
    "torch_xla.distributed.fsdp.xla_fully_sharded_data_parallel": FSDP_V1,
}

_namespaces: dict[str, types.ModuleType] = {}


def _namespace(name: str) -> types.ModuleType:
    mod = _namespaces.get(name)
    if mod is None:
        mod = types.ModuleType(name, f"{name}: its submodules, from xlanb.compat")
        children = {k.rpartition(".")[2] for k in (*MODULES, *NAMESPACES)
                    if k.rpartition(".")[0] == name}

        def __getattr__(attr: str, name=name, children=children):
            if attr in children:
                return importlib.import_module(f"{name}.{attr}")
            if attr.startswith("__") and attr.endswith("__"):
                raise AttributeError(f"module {name!r} has no attribute {attr!r}")
            raise not_provided(name, attr)
        mod.__getattr__ = __getattr__
        _namespaces[name] = mod
    return mod


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        if spec.name in NAMESPACES:
            return _namespace(spec.name)
        return importlib.import_module(MODULES[spec.name])

    def exec_module(self, module) -> None:
        pass  # the module is already built


class TorchXlaFinder(importlib.abc.MetaPathFinder):
    """Answers ``torch_xla`` and ``torch_xla.*`` imports with xlanb's modules."""

    loader = _Loader()

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != "torch_xla" and not fullname.startswith("torch_xla."):
            return None
        for refused, hint in REFUSED.items():
            if fullname == refused or fullname.startswith(refused + "."):
                raise module_not_provided(fullname, hint)
        if fullname in MODULES or fullname in NAMESPACES:
            return importlib.util.spec_from_loader(fullname, self.loader,
                                                   is_package=fullname in PACKAGES)
        known = ", ".join(sorted(MODULES))
        raise module_not_provided(fullname, f"it provides {known}; see the 'Coming from "
                                            "torch_xla' table in xlanb's documentation "
                                            "(docs/guides/torch-xla.md)")


_finder = TorchXlaFinder()


def real_torch_xla() -> str | None:
    """Where the real torch_xla is installed (None if it is not)."""
    mod = sys.modules.get("torch_xla")
    if mod is not None and not _ours(mod):
        return getattr(mod, "__file__", None) or "torch_xla (already imported)"
    spec = importlib.machinery.PathFinder.find_spec("torch_xla")
    if spec is None:
        return None
    return spec.origin or ", ".join(spec.submodule_search_locations or ()) or "torch_xla"


def installed() -> bool:
    """Whether ``import torch_xla`` gives xlanb's modules now."""
    return _finder in sys.meta_path


def _ours(mod) -> bool:
    return mod in _namespaces.values() or getattr(mod, "__name__", "").startswith("xlanb.")


def install(shadow: bool = False) -> bool:
    """Make ``import torch_xla`` (and its submodules) give xlanb's modules. If the real
    torch_xla is installed, warn and leave it in place, unless ``shadow``; returns
    whether xlanb's modules are now the ones imported."""
    if installed():
        return True
    real = real_torch_xla()
    if real is not None:
        if not shadow:
            warnings.warn(f"xlanb.compat: the real torch_xla is installed ({real}); it is "
                          "left in place. To run torch_xla code on xlanb instead, use "
                          "xlanb.compat.install(shadow=True), %xla_compat on --shadow or "
                          "python -m xlanb.run --shadow.", stacklevel=2)
            return False
        if "torch_xla" in sys.modules:
            raise RuntimeError("xlanb.compat: the real torch_xla is already imported in this "
                               "process and has taken the xla device; restart, then "
                               "install(shadow=True) before importing torch_xla")
    sys.meta_path.insert(0, _finder)
    dynamo_bridge.install()  # torch.compile(backend="openxla") runs on xlanb
    try:  # torch_xla's debugging variables (PT_XLA_DEBUG_LEVEL, XLA_SAVE_TENSORS_FILE, ...)
        debug_env.install()
    except ValueError:  # a bad value: nothing is left half-installed
        uninstall()
        raise
    return True


def uninstall() -> None:
    """Undo ``install``: ``import torch_xla`` finds the real one (or nothing) again.
    Modules a program already holds (``xm``, ``met``) keep working."""
    while _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    debug_env.uninstall()
    dynamo_bridge.uninstall()
    for name in [n for n in sys.modules if n == "torch_xla" or n.startswith("torch_xla.")]:
        if _ours(sys.modules[name]):
            del sys.modules[name]


def status() -> str:
    """One line: whether torch_xla is xlanb's, and whether the real one is installed."""
    real = real_torch_xla()
    if installed():
        line = "torch_xla compatibility on: import torch_xla gives xlanb's modules"
        return line + (f" (shadowing the real torch_xla at {real})" if real else "")
    line = "torch_xla compatibility off"
    return line + (f" (the real torch_xla is installed at {real})" if real else "")
