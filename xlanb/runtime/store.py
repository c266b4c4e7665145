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
zlib-compressed and written atomically, one file per key, in
``<cache dir>/xlanb-executables/<environment>/<key[:2]>/<key>``. An entry that cannot be
read back (from an incompatible build) is a miss, and is replaced.

Those executables are pickles, so loading one runs whatever code its writer chose. The
store is therefore private and signed: its directories are created 0700 and refused (with
one warning, the store turned off) when another user owns them or can write to them; an
entry is loaded only if it is a regular file of this user's and its HMAC-SHA256, made with
a per-user secret kept outside the cache directory, verifies. Anything else is never
unpickled: it counts as ``PersistentCacheRejected`` and is deleted.

The store is bounded by ``config.store_max_bytes``: a write that takes it over the cap
deletes entries of other environments (xlanb source digest, torch, JAX or jaxlib version)
first, then the least recently used ones (a load refreshes an entry's mtime).
``python -m xlanb.store`` shows and manages it.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import hmac
import os
import pickle
import secrets
import shutil
import stat
import tempfile
import threading
import time
import warnings
import weakref
import zlib
from typing import NamedTuple

import jax
from jax.experimental import serialize_executable

from ..base import metrics
from ..base.config import config, default_store_key
from ..base.frames import PACKAGE_DIR
from .devices import jax_device
from . import shutdown
from .jit import user_cache_dir

_DIR = "xlanb-executables"
# JAX settings that change what a function lowers to (read with their thread-local value).
_LOWERING_SETTINGS = ("default_matmul_precision", "default_prng_impl", "threefry_partitionable",
                      "numpy_dtype_promotion", "numpy_rank_promotion")

# The sources that decide compiled code besides the description each caller passes,
# relative to the package (a folder means every .py under it): the lowerings, how a
# signature becomes a JAX function (ops/, templates, dtypes, and dispatch and record,
# through which torch's decompositions trace), the description format (ir's digests)
# and how executables are built from it (executables/compile, execute/graphs). Edit this
# list when those move; other modules (metrics, the renderers, the front ends, ...)
# may change freely without losing the store.
KEY_SOURCES = ("lowering", "ops", "ir/templates.py", "ir/nodes.py", "base/dtypes.py",
               "dispatch/dispatcher.py", "modes/record.py", "executables/compile.py",
               "execute/graphs.py",
               "runtime/jit.py")  # its compile_lowered may compile again (YNNPACK)
# Bump when the entry format changes, or when code outside KEY_SOURCES starts to decide
# what an executable computes.
FORMAT_VERSION = 2
_ROOT = PACKAGE_DIR

_MAGIC = b"XLNBEXE2"
_TAG_LEN = 32  # HMAC-SHA256
_TMP_PREFIX = ".tmp-"


def directory() -> str | None:
    """Where entries live, or None when the store is off: no cache directory, the user
    pointed JAX's own persistent cache somewhere (then that cache is used, as JAX does),
    or the store was refused (not private, or no signing key; warned once)."""
    if not config.store_dir or user_cache_dir():
        return None
    if _refusal(config.store_dir, config.store_key_file) is not None:
        return None
    return os.path.join(config.store_dir, _DIR)


# ---------------------------------------------------------------------------------------
# A private store: the directories and the signing key

_refusals: dict = {}  # (cache dir, key file) -> why the store is off there, or None
_setup_lock = threading.Lock()


def _refusal(store_dir: str, key_file: str) -> str | None:
    """Why the store must not run in ``store_dir`` with ``key_file``, or None; decided
    once per process (creating the directories and key as needed), warned once."""
    k = (store_dir, key_file)
    if k in _refusals:
        return _refusals[k]
    with _setup_lock:  # compile threads may ask first, together
        if k in _refusals:
            return _refusals[k]
        why = dir_problem(store_dir)  # before creating anything in it (issue 37)
        if why is None:
            _make_private_dirs(store_dir)
            why = dir_problem(store_dir)
        if why is not None:
            remedy = ("Run chmod go-w on it if it is yours, or set XLANB_STORE_DIR to a "
                      "directory only you can write (empty: no store)")
        else:
            why = _load_secret(key_file)[1]
            remedy = "Fix or delete that file, or set XLANB_STORE_KEY to another path"
        _refusals[k] = why
    if why is not None:
        warnings.warn(f"xlanb: the executable store is turned off: {why}. Compiled "
                      f"executables will not be kept between processes. {remedy}.",
                      RuntimeWarning, stacklevel=3)
    return why


def _make_private_dirs(store_dir: str) -> None:
    """Create the store's root (and the cache directory) where missing. Failing is not
    fatal: a read-only store still loads, and writes warn."""
    try:
        _mkdirs_private(os.path.join(store_dir, _DIR))
    except OSError:
        pass


def _mkdirs_private(d: str) -> None:
    """``d`` and its missing parents, created 0700 (the umask can only narrow that). One
    system call when ``d`` exists."""
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        parent = os.path.dirname(d)
        if parent == d:
            raise
        _mkdirs_private(parent)
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:  # another process made it meanwhile
            pass


def dir_problem(store_dir: str) -> str | None:
    """Why ``store_dir``, the store root in it or a folder inside that root (environment
    and shard folders) is not private, or None. A level that does not exist is fine: it is
    created 0700 when first written."""
    root = os.path.join(store_dir, _DIR)
    for d in (store_dir, root):
        try:
            st = os.stat(d)
        except OSError:
            continue
        why = _not_private(st)
        if why is not None:
            return f"{d} is {why}"
    for d in _subfolders(root):
        try:
            st = os.lstat(d)
        except OSError:
            continue
        why = _not_private(st)
        if why is not None:
            return f"{d} is {why}"
    return None


def _subfolders(root: str, depth: int = 2) -> list[str]:
    """The folders under the store root, ``depth`` levels down (environment, shard)."""
    found, level = [], [root]
    for _ in range(depth):
        nxt = []
        for d in level:
            try:
                with os.scandir(d) as it:
                    nxt += [e.path for e in it if e.is_dir(follow_symlinks=False)]
            except OSError:
                pass
        found += nxt
        level = nxt
    return found


def _not_private(st: os.stat_result) -> str | None:
    """What lets another user change this file or directory, or None (as ssh checks)."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


_secrets: dict = {}  # key file -> (secret or None, why not)


def _load_secret(path: str) -> tuple[bytes | None, str | None]:
    """The per-user signing secret in ``path`` (created if missing), or why not."""
    if path not in _secrets:
        try:
            _secrets[path] = (_read_or_create_secret(path), None)
        except (OSError, ValueError) as e:
            _secrets[path] = (None, f"its signing key {path} cannot be used ({e})")
    return _secrets[path]


def _secret() -> bytes:
    return _load_secret(config.store_key_file)[0]


def _read_or_create_secret(path: str) -> bytes:
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    d = os.path.dirname(path)
    missing = d
    while missing and not os.path.exists(os.path.dirname(missing)) \
            and os.path.dirname(missing) != missing:
        missing = os.path.dirname(missing)
    made = not os.path.exists(d)
    _mkdirs_private(d)
    if made and os.path.abspath(path) != os.path.abspath(default_store_key()):
        # a folder the user named, maybe mistyped: said, not made silently
        warnings.warn(f"xlanb: created the folder {missing} (0700) for the executable "
                      f"store's signing key {path} (XLANB_STORE_KEY)", stacklevel=2)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".store-key-")  # 0600
    try:
        os.write(fd, secrets.token_bytes(_TAG_LEN))
        os.fsync(fd)
        os.close(fd)
        try:
            os.link(tmp, path)  # atomic and never replaces: a racing process's key wins
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return _read_secret(path)


def _read_secret(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError("a symbolic link, not a file") from None
        raise
    try:
        st = os.fstat(fd)  # before any read: a directory or FIFO is named as such
        if stat.S_ISDIR(st.st_mode):
            raise ValueError("a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_uid != os.geteuid():
            raise ValueError(f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()})")
        if st.st_mode & 0o077:
            raise ValueError(f"readable or writable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                             "chmod 600 it")
        if st.st_size != _TAG_LEN:
            raise ValueError(f"not an xlanb store key ({st.st_size} bytes, not {_TAG_LEN})")
        secret = os.read(fd, _TAG_LEN + 1)
    finally:
        os.close(fd)
    if len(secret) != _TAG_LEN:
        raise ValueError(f"not an xlanb store key ({len(secret)} bytes read, not {_TAG_LEN})")
    return secret


def _sign(secret: bytes, key: str, body) -> bytes:
    """The entry's tag: its key and its bytes, so an entry moved to another key fails."""
    h = hmac.new(secret, key.encode() + b"\0", hashlib.sha256)
    h.update(body)
    return h.digest()


# ---------------------------------------------------------------------------------------
# Keys

@functools.cache
def _source_digest(root: str = _ROOT) -> bytes:
    """KEY_SOURCES under ``root`` and FORMAT_VERSION: an edited lowering must miss.
    Raw bytes: stripping docstrings through ``ast`` cost ~100 ms per process."""
    h = hashlib.sha256(b"xlanb-store-format %d\0" % FORMAT_VERSION)
    for path in _key_files(root):
        h.update(os.path.relpath(path, root).encode() + b"\0")
        try:
            with open(path, "rb") as f:
                h.update(f.read())
        except FileNotFoundError:  # a declared source that moved (tests check the list)
            h.update(b"<missing>")
        h.update(b"\0")
    return h.digest()


def _key_files(root: str) -> list[str]:
    """The files KEY_SOURCES names under ``root``, in a fixed order."""
    files = []
    for rel in KEY_SOURCES:
        path = os.path.join(root, rel)
        if not os.path.isdir(path):
            files.append(path)
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            files += [os.path.join(dirpath, n) for n in sorted(filenames) if n.endswith(".py")]
    return files


def _versions() -> bytes:
    import jaxlib
    import torch
    return repr((torch.__version__, jax.__version__, jaxlib.__version__)).encode()


def _environment() -> bytes:
    import torch
    settings = tuple((k, getattr(jax.config, "jax_" + k, None)) for k in _LOWERING_SETTINGS)
    # torch's default dtype can reach inside a decomposition without showing in its result;
    # the mat-mul precisions are read where dots and convolutions are lowered
    precision = (config.mat_mul_precision, torch.get_float32_matmul_precision(),
                 torch.backends.cudnn.allow_tf32)
    return _versions() + repr((os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", ""),
                               settings, torch.get_default_dtype(), precision)).encode()


@functools.cache
def env_tag() -> str:
    """The folder of entries written by this xlanb source, torch, JAX and jaxlib: the
    others are evicted first, and ``python -m xlanb.store prune`` deletes them."""
    return hashlib.sha256(_source_digest() + _versions()).hexdigest()[:16]


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


# ---------------------------------------------------------------------------------------
# Loading: verified before anything is unpickled

class _Rejected(Exception):
    """An entry that must not be loaded: not ours, or its tag does not verify."""


def has(key: str) -> bool:
    """Whether an entry is stored under ``key`` (not whether it loads; counts nothing)."""
    path = _path(key)
    return path is not None and os.path.lexists(path)


def load(key: str, device: int, with_info: bool = False):
    """The ``jax.stages.Compiled`` stored under ``key``, or None; with ``with_info``,
    ``(executable, info)``: the small dict its writer stored beside it (``store``), {}
    for none. Counts
    ``PersistentCacheHit`` / ``PersistentCacheMiss``, and ``PersistentCacheRejected``
    (also a miss) for an entry that is not this user's or not signed with their key."""
    exe, info = _load(key, device)
    return (exe, info) if with_info else exe


def _load(key: str, device: int):
    path = _path(key)
    if path is None:
        return None, {}
    try:
        body = _read_verified(path, key)
    except _Rejected as e:
        _reject(path, str(e))
        body = None
    except OSError:  # unreadable (I/O error): compile again
        body = None
    if body is None:
        metrics.counter("PersistentCacheMiss")
        return None, {}
    try:
        # (payload, in_tree, out_tree[, info]): entries written without info have three
        payload, in_tree, out_tree, *rest = pickle.loads(zlib.decompress(body))
        info = rest[0] if rest and isinstance(rest[0], dict) else {}
        d = jax_device(device)
        _prepare_backend(d.platform)
        exe = serialize_executable.deserialize_and_load(payload, in_tree, out_tree,
                                                        backend=d.client, execution_devices=[d])
    except Exception:  # signed by us, but from an incompatible build: compile again, overwrite
        metrics.counter("PersistentCacheMiss")
        return None, {}
    metrics.counter("PersistentCacheHit")
    _loaded.add(exe)
    return exe, info


# Executables this store loaded: never written again. XLA:CPU (jaxlib 0.10.2) serializes
# a deserialized executable without its object code, and that entry, loaded, fails at
# its first run ("NOT_FOUND: Function tanh_reduce_fusion not found"; pure JAX:
# serialize, deserialize_and_load, serialize). It is in the store already anyway.
_loaded: "weakref.WeakSet" = weakref.WeakSet()


def _read_verified(path: str, key: str):
    """The compressed body of the entry at ``path`` once its owner and tag check out;
    None if there is none. Raises ``_Rejected``. Refreshes its mtime (the LRU clock)."""
    try:
        # no symlinks followed; O_NONBLOCK: a planted FIFO must not hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _Rejected("a symbolic link") from None
        return None  # absent (the usual miss) or unreadable
    try:
        st = os.fstat(fd)
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else _not_private(st)
        if why is not None:
            raise _Rejected(why)
        with os.fdopen(fd, "rb", closefd=False) as f:
            blob = memoryview(f.read())
        tag, body = blob[len(_MAGIC):len(_MAGIC) + _TAG_LEN], blob[len(_MAGIC) + _TAG_LEN:]
        if blob[:len(_MAGIC)] != _MAGIC or not hmac.compare_digest(tag, _sign(_secret(), key, body)):
            raise _Rejected("not signed with your store key")
        _touch(fd)
    finally:
        os.close(fd)
    return body


def _touch(fd: int) -> None:
    try:
        os.utime(fd)
    except OSError:  # read-only store: LRU order is only less exact
        pass


def _delete(path: str) -> str | None:
    """Delete what is at ``path`` (a file, link, FIFO or a planted directory tree, whose
    links are removed, never followed); None once it is gone, else why not."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def _reject(path: str, why: str) -> None:
    metrics.counter("PersistentCacheRejected")
    failed = _delete(path)
    if not _rejected:
        _rejected.append(path)
        done = "rejected and deleted" if failed is None else \
            f"rejected (and could not delete it: {failed})"
        warnings.warn(f"xlanb: {done} an executable-store entry ({why}): {path}. "
                      "Only entries written by your xlanb, signed with your key, are loaded.",
                      RuntimeWarning, stacklevel=3)


_rejected: list = []  # warn once per process


def _prepare_backend(platform: str) -> None:
    """XLA:CPU executables call LAPACK through jaxlib's FFI handlers, whose function
    pointers are filled in when a linalg op is lowered. An executable loaded from the
    store was never lowered in this process, and calling its LAPACK kernels crashed it
    (linalg_qr): fill them in first, as ``jax.export`` does before running a module it
    deserialized. Raises if this JAX has no way to do that (the entry is then a miss)."""
    if platform != "cpu" or _lapack_ready:
        return
    from .jax_compat import initialize_lapack
    initialize_lapack()
    _lapack_ready.append(True)


_lapack_ready: list = []


def store(key: str, compiled, info: dict | None = None) -> None:
    """Write ``compiled`` under ``key``, with ``info`` (a small dict of plain values that
    ``load(with_info=True)`` hands back: a quick executable's compile time); an
    executable that cannot be serialized is not stored (the next process compiles it
    again); nor is any with ``config.store_readonly``."""
    if config.store_readonly or compiled in _loaded:
        return
    path = _path(key)
    if path is None:
        return
    try:
        entry = serialize_executable.serialize(compiled)
        if info:
            entry = (*entry, info)
        # zlib's fastest level: entries are 2.3x smaller for 0.2 ms each (single-op CPU ones)
        blob = zlib.compress(pickle.dumps(entry), 1)
    except Exception:
        return
    _write(path, key, blob)


# Writes one at a time, and none once the process is ending (shutdown.py): at exit a write
# in progress finishes (or its temporary file is deleted) before the process ends, so a
# tier-up cut off there leaves nothing half-written.
_write_lock = threading.Lock()
_writing: list = []  # the temporary file of the write in progress
_ended = [False]
EXIT_WRITE_WAIT_S = 2.0  # a write takes milliseconds; a stuck disk must not hold the exit


def _write(path: str, key: str, body: bytes) -> None:
    """Sign ``body`` and write it at ``path`` atomically, in folders created 0700; then
    keep the store under its cap."""
    tag = _sign(_secret(), key, body)
    with _write_lock:
        if _ended[0]:
            return
        _write_locked(path, key, tag, body)


def _write_locked(path: str, key: str, tag: bytes, body: bytes) -> None:
    try:
        _mkdirs_private(os.path.dirname(path))  # again if someone deleted it as we ran
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=_TMP_PREFIX)  # 0600
        _writing.append(tmp)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + tag)
                f.write(body)  # not joined: a graph's entry can be megabytes
            try:
                os.replace(tmp, path)  # atomic: a reader sees the whole entry or none
            except IsADirectoryError:  # planted at this entry's path: remove it, once
                _reject(path, "a directory")
                os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        finally:
            _writing.clear()
    except OSError as e:  # read-only or full disk: run on, compiling in every process
        if not _write_failed:
            _write_failed.append(e)
            warnings.warn(f"xlanb: cannot write compiled executables to {directory()} ({e}); "
                          "a new process will compile them again. Set XLANB_STORE_DIR to a "
                          "writable directory, or to an empty string to turn the store off.",
                          RuntimeWarning, stacklevel=3)
        return
    metrics.counter("PersistentCacheWrite")
    _account(_root_of(path), len(_MAGIC) + len(tag) + len(body))


_write_failed: list = []  # warn once per process


def _end_writes() -> None:
    """Right before the process ends without finalizing (shutdown.py): the write in
    progress finishes, and no other starts; one stuck past ``EXIT_WRITE_WAIT_S`` has its
    temporary file deleted (a reader never sees it either way: entries appear by rename)."""
    got = _write_lock.acquire(timeout=EXIT_WRITE_WAIT_S)
    _ended[0] = True
    if not got:
        for tmp in list(_writing):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    # (the lock, when taken, is kept: the process ends next)


shutdown.before_exit(_end_writes)


def _path(key: str) -> str | None:
    d = directory()
    return None if d is None else os.path.join(d, env_tag(), key[:2], key)


def _root_of(path: str) -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(path)))


# ---------------------------------------------------------------------------------------
# A bounded store

class Entry(NamedTuple):
    path: str
    size: int
    mtime_ns: int  # refreshed by each load: the LRU clock
    current: bool  # written by this xlanb source, torch, JAX and jaxlib


STALE_TMP_S = 3600  # a write in progress takes seconds; older temporary files are leftovers


def entries(root: str, leftovers: bool = True) -> list[Entry]:
    """Every entry under the store root ``root``. Files of another layout (older xlanb)
    count as entries of another environment; so do temporary files of writes that died
    (a kill -9), older than ``STALE_TMP_S`` (unless ``leftovers`` is false): they take
    disk like entries, so they count toward the cap and are evicted first. Writes in
    progress are left out."""
    current_env = env_tag()
    cutoff = time.time_ns() - int(STALE_TMP_S * 1e9)
    found = []
    for dirpath, _dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root).split(os.sep)
        current = len(rel) == 2 and rel[0] == current_env
        for name in filenames:
            tmp = name.startswith(_TMP_PREFIX)
            if tmp and not leftovers:
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if tmp and st.st_mtime_ns >= cutoff:
                continue  # a write in progress
            found.append(Entry(path, st.st_size, st.st_mtime_ns, current and not tmp))
    return found


def is_leftover(entry: Entry) -> bool:
    return os.path.basename(entry.path).startswith(_TMP_PREFIX)


def evict(root: str, max_bytes: int) -> tuple[list[Entry], int]:
    """Delete entries until ``root`` holds at most ``max_bytes``: other environments'
    first, then the least recently used. Returns those deleted and the bytes left."""
    found = sorted(entries(root), key=lambda e: (e.current, e.mtime_ns))
    total = sum(e.size for e in found)
    gone = []
    for e in found:
        if total <= max_bytes:
            break
        try:
            os.unlink(e.path)
        except FileNotFoundError:  # another process evicted it
            pass
        except OSError:
            continue
        total -= e.size
        gone.append(e)
    return gone, total


_usage: dict = {}  # store root -> bytes it holds, as this process counts them
_usage_lock = threading.Lock()  # writes come from compile threads too


def _account(root: str, added: int) -> None:
    """Count ``added`` bytes into ``root``'s size (scanned on this process's first write)
    and evict when over the cap: down to 90% of it, so the next writes do not scan
    again. Other processes' writes are seen at the next scan, so the cap holds per
    process between scans."""
    with _usage_lock:
        total = _usage.get(root)
        total = sum(e.size for e in entries(root)) if total is None else total + added
        cap = config.store_max_bytes
        if total > cap:
            gone, total = evict(root, cap * 9 // 10)
            metrics.counter("PersistentCacheEvicted", len(gone))
        _usage[root] = total
