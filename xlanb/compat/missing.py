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
# xlanb runs one SPMD program, in one process or several (python -m xlanb.launch): the
# collectives come from sharding, never from per-replica calls
COLLECTIVES = ("torch_xla's per-replica collectives are not provided: xlanb runs one SPMD "
               "program (in one process, or several started by python -m xlanb.launch); "
               "shard tensors with torch_xla.distributed.spmd.mark_sharding and XLA inserts "
               "the collectives (xlanb.collectives() lists them); a program that runs alone "
               "can skip the call with `if xr.world_size() > 1:`")
SPAWN = ("xmp.spawn runs the function once, in this process; start several processes with "
         "`python -m xlanb.launch --nproc N script.py` (xlanb.distributed.initialize() in each)")
# why torch_xla.distributed.fsdp's XlaFullyShardedDataParallel is left out (compat/fsdp.py)
FSDP_V1 = ("FSDP v1 shards over per-replica processes with its own all-gathers and "
           "reduce-scatters; xlanb runs one SPMD program and XLA inserts the collectives, so v1 "
           "is not provided. Move to FSDPv2 (torch_xla's FSDP over SPMD, what Hugging Face's "
           "Trainer runs with fsdp_config xla_fsdp_v2): `from torch_xla.experimental."
           "spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2`; "
           "`mesh = xs.Mesh(range(n), (n, 1), ('fsdp', 'model'))` and `xs.set_global_mesh(mesh)`; "
           "shard each batch with `xs.mark_sharding(x, mesh, ('fsdp', None))`; `model = "
           "FSDPv2(model)` (auto_wrap_policy and checkpoint_module work as in v1); "
           "`optimizer.step()` instead of `xm.optimizer_step`, in one process (no xmp.spawn)")
ONE_PROCESS = COLLECTIVES  # the name other modules import
SEE = ("see the 'Coming from torch_xla' table in xlanb's documentation (docs/guides/torch-xla.md), "
       "or the xlanb API (import xlanb)")


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
