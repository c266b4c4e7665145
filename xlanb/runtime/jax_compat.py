"""The private JAX APIs xlanb uses, each named once here, with the versions checked.

Everything else in xlanb uses JAX's public API (``jax``, ``jax.config``, ``jax.stages``,
``jax.extend``). These have no public equivalent. Checked: jax/jaxlib 0.10.2 (the whole
suite) and 0.10.1 (the demo; docs/compat.md). Where one moves in another JAX, the callers
that can go on without it (source-mapped HLO, loop FLOPs) catch the error and lose only
that feature; the others fail loudly.

Imports happen inside each function: runtime/libtpu.py must configure JAX's platform
before anything asks JAX for a backend.
"""
from __future__ import annotations

__all__ = ["mlir_module", "backends_started", "initialize_lapack", "source_info",
           "locations_frame_limit",
           "hlo_module_cost_analysis", "distributed_client", "exit_handlers_to_skip",
           "shutdown_distributed", "single_device_put"]


def mlir_module():
    """``jax._src.interpreters.mlir``: its ``make_ir_context`` is replaced so that
    xlanb's lowerings reuse one MLIR context per thread (runtime/jit.py)."""
    from jax._src.interpreters import mlir
    return mlir


def backends_started() -> bool:
    """Whether JAX has made its backends yet (``xla_bridge._backends``): after that,
    setting ``jax_platforms`` does nothing (runtime/libtpu.py). The public
    ``jax.extend.backend.backends()`` would make them."""
    from jax._src import xla_bridge
    return bool(xla_bridge._backends)


def initialize_lapack() -> None:
    """Fill in jaxlib's LAPACK FFI handlers, as ``jax.export`` does before it runs a
    module it deserialized (runtime/store.py: a stored CPU executable calls them)."""
    try:
        from jax._src.lax.linalg import initialize_lapack as init
    except ImportError:
        from jaxlib.lapack import _lapack  # older layouts
        init = _lapack.initialize
    init()


def source_info():
    """(``Traceback.get_traceback``, the source-info context) from
    ``jax._src.source_info_util``: the line and scope xlanb gives each traced op
    (executables/stages.py). Raises ImportError or AttributeError where JAX moved them."""
    from jax._src import source_info_util as siu
    return siu.Traceback.get_traceback, siu._source_info_context


def locations_frame_limit():
    """JAX's ``jax_traceback_in_locations_limit`` setting: called with ``n``, a context in
    which JAX's MLIR locations keep at most ``n`` Python frames (on this thread only; the
    public ``jax.config.update`` is process-wide)."""
    from jax._src import config
    return config.traceback_in_locations_limit


def hlo_module_cost_analysis(client, hlo_text: str) -> dict:
    """XLA's generic cost analysis of one HLO module's text (executables/target.py)."""
    from jax._src.lib import _jax
    from jaxlib import _hlo
    return _jax.hlo_module_cost_analysis(client, _hlo.hlo_module_from_text(hlo_text))


def distributed_client():
    """The key-value client ``jax.distributed.initialize`` started (xlanb/distributed.py)."""
    from jax._src import distributed
    return distributed.global_state.client


def exit_handlers_to_skip() -> list:
    """JAX's ``atexit`` handlers that must not run while XLA compiles on another thread
    (runtime/shutdown.py): ``jax._src.api.clean_up`` clears the backends, the client that
    compile uses. Empty where JAX has none by that name."""
    try:
        from jax._src import api
    except ImportError:
        return []
    fn = getattr(api, "clean_up", None)
    return [fn] if callable(fn) else []


def shutdown_distributed() -> None:
    """What ``clean_up`` also does: end ``jax.distributed``'s connection, if one was made
    (``jax._src.distributed.shutdown``; nothing otherwise)."""
    try:
        from jax._src import distributed
        if distributed.global_state.client is not None:
            distributed.shutdown()
    except Exception:  # noqa: BLE001 - the process ends either way
        pass


def single_device_put():
    """``(numpy array, device) -> jax.Array``: one host array copied onto one device with
    its own dtype (int64 stays int64 whatever this thread's x64 setting), by the call
    ``jax.device_put`` ends in (``pxla.batched_device_put``), or None where JAX moved it.
    ``jax.device_put`` itself took 100-130 us a host segment's result inside a generate
    loop, where this call takes 8-12 us (its flattening, sharding checks and dispatch
    are for pytrees and shardings; runtime/transfer.py has one array and one device)."""
    try:
        from jax._src import core
        from jax._src.interpreters import pxla
        from jax.sharding import SingleDeviceSharding
        batched = pxla.batched_device_put
        shaped = core.ShapedArray
    except (ImportError, AttributeError):
        return None
    shardings: dict = {}

    def put(arr, dev):
        sharding = shardings.get(dev)
        if sharding is None:
            sharding = shardings[dev] = SingleDeviceSharding(dev)
        return batched(shaped(arr.shape, arr.dtype), sharding, [arr], [dev], True,
                       enable_x64=True)
    return put
