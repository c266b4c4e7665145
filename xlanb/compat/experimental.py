"""``torch_xla.experimental``: eager mode, on xlanb's modes (eager / lazy)."""
from __future__ import annotations

import contextlib

import xlanb

from .missing import module_getattr

NAME = "torch_xla.experimental"

__all__ = ["eager_mode", "is_eager_mode", "eager_mode_context", "compile"]

__getattr__ = module_getattr(NAME, {
    "plugins": "choose the JAX platform with XLANB_PLATFORM=cpu|gpu|tpu",
    "custom_kernel": "no Pallas kernels on xlanb's device yet",
})


def eager_mode(enable: bool) -> None:
    """True: xlanb's eager mode (each op runs at once through the single-op cache);
    False: lazy mode (one graph per sync). Pending work is kept either way."""
    xlanb.set_mode("eager" if enable else "lazy")


def is_eager_mode() -> bool:
    return xlanb.get_mode() == "eager"


@contextlib.contextmanager
def eager_mode_context(enable: bool):
    """Eager (or lazy) mode inside the block; the mode before it afterwards."""
    with xlanb.mode("eager" if enable else "lazy"):
        yield


def compile(f=None, full_graph: bool = False, name: str | None = None,
            max_different_graphs: int | None = None,
            custom_compile_options: dict | None = None,
            num_different_graphs_allowed: int | None = None):
    """torch_xla's ``compile``: the pending work is synced first, the body is traced in
    lazy mode (whatever the mode outside) and synced as one graph at its end. Without
    ``f``, a context manager (and decorator). ``full_graph``, ``name`` and the graph
    limits are accepted and not enforced: ``xlanb.graphs()`` names every recompile and
    its cause instead."""
    if custom_compile_options is not None:
        raise NotImplementedError(f"{NAME}.compile(custom_compile_options=...): xlanb "
                                  "compiles with JAX's options")

    @contextlib.contextmanager
    def _compile():
        xlanb.sync(cause="torch_xla.compile: pending work before the compiled region")
        with xlanb.mode("lazy"):
            try:
                yield
            finally:
                xlanb.sync(cause=f"torch_xla.compile({name or getattr(f, '__name__', '')})")

    return _compile() if f is None else _compile()(f)
