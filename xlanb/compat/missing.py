"""What xlanb's torch_xla layer does not provide: one error, naming the attribute and what
to use instead.

Both error classes are ``NotImplementedError`` (the message says what to do) and also the
error Python's probes expect, so libraries that test for torch_xla features keep working:
``hasattr(xm, "all_gather")`` is False and ``getattr(xm, "x", None)`` is None
(``AttributeError``), and ``try: import torch_xla.distributed.xla_backend`` / ``except
ImportError:`` takes the except branch (``ModuleNotFoundError``).
"""
from __future__ import annotations

SHARDING = ("shard tensors with torch_xla.distributed.spmd.mark_sharding (xlanb.spmd) "
            "after moving them to the device")
ONE_PROCESS = ("xlanb runs one process on one device: no collectives or replication; "
               "guard the call with `if xr.world_size() > 1:`")
SEE = "see the 'Coming from torch_xla' table in xlanb's README, or the xlanb API (import xlanb)"


class CompatNotImplementedError(NotImplementedError, AttributeError):
    """A torch_xla attribute xlanb's compatibility layer does not provide."""


class CompatImportError(NotImplementedError, ModuleNotFoundError):
    """A torch_xla module xlanb's compatibility layer does not provide."""


def not_provided(module: str, name: str, hints: dict[str, str] | None = None
                 ) -> CompatNotImplementedError:
    hint = (hints or {}).get(name, SEE)
    err = CompatNotImplementedError(
        f"{module}.{name} is not provided by xlanb's torch_xla compatibility layer "
        f"(xlanb.compat): {hint}")
    err.name = name
    return err


def module_not_provided(fullname: str, hint: str = SEE) -> CompatImportError:
    err = CompatImportError(
        f"{fullname} is not provided by xlanb's torch_xla compatibility layer "
        f"(xlanb.compat): {hint}")
    err.name = fullname
    return err


def module_getattr(module: str, hints: dict[str, str] | None = None):
    """A module-level ``__getattr__``: dunder probes get a plain AttributeError (Python's
    own machinery asks for those), every other name the not-provided error."""
    def __getattr__(name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        raise not_provided(module, name, hints)
    return __getattr__
