"""``torch_xla.core.dynamo_bridge``: what torch's own ``openxla`` and ``openxla_eval``
dynamo backends call, so ``torch.compile(model, backend="openxla")`` runs on xlanb's
dynamo backend (``backend="xlanb"``: ``xlanb.compile`` replays each graph's executable).
With ``openxla``, torch's AOTAutograd splits forward and backward first, and each is
one such graph: but AOTAutograd takes fake tensors only, so while xlanb's layer is
installed ``openxla`` is xlanb's dynamo backend itself (see ``install``)."""
from __future__ import annotations

import importlib.abc
import sys

from .missing import module_getattr

NAME = "torch_xla.core.dynamo_bridge"

__all__ = ["extract_compiled_graph"]

__getattr__ = module_getattr(NAME, {})


def extract_compiled_graph(xla_model, xla_args):
    """The callable that runs dynamo's graph ``xla_model`` (first called with
    ``xla_args``) through xlanb's dynamo backend."""
    from xlanb.capture.dynamo import xlanb_backend
    return xlanb_backend(xla_model, list(xla_args))


# torch registers ``openxla`` as AOTAutograd around ``openxla_eval``; AOTAutograd's
# functionalization takes fake tensors only and fails on xlanb's, so while the layer is
# installed ``openxla`` is xlanb's dynamo backend itself (autograd through the lazy trace,
# as backend="xlanb"). torch registers it when its dynamo backends are first looked up:
# swapped then (a hook on that import), or at once if that already happened.
_TORCH_MODULE = "torch._dynamo.backends.torchxla"
_saved: dict = {}


def _swap() -> None:
    from torch._dynamo.backends import registry
    from xlanb.capture.dynamo import xlanb_backend
    if "openxla" in registry._COMPILER_FNS and "openxla" not in _saved:
        _saved["openxla"] = registry._COMPILER_FNS["openxla"]
        registry._COMPILER_FNS["openxla"] = xlanb_backend


class _AfterTorchBackends(importlib.abc.MetaPathFinder):
    """Runs ``_swap`` once torch's module that registers ``openxla`` has run."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TORCH_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                real = spec.loader.exec_module

                def exec_module(module, real=real):
                    real(module)
                    _swap()
                spec.loader = _Wrapped(spec.loader, exec_module)
                return spec
        return None


class _Wrapped(importlib.abc.Loader):
    def __init__(self, loader, exec_module):
        self._loader, self._exec = loader, exec_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._exec(module)


_hook = _AfterTorchBackends()


def install() -> None:
    """Make ``torch.compile(backend="openxla")`` run on xlanb (``compat.install``)."""
    if _TORCH_MODULE in sys.modules:
        _swap()
    elif _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)


def uninstall() -> None:
    """Give torch its ``openxla`` back."""
    while _hook in sys.meta_path:
        sys.meta_path.remove(_hook)
    if "openxla" in _saved:
        from torch._dynamo.backends import registry
        registry._COMPILER_FNS["openxla"] = _saved.pop("openxla")
