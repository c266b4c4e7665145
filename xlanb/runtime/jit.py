"""Compile and run JAX functions for xlanb, with torch's dtypes and a persistent cache.

Everything xlanb traces or compiles goes through ``jax_context()``: x64 on, so int64 and
float64 stay 64-bit. Executables persist across processes in xlanb's executable store
(store.py), not JAX's persistent cache, so that a warm process need not lower them to
find them; if the user configured JAX's cache directory themselves, JAX's cache is used
instead, as JAX does, and its hits and misses are counted.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import heapq
import itertools
import os
import threading
import time

import jax

from ..base import metrics
from . import compile_profile, shutdown
from .jax_compat import mlir_module

_local = threading.local()


def user_cache_dir() -> str | None:
    """JAX's persistent-cache directory, if the user set one globally (it then wins: JAX
    builds its cache object once per process)."""
    return jax.config.jax_compilation_cache_dir


def spans_devices(specs) -> bool:
    """Whether any of ``specs`` (arrays or ShapeDtypeStructs, nested) is placed on more
    than one device."""
    for s in jax.tree_util.tree_leaves(specs):
        sharding = getattr(s, "sharding", None)
        if sharding is not None and len(sharding.device_set) > 1:
            return True
    return False


@contextlib.contextmanager
def jax_context(specs=()):
    """x64 on, for the current thread only (a thread-local JAX state, so the user's own
    JAX code in the process is untouched); the thread's lowerings share an MLIR context.

    Random bits come from JAX's threefry without its partitionable form unless the
    lowering's ``specs`` span several devices. Partitionable threefry hashes every
    element's index (JAX's default, so that a sharded tensor's bits are made where they
    live); the other form hashes half as many counters and emits simpler code. Eight
    dropouts, pure JAX on the CPU: XLA's full compile 1.05 -> 0.38 s, their run 24 -> 7
    ms; the BERT step's tier-up wait 1.84 -> 1.41 s, its steady step 0.078 -> 0.072 s.
    A sharded lowering keeps the partitionable form, or every device would make every
    bit. So a seed gives other dropout masks under SPMD than on one device."""
    outer = getattr(_local, "reuse_ir", False)
    _local.reuse_ir = True
    try:
        with jax.enable_x64(True), jax.threefry_partitionable(spans_devices(specs)):
            yield
    finally:
        _local.reuse_ir = outer


# JAX makes a fresh MLIR context for every lowering and loads every dialect into it: 4-5 ms,
# more than half of tracing and lowering one op (9 ms -> 3 ms reused, measured with an
# elementwise op on the CPU). xlanb's lowerings (inside jax_context) reuse one context per
# thread instead. A context keeps every type, attribute and location made in it, so a
# thread starts a new one after _CONTEXT_USES lowerings; the old one lives on only as long
# as modules lowered in it. The user's own JAX code still gets a fresh context each time.
_CONTEXT_USES = 256
_jax_mlir = mlir_module()
_make_ir_context = getattr(_jax_mlir, "make_ir_context", None)


def _thread_ir_context():
    if not getattr(_local, "reuse_ir", False):
        return _make_ir_context()
    context = getattr(_local, "ir_context", None)
    if context is None or _local.ir_uses >= _CONTEXT_USES:
        context = _local.ir_context = _make_ir_context()
        _local.ir_uses = 0
    _local.ir_uses += 1
    return context


if callable(_make_ir_context):
    _jax_mlir.make_ir_context = _thread_ir_context


def lower_jitted(fn, arg_specs, *, lower_metric: str):
    """Trace and lower ``fn`` for ``arg_specs`` (a ``jax.stages.Lowered``), timed into
    ``lower_metric``. Holds the GIL: it is Python tracing the lowering rules."""
    t0 = time.perf_counter()
    with jax_context(arg_specs):
        lowered = jax.jit(fn).lower(*arg_specs)
    metrics.record(lower_metric, time.perf_counter() - t0)
    return lowered


def compile_lowered(lowered, *, metric: str, compiler_options=None, lower_s: float = 0.0):
    """Compile ``lowered``; ``lower_s`` plus the compile time go into ``metric``.
    ``compiler_options`` are XLA debug options for this executable only. XLA releases the
    GIL while it compiles, so this may run on a background thread (see ``background``).

    Persistent-cache hits and misses seen while doing so are counted as
    ``PersistentCacheHit`` / ``PersistentCacheMiss``.
    """
    t0 = time.perf_counter()
    _local.compiling = True
    try:
        options = compiler_options
        platform = platform_of(lowered)
        if platform == "cpu" and (options or {}).get(_YNN) != YNN_OFF[_YNN] and sums_a_broadcast(lowered):
            metrics.counter("YnnDotsOnly")
            options = {**(options or {}), **YNN_DOTS_ONLY}
        # the compiler's own phase times, kept per executable (compile_profile.py)
        with jax_context(), compile_profile.recording(lowered, platform, metric,
                                                      lower_s) as keep:
            # jax_context is thread-local: the cache settings must be set on this thread
            exe = lowered.compile(options)
            keep(exe)
            return exe
    finally:
        _local.compiling = False
        metrics.record(metric, lower_s + time.perf_counter() - t0)


def platform_of(lowered) -> str | None:
    """The platform ``lowered`` compiles for ("cpu", "tpu", ...; None if JAX does not say).
    JAX has no public name for it: ``Lowered._lowering.compile_args["backend"]`` (checked
    on jax 0.10.2)."""
    try:
        return lowered._lowering.compile_args["backend"].platform
    except (AttributeError, KeyError, TypeError):
        return None


# XLA:CPU (jaxlib 0.10) hands reductions and dots to YNNPACK, and a YNNPACK reduce fused
# with a broadcast returns sums that change from run to run: a 256x256 block repeated to
# 4096x4096 and summed (x.repeat(16, 16).sum() in a lazy graph) gave 9 totals in 15 runs,
# up to 6% off, and broadcasting along the leading dimension did the same. YNNPACK's
# reductions are otherwise correct and 3-14x quicker than XLA's own here, so only a module
# where a reduce can fuse with a broadcast compiles with YNNPACK for dots only. That is
# decided from the module before compiling (compiling, reading the executable's fusions
# and compiling again doubled the BERT step's compile: 2.6 -> 7.2 s).
_YNN = "xla_cpu_experimental_ynn_fusion_type"
YNN_DOTS_ONLY = {_YNN: "LIBRARY_FUSION_TYPE_DOT"}
# Both libraries off (the quick tiers, executables/compile.py): nothing to restrict.
YNN_OFF = {_YNN: "", "xla_cpu_use_xnnpack": False}
# Ops XLA:CPU never fuses into a reduce's input: a broadcast before one cannot reach it.
_FUSION_BARRIERS = frozenset(
    "stablehlo." + n for n in ("dot_general", "convolution", "reduce", "reduce_window", "sort",
                               "custom_call", "while", "scatter", "fft", "rng_bit_generator",
                               "cholesky", "triangular_solve", "all_reduce", "all_gather",
                               "reduce_scatter", "all_to_all", "collective_permute"))


def sums_a_broadcast(lowered) -> bool:
    """Whether a reduce in ``lowered``'s module takes (through ops XLA may fuse with it) a
    broadcast's result, as YNNPACK's broadcast-reduce fusion would. A call counts as a
    broadcast (its body is not followed), so this errs towards True."""
    try:
        module = lowered.compiler_ir("stablehlo")
    except Exception:  # noqa: BLE001 - a lowering that does not say: keep YNNPACK off reduces
        return True
    derived = set()  # operations whose results come from a broadcast through fusible ops

    def walk(block) -> bool:
        for op in block.operations:
            op = op.operation
            name = op.name
            if name == "stablehlo.reduce" and any(
                    getattr(v.owner, "operation", None) in derived for v in op.operands):
                return True
            if name in ("stablehlo.broadcast_in_dim", "stablehlo.broadcast", "func.call") or (
                    name not in _FUSION_BARRIERS and any(
                        getattr(v.owner, "operation", None) in derived for v in op.operands)):
                derived.add(op)
            for region in op.regions:
                for inner in region.blocks:
                    if walk(inner):
                        return True
        return False

    return any(walk(block) for op in module.body.operations
               for region in op.operation.regions for block in region.blocks)


_threads: list = []  # xlanb's compile threads: daemons, made on first use
_wake = threading.Semaphore(0)  # one release per task queued (or turn given back)
# Work waiting for a compile thread, most urgent first: (rank, order, future, fn, args,
# kwargs). Each queued task releases one turn; a thread that takes a turn runs whichever
# task is most urgent when it frees up.
_tasks: list = []
_order = itertools.count()
_tasks_lock = threading.RLock()  # (re-entered by the SIGINT handler at exit: compiles_pending)


def background(fn, *args, later: bool = False, **kwargs) -> concurrent.futures.Future:
    """Run ``fn`` on xlanb's compile threads (one per core, made on first use).
    ``later``: after every task asked for without it, even ones asked for afterwards (a
    compile nobody waits for must not delay one somebody does). Once the program has
    ended (``shutdown.closing``), a ``later`` task is cancelled and another runs here."""
    future = concurrent.futures.Future()
    if shutdown.closing():
        if later:
            future.cancel()
        elif future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - the Future carries it
                future.set_exception(e)
        return future
    if not _threads:
        _start_threads()
    with _tasks_lock:
        heapq.heappush(_tasks, (1 if later else 0, next(_order), future, fn, args, kwargs))
    _wake.release()
    return future


def _start_threads() -> None:
    with _tasks_lock:
        if _threads:
            return
        # Daemons: the interpreter never joins them, so a compile nobody will use does
        # not hold the exit; runtime/shutdown.py ends the process without finalizing
        # while one is inside XLA.
        for i in range(os.cpu_count() or 1):
            t = threading.Thread(target=_compile_thread, name=f"xlanb-compile_{i}", daemon=True)
            t.start()
            _threads.append(t)
    shutdown.add_work("compile(s)", compiles_pending, _drop_queued)


def _compile_thread() -> None:
    while True:
        _wake.acquire()
        _run_most_urgent()


class _Hold:
    """While a value is awaited (``later_held``: ``holders`` > 0), a compile thread that
    finds only ``later`` tasks parks its turn (``parked`` counts them) instead of taking a
    core from the wait. Read and written under ``_tasks_lock``."""
    holders = 0
    parked = 0


_held = _Hold()


@contextlib.contextmanager
def later_held():
    """Tasks queued ``later`` wait until the block ends: a peek's quick compiles and
    single-op runs get both cores, and the optimized compiles follow (measured on the
    seeds/003 first look: about 12% less wall time)."""
    with _tasks_lock:
        _held.holders += 1
    try:
        yield
    finally:
        with _tasks_lock:
            _held.holders -= 1
            parked = _held.parked if not _held.holders else 0
            if parked:
                _held.parked = 0
        for _ in range(parked):
            _wake.release()


def later_is_held() -> bool:
    """Whether tasks queued ``later`` are held back now (inside ``later_held``)."""
    with _tasks_lock:
        return bool(_held.holders)


def _run_most_urgent() -> None:
    with _tasks_lock:
        if not _tasks:  # dropped at exit
            return
        if _held.holders and _tasks[0][0]:  # the most urgent is ``later``: so are all the rest
            _held.parked += 1  # its turn comes back when the hold ends
            return
        _, _, future, fn, args, kwargs = heapq.heappop(_tasks)
        if not future.set_running_or_notify_cancel():
            return
        _running[0] += 1
    try:
        result = fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - the Future carries it to whoever waits
        future.set_exception(e)
    else:
        future.set_result(result)
    finally:
        with _tasks_lock:
            _running[0] -= 1


def compiles_pending() -> bool:
    """Whether a compile runs on xlanb's compile threads or waits for one."""
    with _tasks_lock:  # (a task leaves _tasks and enters _running under it)
        return bool(_running[0] or _tasks)


_running = [0]  # compiles running now (waited for at exit: shutdown.py)


def _drop_queued() -> None:
    """At exit: the compiles not yet started are cancelled (nobody will use them)."""
    with _tasks_lock:
        dropped = [t[2] for t in _tasks]
        _tasks.clear()
        _held.parked = 0
    for future in dropped:
        future.cancel()


_event_lock = threading.Lock()


def _on_jax_event(event: str, **_kw) -> None:
    if not getattr(_local, "compiling", False):
        return  # the user's own JAX compiles are not ours to count
    with _event_lock:  # compile threads count too
        if event == "/jax/compilation_cache/cache_hits":
            metrics.counter("PersistentCacheHit")
        elif event == "/jax/compilation_cache/cache_misses":
            metrics.counter("PersistentCacheMiss")


jax.monitoring.register_event_listener(_on_jax_event)
