"""Compiled executables on disk, found by xlanb's own key: a warm process skips lowering.

JAX's persistent cache keys an executable by its lowered module, so a new process must
trace and lower each graph and each single-op executable before it can find it. For a
BERT step in eager mode that lowering costs more than loading all 181 executables.
xlanb already has a full description of what an executable computes before lowering it:
the op signatures (op, input layouts, static arguments, result layouts) and the wiring.
This store keys executables by that description, together with everything else that
decides the compiled code: xlanb's own source (the lowerings), the versions of torch
(its decompositions) and its default dtype, JAX and jaxlib, XLA's flags, the JAX
settings that change lowering, the device and the compile options. A hit loads the
executable without tracing anything; its StableHLO is lowered again only if someone asks
to see it.

Entries are JAX's own serialized executables (``jax.experimental.serialize_executable``),
zlib-compressed and written atomically, one file per key, in ``<cache dir>/xlanb-executables``. An entry that
cannot be read back (truncated, or from an incompatible build) is a miss, and is replaced.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile
import warnings
import zlib

import jax
from jax.experimental import serialize_executable

from ..base import metrics
from ..base.config import config
from .devices import jax_device
from .jit import user_cache_dir

_DIR = "xlanb-executables"
# JAX settings that change what a function lowers to (read with their thread-local value).
_LOWERING_SETTINGS = ("default_matmul_precision", "default_prng_impl", "threefry_partitionable",
                      "numpy_dtype_promotion", "numpy_rank_promotion")


def directory() -> str | None:
    """Where entries live, or None when the store is off: no cache directory, or the user
    pointed JAX's own persistent cache somewhere (then that cache is used, as JAX does)."""
    if not config.cache_dir or user_cache_dir():
        return None
    return os.path.join(config.cache_dir, _DIR)


@functools.cache
def _source_digest() -> bytes:
    """xlanb's own source, lowerings included: an edited lowering must miss."""
    h = hashlib.sha256()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.digest()


def _environment() -> bytes:
    import jaxlib
    import torch
    from jax._src import config as jax_config
    settings = tuple((k, getattr(getattr(jax_config, k, None), "value", None))
                     for k in _LOWERING_SETTINGS)
    # torch's default dtype can reach inside a decomposition without showing in its result
    return repr((torch.__version__, jax.__version__, jaxlib.__version__,
                 os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", ""),
                 settings, torch.get_default_dtype())).encode()


def key(description: bytes, device: int, options) -> str:
    """The store key of an executable: ``description`` says what it computes (the caller
    makes it complete), the rest is the environment it compiles in."""
    d = jax_device(device)
    h = hashlib.sha256(_source_digest())
    h.update(_environment())
    h.update(repr((d.platform, d.device_kind, d.client.platform_version, d.id,
                   sorted((options or {}).items()))).encode())
    h.update(description)
    return h.hexdigest()


def load(key: str, device: int):
    """The ``jax.stages.Compiled`` stored under ``key``, or None. Counts
    ``PersistentCacheHit`` / ``PersistentCacheMiss``."""
    path = _path(key)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError:
        metrics.counter("PersistentCacheMiss")
        return None
    try:
        payload, in_tree, out_tree = pickle.loads(zlib.decompress(blob))
        d = jax_device(device)
        _prepare_backend(d.platform)
        exe = serialize_executable.deserialize_and_load(payload, in_tree, out_tree,
                                                        backend=d.client, execution_devices=[d])
    except Exception:  # unreadable or incompatible: compile again, and overwrite it
        metrics.counter("PersistentCacheMiss")
        return None
    metrics.counter("PersistentCacheHit")
    return exe


def _prepare_backend(platform: str) -> None:
    """XLA:CPU executables call LAPACK through jaxlib's FFI handlers, whose function
    pointers are filled in when a linalg op is lowered. An executable loaded from the
    store was never lowered in this process, and calling its LAPACK kernels crashed it
    (linalg_qr): fill them in first, as ``jax.export`` does before running a module it
    deserialized. Raises if this JAX has no way to do that (the entry is then a miss)."""
    if platform != "cpu" or _lapack_ready:
        return
    try:
        from jax._src.lax.linalg import initialize_lapack
    except ImportError:
        from jaxlib.lapack import _lapack  # older layouts
        initialize_lapack = _lapack.initialize
    initialize_lapack()
    _lapack_ready.append(True)


_lapack_ready: list = []


def store(key: str, compiled) -> None:
    """Write ``compiled`` under ``key``; an executable that cannot be serialized is not
    stored (the next process compiles it again)."""
    path = _path(key)
    if path is None:
        return
    try:
        # zlib's fastest level: entries are 2.3x smaller for 0.2 ms each (single-op CPU ones)
        blob = zlib.compress(pickle.dumps(serialize_executable.serialize(compiled)), 1)
    except Exception:
        return
    d = os.path.dirname(path)
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)  # atomic: a reader sees the whole entry or none
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:  # read-only or full disk: run on, compiling in every process
        if not _write_failed:
            _write_failed.append(e)
            warnings.warn(f"xlanb: cannot write compiled executables to {directory()} ({e}); "
                          "a new process will compile them again. Set XLANB_CACHE_DIR to a "
                          "writable directory, or to an empty string to turn the store off.",
                          RuntimeWarning, stacklevel=2)


_write_failed: list = []  # warn once per process


def _path(key: str) -> str | None:
    d = directory()
    return None if d is None else os.path.join(d, key[:2], key)
