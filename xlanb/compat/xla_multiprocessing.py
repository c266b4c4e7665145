"""``torch_xla.distributed.xla_multiprocessing`` (``xmp``): ``spawn`` runs the function
once, in this process, as replica 0, so breakpoints, pdb and the magics see it (several
processes are started by ``python -m xlanb.launch``, not by ``spawn``)."""
from __future__ import annotations

from .missing import SPAWN, module_getattr

NAME = "torch_xla.distributed.xla_multiprocessing"

__all__ = ["spawn"]

__getattr__ = module_getattr(NAME, {"MpModelWrapper": "the model itself: .to(torch_xla.device())",
                                    "MpSerialExecutor": "call the function directly"})


def spawn(fn, args: tuple = (), nprocs: int | None = None, join: bool = True,
          daemon: bool = False, start_method: str = "spawn"):
    """``fn(0, *args)`` in this process."""
    if nprocs not in (None, 1):
        raise NotImplementedError(f"{NAME}.spawn(nprocs={nprocs}): {SPAWN}")
    return fn(0, *args)
