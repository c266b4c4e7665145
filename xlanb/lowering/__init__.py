"""Lowerings of aten ops to JAX. Importing this package fills ``registry.LOWERINGS``."""
import importlib
import pkgutil

from . import registry

for _m in pkgutil.iter_modules(__path__):
    if _m.name.startswith("aten_"):
        importlib.import_module(f"{__name__}.{_m.name}")
