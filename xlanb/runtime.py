"""Compile and run JAX functions for xlanb, with torch's dtypes and a persistent cache.

Everything xlanb traces or compiles goes through ``jax_context()``: x64 on (so int64 and
float64 stay 64-bit) and, unless the user configured JAX's cache themselves, the
persistent compilation cache pointed at xlanb's directory with no minimum compile time
(single-op executables compile in milliseconds and would otherwise never be stored).
Both are thread-local JAX states, so the user's own JAX code in the process is untouched.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

import jax
from jax._src import config as jax_config

from . import metrics
from .config import config

_local = threading.local()


def _user_cache_dir() -> str | None:
    # A directory the user set globally wins: JAX builds its cache object once per process.
    return jax_config.compilation_cache_dir.get_global()


@contextlib.contextmanager
def jax_context():
    """x64 and xlanb's persistent-cache settings, for the current thread only."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(jax.enable_x64(True))
        cache_dir = config.cache_dir
        if cache_dir and not _user_cache_dir():
            os.makedirs(cache_dir, exist_ok=True)
            stack.enter_context(jax_config.compilation_cache_dir(cache_dir))
            stack.enter_context(jax_config.persistent_cache_min_compile_time_secs(0.0))
            stack.enter_context(jax_config.persistent_cache_min_entry_size_bytes(-1))
        yield


def compile_jitted(fn, arg_specs, *, metric: str, lower_metric: str):
    """Trace, lower and compile ``fn`` for ``arg_specs``; time it all into ``metric``,
    and the tracing and lowering alone into ``lower_metric``. Returns ``(lowered, compiled)``.

    Persistent-cache hits and misses seen while doing so are counted as
    ``PersistentCacheHit`` / ``PersistentCacheMiss``.
    """
    t0 = time.perf_counter()
    _local.compiling = True
    try:
        with jax_context():
            lowered = jax.jit(fn).lower(*arg_specs)
            metrics.record(lower_metric, time.perf_counter() - t0)
            compiled = lowered.compile()
    finally:
        _local.compiling = False
        metrics.record(metric, time.perf_counter() - t0)
    return lowered, compiled


def _on_jax_event(event: str, **_kw) -> None:
    if not getattr(_local, "compiling", False):
        return  # the user's own JAX compiles are not ours to count
    if event == "/jax/compilation_cache/cache_hits":
        metrics.counter("PersistentCacheHit")
    elif event == "/jax/compilation_cache/cache_misses":
        metrics.counter("PersistentCacheMiss")


jax.monitoring.register_event_listener(_on_jax_event)
